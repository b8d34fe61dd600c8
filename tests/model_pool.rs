//! Model test: the pools and the manager against a deliberately naive reference.
//!
//! Random request streams (requests, finishes, phase tags, cache resets) run on
//! `Manager<TestHardware>` (instant transfers; LRU or priority eviction; with or without a
//! write-through host tier) and on a reference that keeps, per tier, a `BTreeMap` of
//! refcounts, a `Vec` of cached hashes oldest first, phase tags, and a free count. After every step: the counts, the registries with
//! their refcounts and the eviction order agree; free + cached + active = capacity per
//! tier (and the pools' own `check_invariants` finds no block in two places); and
//! replaying every emitted event rebuilds each tier's registry.
//! Failing cases are shrunk by proptest and print the op list.

mod common;

use kvtwin::block::BlockIdentity;
use kvtwin::events::RegistryReplica;
use kvtwin::ids::{RequestId, SequenceHash, Timestamp, WorkerId};
use kvtwin::manager::{
    Manager, ManagerConfig, ManagerOutput, OffloadPolicy, OnboardPolicy, TierConfig,
};
use kvtwin::phase::Phase;
use kvtwin::pool::{BlockChain, EvictionPolicyKind, PoolCounts};
use kvtwin::testing::{TestHardware, TransferTiming};
use kvtwin::tier::Tier;
use proptest::prelude::*;
use std::collections::BTreeMap;

const CHAINS: u64 = 4;
const CHAIN_LEN: usize = 8;

fn chain(c: u64) -> Vec<BlockIdentity> {
    common::shared_prefix_chain(c, CHAIN_LEN)
}

#[derive(Clone, Debug)]
enum Op {
    Request {
        chain: u64,
        len: usize,
    },
    Finish {
        index: usize,
    },
    SetPhase {
        chain: u64,
        len: usize,
        phase: Phase,
    },
    ResetCache,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..CHAINS, 1..=CHAIN_LEN).prop_map(|(chain, len)| Op::Request { chain, len }),
        4 => any::<usize>().prop_map(|index| Op::Finish { index }),
        2 => (0..CHAINS, 1..=CHAIN_LEN, prop::sample::select(Phase::COLDEST_FIRST.to_vec()))
            .prop_map(|(chain, len, phase)| Op::SetPhase { chain, len, phase }),
        1 => Just(Op::ResetCache),
    ]
}

#[derive(Clone, Debug)]
struct Setup {
    device_blocks: usize,
    host_blocks: Option<usize>,
    device_offload: OffloadPolicy,
    eviction: EvictionPolicyKind,
}

fn setup() -> impl Strategy<Value = Setup> {
    let eviction =
        prop::sample::select(vec![EvictionPolicyKind::Lru, EvictionPolicyKind::Priority]);
    (
        2usize..10,
        prop::option::of(2usize..14),
        any::<bool>(),
        eviction,
    )
        .prop_map(|(device, host, write_through, eviction)| Setup {
            device_blocks: device,
            host_blocks: host,
            device_offload: if write_through && host.is_some() {
                OffloadPolicy::WriteThrough
            } else {
                OffloadPolicy::None
            },
            eviction,
        })
}

/// The naive reference of one tier: cached hashes in one list, oldest first; the
/// priority policy evicts the oldest of the coldest phase present.
#[derive(Debug, Default)]
struct RefTier {
    capacity: usize,
    free: usize,
    mutable: usize,
    refcounts: BTreeMap<SequenceHash, u32>,
    phases: BTreeMap<SequenceHash, Phase>,
    cached_oldest_first: Vec<SequenceHash>,
    by_phase: bool,
}

impl RefTier {
    fn new(capacity: usize, eviction: EvictionPolicyKind) -> Self {
        Self {
            capacity,
            free: capacity,
            by_phase: eviction == EvictionPolicyKind::Priority,
            ..Self::default()
        }
    }

    fn rank(&self, hash: &SequenceHash) -> usize {
        if self.by_phase {
            self.phases
                .get(hash)
                .copied()
                .unwrap_or_default()
                .eviction_rank()
        } else {
            0
        }
    }

    /// Cached hashes in the order they will be evicted.
    fn eviction_order(&self) -> Vec<SequenceHash> {
        let mut order = self.cached_oldest_first.clone();
        order.sort_by_key(|h| self.rank(h));
        order
    }

    fn set_phase(&mut self, hash: SequenceHash, phase: Phase) {
        if !self.contains(hash) || self.phases.get(&hash).copied().unwrap_or_default() == phase {
            return;
        }
        self.phases.insert(hash, phase);
        // A re-tagged cached block becomes the newest of its (new) class.
        if self.by_phase && self.cached_oldest_first.contains(&hash) {
            self.cached_oldest_first.retain(|h| *h != hash);
            self.cached_oldest_first.push(hash);
        }
    }

    fn contains(&self, hash: SequenceHash) -> bool {
        self.refcounts.contains_key(&hash)
    }

    fn allocate(&mut self, count: usize) -> bool {
        if self.free + self.cached_oldest_first.len() < count {
            return false;
        }
        for _ in 0..count {
            if self.free > 0 {
                self.free -= 1;
            } else {
                let victim = self.eviction_order()[0];
                self.cached_oldest_first.retain(|h| *h != victim);
                self.refcounts.remove(&victim);
                self.phases.remove(&victim);
            }
            self.mutable += 1;
        }
        true
    }

    fn return_mutable(&mut self) {
        self.mutable -= 1;
        self.free += 1;
    }

    fn acquire(&mut self, hash: SequenceHash) {
        let count = self
            .refcounts
            .get_mut(&hash)
            .expect("acquire of an unregistered hash");
        if *count == 0 {
            self.cached_oldest_first.retain(|h| *h != hash);
        }
        *count += 1;
    }

    fn release(&mut self, hash: SequenceHash) {
        let count = self
            .refcounts
            .get_mut(&hash)
            .expect("release of an unregistered hash");
        *count = count.checked_sub(1).expect("reference refcount underflow");
        if *count == 0 {
            self.cached_oldest_first.push(hash);
        }
    }

    fn release_chain(&mut self, hashes: &[SequenceHash]) {
        for hash in hashes.iter().rev() {
            self.release(*hash);
        }
    }

    fn register(&mut self, hash: SequenceHash) {
        if self.contains(hash) {
            self.acquire(hash);
            self.return_mutable();
        } else {
            self.mutable -= 1;
            self.refcounts.insert(hash, 1);
        }
    }

    fn counts(&self) -> PoolCounts {
        let cached = self.cached_oldest_first.len();
        PoolCounts {
            capacity: self.capacity,
            free: self.free,
            cached,
            active: self.capacity - self.free - cached,
        }
    }

    fn referenced(&self) -> bool {
        self.refcounts.values().any(|c| *c > 0)
    }

    fn clear(&mut self) {
        self.free += self.cached_oldest_first.len();
        self.cached_oldest_first.clear();
        self.refcounts.clear();
        self.phases.clear();
    }
}

struct Harness {
    manager: Manager<TestHardware>,
    device: RefTier,
    host: Option<RefTier>,
    write_through: bool,
    requests: Vec<(BlockChain, Vec<SequenceHash>)>,
    replica: RegistryReplica,
    now: u64,
    next_request: u64,
}

impl Harness {
    fn new(setup: &Setup) -> Self {
        let mut tiers = vec![TierConfig {
            tier: Tier::Device,
            capacity_blocks: setup.device_blocks,
            eviction: setup.eviction,
            offload: setup.device_offload,
        }];
        if let Some(host) = setup.host_blocks {
            tiers.push(TierConfig {
                tier: Tier::Host,
                capacity_blocks: host,
                eviction: setup.eviction,
                offload: OffloadPolicy::None,
            });
        }
        let config = ManagerConfig {
            worker_id: WorkerId::new(0),
            dp_rank: 0,
            block_size_tokens: 16,
            bytes_per_block: 4096,
            tiers,
            onboard: OnboardPolicy::Always,
            max_inflight_transfers: 1024,
        };
        Self {
            manager: Manager::new(TestHardware::new(TransferTiming::Instant), config).unwrap(),
            device: RefTier::new(setup.device_blocks, setup.eviction),
            host: setup
                .host_blocks
                .map(|blocks| RefTier::new(blocks, setup.eviction)),
            write_through: setup.device_offload == OffloadPolicy::WriteThrough,
            requests: Vec::new(),
            replica: RegistryReplica::new(),
            now: 0,
            next_request: 0,
        }
    }

    fn now(&mut self) -> Timestamp {
        self.now += 1_000;
        Timestamp::from_nanos(self.now)
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Request { chain: c, len } => self.request(&chain(c)[..len]),
            Op::Finish { index } => {
                if self.requests.is_empty() {
                    return;
                }
                let (blocks, hashes) = self.requests.remove(index % self.requests.len());
                self.manager.device().release(blocks);
                self.device.release_chain(&hashes);
            }
            Op::SetPhase {
                chain: c,
                len,
                phase,
            } => {
                let hashes: Vec<SequenceHash> =
                    chain(c)[..len].iter().map(|i| i.sequence_hash).collect();
                let now = self.now();
                let found = self.manager.set_phase(&hashes, phase, now);
                assert_eq!(
                    found,
                    hashes.iter().filter(|h| self.device.contains(**h)).count()
                );
                hashes
                    .iter()
                    .rev()
                    .for_each(|h| self.device.set_phase(*h, phase));
            }
            Op::ResetCache => {
                let now = self.now();
                let refused =
                    self.device.referenced() || self.host.as_ref().is_some_and(RefTier::referenced);
                let result = self.manager.reset_cache(now);
                assert_eq!(result.is_err(), refused, "reset_cache: {result:?}");
                if !refused {
                    self.device.clear();
                    if let Some(host) = &mut self.host {
                        host.clear();
                    }
                }
            }
        }
    }

    fn request(&mut self, ids: &[BlockIdentity]) {
        let hashes: Vec<SequenceHash> = ids.iter().map(|i| i.sequence_hash).collect();
        let now = self.now();
        let request = RequestId::new(self.next_request);
        self.next_request += 1;

        // Lookup: the device prefix, then what the host holds after it.
        let mut plan = self.manager.lookup(&hashes, now);
        let on_device = hashes
            .iter()
            .take_while(|h| self.device.contains(**h))
            .count();
        hashes[..on_device]
            .iter()
            .for_each(|h| self.device.acquire(*h));
        let mut onboard = 0;
        if let Some(host) = &mut self.host {
            onboard = hashes[on_device..]
                .iter()
                .take_while(|h| host.contains(**h))
                .count();
            hashes[on_device..on_device + onboard]
                .iter()
                .for_each(|h| host.acquire(*h));
        }
        assert_eq!(plan.device_blocks().len(), on_device);
        assert_eq!(plan.onboard_blocks().len(), onboard);

        // Onboarding: device blocks for the copies, then (instantly) the copies register.
        let onboard_hashes = &hashes[on_device..on_device + onboard];
        let started = self.manager.start_onboard(request, &mut plan, now);
        if onboard > 0 && !self.device.allocate(onboard) {
            assert!(
                started.is_err(),
                "reference could not allocate, manager could: {started:?}"
            );
            drop(plan);
            self.host.as_mut().unwrap().release_chain(onboard_hashes);
            self.device.release_chain(&hashes[..on_device]);
            return;
        }
        assert!(started.is_ok(), "{started:?}");
        self.manager.handle_completions(now);
        let mut held = plan.into_device_blocks();
        while let Some(output) = self.manager.poll_output() {
            if let ManagerOutput::OnboardComplete {
                blocks,
                failed_blocks,
                ..
            } = output
            {
                assert_eq!(failed_blocks, 0);
                held.extend(blocks);
            }
        }
        for hash in onboard_hashes {
            self.device.register(*hash);
        }
        if onboard > 0 {
            self.host.as_mut().unwrap().release_chain(onboard_hashes);
        }

        // Compute the rest.
        let computed = &ids[on_device + onboard..];
        let blocks = self.manager.allocate(computed.len(), now);
        if !self.device.allocate(computed.len()) {
            assert!(blocks.is_err());
            self.manager.device().release(held);
            self.device.release_chain(&hashes[..on_device + onboard]);
            return;
        }
        let blocks = blocks.expect("reference allocated");
        let complete = blocks
            .into_iter()
            .zip(computed)
            .map(|(b, id)| b.apply_identity(*id))
            .collect();
        held.extend(self.manager.register(complete, now));
        let computed_hashes: Vec<SequenceHash> = computed.iter().map(|i| i.sequence_hash).collect();
        computed_hashes
            .iter()
            .for_each(|h| self.device.register(*h));
        if self.write_through {
            let host = self.host.as_mut().unwrap();
            let mut copied = Vec::new();
            for hash in &computed_hashes {
                if !host.contains(*hash) && !copied.contains(hash) && host.allocate(1) {
                    copied.push(*hash);
                }
            }
            copied.iter().for_each(|h| host.register(*h));
            host.release_chain(&copied);
        }
        self.manager.handle_completions(now);
        while self.manager.poll_output().is_some() {}
        assert_eq!(held.sequence_hashes().collect::<Vec<_>>(), hashes);
        self.requests.push((held, hashes));
    }

    fn check(&mut self) {
        for event in self.manager.take_events() {
            self.replica
                .apply(&event)
                .expect("the event stream is consistent");
        }
        let tiers: Vec<(Tier, &RefTier)> = std::iter::once((Tier::Device, &self.device))
            .chain(self.host.as_ref().map(|h| (Tier::Host, h)))
            .collect();
        for (tier, reference) in tiers {
            let pool = self.manager.pool(tier).unwrap();
            let counts = pool.check_invariants();
            assert_eq!(counts, reference.counts(), "{tier} counts");
            let snapshot = pool.snapshot();
            assert_eq!(snapshot.registered, reference.refcounts, "{tier} registry");
            let order: Vec<SequenceHash> = pool
                .coldest_cached(usize::MAX)
                .iter()
                .map(|i| i.sequence_hash)
                .collect();
            assert_eq!(order, reference.eviction_order(), "{tier} eviction order");
            let rebuilt: Vec<SequenceHash> = self.replica.hashes(tier).iter().copied().collect();
            let registered: Vec<SequenceHash> = snapshot.registered.keys().copied().collect();
            assert_eq!(rebuilt, registered, "{tier}: events rebuild the registry");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn manager_and_pools_match_the_naive_reference(setup in setup(), ops in prop::collection::vec(op(), 1..60)) {
        let mut harness = Harness::new(&setup);
        harness.check();
        for op in &ops {
            harness.apply(op);
            harness.check();
        }
        // Finishing every request leaves nothing referenced.
        while !harness.requests.is_empty() {
            harness.apply(&Op::Finish { index: 0 });
            harness.check();
        }
        prop_assert_eq!(harness.manager.device().counts().active, 0);
    }
}
