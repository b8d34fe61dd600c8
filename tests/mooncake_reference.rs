//! The pool's LRU with leaf-first release reproduces the exact hit ratios of
//! `shared/data/mooncake/conversation_lru_reference.csv` (one shared LRU cache replaying
//! the Mooncake conversation trace) to the 4th decimal, at every capacity listed.

mod common;

use kvtwin::pool::EvictionPolicyKind;
use kvtwin_sim::cache::replay;
use kvtwin_sim::workload::read_mooncake_trace;

#[test]
fn pool_reproduces_the_mooncake_lru_reference() {
    let Some(shared) = common::shared_dir("the Mooncake reference test") else {
        return;
    };
    let dir = shared.join("data").join("mooncake");
    let requests = read_mooncake_trace(&dir.join("conversation_trace.jsonl")).unwrap();
    assert_eq!(requests.len(), 12_031);
    let csv = std::fs::read_to_string(dir.join("conversation_lru_reference.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (capacity, hit_blocks, hit_tokens) = (
        column("capacity_blocks"),
        column("hit_blocks"),
        column("hit_tokens"),
    );
    let mut rows = 0;
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split(',').collect();
        let capacity: usize = fields[capacity].parse().unwrap();
        let expected_blocks: f64 = fields[hit_blocks].parse().unwrap();
        let expected_tokens: f64 = fields[hit_tokens].parse().unwrap();
        let row = replay(&requests, capacity, 512, EvictionPolicyKind::Lru).unwrap();
        assert!(
            (row.hit_blocks - expected_blocks).abs() < 5e-5,
            "capacity {capacity}: hit_blocks {:.6} vs {expected_blocks}",
            row.hit_blocks
        );
        assert!(
            (row.hit_tokens - expected_tokens).abs() < 5e-5,
            "capacity {capacity}: hit_tokens {:.6} vs {expected_tokens}",
            row.hit_tokens
        );
        rows += 1;
    }
    assert!(rows >= 5, "the reference lists {rows} rows");
}
