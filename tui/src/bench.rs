//! `kvtwin bench router`: replays a `kv-router-workload` file through kvtwin's indexer,
//! timing every event and match the way peer-bench times Dynamo's indexers, and prints
//! one JSON line with peer-bench's field names.
//!
//! Owns: the timing loop and, for `--threads N > 1`, the thread pool that applies events
//! (a wall clock and threads are allowed here, at the edge). Parsing, the index and the
//! checksum live in `kvtwin::router`.
//!
//! With N threads the index is sharded by worker: worker `w`'s events go, in order, to
//! shard `w mod N`, whose thread applies them. Before a match that follows events, the
//! replay thread waits until every shard it sent events to has applied them (the barrier
//! WORKLOAD.md asks for, counted in `apply_s_total`), then asks every shard on its own
//! thread and merges the answers. Workers never span shards, so the merge is a sort.

use anyhow::{bail, Context, Result};
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::router::indexer::{KvIndexer, MatchScratch, WorkerOverlap};
use kvtwin::router::workload::{parse, Checksum, WorkloadOp};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Work for a shard thread.
enum Task {
    Event(WorkerId, KvCacheEvent),
    /// Acknowledge once every earlier event is applied.
    Flush(mpsc::SyncSender<()>),
}

/// One shard: its index (read by the replay thread between barriers) and its thread.
struct Shard {
    index: Arc<RwLock<KvIndexer>>,
    tasks: Option<mpsc::Sender<Task>>,
    thread: Option<JoinHandle<u64>>,
    /// Events sent since the last barrier.
    dirty: bool,
}

/// The indexer a replay drives: inline on the replay thread, or sharded over threads.
// One value per replay: boxing the inline index would only add a hop to the timed path.
#[allow(clippy::large_enum_variant)]
enum Indexer {
    Inline(KvIndexer),
    Sharded(Vec<Shard>),
}

fn read(index: &RwLock<KvIndexer>) -> RwLockReadGuard<'_, KvIndexer> {
    // A shard thread that panicked poisons its lock; the index is still readable.
    index
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Indexer {
    fn new(threads: usize) -> Self {
        if threads == 1 {
            return Indexer::Inline(KvIndexer::new());
        }
        let shards = (0..threads)
            .map(|_| {
                let index = Arc::new(RwLock::new(KvIndexer::new()));
                let (tasks, inbox) = mpsc::channel::<Task>();
                let shared = Arc::clone(&index);
                let thread = std::thread::spawn(move || {
                    let mut errors = 0u64;
                    for task in inbox {
                        match task {
                            Task::Event(worker, event) => {
                                let mut index = shared
                                    .write()
                                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                                errors += u64::from(index.apply(worker, &event).is_err());
                            }
                            Task::Flush(done) => {
                                let _ = done.send(());
                            }
                        }
                    }
                    errors
                });
                Shard {
                    index,
                    tasks: Some(tasks),
                    thread: Some(thread),
                    dirty: false,
                }
            })
            .collect();
        Indexer::Sharded(shards)
    }

    /// Applies (inline) or hands over (sharded) one event; returns whether it was
    /// rejected (inline only: shards count their own) and, inline, the event itself, so
    /// that the caller frees it after the clock stops: kvtwin's `apply` borrows the
    /// event, and freeing the caller's buffer is not the indexer's work.
    fn apply(
        &mut self,
        worker: WorkerId,
        event: KvCacheEvent,
    ) -> Result<(bool, Option<KvCacheEvent>)> {
        match self {
            Indexer::Inline(index) => Ok((index.apply(worker, &event).is_err(), Some(event))),
            Indexer::Sharded(shards) => {
                let count = shards.len() as u64;
                let shard = &mut shards[(worker.get() % count) as usize];
                shard.dirty = true;
                let tasks = shard.tasks.as_ref().context("shard closed")?;
                tasks
                    .send(Task::Event(worker, event))
                    .ok()
                    .context("a shard thread stopped")?;
                Ok((false, None))
            }
        }
    }

    /// Waits until every event sent so far is applied; returns whether it had to.
    fn barrier(&mut self) -> Result<bool> {
        let Indexer::Sharded(shards) = self else {
            return Ok(false);
        };
        let (done, acks) = mpsc::sync_channel(shards.len());
        let mut waiting = 0;
        for shard in shards.iter_mut().filter(|s| s.dirty) {
            let tasks = shard.tasks.as_ref().context("shard closed")?;
            tasks
                .send(Task::Flush(done.clone()))
                .ok()
                .context("a shard thread stopped")?;
            shard.dirty = false;
            waiting += 1;
        }
        for _ in 0..waiting {
            acks.recv().ok().context("a shard thread stopped")?;
        }
        Ok(waiting > 0)
    }

    /// Every worker's overlap, sorted by worker.
    fn find_matches(
        &self,
        query: &[LocalBlockHash],
        scratch: &mut MatchScratch,
        merged: &mut Vec<WorkerOverlap>,
    ) {
        merged.clear();
        match self {
            Indexer::Inline(index) => {
                merged.extend_from_slice(index.find_matches_with(query, false, scratch))
            }
            Indexer::Sharded(shards) => {
                for shard in shards {
                    merged.extend_from_slice(
                        read(&shard.index).find_matches_with(query, false, scratch),
                    );
                }
                merged.sort_unstable_by_key(|w| w.worker);
            }
        }
    }

    /// Sums a statistic over the shards.
    fn sum(&self, of: impl Fn(&KvIndexer) -> usize) -> usize {
        match self {
            Indexer::Inline(index) => of(index),
            Indexer::Sharded(shards) => shards.iter().map(|s| of(&read(&s.index))).sum(),
        }
    }

    /// Stops the shard threads; returns the events they rejected.
    fn finish(&mut self) -> Result<u64> {
        let Indexer::Sharded(shards) = self else {
            return Ok(0);
        };
        let mut errors = 0;
        for shard in shards.iter_mut() {
            shard.tasks = None;
        }
        for shard in shards.iter_mut() {
            if let Some(thread) = shard.thread.take() {
                errors += thread
                    .join()
                    .map_err(|_| anyhow::anyhow!("a shard thread panicked"))?;
            }
        }
        Ok(errors)
    }
}

/// Replays `path` and prints the JSON line.
pub(crate) fn router(path: &Path, threads: usize) -> Result<()> {
    if threads == 0 {
        bail!("--threads must be at least 1");
    }
    let load_start = Instant::now();
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (_, ops) = parse(&text).with_context(|| format!("parsing {}", path.display()))?;
    drop(text);
    let load_s = load_start.elapsed().as_secs_f64();

    let mut index = Indexer::new(threads);
    let mut scratch = MatchScratch::default();
    let mut merged = Vec::new();
    let mut checksum = Checksum::default();
    let (mut events, mut blocks_stored, mut blocks_removed, mut warnings) =
        (0u64, 0u64, 0u64, 0u64);
    let mut barriers = 0u64;
    let mut apply_total = Duration::ZERO;
    let mut match_times: Vec<Duration> = Vec::new();
    let mut pairs = Vec::new();
    let wall = Instant::now();
    for op in ops {
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
                let (rejected, spent) = index.apply(worker, event)?;
                apply_total += start.elapsed();
                drop(spent);
                warnings += u64::from(rejected);
            }
            WorkloadOp::Match(query) => {
                let start = Instant::now();
                barriers += u64::from(index.barrier()?);
                apply_total += start.elapsed();
                let start = Instant::now();
                index.find_matches(&query, &mut scratch, &mut merged);
                match_times.push(start.elapsed());
                pairs.clear();
                pairs.extend(merged.iter().map(|w| (w.worker.worker.get(), w.blocks)));
                checksum.add(&mut pairs);
            }
        }
    }
    let start = Instant::now();
    barriers += u64::from(index.barrier()?);
    apply_total += start.elapsed();
    let wall_s = wall.elapsed().as_secs_f64();
    // Memory at the end of the replay, per (block, worker) pair held then.
    let (heap_bytes, held_pairs) = (
        index.sum(KvIndexer::heap_bytes),
        index.sum(KvIndexer::pairs),
    );
    let (distinct_blocks, runs) = (
        index.sum(KvIndexer::distinct_blocks),
        index.sum(KvIndexer::runs),
    );
    warnings += index.finish()?;
    let bytes_per_entry = if held_pairs == 0 {
        0.0
    } else {
        heap_bytes as f64 / held_pairs as f64
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
        "barriers": barriers,
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
        "pairs": held_pairs,
        "distinct_blocks": distinct_blocks,
        "runs": runs,
        "checksum": checksum,
    });
    println!("{line}");
    Ok(())
}
