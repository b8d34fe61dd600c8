//! `kvtwin bench sim` end to end on a small Mooncake-format trace: one JSON line with the
//! fields the issue names, the same report digest on every run, the flags reaching the
//! cluster, and a bad trace line reported by its number.

use serde_json::Value;
use std::process::Command;

/// A trace of `conversations` three-turn conversations sharing a two-block system
/// prompt, a second apart, each turn resending the history plus two blocks.
fn trace(conversations: u64) -> String {
    let mut lines = Vec::new();
    for c in 0..conversations {
        let mut history = vec![1, 2];
        for turn in 0..3 {
            history.extend([1000 + c * 100 + turn * 2, 1001 + c * 100 + turn * 2]);
            lines.push(format!(
                r#"{{"timestamp":{},"input_length":{},"output_length":40,"hash_ids":{:?}}}"#,
                c * 1000 + turn * 20_000,
                history.len() * 512 - 100,
                history
            ));
        }
    }
    lines.sort_by_key(|l| {
        let start = l.find(':').unwrap() + 1;
        l[start..l.find(',').unwrap()].parse::<u64>().unwrap()
    });
    lines.join("\n") + "\n"
}

fn bench(trace: &std::path::Path, extra: &[&str]) -> Result<Value, String> {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["bench", "sim", "--trace"])
        .arg(trace)
        .args([
            "--workers",
            "4",
            "--device-blocks",
            "40",
            "--host-blocks",
            "80",
        ])
        .args(extra)
        .output()
        .unwrap();
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&output.stdout).unwrap())
}

#[test]
fn bench_sim_prints_one_reproducible_line_with_the_figures_the_issue_names() {
    let dir = std::env::temp_dir().join(format!("kvtwin-bench-sim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    std::fs::write(&path, trace(30)).unwrap();

    let first = bench(&path, &[]).unwrap();
    for field in [
        "wall_s",
        "requests",
        "requests_per_s",
        "events_per_s",
        "peak_rss_bytes",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "hit_device",
        "hit_host",
        "hit_disk",
    ] {
        assert!(first.get(field).is_some(), "no {field} in {first}");
    }
    assert_eq!(first["requests"], 90);
    assert_eq!(first["completed"], 90);
    assert_eq!(first["workers"], 4);
    assert_eq!(first["routing"], "kv");
    assert_eq!(first["router_view_matches_pools"], true);
    // Later turns find their history: the KV router sends them where it is.
    assert!(first["hit_ratio"].as_f64().unwrap() > 0.3, "{first}");
    let again = bench(&path, &[]).unwrap();
    assert_eq!(first["report_digest"], again["report_digest"]);

    let round_robin = bench(&path, &["--routing", "round-robin"]).unwrap();
    assert_eq!(round_robin["routing"], "round_robin");
    assert_ne!(first["report_digest"], round_robin["report_digest"]);

    std::fs::write(&path, trace(2) + "{\"timestamp\": oops}\n").unwrap();
    let error = bench(&path, &[]).unwrap_err();
    assert!(error.contains("trace.jsonl:7"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}
