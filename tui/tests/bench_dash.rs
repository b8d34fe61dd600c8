//! `kvtwin bench dash` end to end, tiny: one JSON line with every measurement the issue
//! names, each with figures that make sense for the flags given. No timing is asserted:
//! only that the times are there, finite and non-negative.

use serde_json::Value;
use std::process::Command;

fn bench(extra: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["bench", "dash"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{extra:?}: {stderr}");
    assert!(
        stderr.contains("frame cost"),
        "no table on stderr: {stderr}"
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    serde_json::from_str(&stdout).unwrap()
}

/// A duration or a share: present, finite, not negative.
fn time(line: &Value, path: &[&str]) -> f64 {
    let value = path.iter().fold(line, |v, key| &v[*key]);
    let figure = value
        .as_f64()
        .unwrap_or_else(|| panic!("no {path:?} in {line}"));
    assert!(figure.is_finite() && figure >= 0.0, "{path:?} = {figure}");
    figure
}

#[test]
fn bench_dash_prints_one_line_with_every_measurement() {
    let line = bench(&[
        "--workers",
        "30",
        "--frames",
        "2",
        "--events",
        "250000",
        "--seconds",
        "20",
    ]);
    assert_eq!(line["workers"], 30);

    let views = line["frames"]["per_view"].as_array().unwrap();
    // Five views at two sizes.
    assert_eq!(views.len(), 10, "{line}");
    let names: Vec<&str> = views[..5]
        .iter()
        .map(|v| v["view"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["workers", "charts", "routes", "integrity", "transfers"]
    );
    assert_eq!(views[0]["size"], "160x48");
    assert_eq!(views[5]["size"], "80x24");
    for view in views {
        let mean = time(view, &["mean_ms"]);
        assert!(time(view, &["p99_ms"]) > 0.0);
        let share = time(view, &["core_share_at_10fps"]);
        assert!((share - mean / 100.0).abs() < 1e-9, "{view}");
    }
    assert!(line["frames"]["under_10_percent"].is_boolean());

    assert_eq!(line["ingest"]["rows_per_delta"], 30);
    time(&line, &["ingest", "mean_ms"]);
    time(&line, &["ingest", "core_share_at_10_per_s"]);

    let replica = &line["replica"];
    assert!(
        replica["block_events"].as_u64().unwrap() >= 250_000,
        "{replica}"
    );
    // A read every 100,000 blocks.
    assert_eq!(replica["reads"], 2, "{replica}");
    assert!(time(&line, &["replica", "block_events_per_s"]) > 0.0);
    assert!(replica["keeps_up_at_1m"].is_boolean());
    assert!(replica["note"].as_str().unwrap().contains("decode"));

    for key in [
        "sort_max_ms",
        "filter_max_ms",
        "tab_max_ms",
        "freeze_max_ms",
        "max_ms",
    ] {
        time(&line, &["keys", key]);
    }
    assert!(line["keys"]["under_50_ms"].is_boolean());

    let replay = &line["replay"];
    assert_eq!(replay["recorded_s"], 20.0);
    // An update every 100 ms, the first at 0.
    assert_eq!(replay["updates"], 201);
    // A frame every 10 s of recording: at 0, 10 and 20 s.
    assert_eq!(replay["frames"], 3);
    assert!(time(&line, &["replay", "speed_x"]) > 0.0);
    assert!(replay["file_bytes"].as_u64().unwrap() > 0);
    time(&line, &["replay", "bytes_per_update"]);
}

#[test]
fn bench_dash_refuses_an_empty_world() {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["bench", "dash", "--workers", "0"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--workers"));
}
