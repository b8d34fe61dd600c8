//! A trace whose rows disagree with themselves: `kvtwin run` and `kvtwin cache` stop with
//! an error naming the file, line and field by default; `--trace-mismatch clamp` and
//! `extend` run it and the report counts the rows.

use serde_json::Value;
use std::process::Command;

fn kvtwin(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .env("RUST_BACKTRACE", "0")
        .args(args)
        .output()
        .unwrap()
}

/// 40 rows of 512-token blocks, rows 7 and 23 (lines 7 and 23) with 300 tokens more
/// than their hash ids cover, row 31 with a hash id past its tokens.
fn trace_text() -> String {
    (1..=40)
        .map(|line| {
            let ids: Vec<u64> = (0..3).map(|k| (line % 5) * 10 + k).collect();
            let tokens = match line {
                7 | 23 => 3 * 512 + 300,
                31 => 2 * 512,
                _ => 3 * 512 - 100,
            };
            format!(
                "{{\"timestamp\":{},\"input_length\":{tokens},\"output_length\":8,\"hash_ids\":{ids:?}}}\n",
                line * 50
            )
        })
        .collect()
}

#[test]
fn mismatched_rows_are_an_error_by_default_and_counted_when_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("mismatched.jsonl");
    std::fs::write(&trace, trace_text()).unwrap();
    let trace = trace.to_str().unwrap();
    let scenario = "scenarios/conversation-trace.ron";

    let output = kvtwin(&["run", scenario, "--trace", trace]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "mismatched.jsonl:7",
        "field `input_length`",
        "300 tokens past",
        "--trace-mismatch",
    ] {
        assert!(stderr.contains(needle), "{needle} missing: {stderr}");
    }

    for (policy, word) in [("clamp", "clamped"), ("extend", "extended")] {
        let json = dir.path().join(format!("{policy}.json"));
        let output = kvtwin(&[
            "run",
            scenario,
            "--trace",
            trace,
            "--trace-mismatch",
            policy,
            "--json",
            json.to_str().unwrap(),
        ]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(stdout.contains(&format!("trace     40 rows checked at 512 tokens a block: 2 with tokens past their hash_ids, 1 with hash_ids past their tokens ({word})")), "{stdout}");
        let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(report["completed"], 40);
        let section = &report["trace"];
        assert_eq!(section["rows"], 40);
        assert_eq!(section["tokens_past_hash_ids"], 2);
        assert_eq!(section["hash_ids_past_tokens"], 1);
        assert_eq!(
            section["mismatch"],
            if policy == "clamp" { "Clamp" } else { "Extend" }
        );
    }

    // The cache replay reads with the same check.
    let output = kvtwin(&["cache", "--trace", trace, "--capacity-blocks", "8"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("mismatched.jsonl:7"));
    let output = kvtwin(&[
        "cache",
        "--trace",
        trace,
        "--capacity-blocks",
        "8",
        "--trace-mismatch",
        "clamp",
    ]);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("3 of 40 rows clamped"), "{stderr}");
}

#[test]
fn a_trace_read_at_a_smaller_block_size_says_it_fits_at_mooncakes() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("mooncake.jsonl");
    std::fs::write(
        &trace,
        "{\"timestamp\":0,\"input_length\":1000,\"output_length\":8,\"hash_ids\":[1,2]}\n",
    )
    .unwrap();
    // The default scenario's blocks are 64 tokens.
    let output = kvtwin(&["run", "--trace", trace.to_str().unwrap()]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("fits at Mooncake's 512 tokens a block"),
        "{stderr}"
    );
}
