//! `kvtwin bench router`: replays a `kv-router-workload` file through kvtwin's indexer,
//! timing every event and match the way peer-bench times Dynamo's indexers, and prints
//! one JSON line with peer-bench's field names.
//!
//! Owns: the timing loop only (a wall clock is allowed here, at the edge); parsing, the
//! index and the checksum live in `kvtwin::router`.

use anyhow::{bail, Context, Result};
use kvtwin::events::KvCacheEventData;
use kvtwin::router::indexer::{KvIndexer, MatchScratch};
use kvtwin::router::workload::{parse, Checksum, WorkloadOp};
use std::path::Path;
use std::time::{Duration, Instant};

/// Replays `path` and prints the JSON line.
pub(crate) fn router(path: &Path, threads: usize) -> Result<()> {
    if threads != 1 {
        bail!("the indexer applies events on one thread; --threads {threads} is not supported yet (use 1)");
    }
    let load_start = Instant::now();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (_, ops) = parse(&text).with_context(|| format!("parsing {}", path.display()))?;
    drop(text);
    let load_s = load_start.elapsed().as_secs_f64();

    let mut index = KvIndexer::new();
    let mut scratch = MatchScratch::default();
    let mut checksum = Checksum::default();
    let (mut events, mut blocks_stored, mut blocks_removed, mut warnings) =
        (0u64, 0u64, 0u64, 0u64);
    let mut apply_total = Duration::ZERO;
    let mut match_times: Vec<Duration> = Vec::new();
    let mut pairs = Vec::new();
    let mut peak_pairs = 0usize;
    let mut peak_bytes = 0usize;
    let wall = Instant::now();
    for op in &ops {
        match op {
            WorkloadOp::Event { worker, event } => {
                events += 1;
                match &event.data {
                    KvCacheEventData::Stored { blocks, .. } => blocks_stored += blocks.len() as u64,
                    KvCacheEventData::Removed { block_hashes, .. } => {
                        blocks_removed += block_hashes.len() as u64
                    }
                    KvCacheEventData::Cleared => {}
                }
                let start = Instant::now();
                let result = index.apply(*worker, event);
                apply_total += start.elapsed();
                warnings += u64::from(result.is_err());
                if index.pairs() > peak_pairs {
                    peak_pairs = index.pairs();
                }
            }
            WorkloadOp::Match(query) => {
                let start = Instant::now();
                let scores = index.find_matches_with(query, false, &mut scratch);
                match_times.push(start.elapsed());
                pairs.clear();
                pairs.extend(scores.iter().map(|w| (w.worker.worker.get(), w.blocks)));
                checksum.add(&mut pairs);
            }
        }
    }
    let wall_s = wall.elapsed().as_secs_f64();
    // Memory at the end of the replay, per (block, worker) pair held then.
    peak_bytes = peak_bytes.max(index.heap_bytes());
    let bytes_per_entry = if index.pairs() == 0 {
        0.0
    } else {
        peak_bytes as f64 / index.pairs() as f64
    };
    let mut sorted = match_times.clone();
    sorted.sort_unstable();
    let percentile_us = |q: f64| -> f64 {
        if sorted.is_empty() {
            return 0.0;
        }
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1].as_secs_f64() * 1e6
    };
    let apply_s_total = apply_total.as_secs_f64();
    let match_s_total: f64 = match_times.iter().map(Duration::as_secs_f64).sum();
    let per_s = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    let line = serde_json::json!({
        "impl": "kvtwin",
        "threads": threads,
        "workload": path.display().to_string(),
        "events": events,
        "blocks_stored": blocks_stored,
        "blocks_removed": blocks_removed,
        "matches": match_times.len(),
        "barriers": 0,
        "apply_s_total": apply_s_total,
        "events_per_s": per_s(events, apply_s_total),
        "blocks_per_s": per_s(blocks_stored + blocks_removed, apply_s_total),
        "match_s_total": match_s_total,
        "match_per_s": per_s(match_times.len() as u64, match_s_total),
        "match_p50_us": percentile_us(0.50),
        "match_p99_us": percentile_us(0.99),
        "wall_s": wall_s,
        "load_s": load_s,
        "warnings": warnings,
        "bytes_per_entry": bytes_per_entry,
        "pairs": index.pairs(),
        "peak_pairs": peak_pairs,
        "checksum": checksum,
    });
    println!("{line}");
    Ok(())
}
