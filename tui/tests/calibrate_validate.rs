//! `kvtwin calibrate --quick` and `kvtwin validate` end to end: the profile calibration
//! writes loads as a `HardwareProfile` (alone, and as a scenario's `hardware`), and
//! validation on `scenarios/validate_host_disk.ron` with it prints every metric with
//! finite figures, as a table and as JSON; without a profile it calibrates before every
//! repeat and reports each metric's error range, real spread, target and verdict. No
//! timing is asserted: machines here are shared and noisy.

use kvtwin_sim::hardware::HardwareProfile;
use kvtwin_sim::scenario::Scenario;
use kvtwin_sim::validation::load_profile;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory of this test's own, removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn kvtwin(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "kvtwin {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn calibrate_writes_a_loadable_profile_and_validate_prints_every_metric() {
    let dir = Dir(std::env::temp_dir().join(format!("kvtwin-cal-test-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let out = dir.0.join("profile.ron");
    let (out_arg, dir_arg) = (out.to_str().unwrap(), dir.0.to_str().unwrap());
    let table = kvtwin(&["calibrate", "--quick", "--out", out_arg, "--dir", dir_arg]);
    for needle in [
        "host->device",
        "device->host",
        "host->disk",
        "disk->device",
        "no GPU",
    ] {
        assert!(table.contains(needle), "{needle} missing:\n{table}");
    }

    // The profile loads alone and as the hardware of a scenario.
    let profile: HardwareProfile = load_profile(&out).unwrap();
    assert!(profile.pcie_bytes_per_s > 0 && profile.nvme_read_bytes_per_s > 0);
    assert!(profile.transfer_workers > 0);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with("// "), "the method opens the file");
    let default = std::fs::read_to_string(repo_root().join("scenarios/default.ron")).unwrap();
    let start = default.find("hardware: (").unwrap() + "hardware: ".len();
    let end = start + default[start..].find("\n    ),").unwrap() + "\n    )".len();
    let body = text
        .lines()
        .filter(|l| !l.starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let scenario_text = format!("{}{}{}", &default[..start], body, &default[end..]);
    let scenario = Scenario::parse(&scenario_text, Path::new("calibrated.ron")).unwrap();
    assert_eq!(scenario.hardware, profile);

    // Validation: every metric, finite, as a table and as JSON.
    let script = "scenarios/validate_host_disk.ron";
    let args = [
        "validate",
        script,
        "--profile",
        out_arg,
        "--dir",
        dir_arg,
        "--repeat",
        "1",
    ];
    let table = kvtwin(&args);
    let json_args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    let json: Value = serde_json::from_str(kvtwin(&json_args).trim()).unwrap();
    let metrics = json["metrics"].as_array().unwrap();
    assert!(metrics.len() >= 30, "{} metrics", metrics.len());
    for metric in metrics {
        let name = metric["name"].as_str().unwrap();
        for field in ["real", "sim", "error_pct"] {
            let value = metric[field].as_f64();
            assert!(
                value.is_some_and(f64::is_finite),
                "{name}.{field}: {metric}"
            );
        }
        assert!(
            table.contains(name),
            "{name} missing from the table:\n{table}"
        );
    }
    let names: Vec<&str> = metrics
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "time_ms.total");
    for pair in ["device->host", "host->disk", "host->device", "disk->device"] {
        for kind in ["latency_p50_us", "latency_p99_us", "bandwidth_gbps"] {
            let name = format!("{kind}.{pair}");
            assert!(names.contains(&name.as_str()), "{name} missing");
        }
    }
}

/// `kvtwin` with `args` that must fail: its stderr.
fn kvtwin_fails(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(args)
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(!output.status.success(), "kvtwin {args:?} succeeded");
    String::from_utf8(output.stderr).unwrap()
}

#[test]
fn validate_without_a_profile_calibrates_before_every_repeat_and_prints_the_spread() {
    let dir = Dir(std::env::temp_dir().join(format!("kvtwin-val-test-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let dir_arg = dir.0.to_str().unwrap();
    let script = "scenarios/validate_host_disk.ron";
    let json: Value = serde_json::from_str(
        kvtwin(&[
            "validate", script, "--quick", "--repeat", "2", "--dir", dir_arg, "--json",
        ])
        .trim(),
    )
    .unwrap();
    assert_eq!(json["repeat"], 2);
    // No GPU was asked for (and this test build may have none): the device is emulated.
    let device_tier = json["device_tier"].as_str().unwrap();
    assert!(
        device_tier.contains("emulated in host memory"),
        "{device_tier}"
    );
    // Each repeat has its own calibration.
    let profiles = json["profiles"].as_array().unwrap();
    assert_eq!(profiles.len(), 2);
    for profile in profiles {
        assert!(profile["pcie_gbps"].as_f64().unwrap() > 0.0, "{profile}");
        assert!(
            profile["nvme_write_gbps"].as_f64().unwrap() > 0.0,
            "{profile}"
        );
    }
    let metrics = json["metrics"].as_array().unwrap();
    assert!(metrics.len() >= 30, "{} metrics", metrics.len());
    // Every repeat's own metrics come too.
    let runs = json["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        assert_eq!(run.as_array().unwrap().len(), metrics.len());
    }
    for metric in metrics {
        let name = metric["name"].as_str().unwrap();
        for field in [
            "real",
            "sim",
            "error_pct",
            "error_min_pct",
            "error_max_pct",
            "real_spread_pct",
        ] {
            assert!(
                metric[field].as_f64().is_some_and(f64::is_finite),
                "{name}.{field}: {metric}"
            );
        }
        let (low, mid, high) = (
            metric["error_min_pct"].as_f64().unwrap(),
            metric["error_pct"].as_f64().unwrap(),
            metric["error_max_pct"].as_f64().unwrap(),
        );
        assert!(low <= mid && mid <= high, "{name}: {metric}");
        assert!(metric["real_spread_pct"].as_f64().unwrap() >= 0.0);
        assert_eq!(metric["repeats"], 2, "{name}");
        assert!(metric["noisy"].is_boolean(), "{name}");
        // Targets: 5 % on times, 10 % on p50s per level, none elsewhere; a verdict each.
        let target = metric["target_pct"].as_f64();
        let expected = if name.starts_with("time_ms.") {
            Some(5.0)
        } else if name.starts_with("latency_p50_us.c") {
            Some(10.0)
        } else {
            None
        };
        assert_eq!(target, expected, "{name}");
        let verdict = metric["verdict"].as_str().unwrap();
        match target {
            None => assert_eq!(verdict, "untargeted", "{name}"),
            Some(_) => assert!(
                ["within", "within_noise", "outside"].contains(&verdict),
                "{name}: {verdict}"
            ),
        }
    }

    // A given profile and a calibration per repeat exclude each other.
    let stderr = kvtwin_fails(&["validate", script, "--profile", "p.ron", "--calibrate"]);
    assert!(stderr.contains("--calibrate"), "{stderr}");
}

/// A build without feature `cuda` asked for a GPU device tier says why it cannot, before
/// anything is measured; the same build with `--no-gpu` is the emulated default.
#[cfg(not(feature = "cuda"))]
#[test]
fn validate_on_a_gpu_needs_the_cuda_feature() {
    let script = "scenarios/validate_gpu_host_disk.ron";
    let stderr = kvtwin_fails(&["validate", script, "--gpu", "0", "--quick", "--repeat", "1"]);
    assert!(stderr.contains("feature `cuda`"), "{stderr}");
    let stderr = kvtwin_fails(&["validate", script, "--gpu", "0", "--no-gpu"]);
    assert!(stderr.contains("--no-gpu"), "{stderr}");
}
