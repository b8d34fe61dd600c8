//! The shared (G4) tier of a simulated cluster: one store that every worker writes the
//! blocks it computes to and reads prefixes from over the network, as Mooncake Store,
//! LMCache's remote backends, SGLang HiCache's L3 or `kvtwin store` serve many engines.
//!
//! Owns: [`SharedTierSpec`] (the scenario's `cluster.shared_tier`), [`SharedStore`] (the
//! blocks it holds and which worker wrote each, its eviction policy, its links and the
//! reads and writes on them, its counters) and [`SharedTierReport`].
//! Never: know requests, pools or the router (the cluster maps reads to requests and
//! tells the router what the store holds), read a clock, or iterate a hash map.
//!
//! The model:
//! - a worker writes every block it registers on its device (computed, or generated and
//!   cached) that the store neither holds nor is receiving, after the fact and in the
//!   background, as a write-through connector does; the blocks are findable once the
//!   write lands;
//! - a request reads the blocks that continue its prefix past what its worker holds
//!   itself, if the store holds them, in one transfer; they are prefilled by nobody and
//!   registered on the worker when the read lands;
//! - reads and writes cross the links of a [`FluidLinks`], full duplex as networks are:
//!   the store's out (reads) and in (writes), each of its bandwidth, and each worker's
//!   NIC to it, in and out, at the hardware profile's NIC bandwidth (apart from the NIC
//!   links of the worker's own remote tier); the transfers on a link share it max-min
//!   fairly, so eight workers reading at once each get an eighth of the store; each
//!   transfer lands `latency_ns` after its bytes;
//! - the store is bounded in blocks under one of the advisor's policies (LRU, LFU,
//!   S3-FIFO, ARC); a block being read is not evicted under the reader (the read counts
//!   from its start, as a lease would hold it);
//! - capacity 0, the default, is no store: nothing is written, nothing is read, the
//!   router is told of nothing, and the report leaves the section out, so a scenario
//!   without one reports byte for byte what it did before the shared tier existed.

use crate::advisor::policy::{Policy, TierCache};
use crate::cluster::Percentiles;
use crate::links::{FluidLinks, LinkSpec, LinkUsage};
use kvtwin::ids::{SequenceHash, Timestamp};
use kvtwin::stats::Latencies;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The shared tier of a cluster (`cluster.shared_tier` in a scenario).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SharedTierSpec {
    /// Blocks the store holds at most (each `worker.bytes_per_block`); 0, the default:
    /// no shared tier.
    pub capacity_blocks: u64,
    /// What it evicts to take a new block.
    pub policy: Policy,
    /// The store's bandwidth per direction, bytes per second (reads share one
    /// direction, writes the other).
    pub bytes_per_s: u64,
    /// What each read or write adds once its bytes are through, nanoseconds.
    pub latency_ns: u64,
    /// Its price, US dollars per GB-month (10⁹ bytes, 730 hours), for `kvtwin plan`.
    pub usd_per_gb_month: f64,
    /// Fraction of a block's prefill the router credits for a block found only in the
    /// store (Dynamo's `shared_cache_multiplier`, 0.5 when its shared cache is on).
    pub router_credit: f64,
}

impl Default for SharedTierSpec {
    /// No store; when one is given a capacity: a 200 Gb/s store, 20 µs a transfer,
    /// priced as host DRAM is by the planner (0.0036 $/GB-hour), credited as Dynamo
    /// does.
    fn default() -> Self {
        Self {
            capacity_blocks: 0,
            policy: Policy::Lru,
            bytes_per_s: 25_000_000_000,
            latency_ns: 20_000,
            usd_per_gb_month: 0.0036 * HOURS_PER_MONTH,
            router_credit: 0.5,
        }
    }
}

/// Hours in the month prices are quoted by (365 × 24 / 12).
pub const HOURS_PER_MONTH: f64 = 730.0;

impl SharedTierSpec {
    /// Whether the cluster has a shared tier.
    pub fn is_on(&self) -> bool {
        self.capacity_blocks > 0
    }

    /// Why it cannot be simulated, naming the field; `None` when it can.
    pub fn problem(&self) -> Option<String> {
        if !self.is_on() {
            return None;
        }
        if self.bytes_per_s == 0 {
            return Some("bytes_per_s: a shared tier with a capacity needs a bandwidth".into());
        }
        if !(self.usd_per_gb_month.is_finite() && self.usd_per_gb_month >= 0.0) {
            return Some(format!(
                "usd_per_gb_month: {} is not a price (a finite number ≥ 0)",
                self.usd_per_gb_month
            ));
        }
        if !(0.0..=1.0).contains(&self.router_credit) {
            return Some(format!(
                "router_credit: {} is not between 0 and 1",
                self.router_credit
            ));
        }
        None
    }

    /// US dollars an hour for the store at `bytes_per_block`.
    pub fn usd_per_hour(&self, bytes_per_block: u64) -> f64 {
        let gb = self.capacity_blocks as f64 * bytes_per_block as f64 / 1e9;
        gb * self.usd_per_gb_month / HOURS_PER_MONTH
    }
}

/// A transfer of the store landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed<T> {
    /// A read started with this tag ([`SharedStore::read`]).
    Read(T),
    /// A write: its blocks are findable from now on (or evicted already).
    Write,
}

/// A transfer on the store's links.
#[derive(Debug)]
enum Transfer<T> {
    Read {
        tag: T,
        started: Timestamp,
    },
    Write {
        writer: usize,
        blocks: Vec<SequenceHash>,
    },
}

/// The store during a run (see the module docs). `T` tags a read for whoever started it.
pub struct SharedStore<T> {
    spec: SharedTierSpec,
    bytes_per_block: u64,
    nic_bytes_per_s: u64,
    policy: Box<dyn TierCache>,
    /// Blocks held, with the worker that wrote each (looked up, never iterated).
    writers: FxHashMap<SequenceHash, usize>,
    /// Blocks being written (looked up, never iterated).
    writing: FxHashSet<SequenceHash>,
    /// Link 0 is the store's out (reads), 1 its in (writes); worker `w`'s NIC out is
    /// `2 + 2w`, its NIC in `3 + 2w`, added as workers are first seen.
    links: FluidLinks,
    transfers: FxHashMap<u64, Transfer<T>>,
    next_id: u64,
    counts: SharedTierReport,
    /// How long each read took, start to landing.
    read_times: Latencies,
}

impl<T> SharedStore<T> {
    /// An empty store of `spec`, blocks of `bytes_per_block`, each worker's NIC
    /// `nic_bytes_per_s` per direction.
    pub fn new(spec: &SharedTierSpec, bytes_per_block: u64, nic_bytes_per_s: u64) -> Self {
        let capacity = usize::try_from(spec.capacity_blocks).unwrap_or(usize::MAX);
        Self {
            policy: spec.policy.cache(capacity),
            spec: spec.clone(),
            bytes_per_block,
            nic_bytes_per_s,
            writers: FxHashMap::default(),
            writing: FxHashSet::default(),
            links: FluidLinks::new(vec![LinkSpec::bandwidth(spec.bytes_per_s); 2]),
            transfers: FxHashMap::default(),
            next_id: 0,
            read_times: Latencies::new(),
            counts: SharedTierReport {
                capacity_blocks: spec.capacity_blocks,
                policy: spec.policy.name().to_string(),
                ..SharedTierReport::default()
            },
        }
    }

    /// Whether there is a store at all (capacity above 0).
    pub fn is_on(&self) -> bool {
        self.spec.is_on()
    }

    /// Its specification.
    pub fn spec(&self) -> &SharedTierSpec {
        &self.spec
    }

    /// How many of `prefix`'s leading blocks it holds (changes nothing).
    pub fn prefix(&self, prefix: &[SequenceHash]) -> usize {
        if !self.is_on() {
            return 0;
        }
        prefix
            .iter()
            .take_while(|hash| self.writers.contains_key(hash))
            .count()
    }

    /// Worker `reader` reads `blocks` (held: [`Self::prefix`] said so) at `now`; `tag`
    /// comes back with [`Landed::Read`] when they are in.
    pub fn read(&mut self, reader: usize, blocks: &[SequenceHash], tag: T, now: Timestamp) {
        self.counts.reads += 1;
        for hash in blocks {
            self.policy.hit(*hash);
            self.counts.read_blocks += 1;
            if self
                .writers
                .get(hash)
                .is_some_and(|writer| *writer != reader)
            {
                self.counts.cross_worker_blocks += 1;
            }
        }
        let path = [STORE_OUT, self.nic(reader, Direction::In)];
        self.start(
            &path,
            blocks.len(),
            Transfer::Read { tag, started: now },
            now,
        );
        self.counts.read_bytes += self.bytes_per_block * blocks.len() as u64;
    }

    /// Worker `writer` registered `blocks` at `now`: those the store neither holds nor
    /// is receiving go to it in one write.
    pub fn write(&mut self, writer: usize, blocks: &[SequenceHash], now: Timestamp) {
        if !self.is_on() {
            return;
        }
        let new: Vec<SequenceHash> = blocks
            .iter()
            .filter(|hash| !self.writers.contains_key(hash) && !self.writing.contains(hash))
            .copied()
            .collect();
        self.counts.write_skipped_blocks += (blocks.len() - new.len()) as u64;
        if new.is_empty() {
            return;
        }
        self.writing.extend(new.iter().copied());
        self.counts.writes += 1;
        self.counts.written_blocks += new.len() as u64;
        self.counts.written_bytes += self.bytes_per_block * new.len() as u64;
        let path = [self.nic(writer, Direction::Out), STORE_IN];
        let count = new.len();
        self.start(
            &path,
            count,
            Transfer::Write {
                writer,
                blocks: new,
            },
            now,
        );
    }

    /// When something next happens on its links.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.links.next_deadline()
    }

    /// The next transfer landed by `now`, in landing order: a write's blocks are held
    /// from then on (evicting what the policy says), a read's tag is returned.
    pub fn pop_landed(&mut self, now: Timestamp) -> Option<Landed<T>> {
        self.links.advance(now);
        loop {
            let id = self.links.pop_landed(now)?;
            match self.transfers.remove(&id) {
                Some(Transfer::Read { tag, started }) => {
                    self.read_times
                        .push_duration(now.saturating_duration_since(started));
                    return Some(Landed::Read(tag));
                }
                Some(Transfer::Write { writer, blocks }) => {
                    for hash in blocks {
                        self.writing.remove(&hash);
                        self.take(writer, hash);
                    }
                    return Some(Landed::Write);
                }
                None => continue,
            }
        }
    }

    /// Its counters and link usage, for the report; `None` without a store.
    pub fn report(&self) -> Option<SharedTierReport> {
        if !self.is_on() {
            return None;
        }
        let usage = self.links.usage();
        Some(SharedTierReport {
            read_time: Percentiles::of(self.read_times.clone()),
            held_blocks: self.writers.len() as u64,
            read_link: usage[STORE_OUT],
            write_link: usage[STORE_IN],
            ..self.counts.clone()
        })
    }

    /// The policy takes `hash` written by `writer` (or refuses it), and what it evicts
    /// goes.
    fn take(&mut self, writer: usize, hash: SequenceHash) {
        if self.policy.contains(hash) {
            return;
        }
        for evicted in self.policy.insert(hash) {
            self.writers.remove(&evicted);
            self.counts.evicted_blocks += 1;
        }
        if self.policy.contains(hash) {
            self.writers.insert(hash, writer);
            self.counts.peak_blocks = self.counts.peak_blocks.max(self.writers.len() as u64);
        } else {
            self.counts.refused_blocks += 1;
        }
    }

    fn start(&mut self, path: &[usize], blocks: usize, transfer: Transfer<T>, now: Timestamp) {
        let id = self.next_id;
        self.next_id += 1;
        let bytes = self.bytes_per_block.saturating_mul(blocks as u64);
        let latency = Duration::from_nanos(self.spec.latency_ns);
        self.links.start(id, path, bytes, latency, now);
        self.transfers.insert(id, transfer);
    }

    /// Worker `w`'s NIC link in `direction`, its links added (in worker order) when the
    /// worker is first seen.
    fn nic(&mut self, w: usize, direction: Direction) -> usize {
        while self.links.specs().len() < 4 + 2 * w {
            self.links
                .add_link(LinkSpec::bandwidth(self.nic_bytes_per_s));
        }
        match direction {
            Direction::Out => 2 + 2 * w,
            Direction::In => 3 + 2 * w,
        }
    }
}

/// The store's links: reads leave by one, writes come in by the other.
const STORE_OUT: usize = 0;
const STORE_IN: usize = 1;

#[derive(Clone, Copy)]
enum Direction {
    Out,
    In,
}

/// The shared tier's part of a run's report (absent without one).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct SharedTierReport {
    /// Blocks it holds at most.
    pub capacity_blocks: u64,
    /// Its eviction policy.
    pub policy: String,
    /// Reads (one per request that found blocks there).
    pub reads: u64,
    /// Blocks read.
    pub read_blocks: u64,
    /// Of those, blocks another worker had written: what no worker's own tiers could
    /// have given it.
    pub cross_worker_blocks: u64,
    /// Bytes read.
    pub read_bytes: u64,
    /// Writes (one per registration with a block new to the store).
    pub writes: u64,
    /// Blocks written.
    pub written_blocks: u64,
    /// Bytes written.
    pub written_bytes: u64,
    /// Blocks registered that the store held or was receiving already (not sent).
    pub write_skipped_blocks: u64,
    /// Blocks written that the policy did not take (S3-FIFO's probation may not).
    pub refused_blocks: u64,
    /// Blocks evicted to make room.
    pub evicted_blocks: u64,
    /// Blocks held at most at once.
    pub peak_blocks: u64,
    /// Blocks held at the end.
    pub held_blocks: u64,
    /// Blocks read from it over the run's prompt blocks.
    pub hit_ratio: f64,
    /// Blocks read from it that another worker had written, over the run's prompt
    /// blocks: the hits no worker's own tiers could have given.
    pub cross_worker_hit_ratio: f64,
    /// How long a read took, start to landing (sharing the links with the others).
    pub read_time: Percentiles,
    /// Traffic out of the store (reads).
    pub read_link: LinkUsage,
    /// Traffic into the store (writes).
    pub write_link: LinkUsage,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(range: std::ops::Range<u64>) -> Vec<SequenceHash> {
        range.map(SequenceHash::new).collect()
    }

    fn spec(capacity_blocks: u64) -> SharedTierSpec {
        SharedTierSpec {
            capacity_blocks,
            bytes_per_s: 1_000_000_000,
            latency_ns: 1_000,
            ..SharedTierSpec::default()
        }
    }

    fn drain(store: &mut SharedStore<u32>) -> Vec<(Timestamp, Landed<u32>)> {
        let mut landed = Vec::new();
        while let Some(at) = store.next_deadline() {
            while let Some(l) = store.pop_landed(at) {
                landed.push((at, l));
            }
        }
        landed
    }

    #[test]
    fn a_block_is_findable_once_its_write_lands_and_counts_as_cross_worker_for_another() {
        let mut store = SharedStore::<u32>::new(&spec(10), 1_000_000, 1_000_000_000);
        let blocks = hashes(0..4);
        store.write(0, &blocks, Timestamp::ZERO);
        assert_eq!(store.prefix(&blocks), 0, "not before the write lands");
        // Written twice while the first is in flight: sent once.
        store.write(1, &blocks, Timestamp::ZERO);
        let landed = drain(&mut store);
        assert_eq!(landed.len(), 1);
        // 4 MB at 1 GB/s on both links (NIC and store equal), then 1 µs.
        assert_eq!(landed[0].0, Timestamp::from_nanos(4_000_000 + 1_000));
        assert_eq!(store.prefix(&blocks), 4);
        assert_eq!(store.prefix(&hashes(0..2)), 2);
        let mut query = hashes(0..2);
        query.push(SequenceHash::new(99));
        query.push(SequenceHash::new(3));
        assert_eq!(store.prefix(&query), 2, "a prefix stops at the first miss");
        store.read(1, &blocks[..3], 7, landed[0].0);
        store.read(0, &blocks[..1], 8, landed[0].0);
        let reads = drain(&mut store);
        assert_eq!(
            reads.iter().map(|(_, l)| *l).collect::<Vec<_>>(),
            [Landed::Read(8), Landed::Read(7)],
            "the shorter read lands first"
        );
        let report = store.report().unwrap();
        assert_eq!(report.read_blocks, 4);
        assert_eq!(
            report.cross_worker_blocks, 3,
            "worker 1 read worker 0's blocks"
        );
        assert_eq!(report.written_blocks, 4);
        assert_eq!(report.write_skipped_blocks, 4);
        assert_eq!(report.read_link.bytes, 4_000_000);
        assert_eq!(report.write_link.bytes, 4_000_000);
    }

    #[test]
    fn a_full_store_evicts_by_its_policy_and_capacity_zero_is_no_store() {
        let mut store = SharedStore::<u32>::new(&spec(3), 1_000, 1_000_000_000);
        store.write(0, &hashes(0..3), Timestamp::ZERO);
        drain(&mut store);
        // Block 0 used, so LRU evicts block 1 for block 3.
        let at = Timestamp::from_nanos(1_000_000);
        store.read(0, &hashes(0..1), 1, at);
        store.write(0, &hashes(3..4), at);
        drain(&mut store);
        assert_eq!(store.prefix(&hashes(0..1)), 1);
        assert_eq!(store.prefix(&hashes(1..2)), 0);
        assert_eq!(store.prefix(&hashes(2..4)), 2);
        let report = store.report().unwrap();
        assert_eq!((report.evicted_blocks, report.peak_blocks), (1, 3));

        let mut none = SharedStore::<u32>::new(&spec(0), 1_000, 1_000_000_000);
        none.write(0, &hashes(0..3), Timestamp::ZERO);
        assert!(
            none.next_deadline().is_none(),
            "nothing is sent to no store"
        );
        assert_eq!(none.prefix(&hashes(0..3)), 0);
        assert!(none.report().is_none());
    }

    #[test]
    fn the_spec_names_the_field_it_cannot_run_and_prices_by_the_gb_month() {
        assert_eq!(SharedTierSpec::default().problem(), None, "off is fine");
        let broke = SharedTierSpec {
            bytes_per_s: 0,
            ..spec(5)
        };
        assert!(broke.problem().unwrap().starts_with("bytes_per_s"));
        let credit = SharedTierSpec {
            router_credit: 1.5,
            ..spec(5)
        };
        assert!(credit.problem().unwrap().starts_with("router_credit"));
        let priced = SharedTierSpec {
            capacity_blocks: 1_000,
            usd_per_gb_month: 7.3,
            ..SharedTierSpec::default()
        };
        // 1,000 blocks of 1 GB at 7.3 $/GB-month: 10 $ an hour.
        assert!((priced.usd_per_hour(1_000_000_000) - 10.0).abs() < 1e-9);
    }
}
