//! `kvtwin cache --curve`: on the Mooncake trace, the one-pass curve prints exactly the
//! JSON of the per-capacity replays; `--policy priority` is refused with it, and
//! `--capacity-blocks` stays required without it.

mod common;

use std::path::PathBuf;
use std::process::Command;

/// The reference's capacities.
const CAPACITIES: &str = "1000,2000,5000,5859,6000,10000,20000,50000,97656,100000";

/// The Mooncake trace, or `None` with a printed reason when `../shared` is absent and the
/// run is not CI (CI always has it, so there its absence fails the test).
fn trace() -> Option<PathBuf> {
    let shared = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    if !shared.is_dir() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but ../shared is missing; the cache curve test needs it"
        );
        eprintln!("skipping the cache curve test: ../shared is not beside the repository");
        return None;
    }
    Some(shared.join("data/mooncake/conversation_trace.jsonl"))
}

#[test]
fn curve_json_equals_the_per_capacity_replays_on_the_mooncake_trace() {
    let Some(trace) = trace() else {
        return;
    };
    let trace = trace.to_str().unwrap();
    let args = ["cache", "--trace", trace, "--capacity-blocks", CAPACITIES];
    let replays = common::kvtwin(&[&args[..], &["--json"]].concat());
    let curve = common::kvtwin(&[&args[..], &["--json", "--curve"]].concat());
    assert_eq!(curve, replays);
    assert!(curve.starts_with("{\"rows\":[{\"capacity_blocks\":1000,"));
}

#[test]
fn curve_refuses_the_priority_policy_and_capacities_stay_required_without_it() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kvtwin"))
            .args(args)
            .output()
            .unwrap()
    };
    let priority = run(&[
        "cache",
        "--trace",
        "missing.jsonl",
        "--curve",
        "--policy",
        "priority",
    ]);
    assert!(!priority.status.success());
    assert!(String::from_utf8_lossy(&priority.stderr).contains("--policy priority"));
    let bare = run(&["cache", "--trace", "missing.jsonl"]);
    assert!(!bare.status.success());
    assert!(String::from_utf8_lossy(&bare.stderr).contains("--capacity-blocks"));
}
