//! Live traffic captured for the twin: every request the front door served, one
//! Mooncake-format JSON line each, so `kvtwin run SCENARIO --trace FILE` replays the
//! traffic the cluster saw.
//!
//! Owns: [`TraceRow`] (the line: Mooncake's `timestamp` (ms), `input_length`,
//! `output_length`, `hash_ids`, then kvtwin's fields), [`hash_ids`] (a prompt's ids at
//! the trace's block size), [`TraceRecorder`] (a bounded queue to one writer thread that
//! appends and flushes each line) and [`TraceCounts`].
//!
//! Hash ids are the prompt's chained sequence hashes at the trace's block size, the last
//! partial block included (Mooncake rows cover every token), cut to 53 bits so every
//! JSON reader keeps them exact; equal ids mean equal prefixes, as in Mooncake's traces,
//! without a table of ids that would grow with the traffic. Two different prefixes share
//! an id with probability about n² / 2⁵⁴ for n distinct blocks (5 × 10⁻⁵ at a million).
//! Bounded: the queue holds [`QUEUE_ROWS`] rows and the file grows to `max_bytes` at
//! most; what does not fit is dropped and counted by reason, never blocking a request.
//! Append-only: an existing file is appended to, its rows kept, and new rows' timestamps
//! continue after its last one, so the whole file replays as one trace.
//! Never: rewrite or truncate the file, or make a request wait for the disk.

use kvtwin::tokens::{chain_sequence_hash, compute_local_hash, HashSeed, Token};
use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

/// Rows queued for the writer at most.
pub const QUEUE_ROWS: usize = 4096;

/// The ids kept of a sequence hash: JavaScript's safe integers.
const HASH_ID_MASK: u64 = (1 << 53) - 1;

/// One served request, as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceRow {
    /// Arrival, milliseconds since the trace began (Mooncake's `timestamp`).
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Output tokens (from the engine's usage).
    pub output_length: u64,
    /// One id per block of the prompt at the trace's block size (see the module
    /// documentation).
    pub hash_ids: Vec<u64>,
    /// The worker that served it.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// Prompt tokens the engine found cached.
    pub cached_tokens: u64,
    /// Prompt tokens the router predicted cached (overlap × its block size).
    pub predicted_cached_tokens: u64,
    /// Time to the first output token, ms (streamed requests only).
    pub ttft_ms: Option<f64>,
    /// Mean time between output chunks, ms (streamed requests with two or more).
    pub itl_ms: Option<f64>,
    /// Arrival to the last byte, ms.
    pub e2e_ms: f64,
    /// The model asked for.
    pub model: Option<String>,
}

/// The hash ids of a prompt of `tokens`, hashed with `seed`, at `block_size` tokens a
/// block (the last block may be partial).
pub fn hash_ids(tokens: &[Token], block_size: usize, seed: HashSeed) -> Vec<u64> {
    let mut parent = None;
    tokens
        .chunks(block_size.max(1))
        .map(|block| {
            let sequence = chain_sequence_hash(parent, compute_local_hash(block, seed));
            parent = Some(sequence);
            sequence.get() & HASH_ID_MASK
        })
        .collect()
}

/// Ids for a prompt the router could not tokenize: `blocks` ids no other row has (the
/// top of the 53 bits set, a counter below), so a replay counts its tokens without
/// inventing sharing.
pub fn unique_hash_ids(row_seq: u64, blocks: u64) -> Vec<u64> {
    (0..blocks)
        .map(|k| (1 << 52) | ((row_seq << 20 | (k & 0xF_FFFF)) & ((1 << 52) - 1)))
        .collect()
}

/// What the recorder did.
#[derive(Debug, Default)]
pub struct TraceCounts {
    /// Rows written.
    pub written: AtomicU64,
    /// Rows dropped because the queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Rows dropped because the file reached its bound.
    pub dropped_file_full: AtomicU64,
    /// Rows dropped because writing failed.
    pub dropped_io_error: AtomicU64,
}

impl TraceCounts {
    /// Dropped rows by reason, in a fixed order.
    pub fn dropped(&self) -> [(&'static str, u64); 3] {
        [
            (
                "queue_full",
                self.dropped_queue_full.load(Ordering::Relaxed),
            ),
            ("file_full", self.dropped_file_full.load(Ordering::Relaxed)),
            ("io_error", self.dropped_io_error.load(Ordering::Relaxed)),
        ]
    }
}

/// Why a trace file could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("trace file {path}: {source}")]
pub struct TraceFileError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    #[source]
    pub source: std::io::Error,
}

/// The last row's timestamp in an existing trace (0 when empty or unreadable at its end).
fn last_timestamp(file: &mut std::fs::File) -> std::io::Result<u64> {
    let len = file.seek(SeekFrom::End(0))?;
    let tail = len.min(64 << 10);
    file.seek(SeekFrom::Start(len - tail))?;
    let mut bytes = Vec::with_capacity(tail as usize);
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    Ok(text
        .lines()
        .rev()
        .filter(|line| !line.trim().is_empty())
        .find_map(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()?
                .get("timestamp")?
                .as_u64()
        })
        .unwrap_or(0))
}

/// Appends served requests to a trace file from a thread of its own.
#[derive(Debug, Clone)]
pub struct TraceRecorder {
    queue: SyncSender<TraceRow>,
    counts: Arc<TraceCounts>,
    /// The first row's arrival: timestamps count from it.
    started: Arc<std::sync::OnceLock<Instant>>,
    /// Added to every row's timestamp: the file's last one when it was opened.
    offset_ms: u64,
    block_size: usize,
    path: PathBuf,
}

impl TraceRecorder {
    /// Opens (or creates) `path` for appending rows whose hash ids are at `block_size`
    /// tokens a block, up to `max_bytes` of file; the writer thread ends when the last
    /// clone of the recorder is dropped.
    pub fn open(path: &Path, block_size: usize, max_bytes: u64) -> Result<Self, TraceFileError> {
        let error = |source| TraceFileError {
            path: path.to_owned(),
            source,
        };
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(path)
            .map_err(error)?;
        let offset_ms = last_timestamp(&mut file).map_err(error)?;
        let mut size = file.metadata().map_err(error)?.len();
        let counts = Arc::new(TraceCounts::default());
        let (queue, rows) = sync_channel::<TraceRow>(QUEUE_ROWS);
        let writer_counts = counts.clone();
        let writer_path = path.to_owned();
        std::thread::Builder::new()
            .name("kvtwin-trace".into())
            .spawn(move || {
                let mut warned = false;
                for row in rows {
                    let Ok(mut line) = serde_json::to_vec(&row) else {
                        continue;
                    };
                    line.push(b'\n');
                    if size + line.len() as u64 > max_bytes {
                        writer_counts.dropped_file_full.fetch_add(1, Ordering::Relaxed);
                        if !warned {
                            tracing::warn!(
                                "trace file {} reached its bound ({max_bytes} bytes): later rows are dropped (counted)",
                                writer_path.display()
                            );
                            warned = true;
                        }
                        continue;
                    }
                    match file.write_all(&line).and_then(|()| file.flush()) {
                        Ok(()) => {
                            size += line.len() as u64;
                            writer_counts.written.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(error) => {
                            writer_counts.dropped_io_error.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!("trace file {}: {error}", writer_path.display());
                        }
                    }
                }
            })
            .map_err(error)?;
        Ok(Self {
            queue,
            counts,
            started: Arc::new(std::sync::OnceLock::new()),
            offset_ms,
            block_size: block_size.max(1),
            path: path.to_owned(),
        })
    }

    /// The trace's block size.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What it wrote and dropped.
    pub fn counts(&self) -> Arc<TraceCounts> {
        self.counts.clone()
    }

    /// The timestamp of a request that arrived at `arrival`: milliseconds since the
    /// first row's arrival (after the file's last timestamp when it had rows).
    pub fn timestamp_ms(&self, arrival: Instant) -> u64 {
        let started = *self.started.get_or_init(|| arrival);
        self.offset_ms + arrival.saturating_duration_since(started).as_millis() as u64
    }

    /// Queues `row`; dropped (and counted) if the queue is full.
    pub fn record(&self, row: TraceRow) {
        match self.queue.try_send(row) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.counts
                    .dropped_queue_full
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(TrySendError::Disconnected(_)) => {
                self.counts.dropped_io_error.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::tokens::{compute_local_hashes, compute_sequence_hashes};

    fn row(timestamp: u64, hash_ids: Vec<u64>) -> TraceRow {
        TraceRow {
            timestamp,
            input_length: 40,
            output_length: 8,
            hash_ids,
            worker_id: 1,
            dp_rank: 0,
            cached_tokens: 32,
            predicted_cached_tokens: 32,
            ttft_ms: Some(12.5),
            itl_ms: None,
            e2e_ms: 80.0,
            model: Some("tiny".into()),
        }
    }

    #[test]
    fn hash_ids_chain_full_blocks_as_the_router_does_and_cover_the_tail() {
        let tokens: Vec<u32> = (0..40).collect();
        let seed = HashSeed::default();
        let ids = hash_ids(&tokens, 16, seed);
        assert_eq!(ids.len(), 3, "two full blocks and a partial one");
        let full = compute_sequence_hashes(&compute_local_hashes(&tokens, 16, seed));
        assert_eq!(ids[0], full[0].get() & HASH_ID_MASK);
        assert_eq!(ids[1], full[1].get() & HASH_ID_MASK);
        // A shared prefix shares ids; the salt separates everything.
        let other: Vec<u32> = (0..32).chain(100..108).collect();
        let other_ids = hash_ids(&other, 16, seed);
        assert_eq!(other_ids[..2], ids[..2]);
        assert_ne!(other_ids[2], ids[2]);
        let salted = hash_ids(&tokens, 16, seed.with_salt(b"tenant"));
        assert!(salted.iter().zip(&ids).all(|(a, b)| a != b));
        assert!(ids.iter().all(|id| *id <= HASH_ID_MASK));
        let unique = unique_hash_ids(7, 3);
        assert_eq!(unique.len(), 3);
        assert!(unique
            .iter()
            .all(|id| *id <= HASH_ID_MASK && *id >= 1 << 52));
    }

    #[test]
    fn rows_are_appended_and_a_reopened_file_continues_its_timestamps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.jsonl");
        let recorder = TraceRecorder::open(&path, 16, 1 << 20).unwrap();
        recorder.record(row(0, vec![1, 2, 3]));
        recorder.record(row(1500, vec![1, 2, 4]));
        let counts = recorder.counts();
        drop(recorder);
        wait_for(|| counts.written.load(Ordering::Relaxed) == 2);
        let reopened = TraceRecorder::open(&path, 16, 1 << 20).unwrap();
        assert!(reopened.timestamp_ms(Instant::now()) >= 1500);
        let text = std::fs::read_to_string(&path).unwrap();
        let rows: Vec<TraceRow> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        assert_eq!(rows, [row(0, vec![1, 2, 3]), row(1500, vec![1, 2, 4])]);
    }

    #[test]
    fn past_its_bound_the_file_stops_growing_and_drops_are_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trace.jsonl");
        let one = serde_json::to_vec(&row(0, vec![1])).unwrap().len() as u64 + 1;
        let recorder = TraceRecorder::open(&path, 16, 2 * one).unwrap();
        for k in 0..5 {
            recorder.record(row(k, vec![1]));
        }
        let counts = recorder.counts();
        drop(recorder);
        wait_for(|| {
            counts.written.load(Ordering::Relaxed)
                + counts.dropped_file_full.load(Ordering::Relaxed)
                == 5
        });
        assert_eq!(counts.written.load(Ordering::Relaxed), 2);
        assert_eq!(counts.dropped()[1], ("file_full", 3));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * one);
    }

    fn wait_for(done: impl Fn() -> bool) {
        for _ in 0..500 {
            if done() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the writer did not finish");
    }
}
