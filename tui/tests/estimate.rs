//! `kvtwin estimate` as a user runs it: one point and a grid as JSON lines with
//! AIConfigurator's field names, a measured table loaded from a file, and the errors
//! for what cannot be estimated, each naming its flag.

mod common;

use common::kvtwin_outcome;
use serde_json::Value;

fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn one_point_prints_aiconfigurators_fields() {
    let (ok, stdout, stderr) = kvtwin_outcome(&[
        "estimate",
        "--compute",
        "h100-llama3-8b",
        "--isl",
        "4096",
        "--osl",
        "128",
        "--batch",
        "8",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let points = json_lines(&stdout);
    assert_eq!(points.len(), 1);
    let point = &points[0];
    for field in [
        "isl",
        "osl",
        "prefix",
        "batch_size",
        "tp_size",
        "ttft",
        "tpot",
        "request_latency",
        "context_latency",
        "generation_latency",
        "seq_per_second",
        "tokens_per_second",
        "tokens_per_second_per_gpu",
        "tokens_per_second_per_user",
        "memory",
        "kv_bytes_per_sequence",
    ] {
        assert!(point.get(field).is_some(), "{field} missing: {point}");
    }
    assert_eq!(point["batch_size"], 8);
    assert_eq!(point["kv_bytes_per_sequence"], (4096 + 128) * 131_072);
    let latency = point["ttft"].as_f64().unwrap() + 127.0 * point["tpot"].as_f64().unwrap();
    assert!((point["request_latency"].as_f64().unwrap() - latency).abs() < 1e-6);
}

#[test]
fn a_grid_gives_every_combination_and_the_table_names_them() {
    let args = [
        "estimate",
        "--compute",
        "h200x2-llama3-70b",
        "--grid",
        "isl=1024,8192",
        "--grid",
        "batch=1,16,32",
        "--osl",
        "64",
    ];
    let (ok, stdout, stderr) = kvtwin_outcome(&[&args[..], &["--json"]].concat());
    assert!(ok, "{stderr}");
    let points = json_lines(&stdout);
    assert_eq!(points.len(), 6);
    assert_eq!(points[5]["isl"], 8192);
    assert_eq!(points[5]["batch_size"], 32);
    assert_eq!(points[0]["tp_size"], 2);
    // Bigger batches: slower steps, more tokens a second.
    let tpot = |i: usize| points[i]["tpot"].as_f64().unwrap();
    let rate = |i: usize| points[i]["tokens_per_second"].as_f64().unwrap();
    assert!(tpot(2) > tpot(0) && rate(2) > rate(0));
    let (ok, table, _) = kvtwin_outcome(&args);
    assert!(ok);
    assert!(
        table.starts_with("h200x2-llama3-70b: static estimate"),
        "{table}"
    );
    assert!(table.contains("tokens/s/gpu"), "{table}");
    assert_eq!(table.lines().count(), 2 + 6, "{table}");
}

#[test]
fn a_measured_table_loads_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("measured.ron");
    std::fs::write(
        &path,
        r#"Table((
            name: "vllm llama-3-8b h100, measured",
            kv_bytes_per_token: 131072,
            max_kv_tokens: 400000,
            prefill_isl: [1024, 4096],
            prefill_ms: [22.0, 90.0],
            decode: [
                (context: 1024, batch: [1, 64], ms: [6.0, 10.0]),
                (context: 4096, batch: [1, 64], ms: [6.5, 18.0]),
            ],
        ))"#,
    )
    .unwrap();
    let path = path.to_str().unwrap();
    let at_4096 = |extra: &[&str]| {
        let args = ["estimate", "--compute", path, "--isl", "4096", "--osl", "2"];
        kvtwin_outcome(&[&args[..], extra].concat())
    };
    let (ok, stdout, stderr) = at_4096(&["--json"]);
    assert!(ok, "{stderr}");
    let point = &json_lines(&stdout)[0];
    assert!(
        (point["ttft"].as_f64().unwrap() - 90.0).abs() < 1e-6,
        "{point}"
    );
    assert!(
        (point["tpot"].as_f64().unwrap() - 6.5).abs() < 0.01,
        "{point}"
    );
    // 400,000 KV tokens hold 97 sequences of 4,098.
    let (ok, _, stderr) = at_4096(&["--batch", "128"]);
    assert!(!ok);
    assert!(
        stderr.contains("--batch: 128 sequences") && stderr.contains("at most 97"),
        "{stderr}"
    );

    std::fs::write(dir.path().join("bad.ron"), "Table((name: \"x\", prefill_isl: [2, 1], prefill_ms: [1.0, 2.0], decode: [(context: 1, batch: [1], ms: [1.0])]))").unwrap();
    let bad = dir.path().join("bad.ron");
    let (ok, _, stderr) = kvtwin_outcome(&["estimate", "--compute", bad.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        stderr.contains("prefill_isl") && stderr.contains("2 then 1"),
        "{stderr}"
    );
}

#[test]
fn what_cannot_be_estimated_is_refused_naming_the_flag() {
    let refused = |args: &[&str], expected: &[&str]| {
        let (ok, _, stderr) = kvtwin_outcome(&[&["estimate"][..], args].concat());
        assert!(!ok, "{args:?} was accepted");
        for part in expected {
            assert!(stderr.contains(part), "{args:?}: {stderr}");
        }
    };
    refused(
        &["--compute", "tpu-v5"],
        &["--compute", "tpu-v5", "h100-llama3-8b"],
    );
    let h100 = ["--compute", "h100-llama3-8b"];
    refused(
        &[&h100[..], &["--isl", "0"]].concat(),
        &["--isl must be at least 1"],
    );
    refused(
        &[&h100[..], &["--osl", "0"]].concat(),
        &["--osl must be at least 1"],
    );
    refused(
        &[&h100[..], &["--batch", "0"]].concat(),
        &["--batch must be at least 1"],
    );
    refused(
        &[&h100[..], &["--batch", "-4"]].concat(),
        &["--batch", "negative"],
    );
    refused(
        &["--compute", "dynosim", "--batch", "100000"],
        &["--batch must be at most 65536"],
    );
    refused(
        &[&h100[..], &["--isl", "1000", "--prefix", "1000"]].concat(),
        &["--prefix 1000 must be below --isl 1000"],
    );
    // 512 sequences of 9,216 tokens: about 634 GB of KV for one 80 GB H100.
    refused(
        &[&h100[..], &["--isl", "8192", "--batch", "512"]].concat(),
        &["--batch: 512 sequences", "h100-sxm", "at most 46 fit"],
    );
    // In a grid, points that do not fit are skipped and said; none fitting is an error.
    let (ok, stdout, stderr) = kvtwin_outcome(&[
        "estimate",
        "--compute",
        "h100-llama3-8b",
        "--isl",
        "8192",
        "--grid",
        "batch=1,512",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(json_lines(&stdout).len(), 1);
    assert!(
        stderr.contains("skipped: --batch: 512 sequences"),
        "{stderr}"
    );
    refused(
        &[&h100[..], &["--isl", "8192", "--grid", "batch=512,1024"]].concat(),
        &["no grid point fits: 2 skipped"],
    );
    refused(
        &[&h100[..], &["--grid", "batch=1,0"]].concat(),
        &["--batch must be at least 1", "grid point batch=0"],
    );
    refused(
        &[&h100[..], &["--grid", "depth=1"]].concat(),
        &["--grid depth=1", "unknown key"],
    );
}

/// A full simulation of one request alone on the scenario's worker gives the estimate's
/// TTFT: the scheduler adds nothing to a lone prompt that fits one pass (8,192 tokens,
/// the scenario's `max_batch_tokens`); a longer one is prefilled in chunks, each pass
/// paying the fixed cost again (0.46 ms on this profile) while the attention is the same.
#[test]
fn a_full_run_of_one_request_has_the_estimates_ttft() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/h100-llama3-8b.ron"
    );
    let dir = tempfile::tempdir().unwrap();
    for isl in [1024u64, 4096, 16384] {
        let trace = dir.path().join(format!("one-{isl}.jsonl"));
        // 64-token blocks, as the scenario's worker has them.
        let hash_ids: Vec<u64> = (0..isl / 64).collect();
        let row = serde_json::json!({
            "timestamp": 0, "input_length": isl, "output_length": 2, "hash_ids": hash_ids,
        });
        std::fs::write(&trace, format!("{row}\n")).unwrap();
        let report = dir.path().join(format!("report-{isl}.json"));
        let (ok, _, stderr) = kvtwin_outcome(&[
            "run",
            scenario,
            "--trace",
            trace.to_str().unwrap(),
            "--json",
            report.to_str().unwrap(),
        ]);
        assert!(ok, "{stderr}");
        let report: Value =
            serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
        let simulated = report["ttft"]["mean_ms"].as_f64().unwrap();
        let isl_flag = isl.to_string();
        let (ok, stdout, stderr) = kvtwin_outcome(&[
            "estimate",
            "--compute",
            "h100-llama3-8b",
            "--isl",
            &isl_flag,
            "--osl",
            "2",
            "--json",
        ]);
        assert!(ok, "{stderr}");
        let estimated = json_lines(&stdout)[0]["ttft"].as_f64().unwrap();
        let error = simulated / estimated - 1.0;
        println!(
            "isl {isl}: run {simulated:.2} ms, estimate {estimated:.2} ms ({:+.2} %)",
            error * 100.0
        );
        assert!(
            error.abs() < 0.10,
            "isl {isl}: run {simulated} ms, estimate {estimated} ms"
        );
        if isl <= 8192 {
            // One pass: nothing added.
            assert!(
                (simulated - estimated).abs() < 0.01,
                "isl {isl}: {simulated} vs {estimated}"
            );
        } else {
            // Two chunks: one more fixed cost, within a millisecond.
            assert!(
                simulated > estimated && simulated - estimated < 1.0,
                "{simulated} vs {estimated}"
            );
        }
    }
}

/// A folder of Dynamo planner profiles is a measured table: `kvtwin profile` writes the
/// scenario's model into one, and the estimate read back from it is the model's at the
/// points profiled.
#[test]
fn a_dynamo_planner_profile_folder_is_read_as_a_measured_table() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/h100-llama3-8b.ron"
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("profiles");
    let out = out.to_str().unwrap();
    let (ok, _, stderr) = kvtwin_outcome(&["profile", scenario, "--out", out]);
    assert!(ok, "{stderr}");
    let ask = |compute: &str| {
        let (ok, stdout, stderr) = kvtwin_outcome(&[
            "estimate",
            "--compute",
            compute,
            "--grid",
            "isl=1024,4096,16384",
            "--osl",
            "64",
            "--json",
        ]);
        assert!(ok, "{stderr}");
        json_lines(&stdout)
    };
    let (measured, model) = (ask(out), ask("h100-llama3-8b"));
    for (table, roofline) in measured.iter().zip(&model) {
        for field in ["ttft", "tpot"] {
            let (t, r) = (
                table[field].as_f64().unwrap(),
                roofline[field].as_f64().unwrap(),
            );
            assert!(
                (t / r - 1.0).abs() < 0.01,
                "{field} at isl {}: {t} vs {r}",
                table["isl"]
            );
        }
        // A table knows no weights: no memory figure, but the replica's KV tokens.
        assert!(table["memory"].is_null());
    }
    // Past the KV the profile measured: refused.
    let (ok, _, stderr) = kvtwin_outcome(&["estimate", "--compute", out, "--batch", "4096"]);
    assert!(!ok);
    assert!(stderr.contains("--batch: 4096 sequences"), "{stderr}");
}
