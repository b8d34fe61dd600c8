//! `kvtwin profile`: on the shipped H100 scenario it writes both tables in Dynamo's
//! planner layout, they read back, and they are sane (TTFT grows with ISL, ITL with KV
//! usage at a fixed context); bad grids name their flag's field; `--engine` refuses what it
//! cannot measure (a real engine is measured in engines_twin.rs).

mod common;

use kvtwin_sim::autoscale::profile::{
    load_profiles, DECODE_JSON, DECODE_NPZ, PREFILL_JSON, PREFILL_NPZ,
};

const SCENARIO: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../scenarios/h100-llama3-8b.ron"
);

/// `kvtwin profile` with `args`: (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    common::kvtwin_outcome(&[&["profile"], args].concat())
}

#[test]
fn writes_dynamo_planner_tables_that_read_back_sane() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (ok, stdout, stderr) = run(&[SCENARIO, "--out", out]);
    assert!(ok, "{stderr}");
    for file in [PREFILL_NPZ, DECODE_NPZ, PREFILL_JSON, DECODE_JSON] {
        assert!(dir.path().join(file).is_file(), "{file}");
        assert!(stdout.contains(file), "{stdout}");
    }
    assert!(
        stdout.contains("TTFT ms") && stdout.contains("ITL ms"),
        "{stdout}"
    );

    let (prefill, decode) = load_profiles(dir.path()).unwrap();
    // 4,000 blocks of 64 tokens on the device.
    assert_eq!(decode.max_kv_tokens, 256_000);
    assert!(prefill.isl.len() >= 5, "{prefill:?}");
    assert!(prefill.isl.windows(2).all(|w| w[0] < w[1]), "{prefill:?}");
    assert!(
        prefill.ttft_ms.windows(2).all(|w| w[0] < w[1]),
        "{prefill:?}"
    );
    assert!(prefill.thpt_per_gpu.iter().all(|t| *t > 0.0));

    let mut contexts = decode.context_length.clone();
    contexts.dedup();
    assert!(contexts.len() >= 3, "{decode:?}");
    for context in contexts {
        let curve: Vec<(f64, f64)> = (0..decode.kv_usage.len())
            .filter(|i| decode.context_length[*i] == context)
            .map(|i| (decode.kv_usage[i], decode.itl_ms[i]))
            .collect();
        assert!(curve.len() >= 2, "{context}: {curve:?}");
        assert!(
            curve.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1),
            "ITL must grow with KV usage at context {context}: {curve:?}"
        );
    }
    assert!(decode.kv_usage.iter().all(|u| *u > 0.0 && *u <= 1.0));
    // Under a 20 ms ITL target a replica decodes more at short contexts than long ones.
    assert!(decode.best_thpt_per_gpu(20.0, 1024.0) > decode.best_thpt_per_gpu(20.0, 8192.0));
}

#[test]
fn explicit_grids_are_used_and_bad_ones_name_their_field() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let (ok, _, stderr) = run(&[
        SCENARIO,
        "--out",
        out,
        "--isl",
        "256,2048",
        "--context",
        "2048",
        "--kv-usage",
        "0.1,0.5",
    ]);
    assert!(ok, "{stderr}");
    let (prefill, decode) = load_profiles(dir.path()).unwrap();
    assert_eq!(prefill.isl, [256.0, 2048.0]);
    assert_eq!(decode.context_length, [2048.0, 2048.0]);

    let (ok, _, stderr) = run(&[SCENARIO, "--out", out, "--kv-usage", "1.5"]);
    assert!(!ok);
    assert!(stderr.contains("kv_usage: 1.5"), "{stderr}");
    let (ok, _, stderr) = run(&["no-such.ron", "--out", out]);
    assert!(!ok);
    assert!(stderr.contains("no-such.ron"), "{stderr}");
}

#[test]
fn engine_profiling_refuses_what_it_cannot_measure_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // Neither a scenario nor an engine.
    let (ok, _, stderr) = run(&["--out", out]);
    assert!(!ok);
    assert!(stderr.contains("--engine"), "{stderr}");
    // Both.
    let (ok, _, stderr) = run(&[SCENARIO, "--engine", "http://127.0.0.1:1", "--out", out]);
    assert!(!ok);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
    // Engine-only flags without an engine.
    let (ok, _, stderr) = run(&[SCENARIO, "--out", out, "--repeats", "5"]);
    assert!(!ok);
    assert!(stderr.contains("--engine"), "{stderr}");
    // Nothing listening: the URL it tried is named.
    let (ok, _, stderr) = run(&["--engine", "http://127.0.0.1:1", "--out", out]);
    assert!(!ok);
    assert!(stderr.contains("http://127.0.0.1:1/v1/models"), "{stderr}");
    let (ok, _, stderr) = run(&[
        "--engine",
        "http://127.0.0.1:1",
        "--out",
        out,
        "--repeats",
        "0",
    ]);
    assert!(!ok);
    assert!(stderr.contains("--repeats must be at least 1"), "{stderr}");
    assert!(
        std::fs::read_dir(dir.path()).unwrap().next().is_none(),
        "wrote nothing"
    );
}
