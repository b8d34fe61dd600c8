//! `kvtwin run` on the autoscaling scenarios: the report shows the planner's work, the
//! JSON carries the `autoscale` object, `--plot` draws the charts, and `--speedup`
//! plays the traffic faster; a plot asked of a scenario without a planner is an error.

mod common;

use std::path::Path;

fn scenario(name: &str) -> String {
    format!("{}/../scenarios/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// `kvtwin run` with `args`: (success, stdout, stderr).
fn run(args: &[&str]) -> (bool, String, String) {
    common::kvtwin_outcome(&[&["run"], args].concat())
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_burst_run_reports_and_plots_its_autoscaling() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let charts = dir.path().join("charts");
    let (ok, stdout, stderr) = run(&[
        &scenario("autoscale-burst.ron"),
        "--set",
        "traffic.horizon_s=360",
        "--json",
        report.to_str().unwrap(),
        "--plot",
        charts.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.contains("autoscale: planner load every 5 s"),
        "{stdout}"
    );
    assert!(stdout.contains("prefill 1 -> 2"), "{stdout}");
    let autoscale = &json(&report)["autoscale"];
    for field in ["gpu_hours", "slo_attainment", "direction_flips"] {
        assert!(autoscale[field].is_number(), "{field}: {autoscale}");
    }
    assert!(autoscale["gpu_hours"].as_f64().unwrap() > 0.0);
    let timeline = autoscale["timeline"].as_array().unwrap();
    assert!(!timeline.is_empty());
    assert_eq!(timeline[0]["pool"], "Prefill");
    assert_eq!(autoscale["pools"], serde_json::json!(["Prefill", "Decode"]));
    // An interval every 5 s for the 360 s of traffic, and on while the last requests
    // finish.
    assert!(autoscale["intervals"].as_array().unwrap().len() >= 72);
    for chart in ["autoscale-replicas", "autoscale-load", "autoscale-slo"] {
        for ext in ["svg", "png"] {
            let file = charts.join(format!("{chart}.{ext}"));
            assert!(std::fs::metadata(&file).unwrap().len() > 1000, "{file:?}");
        }
    }
}

#[test]
fn speedup_plays_the_traffic_faster_and_plots_need_a_planner() {
    let dir = tempfile::tempdir().unwrap();
    let simulated = |speedup: &str| {
        let report = dir.path().join(format!("speedup-{speedup}.json"));
        let (ok, _, stderr) = run(&[
            &scenario("autoscale-flap.ron"),
            "--set",
            "traffic.horizon_s=240",
            "--speedup",
            speedup,
            "--json",
            report.to_str().unwrap(),
        ]);
        assert!(ok, "{stderr}");
        let report = json(&report);
        (
            report["requests"].as_u64().unwrap(),
            report["simulated_s"].as_f64().unwrap(),
        )
    };
    let (requests, once) = simulated("1");
    let (same, twice) = simulated("2");
    assert_eq!(requests, same, "the same requests");
    assert!(
        twice < once * 0.75,
        "{twice} s at 2x against {once} s at 1x"
    );
    let (ok, _, stderr) = run(&[&scenario("autoscale-flap.ron"), "--speedup", "0"]);
    assert!(
        !ok && stderr.contains("traffic.speedup: 0 must be above 0"),
        "{stderr}"
    );
    let (ok, _, stderr) = run(&[&scenario("cluster-kv.ron"), "--plot", "charts"]);
    assert!(
        !ok && stderr.contains("has no autoscale section"),
        "{stderr}"
    );
}
