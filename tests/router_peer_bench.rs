//! kvtwin's indexer against NVIDIA Dynamo's, on the same files: peer-bench generates
//! workloads (synthetic, interleaved, with clears, Mooncake traces, any number of
//! workers), its generator states the checksum that Dynamo's three indexers and its naive
//! reference reproduce, and kvtwin must print the same one.
//!
//! Needs the peer-bench binary: set `PEER_BENCH=/path/to/peer-bench` (`.ci/run` builds it
//! from `../shared/peer-bench`). Skips with a reason when it is absent, fails under CI.

mod common;

use kvtwin::router::indexer::KvIndexer;
use kvtwin::router::workload::{parse, replay};
use std::path::{Path, PathBuf};
use std::process::Command;

fn peer_bench() -> Option<PathBuf> {
    match std::env::var_os("PEER_BENCH") {
        Some(path) => Some(PathBuf::from(path)),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but PEER_BENCH is not set"
            );
            eprintln!("skipping: set PEER_BENCH to a peer-bench binary (see ../shared/peer-bench/README.md)");
            None
        }
    }
}

/// Generates a workload with `args`, then checks kvtwin's checksum against the
/// generator's expected one.
fn check(binary: &Path, dir: &Path, name: &str, args: &[&str]) {
    let out = dir.join(format!("{name}.jsonl"));
    let output = Command::new(binary)
        .arg("gen")
        .args(args)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("peer-bench runs");
    assert!(
        output.status.success(),
        "{name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("gen prints JSON");
    let expected = &report["expected"];
    let text = std::fs::read_to_string(&out).unwrap();
    let (_, ops) = parse(&text).unwrap();
    let mut index = KvIndexer::new();
    let got = replay(&ops, &mut index);
    assert_eq!(got.hits, expected["hits"].as_u64().unwrap(), "{name}: hits");
    assert_eq!(
        got.sum_max,
        expected["sum_max"].as_u64().unwrap(),
        "{name}: sum_max"
    );
    assert_eq!(
        got.sum_all,
        expected["sum_all"].as_u64().unwrap(),
        "{name}: sum_all"
    );
    assert_eq!(
        got.digest_hex(),
        expected["digest"].as_str().unwrap(),
        "{name}: digest"
    );
    let stats = index.stats();
    assert_eq!(stats.rejections(), 0, "{name}: {stats:?}");
    std::fs::remove_file(&out).unwrap();
}

#[test]
fn checksums_equal_dynamos_on_every_kind_of_generated_workload() {
    let Some(binary) = peer_bench() else { return };
    let dir = std::env::temp_dir().join(format!("kvtwin-peer-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let small = [
        "--stores",
        "4000",
        "--queries",
        "4000",
        "--capacity-blocks",
        "256",
    ];
    let cases: Vec<(&str, Vec<&str>)> = vec![
        ("phased", vec!["synthetic", "--seed", "1"]),
        (
            "interleaved",
            vec!["synthetic", "--seed", "2", "--interleaved"],
        ),
        (
            "clears",
            vec![
                "synthetic",
                "--seed",
                "3",
                "--interleaved",
                "--clear-every",
                "50",
            ],
        ),
        (
            "one-worker",
            vec!["synthetic", "--seed", "4", "--workers", "1"],
        ),
        (
            "three-workers",
            vec![
                "synthetic",
                "--seed",
                "5",
                "--workers",
                "3",
                "--block-size",
                "4",
            ],
        ),
    ];
    for (name, mut args) in cases {
        args.extend_from_slice(&small);
        check(&binary, &dir, name, &args);
    }
    if let Some(shared) = common::shared_dir("the Mooncake workloads") {
        let trace = shared.join("data/mooncake/conversation_trace.jsonl");
        let trace = trace.to_str().unwrap();
        for routing in ["overlap", "round-robin"] {
            let args = [
                "mooncake",
                "--trace",
                trace,
                "--workers",
                "4",
                "--capacity-blocks",
                "2048",
                "--routing",
                routing,
            ];
            check(&binary, &dir, &format!("mooncake-{routing}"), &args);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
