//! The `kv-router-workload` checksum (peer-bench's WORKLOAD.md), so kvtwin's router can be
//! checked against Dynamo's indexers on the same file.
//!
//! Owns: [`Checksum`]: per match op, the (worker, score) pairs with score ≥ 1 sorted by
//! worker, folded into `hits`, `sum_max`, `sum_all` and an FNV-1a 64 digest of
//! `u32 LE pair count ‖ (u64 LE worker ‖ u32 LE score)*`.
//! Never: read files (the command line does).

use serde::Serialize;

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0100_0000_01b3;

/// The checksum of all match results of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Checksum {
    /// Match ops whose best score is at least 1.
    pub hits: u64,
    /// Sum of the best score of every match op.
    pub sum_max: u64,
    /// Sum of all scores of every match op.
    pub sum_all: u64,
    /// FNV-1a 64 of every result, printed as 16 lowercase hex digits.
    #[serde(serialize_with = "hex16")]
    pub digest: u64,
}

fn hex16<S: serde::Serializer>(digest: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format!("{digest:016x}"))
}

impl Default for Checksum {
    fn default() -> Self {
        Self {
            hits: 0,
            sum_max: 0,
            sum_all: 0,
            digest: FNV_OFFSET_BASIS,
        }
    }
}

impl Checksum {
    /// Folds one match result given as (worker, score) pairs in any order; zero scores
    /// are dropped.
    pub fn add(&mut self, pairs: &mut Vec<(u64, u32)>) {
        pairs.retain(|(_, score)| *score > 0);
        pairs.sort_unstable();
        let best = pairs.iter().map(|(_, score)| *score).max().unwrap_or(0);
        self.hits += u64::from(best > 0);
        self.sum_max += u64::from(best);
        self.sum_all += pairs
            .iter()
            .map(|(_, score)| u64::from(*score))
            .sum::<u64>();
        self.fold(&(pairs.len() as u32).to_le_bytes());
        for (worker, score) in pairs.iter() {
            self.fold(&worker.to_le_bytes());
            self.fold(&score.to_le_bytes());
        }
    }

    fn fold(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.digest = (self.digest ^ u64::from(*byte)).wrapping_mul(FNV_PRIME);
        }
    }

    /// The digest as peer-bench prints it.
    pub fn digest_hex(&self) -> String {
        format!("{:016x}", self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worked_example_of_workload_md() {
        let mut checksum = Checksum::default();
        assert_eq!(checksum.digest_hex(), "cbf29ce484222325");
        checksum.add(&mut vec![(7, 0), (3, 2), (1, 5)]);
        checksum.add(&mut vec![]);
        assert_eq!(
            (checksum.hits, checksum.sum_max, checksum.sum_all),
            (1, 5, 7)
        );
        assert_eq!(checksum.digest_hex(), "6ae78ab6ca3e5ac2");
    }
}

/// The first line of a workload file.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// Always `kv-router-workload`.
    pub format: String,
    /// Always 1.
    pub version: u32,
    /// Tokens per block (information only).
    pub block_size: u32,
    /// Worker ids lie in `0..workers`.
    pub workers: u64,
    /// The generator's seed.
    pub seed: u64,
    /// The generator and its parameters.
    pub source: String,
}

#[derive(serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
enum Line {
    Stored {
        worker: u64,
        parent: Option<u64>,
        blocks: Vec<(u64, u64)>,
    },
    Removed {
        worker: u64,
        blocks: Vec<u64>,
    },
    Cleared {
        worker: u64,
    },
    Match {
        blocks: Vec<u64>,
    },
}

/// One op of a workload, in kvtwin's types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkloadOp {
    /// An event of `worker` (numbered per worker from 1, dp rank 0, device tier).
    Event {
        /// The worker.
        worker: crate::ids::WorkerId,
        /// The event.
        event: crate::events::KvCacheEvent,
    },
    /// A routing query: the tokens hash of each full block of a prompt.
    Match(Vec<crate::ids::LocalBlockHash>),
}

/// A workload file could not be parsed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// The file has no header line.
    #[error("empty workload")]
    Empty,
    /// A line is not valid JSON of the expected shape.
    #[error("line {line}: {source}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// Why.
        source: serde_json::Error,
    },
    /// The header names another format or version.
    #[error("unsupported workload format {format:?} version {version}")]
    Unsupported {
        /// The format named.
        format: String,
        /// The version named.
        version: u32,
    },
}

/// Parses a whole workload (JSON lines) into its header and ops.
pub fn parse(text: &str) -> Result<(Header, Vec<WorkloadOp>), WorkloadError> {
    use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
    use crate::ids::{LocalBlockHash, SequenceHash, WorkerId};
    let mut lines = text.lines().enumerate();
    let (_, first) = lines.next().ok_or(WorkloadError::Empty)?;
    let header: Header =
        serde_json::from_str(first).map_err(|source| WorkloadError::Parse { line: 1, source })?;
    if header.format != "kv-router-workload" || header.version != 1 {
        return Err(WorkloadError::Unsupported {
            format: header.format,
            version: header.version,
        });
    }
    let mut next_event_id: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let mut ops = Vec::new();
    for (index, text) in lines {
        let line: Line = serde_json::from_str(text).map_err(|source| WorkloadError::Parse {
            line: index + 1,
            source,
        })?;
        let (worker, data) = match line {
            Line::Match { blocks } => {
                ops.push(WorkloadOp::Match(
                    blocks.into_iter().map(LocalBlockHash::new).collect(),
                ));
                continue;
            }
            Line::Stored {
                worker,
                parent,
                blocks,
            } => {
                let blocks = blocks
                    .into_iter()
                    .map(|(tokens, hash)| StoredBlock {
                        block_hash: SequenceHash::new(hash),
                        tokens_hash: LocalBlockHash::new(tokens),
                    })
                    .collect();
                (
                    worker,
                    KvCacheEventData::Stored {
                        parent_hash: parent.map(SequenceHash::new),
                        blocks,
                        tier: crate::tier::Tier::Device,
                    },
                )
            }
            Line::Removed { worker, blocks } => {
                let block_hashes = blocks.into_iter().map(SequenceHash::new).collect();
                (
                    worker,
                    KvCacheEventData::Removed {
                        block_hashes,
                        tier: crate::tier::Tier::Device,
                    },
                )
            }
            Line::Cleared { worker } => (worker, KvCacheEventData::Cleared),
        };
        let event_id = next_event_id.entry(worker).or_insert(0);
        *event_id += 1;
        let event = KvCacheEvent {
            event_id: *event_id,
            dp_rank: 0,
            data,
        };
        ops.push(WorkloadOp::Event {
            worker: WorkerId::new(worker),
            event,
        });
    }
    Ok((header, ops))
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn parses_every_op_and_rejects_unknown_keys_and_formats() {
        let text = concat!(
            r#"{"format":"kv-router-workload","version":1,"block_size":16,"workers":2,"seed":0,"source":"t"}"#,
            "\n",
            r#"{"op":"stored","worker":1,"parent":null,"blocks":[[5,5],[6,18446744073709551615]]}"#,
            "\n",
            r#"{"op":"removed","worker":1,"blocks":[5]}"#,
            "\n",
            r#"{"op":"cleared","worker":0}"#,
            "\n",
            r#"{"op":"match","blocks":[5,6]}"#,
            "\n"
        );
        let (header, ops) = parse(text).unwrap();
        assert_eq!(header.workers, 2);
        assert_eq!(ops.len(), 4);
        let WorkloadOp::Event { event, .. } = &ops[1] else {
            panic!("{:?}", ops[1])
        };
        assert_eq!(event.event_id, 2, "numbered per worker from 1");
        assert!(matches!(&ops[3], WorkloadOp::Match(q) if q.len() == 2));
        let bad = text.replace(
            r#""op":"cleared","worker":0"#,
            r#""op":"cleared","worker":0,"x":1"#,
        );
        assert!(matches!(
            parse(&bad),
            Err(WorkloadError::Parse { line: 4, .. })
        ));
        assert!(matches!(
            parse(&text.replace("\"version\":1", "\"version\":2")),
            Err(WorkloadError::Unsupported { .. })
        ));
        assert!(matches!(parse(""), Err(WorkloadError::Empty)));
    }
}

/// Replays `ops` in order through `index` (events applied, rejected ones counted by the
/// index) and returns the checksum of every match (exact scores, `early_exit = false`).
pub fn replay(ops: &[WorkloadOp], index: &mut super::indexer::KvIndexer) -> Checksum {
    let mut scratch = super::indexer::MatchScratch::default();
    let mut checksum = Checksum::default();
    let mut pairs = Vec::new();
    for op in ops {
        match op {
            WorkloadOp::Event { worker, event } => {
                // Rejections are counted in the index's stats; replay goes on, as every
                // indexer replaying the file does.
                let _ = index.apply(*worker, event);
            }
            WorkloadOp::Match(query) => {
                pairs.clear();
                let scores = index.find_matches_with(query, false, &mut scratch);
                pairs.extend(scores.iter().map(|w| (w.worker.worker.get(), w.blocks)));
                checksum.add(&mut pairs);
            }
        }
    }
    checksum
}

/// Options of kvtwin's own synthetic workload generator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticOptions {
    /// The generator's seed: the same options give the same ops.
    pub seed: u64,
    /// Worker ids `0..workers`.
    pub workers: u64,
    /// `stored` ops to emit.
    pub stores: usize,
    /// `match` ops to emit.
    pub queries: usize,
    /// Blocks a worker holds before it evicts.
    pub capacity_blocks: usize,
    /// Prefix families (system prompts) that prompts share.
    pub families: usize,
    /// Matches spread among the events instead of after them.
    pub interleaved: bool,
    /// Clear one random worker after every K-th store (0: never).
    pub clear_every: usize,
}

/// One worker's cache in the generator: LRU by tick, leaves first, prefix-closed.
#[derive(Default)]
struct ModelCache {
    // (tick, deepest first, hash) in eviction order, and hash -> (tick, depth).
    order: std::collections::BTreeSet<(u64, std::cmp::Reverse<u32>, u64)>,
    blocks: std::collections::BTreeMap<u64, (u64, u32)>,
}

/// Generates a workload that follows peer-bench's rules (block hashes chain, stores
/// name cached parents, caches stay prefix-closed, removals list held blocks leaf first),
/// for tests that compare indexers on the same ops.
pub fn generate_synthetic(options: &SyntheticOptions) -> Vec<WorkloadOp> {
    use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
    use crate::ids::{LocalBlockHash, SequenceHash, WorkerId};
    use crate::tier::Tier;
    use rand::{Rng, SeedableRng};

    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(options.seed);
    let workers = options.workers.max(1);
    let families: Vec<Vec<u64>> = (0..options.families.max(1))
        .map(|_| (0..rng.gen_range(1..6)).map(|_| rng.gen()).collect())
        .collect();
    let mut caches: Vec<ModelCache> = (0..workers).map(|_| ModelCache::default()).collect();
    let mut event_ids = vec![0u64; workers as usize];
    let mut ops = Vec::new();
    let mut tick = 0u64;
    let prompt = |rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u64> {
        let mut tokens = families[rng.gen_range(0..families.len())].clone();
        tokens.extend((0..rng.gen_range(0..8)).map(|_| rng.gen_range(0..64u64)));
        tokens
    };
    let mut push_event = |ops: &mut Vec<WorkloadOp>, worker: u64, data: KvCacheEventData| {
        event_ids[worker as usize] += 1;
        let event = KvCacheEvent {
            event_id: event_ids[worker as usize],
            dp_rank: 0,
            data,
        };
        ops.push(WorkloadOp::Event {
            worker: WorkerId::new(worker),
            event,
        });
    };
    let (mut stores, mut queries) = (0, 0);
    while stores < options.stores || queries < options.queries {
        let query_now = stores >= options.stores
            || (options.interleaved && queries < options.queries && rng.gen_bool(0.5));
        let tokens = prompt(&mut rng);
        let hashes: Vec<u64> = {
            let mut previous = None;
            tokens
                .iter()
                .map(|t| {
                    let hash =
                        crate::tokens::chain_sequence_hash(previous, LocalBlockHash::new(*t));
                    previous = Some(hash);
                    hash.get()
                })
                .collect()
        };
        if query_now {
            ops.push(WorkloadOp::Match(
                tokens.iter().map(|t| LocalBlockHash::new(*t)).collect(),
            ));
            queries += 1;
            continue;
        }
        let worker = rng.gen_range(0..workers);
        let cache = &mut caches[worker as usize];
        tick += 1;
        let cached = hashes
            .iter()
            .take_while(|h| cache.blocks.contains_key(h))
            .count();
        for (depth, hash) in hashes.iter().enumerate() {
            if let Some((old_tick, old_depth)) = cache.blocks.insert(*hash, (tick, depth as u32)) {
                cache
                    .order
                    .remove(&(old_tick, std::cmp::Reverse(old_depth), *hash));
            }
            cache
                .order
                .insert((tick, std::cmp::Reverse(depth as u32), *hash));
        }
        let parent = cached.checked_sub(1).map(|i| SequenceHash::new(hashes[i]));
        let blocks = tokens[cached..]
            .iter()
            .zip(&hashes[cached..])
            .map(|(t, h)| StoredBlock {
                block_hash: SequenceHash::new(*h),
                tokens_hash: LocalBlockHash::new(*t),
            })
            .collect::<Vec<_>>();
        if !blocks.is_empty() {
            push_event(
                &mut ops,
                worker,
                KvCacheEventData::Stored {
                    parent_hash: parent,
                    blocks,
                    tier: Tier::Device,
                },
            );
        }
        let cache = &mut caches[worker as usize];
        let mut evicted = Vec::new();
        while cache.blocks.len() > options.capacity_blocks {
            let Some(victim) = cache.order.pop_first() else {
                break;
            };
            cache.blocks.remove(&victim.2);
            evicted.push(SequenceHash::new(victim.2));
        }
        if !evicted.is_empty() {
            push_event(
                &mut ops,
                worker,
                KvCacheEventData::Removed {
                    block_hashes: evicted,
                    tier: Tier::Device,
                },
            );
        }
        stores += 1;
        if options.clear_every > 0 && stores % options.clear_every == 0 {
            let victim = rng.gen_range(0..workers);
            caches[victim as usize] = ModelCache::default();
            push_event(&mut ops, victim, KvCacheEventData::Cleared);
        }
    }
    ops
}

#[cfg(test)]
mod fuzz_tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,400}") {
            let _ = parse(&text);
        }

        #[test]
        fn parsing_arbitrary_ops_after_a_valid_header_never_panics(
            lines in prop::collection::vec(r#"\{"op":"(stored|removed|cleared|match)"[ -~]{0,60}"#, 0..8),
        ) {
            let mut text = String::from(r#"{"format":"kv-router-workload","version":1,"block_size":16,"workers":2,"seed":0,"source":"t"}"#);
            for line in lines {
                text.push('\n');
                text.push_str(&line);
            }
            let _ = parse(&text);
        }
    }
}
