//! `kvtwin plan`: on a space of 200 points it finds the exhaustive sweep's optimum with
//! at most a quarter of the simulations; an SLO nothing meets names the constraint that
//! fails and by how much; bad input names its field.

mod common;

use std::path::Path;
use std::process::Command;

const SCENARIO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/cluster-kv.ron");

const SLO: &str = "ttft_p99_ms=300,tpot_p99_ms=40";

/// `kvtwin` with `args`: (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn an_slo_nothing_meets_names_the_constraint_that_fails_and_by_how_much() {
    let dir = tempfile::tempdir().unwrap();
    let space = write(
        dir.path(),
        "space.ron",
        r#"(set: [("workload.Conversations.conversations", ["40"])], workers: [1, 2])"#,
    );
    let (ok, stdout, stderr) = run(&[
        "plan",
        SCENARIO,
        "--space",
        &space,
        "--slo",
        "ttft_p99_ms=1,tpot_p99_ms=1000",
    ]);
    assert!(!ok);
    assert!(stdout.contains("no point meets the SLO"), "{stdout}");
    assert!(
        stdout.contains("ttft_p99_ms") && stdout.contains("FAILS, over by"),
        "{stdout}"
    );
    assert!(
        stdout.contains("2 workers"),
        "the closest has the most workers: {stdout}"
    );
    assert!(
        stderr.contains("no point of the space meets the SLO"),
        "{stderr}"
    );
}

#[test]
fn bad_input_names_its_field() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(dir.path(), "good.ron", r#"(workers: [1, 2])"#);
    let fails = |args: &[&str], needles: &[&str]| {
        let (ok, _, stderr) = run(&[&["plan", SCENARIO][..], args].concat());
        assert!(!ok, "{args:?} succeeded");
        for needle in needles {
            assert!(
                stderr.contains(needle),
                "{args:?}: no {needle:?} in {stderr}"
            );
        }
    };
    let unknown_path = write(
        dir.path(),
        "path.ron",
        r#"(set: [("cluster.wrokers", ["1"])])"#,
    );
    fails(
        &["--space", &unknown_path, "--slo", SLO],
        &["path.ron", "set[0]", "cluster.wrokers", "no such field"],
    );
    let unknown_field = write(dir.path(), "field.ron", r#"(wrokers: [1])"#);
    fails(
        &["--space", &unknown_field, "--slo", SLO],
        &["field.ron:1:", "wrokers"],
    );
    let zero = write(dir.path(), "zero.ron", r#"(host_blocks: [0, 100])"#);
    fails(
        &["--space", &zero, "--slo", SLO],
        &["host_blocks", "at least 1"],
    );
    let gpu = write(dir.path(), "gpu.ron", r#"(gpu: ["tpu-v9-llama"])"#);
    fails(
        &["--space", &gpu, "--slo", SLO],
        &["gpu", "tpu-v9-llama", "h100-llama3-8b"],
    );
    fails(
        &["--space", &good, "--slo", "itl_p99_ms=5"],
        &["itl_p99_ms", "no such metric", "tpot_p99_ms"],
    );
    fails(&["--space", &good, "--slo", "ttft_p99_ms"], &["METRIC=MS"]);
    let prices = write(
        dir.path(),
        "prices.ron",
        "(gpu_usd_per_hour: {\"h100-sxm\": \"cheap\"}, dram_usd_per_gb_hour: 0.1, ssd_usd_per_gb_hour: 0.1)",
    );
    fails(
        &["--space", &good, "--slo", SLO, "--prices", &prices],
        &["prices.ron:1:"],
    );
    let no_h100 = write(
        dir.path(),
        "no-h100.ron",
        "(gpu_usd_per_hour: {\"h200\": 3.0}, dram_usd_per_gb_hour: 0.1, ssd_usd_per_gb_hour: 0.1)",
    );
    fails(
        &["--space", &good, "--slo", SLO, "--prices", &no_h100],
        &["no-h100.ron", "no price for GPU \"h100-sxm\"", "h200"],
    );
    let sweep = write(
        dir.path(),
        "other.jsonl",
        "{\"run\":0,\"runs\":1,\"overrides\":{\"cluster.workers\":7},\"seed\":1}\n",
    );
    fails(
        &["--space", &good, "--slo", SLO, "--from-sweep", &sweep],
        &["other.jsonl:1", "no point of the space"],
    );
}
