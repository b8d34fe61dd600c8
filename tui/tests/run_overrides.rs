//! `kvtwin run --set`: overrides reach the simulation (the JSON report shows them), and an
//! unknown path fails with the list of valid ones instead of running anything.

use serde_json::Value;
use std::process::Command;

fn kvtwin() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvtwin"));
    // The default scenario's path is relative to the repository root.
    command.current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    command
}

#[test]
fn set_overrides_reach_the_report_and_unknown_paths_are_listed() {
    let json = std::env::temp_dir().join(format!("kvtwin-run-set-{}.json", std::process::id()));
    let output = kvtwin()
        .args(["run", "--set", "name=what-if", "--set"])
        .arg("workload.Conversations.conversations=20")
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    std::fs::remove_file(&json).unwrap();
    assert_eq!(report["scenario"], "what-if");
    // 20 conversations of 1 to 8 turns, instead of the default's 1,500.
    let requests = report["requests"].as_u64().unwrap();
    assert!((20..=160).contains(&requests), "{requests}");

    let output = kvtwin()
        .args(["run", "--set", "hardware.pcie_gbps=64"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("hardware.pcie_gbps: no such field"),
        "{stderr}"
    );
    assert!(stderr.contains("hardware.pcie_bytes_per_s"), "{stderr}");
}
