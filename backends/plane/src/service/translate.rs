//! Engine block hashes to kvtwin's chained sequence hashes, per worker: a `WorkerEvent`
//! becomes the `KvCacheEvent` the indexer applies.
//!
//! Owns: [`EngineHashes`] (one worker
//! rank's map from engine hash to kvtwin `SequenceHash` and the tiers holding it, with
//! per-tier counts and the [`block_digest`] of what it tracks) and [`TranslateError`].
//!
//! Why: an engine's block hash is an opaque id (vLLM seeds it per process, so two workers
//! hash the same tokens differently), while kvtwin's indexer keys blocks by the chain of
//! token hashes, identical on every worker and verified as events arrive. A `Stored`
//! event is therefore rebuilt from its token hashes: the parent's kvtwin hash is looked up
//! by its engine hash, each block's is chained from it, and the engine hash is remembered
//! so later events naming it (as a parent, or removed) can be translated.
//! Bounded: under a budget the router state sweeps out the entries of blocks its index
//! evicted ([`EngineHashes::sweep`]) once the map outgrows the index's view. Swept
//! blocks stay in the per-tier counts (the worker still reports holding them) as
//! *untracked*; a later removal of an engine hash the map does not know, while some are
//! untracked, is taken as one of them (counted in `evicted_removals`, and the count goes
//! down), and a store under such a hash is refused as `EvictedParent`, not
//! `UnknownParent`. That guess can take a truly unknown removal for an evicted one; it
//! never changes what the index answers.
//! The map also counts against the caps itself ([`EngineHashes::evict`], called by the
//! router state past `max_blocks_per_worker` entries for a rank, or `max_blocks` for
//! all): an engine republishing the same tokens under fresh hashes adds entries, not
//! indexed blocks, so no sweep frees them. Evicted entries become untracked the same
//! way; the index's blocks are left to its own budget, since a block whose entry went may
//! still be named by another engine hash of the same tokens (removing it would
//! under-report that one). Either way a later miss, never a wrong answer.
//!
//! Memory: an entry is the engine hash, the kvtwin hash and the tier bits packed in 17
//! bytes (a `HashMap<u64, (SequenceHash, u8)>` pads them to 24), in 64 hashbrown
//! shards, each rebuilt at its entries' size plus a quarter when it runs out of room or
//! removals' tombstones pass an eighth of its entries, as the index's position table is
//! (`BlockTree::reserve_locations`): hashbrown alone doubles a table whose load sits
//! just above half under churn, which is where an engine's cache sits. Sweeps and
//! rebuilds pass over one shard at a time, so none holds the router's lock for long.
//! Never: apply events to the indexer (the router state does), or guess a parent it does
//! not know (the event is refused, as Dynamo's indexer refuses it).

use crate::wire::{WorkerEvent, WorkerEventData};
use hashbrown::HashTable;
use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::SequenceHash;
use kvtwin::tokens::chain_sequence_hash;
use std::hash::BuildHasher;
use xxhash_rust::xxh3::xxh3_64;

/// One block's share of a [`block_digest`]: xxh3-64 of the engine hash's 8 little-endian
/// bytes followed by the tier set (bit `Tier::index` per tier holding it).
pub fn block_digest_term(engine: u64, tiers: u8) -> u64 {
    let mut bytes = [0u8; 9];
    bytes[..8].copy_from_slice(&engine.to_le_bytes());
    bytes[8] = tiers;
    xxh3_64(&bytes)
}

/// An order-independent digest of a set of blocks, each an engine hash and the tiers
/// holding it: the wrapping sum of their [`block_digest_term`]s (0 for no blocks). Two
/// sides that agree on the set agree on the digest whatever order they saw it in, and a
/// router keeps it up to date block by block, so comparing a worker's cache with a
/// router's view costs one number (`GET /v1/workers`' `block_digest`).
pub fn block_digest(blocks: impl IntoIterator<Item = (u64, u8)>) -> u64 {
    blocks.into_iter().fold(0u64, |digest, (engine, tiers)| {
        digest.wrapping_add(block_digest_term(engine, tiers))
    })
}

/// Moves `digest` from a block held in `old` tiers to `new` ones (an empty set is absent).
fn retier(digest: &mut u64, engine: u64, old: u8, new: u8) {
    if old != 0 {
        *digest = digest.wrapping_sub(block_digest_term(engine, old));
    }
    if new != 0 {
        *digest = digest.wrapping_add(block_digest_term(engine, new));
    }
}

/// An event that cannot be translated; nothing of it was applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TranslateError {
    /// A `Stored` whose parent this worker never stored (or has removed from every
    /// tier): its blocks cannot be placed.
    #[error("stored under engine block {0:#x}, which the worker does not hold")]
    UnknownParent(u64),
    /// A `Stored` under a block the worker may hold but the router's budget evicted
    /// (and swept): its blocks cannot be placed, which costs misses, not correctness.
    #[error("stored under engine block {0:#x}, which the router evicted")]
    EvictedParent(u64),
}

impl TranslateError {
    /// A stable label for counters and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            TranslateError::UnknownParent(_) => "unknown_parent",
            TranslateError::EvictedParent(_) => "evicted_parent",
        }
    }
}

/// One engine block: its hash, its kvtwin hash and the tiers holding it, packed (the
/// fields are read by value, never by reference).
#[derive(Clone, Copy, Debug)]
#[repr(C, packed)]
struct Entry {
    engine: u64,
    sequence: u64,
    /// Bit `Tier::index` set for each tier holding the block.
    tiers: u8,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 17);

fn hash_of(engine: u64) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(engine)
}

/// Shards of an engine-hash table (by bits of the key's hash that hashbrown's probing
/// does not use): a sweep or a rebuild passes over one shard at a time, so the router
/// state's lock is never held for a pass over a whole map (for a worker at a 4 M-block
/// cap, a full sweep and the rebuild after it stalled `/v1/route` for seconds).
const SHARDS: usize = 64;

fn shard_of(hash: u64) -> usize {
    (hash >> 40) as usize & (SHARDS - 1)
}

/// The engine-hash table: entries keyed by their engine hash, in [`SHARDS`] shards made
/// on the first insert (an idle rank costs a few words).
#[derive(Clone, Debug, Default)]
struct EngineTable {
    shards: Vec<Shard>,
    /// The shard [`EngineTable::retain_step`] sweeps next.
    cursor: usize,
}

/// One shard: its size kept near its entries' (see the module documentation).
#[derive(Clone, Debug, Default)]
struct Shard {
    table: HashTable<Entry>,
    /// `table.capacity()` right after the last rebuild: what it falls short of now is
    /// tombstones.
    full_capacity: usize,
}

fn same_key(engine: u64) -> impl Fn(&Entry) -> bool {
    move |e| {
        let key = e.engine;
        key == engine
    }
}

impl EngineTable {
    fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.table.len()).sum()
    }

    fn shard(&self, hash: u64) -> Option<&Shard> {
        self.shards.get(shard_of(hash))
    }

    fn get(&self, engine: u64) -> Option<Entry> {
        let hash = hash_of(engine);
        self.shard(hash)?
            .table
            .find(hash, same_key(engine))
            .copied()
    }

    /// The entry of `engine`, inserted as `fresh` if absent.
    fn get_or_insert(&mut self, engine: u64, fresh: Entry) -> &mut Entry {
        if self.shards.is_empty() {
            self.shards.resize_with(SHARDS, Shard::default);
        }
        let hash = hash_of(engine);
        let shard = &mut self.shards[shard_of(hash)];
        // Room first, whether or not `engine` is there: one probe instead of a lookup
        // and then the entry, and at worst a rebuild a little early (when the shard is
        // full and this store names a block it has), which the next inserts needed.
        shard.make_room();
        let entry = shard
            .table
            .entry(hash, same_key(engine), |e| hash_of(e.engine));
        entry.or_insert(fresh).into_mut()
    }

    /// Takes tier `bit` away from `engine`'s entry, and the entry away once it holds no
    /// tier: one probe. The entry as it was (`None`: absent).
    fn take_tier(&mut self, engine: u64, bit: u8) -> Option<Entry> {
        let hash = hash_of(engine);
        let shard = self.shards.get_mut(shard_of(hash))?;
        let mut found = shard.table.find_entry(hash, same_key(engine)).ok()?;
        let before = *found.get();
        let tiers = before.tiers & !bit;
        if tiers == 0 {
            found.remove();
        } else if tiers != before.tiers {
            found.get_mut().tiers = tiers;
        }
        Some(before)
    }

    /// Keeps the entries `keep` accepts, in every shard.
    fn retain(&mut self, mut keep: impl FnMut(&mut Entry) -> bool) {
        for shard in &mut self.shards {
            shard.table.retain(&mut keep);
        }
        // Erased in place: those are tombstones too, shed at the next insert.
    }

    /// Removes up to `n` entries, `forget` told of each, shard by shard from the next in
    /// turn (at most one pass over every shard). How many went.
    fn evict(&mut self, n: usize, mut forget: impl FnMut(&Entry)) -> usize {
        let mut gone = 0;
        for _ in 0..self.shards.len() {
            if gone >= n {
                break;
            }
            let at = self.cursor % SHARDS;
            self.cursor = (at + 1) % SHARDS;
            self.shards[at].table.retain(|entry| {
                if gone >= n {
                    return true;
                }
                forget(entry);
                gone += 1;
                false
            });
        }
        gone
    }

    /// Keeps the entries `keep` accepts in the next shard only (round robin).
    fn retain_step(&mut self, keep: impl FnMut(&mut Entry) -> bool) {
        if self.shards.is_empty() {
            return;
        }
        let at = self.cursor % SHARDS;
        self.cursor = (at + 1) % SHARDS;
        self.shards[at].table.retain(keep);
    }

    fn clear(&mut self) {
        *self = EngineTable::default();
    }

    fn heap_bytes(&self) -> usize {
        self.shards.capacity() * std::mem::size_of::<Shard>()
            + self
                .shards
                .iter()
                .map(|shard| shard.table.allocation_size())
                .sum::<usize>()
    }
}

impl Shard {
    /// Room for one more entry; rebuilds at the entries' size plus a quarter when there
    /// is none, or when tombstones pass an eighth of the entries (amortised O(1): a
    /// rebuild follows at least that many removals or a growth).
    fn make_room(&mut self) {
        let entries = self.table.len();
        let tombstones = self.full_capacity.saturating_sub(self.table.capacity());
        if entries < self.table.capacity() && tombstones <= entries / 8 {
            return;
        }
        let needed = entries + 1;
        let mut rebuilt = HashTable::with_capacity(needed + needed / 4);
        for entry in self.table.drain() {
            rebuilt.insert_unique(hash_of(entry.engine), entry, |e| hash_of(e.engine));
        }
        self.table = rebuilt;
        self.full_capacity = self.table.capacity();
    }
}

/// One worker rank's engine hashes; see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct EngineHashes {
    blocks: EngineTable,
    /// Blocks reported held per tier, swept ones included.
    counts: [u64; 4],
    /// Of `counts`, blocks swept out of `blocks` and not yet removed.
    untracked: [u64; 4],
    unknown_removals: u64,
    evicted_removals: u64,
    /// Entries evicted to keep the map within its cap ([`EngineHashes::evict`]).
    evicted_entries: u64,
    /// [`block_digest`] of `blocks`, kept as they change.
    digest: u64,
}

impl EngineHashes {
    /// No blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Blocks held in each tier, by `Tier::index`.
    pub fn counts(&self) -> [u64; 4] {
        self.counts
    }

    /// Removals of blocks the worker did not hold in that tier (skipped).
    pub fn unknown_removals(&self) -> u64 {
        self.unknown_removals
    }

    /// Removals taken as those of swept (evicted) blocks.
    pub fn evicted_removals(&self) -> u64 {
        self.evicted_removals
    }

    /// The [`block_digest`] of the blocks the map tracks (engine hash and tiers): with no
    /// sweep, exactly what the worker reported holding.
    pub fn digest(&self) -> u64 {
        self.digest
    }

    /// Engine hashes held in the map.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the map is empty.
    pub fn is_empty(&self) -> bool {
        self.blocks.len() == 0
    }

    /// Heap bytes of the map, as allocated.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.heap_bytes()
    }

    /// Entries evicted to keep the map within its cap, over the map's life.
    pub fn evicted_entries(&self) -> u64 {
        self.evicted_entries
    }

    /// Forgets `n` engine hashes (or all), whatever the index holds: what keeps the map
    /// within the router's caps when an engine names more blocks than it may (the same
    /// tokens republished under fresh hashes make one indexed block per many entries,
    /// which no sweep of evicted blocks frees). They stay counted as reported but
    /// untracked, exactly as swept ones: a later removal of one is an evicted removal, a
    /// store under one `EvictedParent`. Shard by shard from the next in turn, so the
    /// cost is a pass over the shards it needs. How many went.
    pub fn evict(&mut self, n: usize) -> usize {
        let untracked = &mut self.untracked;
        let digest = &mut self.digest;
        let gone = self.blocks.evict(n, |entry| {
            let tiers = entry.tiers;
            retier(digest, entry.engine, tiers, 0);
            for (index, count) in untracked.iter_mut().enumerate() {
                if tiers & (1 << index) != 0 {
                    *count += 1;
                }
            }
        });
        self.evicted_entries += gone as u64;
        gone
    }

    /// Forgets every block whose kvtwin hash `keep` refuses (the index evicted it); they
    /// stay counted as reported but untracked. How many went.
    pub fn sweep(&mut self, keep: impl FnMut(SequenceHash) -> bool) -> usize {
        self.sweep_where(keep, false)
    }

    /// [`EngineHashes::sweep`] over one shard of the map (1/64 of it, the next in turn):
    /// what a caller holding a lock does on each event while the map is over its bound,
    /// so no one event pays for a pass over the whole map. How many went.
    pub fn sweep_step(&mut self, keep: impl FnMut(SequenceHash) -> bool) -> usize {
        self.sweep_where(keep, true)
    }

    fn sweep_where(&mut self, mut keep: impl FnMut(SequenceHash) -> bool, step: bool) -> usize {
        let before = self.blocks.len();
        let untracked = &mut self.untracked;
        let digest = &mut self.digest;
        let mut forget = |entry: &mut Entry| {
            if keep(SequenceHash::new(entry.sequence)) {
                return true;
            }
            let tiers = entry.tiers;
            retier(digest, entry.engine, tiers, 0);
            for (index, count) in untracked.iter_mut().enumerate() {
                if tiers & (1 << index) != 0 {
                    *count += 1;
                }
            }
            false
        };
        if step {
            self.blocks.retain_step(&mut forget);
        } else {
            self.blocks.retain(&mut forget);
        }
        before - self.blocks.len()
    }

    /// The kvtwin hash of engine block `engine`, if held in some tier.
    pub fn sequence_hash(&self, engine: u64) -> Option<SequenceHash> {
        self.blocks
            .get(engine)
            .map(|entry| SequenceHash::new(entry.sequence))
    }

    /// Translates `event` into kvtwin's hashes and updates the map.
    pub fn translate(&mut self, event: &WorkerEvent) -> Result<KvCacheEvent, TranslateError> {
        let data = match &event.data {
            WorkerEventData::Stored {
                parent,
                blocks,
                tier,
            } => {
                let parent_hash = match parent {
                    None => None,
                    Some(engine) => match self.sequence_hash(*engine) {
                        Some(hash) => Some(hash),
                        None if self.untracked.iter().any(|n| *n > 0) => {
                            return Err(TranslateError::EvictedParent(*engine));
                        }
                        None => return Err(TranslateError::UnknownParent(*engine)),
                    },
                };
                let bit = 1u8 << tier.index();
                let mut previous = parent_hash;
                let mut stored = Vec::with_capacity(blocks.len());
                for &(engine, tokens_hash) in blocks {
                    let sequence = chain_sequence_hash(previous, tokens_hash);
                    let fresh = Entry {
                        engine,
                        sequence: sequence.get(),
                        tiers: 0,
                    };
                    let entry = self.blocks.get_or_insert(engine, fresh);
                    let (held, tiers) = (entry.sequence, entry.tiers);
                    if held != sequence.get() {
                        // The engine reused a hash for other tokens: the newest wins,
                        // and the tiers that held the old block no longer do.
                        for (index, count) in self.counts.iter_mut().enumerate() {
                            if tiers & (1 << index) != 0 {
                                *count -= 1;
                            }
                        }
                        retier(&mut self.digest, engine, tiers, 0);
                        *entry = fresh;
                    }
                    let tiers = entry.tiers;
                    if tiers & bit == 0 {
                        retier(&mut self.digest, engine, tiers, tiers | bit);
                        entry.tiers = tiers | bit;
                        self.counts[tier.index()] += 1;
                    }
                    stored.push(StoredBlock {
                        block_hash: sequence,
                        tokens_hash,
                    });
                    previous = Some(sequence);
                }
                KvCacheEventData::Stored {
                    parent_hash,
                    blocks: stored,
                    tier: *tier,
                }
            }
            WorkerEventData::Removed { hashes, tier } => {
                let bit = 1u8 << tier.index();
                let mut removed = Vec::with_capacity(hashes.len());
                for engine in hashes {
                    match self.blocks.take_tier(*engine, bit) {
                        Some(before) if before.tiers & bit != 0 => {
                            retier(&mut self.digest, *engine, before.tiers, before.tiers & !bit);
                            self.counts[tier.index()] -= 1;
                            removed.push(SequenceHash::new(before.sequence));
                        }
                        Some(_) => self.unknown_removals += 1,
                        None if self.untracked[tier.index()] > 0 => {
                            self.untracked[tier.index()] -= 1;
                            self.counts[tier.index()] -= 1;
                            self.evicted_removals += 1;
                        }
                        None => self.unknown_removals += 1,
                    }
                }
                KvCacheEventData::Removed {
                    block_hashes: removed,
                    tier: *tier,
                }
            }
            WorkerEventData::Cleared => {
                self.blocks.clear();
                self.digest = 0;
                self.counts = [0; 4];
                self.untracked = [0; 4];
                KvCacheEventData::Cleared
            }
        };
        Ok(KvCacheEvent {
            event_id: event.event_id,
            dp_rank: event.dp_rank,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::worker::stored_event;
    use kvtwin::ids::{LocalBlockHash, WorkerId};
    use kvtwin::tier::Tier;

    fn stored(parent: Option<u64>, blocks: &[(u64, u64)], tier: Tier) -> WorkerEvent {
        stored_event(1, 0, parent, blocks, tier)
    }

    fn removed(hashes: &[u64], tier: Tier) -> WorkerEvent {
        WorkerEvent {
            worker: WorkerId::new(1),
            dp_rank: 0,
            event_id: 1,
            data: WorkerEventData::Removed {
                hashes: hashes.to_vec(),
                tier,
            },
        }
    }

    #[test]
    fn two_workers_with_different_engine_hashes_for_the_same_tokens_agree_in_kvtwin() {
        let (mut a, mut b) = (EngineHashes::new(), EngineHashes::new());
        let ea = a
            .translate(&stored(None, &[(0xa1, 10), (0xa2, 20)], Tier::Device))
            .unwrap();
        let eb = b
            .translate(&stored(None, &[(0xb1, 10)], Tier::Device))
            .unwrap();
        let eb2 = b
            .translate(&stored(Some(0xb1), &[(0xb2, 20)], Tier::Device))
            .unwrap();
        let hashes = |event: &KvCacheEvent| match &event.data {
            KvCacheEventData::Stored { blocks, .. } => {
                blocks.iter().map(|b| b.block_hash).collect::<Vec<_>>()
            }
            _ => Vec::new(),
        };
        let expected_first = chain_sequence_hash(None, LocalBlockHash::new(10));
        let expected_second = chain_sequence_hash(Some(expected_first), LocalBlockHash::new(20));
        assert_eq!(hashes(&ea), [expected_first, expected_second]);
        assert_eq!(hashes(&eb), [expected_first]);
        assert_eq!(hashes(&eb2), [expected_second]);
        assert!(matches!(
            eb2.data,
            KvCacheEventData::Stored { parent_hash: Some(p), .. } if p == expected_first
        ));
    }

    #[test]
    fn a_sweep_in_steps_takes_one_shard_at_a_time_and_ends_where_a_full_sweep_does() {
        let mut hashes = EngineHashes::new();
        let blocks: Vec<(u64, u64)> = (1..=4096).map(|i| (i * 7919, i)).collect();
        for chunk in blocks.chunks(16) {
            hashes
                .translate(&stored(None, &chunk[..1], Tier::Device))
                .unwrap();
            for pair in chunk.windows(2) {
                hashes
                    .translate(&stored(Some(pair[0].0), &pair[1..], Tier::Device))
                    .unwrap();
            }
        }
        let kept: std::collections::BTreeSet<SequenceHash> = blocks
            .iter()
            .filter(|(engine, _)| engine % 3 == 0)
            .map(|(engine, _)| hashes.sequence_hash(*engine).unwrap())
            .collect();
        let mut full = hashes.clone();
        let gone = full.sweep(|sequence| kept.contains(&sequence));
        let mut steps = Vec::new();
        for _ in 0..SHARDS {
            steps.push(hashes.sweep_step(|sequence| kept.contains(&sequence)));
        }
        // Each step is a part: no step takes everything, together they take it all.
        assert!(steps.iter().all(|step| *step < gone), "{steps:?}");
        assert_eq!(steps.iter().sum::<usize>(), gone);
        assert_eq!(hashes.len(), full.len());
        assert_eq!(hashes.digest(), full.digest());
        assert_eq!(hashes.counts(), full.counts());
        // Another round finds nothing more.
        assert_eq!(
            (0..SHARDS)
                .map(|_| hashes.sweep_step(|_| false))
                .sum::<usize>(),
            full.len()
        );
    }

    #[test]
    fn swept_blocks_stay_reported_until_removed_and_explain_removals_and_parents() {
        let mut hashes = EngineHashes::new();
        hashes
            .translate(&stored(None, &[(1, 1), (2, 2), (3, 3)], Tier::Device))
            .unwrap();
        let first = hashes.sequence_hash(1).unwrap();
        // The index kept only the first block.
        assert_eq!(hashes.sweep(|sequence| sequence == first), 2);
        assert_eq!((hashes.len(), hashes.counts()), (1, [3, 0, 0, 0]));
        assert_eq!(
            hashes.translate(&stored(Some(3), &[(4, 4)], Tier::Device)),
            Err(TranslateError::EvictedParent(3))
        );
        hashes
            .translate(&removed(&[3, 2, 9], Tier::Device))
            .unwrap();
        // Two removals explained by the sweep; the third has nothing left to explain it.
        assert_eq!(hashes.evicted_removals(), 2);
        assert_eq!(hashes.unknown_removals(), 1);
        assert_eq!(hashes.counts(), [1, 0, 0, 0]);
        assert_eq!(
            hashes.translate(&stored(Some(3), &[(4, 4)], Tier::Device)),
            Err(TranslateError::UnknownParent(3))
        );
    }

    #[test]
    fn the_digest_kept_block_by_block_is_the_digest_of_the_blocks_held() {
        let mut hashes = EngineHashes::new();
        assert_eq!(hashes.digest(), 0);
        hashes
            .translate(&stored(None, &[(1, 1), (2, 2), (3, 3)], Tier::Device))
            .unwrap();
        hashes
            .translate(&stored(Some(1), &[(2, 2)], Tier::Host))
            .unwrap();
        hashes.translate(&removed(&[3, 8], Tier::Device)).unwrap();
        let device = 1 << Tier::Device.index();
        let host = 1 << Tier::Host.index();
        let expected = block_digest([(1, device), (2, device | host)]);
        assert_eq!(hashes.digest(), expected);
        // Order does not matter, and every difference shows.
        assert_eq!(expected, block_digest([(2, device | host), (1, device)]));
        assert_ne!(expected, block_digest([(1, device), (2, device)]));
        assert_ne!(expected, block_digest([(1, device)]));
        let first = hashes.sequence_hash(1).unwrap();
        hashes.sweep(|sequence| sequence == first);
        assert_eq!(hashes.digest(), block_digest([(1, device)]));
        let cleared = WorkerEvent {
            data: WorkerEventData::Cleared,
            ..removed(&[], Tier::Host)
        };
        hashes.translate(&cleared).unwrap();
        assert_eq!(hashes.digest(), 0);
    }

    #[test]
    fn an_unknown_parent_refuses_the_event_and_changes_nothing() {
        let mut hashes = EngineHashes::new();
        assert_eq!(
            hashes.translate(&stored(Some(0x99), &[(0x1, 1)], Tier::Host)),
            Err(TranslateError::UnknownParent(0x99))
        );
        assert_eq!(hashes.counts(), [0; 4]);
        assert_eq!(hashes.sequence_hash(0x1), None);
    }

    #[test]
    fn tiers_are_counted_and_a_block_is_forgotten_when_no_tier_holds_it() {
        let mut hashes = EngineHashes::new();
        hashes
            .translate(&stored(None, &[(1, 1), (2, 2)], Tier::Device))
            .unwrap();
        hashes
            .translate(&stored(None, &[(1, 1)], Tier::Host))
            .unwrap();
        assert_eq!(hashes.counts(), [2, 1, 0, 0]);
        let event = hashes
            .translate(&removed(&[1, 2, 7], Tier::Device))
            .unwrap();
        assert!(
            matches!(&event.data, KvCacheEventData::Removed { block_hashes, .. } if block_hashes.len() == 2)
        );
        assert_eq!(hashes.counts(), [0, 1, 0, 0]);
        assert_eq!(hashes.unknown_removals(), 1);
        // Block 1 is still on host; block 2 is gone altogether.
        assert!(hashes.sequence_hash(1).is_some());
        assert_eq!(hashes.sequence_hash(2), None);
        // A removal from a tier that does not hold it changes nothing but the count.
        let digest = hashes.digest();
        hashes.translate(&removed(&[1], Tier::Disk)).unwrap();
        assert_eq!(hashes.unknown_removals(), 2);
        assert_eq!(hashes.counts(), [0, 1, 0, 0]);
        assert_eq!(hashes.digest(), digest);
        assert!(hashes.sequence_hash(1).is_some());
        let cleared = WorkerEvent {
            data: WorkerEventData::Cleared,
            ..removed(&[], Tier::Host)
        };
        hashes.translate(&cleared).unwrap();
        assert_eq!(hashes.counts(), [0; 4]);
        assert_eq!(hashes.sequence_hash(1), None);
    }
}
