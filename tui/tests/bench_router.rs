//! `kvtwin bench router` end to end: a workload from kvtwin's own generator, written in
//! peer-bench's file format, replayed by the binary on one thread and sharded over
//! several, must print the checksum that the library's in-order replay gives; replayed
//! with `--floor`, the same ops through no index (no hits, one thread only).

use kvtwin::events::KvCacheEventData;
use kvtwin::router::indexer::KvIndexer;
use kvtwin::router::workload::{generate_synthetic, replay, SyntheticOptions, WorkloadOp};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::process::Command;

/// The ops as a `kv-router-workload` v1 file (WORKLOAD.md).
fn to_file(ops: &[WorkloadOp], workers: u64) -> String {
    let mut text = json!({"format": "kv-router-workload", "version": 1, "block_size": 16,
        "workers": workers, "seed": 0, "source": "kvtwin test"})
    .to_string();
    text.push('\n');
    for op in ops {
        let line = match op {
            WorkloadOp::Match(query) => {
                json!({"op": "match", "blocks": query.iter().map(|t| t.get()).collect::<Vec<_>>()})
            }
            WorkloadOp::Event { worker, event } => match &event.data {
                KvCacheEventData::Stored {
                    parent_hash,
                    blocks,
                    ..
                } => json!({"op": "stored", "worker": worker.get(),
                    "parent": parent_hash.map(|p| p.get()),
                    "blocks": blocks.iter().map(|b| [b.tokens_hash.get(), b.block_hash.get()]).collect::<Vec<_>>()}),
                KvCacheEventData::Removed { block_hashes, .. } => json!({"op": "removed",
                    "worker": worker.get(),
                    "blocks": block_hashes.iter().map(|h| h.get()).collect::<Vec<_>>()}),
                KvCacheEventData::Cleared => json!({"op": "cleared", "worker": worker.get()}),
            },
        };
        writeln!(text, "{line}").unwrap();
    }
    text
}

#[test]
fn sharded_and_inline_replays_print_the_library_checksum() {
    let options = SyntheticOptions {
        seed: 11,
        workers: 5,
        stores: 600,
        queries: 600,
        capacity_blocks: 96,
        families: 4,
        interleaved: true,
        clear_every: 97,
    };
    let ops = generate_synthetic(&options);
    let expected = replay(&ops, &mut KvIndexer::new());
    assert!(expected.hits > 0 && expected.sum_all > expected.sum_max);
    let path =
        std::env::temp_dir().join(format!("kvtwin-bench-router-{}.jsonl", std::process::id()));
    std::fs::write(&path, to_file(&ops, options.workers)).unwrap();
    for threads in ["1", "3"] {
        let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
            .args(["bench", "router", "--workload"])
            .arg(&path)
            .args(["--threads", threads])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let line: Value = serde_json::from_slice(&output.stdout).unwrap();
        let checksum = &line["checksum"];
        assert_eq!(
            checksum["digest"],
            json!(expected.digest_hex()),
            "threads {threads}"
        );
        assert_eq!(checksum["hits"], json!(expected.hits), "threads {threads}");
        assert_eq!(
            checksum["sum_max"],
            json!(expected.sum_max),
            "threads {threads}"
        );
        assert_eq!(
            checksum["sum_all"],
            json!(expected.sum_all),
            "threads {threads}"
        );
        assert_eq!(line["warnings"], json!(0), "threads {threads}");
        assert!(line["bytes_per_entry"].as_f64().unwrap() > 0.0);
    }
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn the_floor_replays_every_op_through_no_index() {
    let options = SyntheticOptions {
        seed: 5,
        workers: 3,
        stores: 200,
        queries: 150,
        capacity_blocks: 64,
        families: 3,
        interleaved: true,
        clear_every: 0,
    };
    let ops = generate_synthetic(&options);
    let path = std::env::temp_dir().join(format!(
        "kvtwin-bench-router-floor-{}.jsonl",
        std::process::id()
    ));
    std::fs::write(&path, to_file(&ops, options.workers)).unwrap();
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kvtwin"))
            .args(["bench", "router", "--workload"])
            .arg(&path)
            .args(extra)
            .output()
            .unwrap()
    };
    let (indexed, floor) = (run(&[]), run(&["--floor"]));
    assert!(
        floor.status.success(),
        "{}",
        String::from_utf8_lossy(&floor.stderr)
    );
    let indexed: Value = serde_json::from_slice(&indexed.stdout).unwrap();
    let floor: Value = serde_json::from_slice(&floor.stdout).unwrap();
    assert_eq!(floor["impl"], json!("floor"));
    assert_eq!(indexed["impl"], json!("kvtwin"));
    // The same ops, timed the same way, answered by nothing.
    for field in ["events", "blocks_stored", "blocks_removed", "matches"] {
        assert_eq!(floor[field], indexed[field], "{field}");
    }
    assert!(indexed["checksum"]["hits"].as_u64().unwrap() > 0);
    assert_eq!(floor["checksum"]["hits"], json!(0));
    assert_eq!(floor["pairs"], json!(0));
    assert!(floor["apply_s_total"].as_f64().unwrap() > 0.0);
    // The floor is the one-thread replay's: asking for threads is a user error.
    let threaded = run(&["--floor", "--threads", "2"]);
    assert!(!threaded.status.success());
    let stderr = String::from_utf8_lossy(&threaded.stderr);
    assert!(stderr.contains("--floor replays on one thread"), "{stderr}");
    std::fs::remove_file(&path).unwrap();
}
