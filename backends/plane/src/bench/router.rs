//! `kvtwin bench router`: replays a `kv-router-workload` file through kvtwin's indexer,
//! timing every event and match the way peer-bench times Dynamo's indexers.
//!
//! Owns: [`RouterBenchConfig`], [`run_router_bench`] and its [`RouterBenchReport`] (whose
//! JSON line has peer-bench's field names), [`RouterBenchError`], the timing loop, the
//! floor replay's stand-in for an index and, for `threads > 1`, the thread pool that
//! applies events (a wall clock and threads are allowed here, at the edge). Parsing, the index and the checksum live in
//! `kvtwin::router`.
//!
//! With N threads the index is sharded by worker: worker `w`'s events go, in order, to
//! shard `w mod N`, whose thread applies them. Before a match that follows events, the
//! replay thread waits until every shard it sent events to has applied them (the barrier
//! WORKLOAD.md asks for, counted in `apply_s_total`), then asks every shard on its own
//! thread and merges the answers. Workers never span shards, so the merge is a sort.
//!
//! With `floor`, the same replay drives no index: each event and each query has its
//! first hash read (as any index must read it) and nothing else is done, every match
//! answering nothing. What that replay measures is the replay's own cost, which every
//! figure of this method carries whatever index it drives, Dynamo's included: two clock
//! reads an event and a match, and the parsed event's or query's bytes, cold since the
//! file was parsed. Subtract it before asking what an index costs.
//! Never: print (the command line does) or go through the router service (this times
//! the index alone).

use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::router::indexer::{KvIndexer, MatchScratch, WorkerOverlap};
use kvtwin::router::workload::{parse, Checksum, WorkloadOp};
use kvtwin::stats::nearest_rank;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to replay, and on how many threads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterBenchConfig {
    /// The `kv-router-workload` file.
    pub workload: PathBuf,
    /// 1: the index on the replay thread; more: sharded by worker over that many threads.
    pub threads: usize,
    /// Drive no index: measure the replay's own cost (see the module documentation).
    /// One thread only.
    pub floor: bool,
}

/// The bench could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RouterBenchError {
    /// `threads` was 0.
    #[error("--threads must be at least 1")]
    NoThreads,
    /// `floor` with more than one thread: the floor is the single-threaded replay's.
    #[error("--floor replays on one thread: drop --threads {threads}")]
    FloorWithThreads {
        /// The threads asked for.
        threads: usize,
    },
    /// The workload file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The workload file is not a `kv-router-workload`.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Where and why.
        source: kvtwin::router::workload::WorkloadError,
    },
    /// A shard thread stopped (it panicked) before the replay ended.
    #[error("a shard thread stopped")]
    ShardStopped,
}

/// What a replay measured.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterBenchReport {
    /// The configuration it ran.
    pub config: RouterBenchConfig,
    /// Events applied (or refused).
    pub events: u64,
    /// Blocks in `Stored` events.
    pub blocks_stored: u64,
    /// Blocks in `Removed` events.
    pub blocks_removed: u64,
    /// Match queries answered.
    pub matches: u64,
    /// Barriers that had to wait for shards (sharded only).
    pub barriers: u64,
    /// Time spent applying events, barriers included.
    pub apply_total: Duration,
    /// Time spent answering matches.
    pub match_total: Duration,
    /// Nearest-rank median of one match.
    pub match_p50: Duration,
    /// Nearest-rank 99th percentile of one match.
    pub match_p99: Duration,
    /// The whole replay.
    pub wall: Duration,
    /// Reading and parsing the file.
    pub load: Duration,
    /// Events the indexer refused.
    pub warnings: u64,
    /// Heap bytes of the index at the end, over the (block, worker) pairs it holds.
    pub bytes_per_entry: f64,
    /// (block, worker) pairs held at the end.
    pub pairs: usize,
    /// Distinct blocks held at the end.
    pub distinct_blocks: usize,
    /// Runs (compressed chains) held at the end.
    pub runs: usize,
    /// The checksum of every match answer, as peer-bench computes it.
    pub checksum: Checksum,
}

impl RouterBenchReport {
    /// The report as peer-bench's JSON line.
    pub fn to_json(&self) -> Value {
        let apply_s_total = self.apply_total.as_secs_f64();
        let match_s_total = self.match_total.as_secs_f64();
        let per_s = |n: u64, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        json!({
            "impl": if self.config.floor { "floor" } else { "kvtwin" },
            "threads": self.config.threads,
            "workload": self.config.workload.display().to_string(),
            "events": self.events,
            "blocks_stored": self.blocks_stored,
            "blocks_removed": self.blocks_removed,
            "matches": self.matches,
            "barriers": self.barriers,
            "apply_s_total": apply_s_total,
            "events_per_s": per_s(self.events, apply_s_total),
            "blocks_per_s": per_s(self.blocks_stored + self.blocks_removed, apply_s_total),
            "match_s_total": match_s_total,
            "match_per_s": per_s(self.matches, match_s_total),
            "match_p50_us": micros(self.match_p50),
            "match_p99_us": micros(self.match_p99),
            "wall_s": self.wall.as_secs_f64(),
            "load_s": self.load.as_secs_f64(),
            "warnings": self.warnings,
            "bytes_per_entry": self.bytes_per_entry,
            "pairs": self.pairs,
            "distinct_blocks": self.distinct_blocks,
            "runs": self.runs,
            "checksum": self.checksum,
        })
    }
}

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
    /// No index: the replay's own cost (the module documentation's `floor`).
    Floor,
}

/// What the floor replay does with a list of hashes: reads the first, as an index must.
fn touch_first<T: Copy>(hashes: &[T]) {
    std::hint::black_box(hashes.first().copied());
}

fn read(index: &RwLock<KvIndexer>) -> RwLockReadGuard<'_, KvIndexer> {
    // A shard thread that panicked poisons its lock; the index is still readable.
    index
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Indexer {
    fn new(threads: usize, floor: bool) -> Self {
        if floor {
            return Indexer::Floor;
        }
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
    ) -> Result<(bool, Option<KvCacheEvent>), RouterBenchError> {
        match self {
            Indexer::Inline(index) => Ok((index.apply(worker, &event).is_err(), Some(event))),
            Indexer::Floor => {
                match &event.data {
                    KvCacheEventData::Stored { blocks, .. } => touch_first(blocks),
                    KvCacheEventData::Removed { block_hashes, .. } => touch_first(block_hashes),
                    KvCacheEventData::Cleared => {}
                }
                Ok((false, Some(event)))
            }
            Indexer::Sharded(shards) => {
                let count = shards.len() as u64;
                let shard = &mut shards[(worker.get() % count) as usize];
                shard.dirty = true;
                let tasks = shard.tasks.as_ref().ok_or(RouterBenchError::ShardStopped)?;
                tasks
                    .send(Task::Event(worker, event))
                    .map_err(|_| RouterBenchError::ShardStopped)?;
                Ok((false, None))
            }
        }
    }

    /// Waits until every event sent so far is applied; returns whether it had to.
    fn barrier(&mut self) -> Result<bool, RouterBenchError> {
        let Indexer::Sharded(shards) = self else {
            return Ok(false);
        };
        let (done, acks) = mpsc::sync_channel(shards.len());
        let mut waiting = 0;
        for shard in shards.iter_mut().filter(|s| s.dirty) {
            let tasks = shard.tasks.as_ref().ok_or(RouterBenchError::ShardStopped)?;
            tasks
                .send(Task::Flush(done.clone()))
                .map_err(|_| RouterBenchError::ShardStopped)?;
            shard.dirty = false;
            waiting += 1;
        }
        for _ in 0..waiting {
            acks.recv().map_err(|_| RouterBenchError::ShardStopped)?;
        }
        Ok(waiting > 0)
    }

    /// Every worker's overlap, sorted by worker: the index's own answer (in `scratch`)
    /// on one thread, as a router reads it; the shards' answers merged into `merged`.
    fn find_matches<'a>(
        &self,
        query: &[LocalBlockHash],
        scratch: &'a mut MatchScratch,
        merged: &'a mut Vec<WorkerOverlap>,
    ) -> &'a [WorkerOverlap] {
        match self {
            Indexer::Inline(index) => index.find_matches_with(query, false, scratch),
            Indexer::Floor => {
                touch_first(query);
                &[]
            }
            Indexer::Sharded(shards) => {
                merged.clear();
                for shard in shards {
                    merged.extend_from_slice(
                        read(&shard.index).find_matches_with(query, false, scratch),
                    );
                }
                merged.sort_unstable_by_key(|w| w.worker);
                merged
            }
        }
    }

    /// Sums a statistic over the shards.
    fn sum(&self, of: impl Fn(&KvIndexer) -> usize) -> usize {
        match self {
            Indexer::Inline(index) => of(index),
            Indexer::Sharded(shards) => shards.iter().map(|s| of(&read(&s.index))).sum(),
            Indexer::Floor => 0,
        }
    }

    /// Stops the shard threads; returns the events they rejected.
    fn finish(&mut self) -> Result<u64, RouterBenchError> {
        let Indexer::Sharded(shards) = self else {
            return Ok(0);
        };
        let mut errors = 0;
        for shard in shards.iter_mut() {
            shard.tasks = None;
        }
        for shard in shards.iter_mut() {
            if let Some(thread) = shard.thread.take() {
                errors += thread.join().map_err(|_| RouterBenchError::ShardStopped)?;
            }
        }
        Ok(errors)
    }
}

/// Replays `config.workload`; see the module documentation.
pub fn run_router_bench(config: &RouterBenchConfig) -> Result<RouterBenchReport, RouterBenchError> {
    if config.threads == 0 {
        return Err(RouterBenchError::NoThreads);
    }
    if config.floor && config.threads > 1 {
        return Err(RouterBenchError::FloorWithThreads {
            threads: config.threads,
        });
    }
    let path = &config.workload;
    let load_start = Instant::now();
    let text = std::fs::read_to_string(path).map_err(|source| RouterBenchError::Read {
        path: path.clone(),
        source,
    })?;
    let (_, ops) = parse(&text).map_err(|source| RouterBenchError::Parse {
        path: path.clone(),
        source,
    })?;
    drop(text);
    let load = load_start.elapsed();

    let mut index = Indexer::new(config.threads, config.floor);
    let mut scratch = MatchScratch::default();
    let mut merged = Vec::new();
    let mut checksum = Checksum::default();
    let (mut events, mut blocks_stored, mut blocks_removed, mut warnings) =
        (0u64, 0u64, 0u64, 0u64);
    let mut barriers = 0u64;
    let mut unflushed = false;
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
                unflushed = true;
                drop(spent);
                warnings += u64::from(rejected);
            }
            WorkloadOp::Match(query) => {
                // As peer-bench replays (WORKLOAD.md, "Barrier before a match"): a barrier,
                // timed into apply, only when an event came since the last one. Timing
                // one before every match put two clock reads a match into apply on a
                // phased file (100,000 on the synthetic one) that Dynamo's side never
                // pays.
                if unflushed {
                    let start = Instant::now();
                    barriers += u64::from(index.barrier()?);
                    apply_total += start.elapsed();
                    unflushed = false;
                }
                let start = Instant::now();
                let answer = index.find_matches(&query, &mut scratch, &mut merged);
                match_times.push(start.elapsed());
                pairs.clear();
                pairs.extend(answer.iter().map(|w| (w.worker.worker.get(), w.blocks)));
                checksum.add(&mut pairs);
            }
        }
    }
    if unflushed {
        let start = Instant::now();
        barriers += u64::from(index.barrier()?);
        apply_total += start.elapsed();
    }
    let wall = wall.elapsed();
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
    let match_total = match_times.iter().sum();
    match_times.sort_unstable();
    let percentile = |q: f64| nearest_rank(&match_times, q).unwrap_or_default();
    Ok(RouterBenchReport {
        config: config.clone(),
        events,
        blocks_stored,
        blocks_removed,
        matches: match_times.len() as u64,
        barriers,
        apply_total,
        match_total,
        match_p50: percentile(0.50),
        match_p99: percentile(0.99),
        wall,
        load,
        warnings,
        bytes_per_entry,
        pairs: held_pairs,
        distinct_blocks,
        runs,
        checksum,
    })
}
