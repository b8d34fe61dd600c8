//! The manager with transfers that take time and sometimes fail: safety and liveness.
//!
//! Random streams of requests, finishes, phase tags, clock advances and injected transfer
//! failures run on `Manager<TestHardware>` with fixed transfer delays, write-back or
//! write-through tiers and either eviction policy. There is no reference model here (the
//! timing makes one as complex as the manager); instead, after every step:
//! - every pool's own invariants hold (free + cached + active = capacity, no block in two
//!   places, refcounts consistent);
//! - replaying the emitted events rebuilds every tier's registry.
//!
//! And once the stream ends and time runs on (faults stop), every request completes,
//! nothing stays referenced and no transfer stays in flight.

mod common;

use kvtwin::block::BlockIdentity;
use kvtwin::events::RegistryReplica;
use kvtwin::ids::{RequestId, SequenceHash, Timestamp, WorkerId};
use kvtwin::manager::{
    Manager, ManagerConfig, ManagerOutput, OffloadPolicy, OnboardPolicy, TierConfig,
};
use kvtwin::phase::Phase;
use kvtwin::pool::{BlockChain, EvictionPolicyKind};
use kvtwin::testing::{TestHardware, TransferTiming};
use kvtwin::tier::Tier;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

const CHAIN_LEN: usize = 6;

fn chain(c: u64) -> Vec<BlockIdentity> {
    common::shared_prefix_chain(c, CHAIN_LEN)
}

#[derive(Clone, Debug)]
enum Op {
    Request { chain: u64, len: usize },
    Finish { index: usize },
    SetPhase { chain: u64, phase: Phase },
    Advance { micros: u64 },
    FailNext { transfers: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u64..5, 1..=CHAIN_LEN).prop_map(|(chain, len)| Op::Request { chain, len }),
        3 => any::<usize>().prop_map(|index| Op::Finish { index }),
        1 => (0u64..5, prop::sample::select(Phase::COLDEST_FIRST.to_vec()))
            .prop_map(|(chain, phase)| Op::SetPhase { chain, phase }),
        3 => (0u64..30).prop_map(|micros| Op::Advance { micros }),
        1 => (1usize..3).prop_map(|transfers| Op::FailNext { transfers }),
    ]
}

fn offload() -> impl Strategy<Value = OffloadPolicy> {
    prop_oneof![
        Just(OffloadPolicy::None),
        Just(OffloadPolicy::WriteThrough),
        (1usize..3).prop_map(|low_watermark_blocks| OffloadPolicy::WriteBack {
            low_watermark_blocks
        }),
    ]
}

#[derive(Clone, Debug)]
struct Setup {
    device: usize,
    host: usize,
    disk: usize,
    device_offload: OffloadPolicy,
    host_offload: OffloadPolicy,
    eviction: EvictionPolicyKind,
    delay_micros: u64,
    disk_cost_micros: u64,
    onboard: OnboardPolicy,
}

fn setup() -> impl Strategy<Value = Setup> {
    let eviction =
        prop::sample::select(vec![EvictionPolicyKind::Lru, EvictionPolicyKind::Priority]);
    let onboard = prop::sample::select(vec![OnboardPolicy::Always, OnboardPolicy::CostAware]);
    let sizes = (CHAIN_LEN..CHAIN_LEN + 6, 3usize..12, 3usize..20);
    let policies = (offload(), offload(), eviction, onboard);
    let timing = (1u64..20, 1u64..20);
    (sizes, policies, timing).prop_map(
        |(
            (device, host, disk),
            (device_offload, host_offload, eviction, onboard),
            (delay_micros, disk_cost_micros),
        )| {
            Setup {
                device,
                host,
                disk,
                device_offload,
                host_offload,
                eviction,
                delay_micros,
                disk_cost_micros,
                onboard,
            }
        },
    )
}

enum Waiting {
    Onboarding {
        hashes: Vec<BlockIdentity>,
        held: BlockChain,
    },
}

struct Harness {
    manager: Manager<TestHardware>,
    replica: RegistryReplica,
    waiting: BTreeMap<RequestId, Waiting>,
    running: Vec<BlockChain>,
    now: u64,
    next_request: u64,
    completed: u64,
    started: u64,
}

impl Harness {
    fn new(setup: &Setup) -> Self {
        let tier = |tier, capacity_blocks, offload| TierConfig {
            tier,
            capacity_blocks,
            eviction: setup.eviction,
            offload,
        };
        let config = ManagerConfig {
            worker_id: WorkerId::new(0),
            dp_rank: 0,
            block_size_tokens: 16,
            bytes_per_block: 4096,
            tiers: vec![
                tier(Tier::Device, setup.device, setup.device_offload),
                tier(Tier::Host, setup.host, setup.host_offload),
                tier(Tier::Disk, setup.disk, OffloadPolicy::None),
            ],
            onboard: setup.onboard,
            max_inflight_transfers: 8,
        };
        // Estimates under which onboarding from host always pays and from disk sometimes
        // does, so the cost-aware cut is exercised on both sides.
        let delay = Duration::from_micros(setup.delay_micros);
        let hardware = TestHardware::new(TransferTiming::Fixed(delay))
            .with_transfer_cost(Tier::Host, Duration::from_micros(1), 4096)
            .with_transfer_cost(
                Tier::Disk,
                Duration::from_micros(setup.disk_cost_micros),
                4096,
            )
            .with_recompute_cost(Duration::from_micros(10));
        Self {
            manager: Manager::new(hardware, config).unwrap(),
            replica: RegistryReplica::new(),
            waiting: BTreeMap::new(),
            running: Vec::new(),
            now: 0,
            next_request: 0,
            completed: 0,
            started: 0,
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_nanos(self.now)
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Request { chain: c, len } => self.request(chain(c)[..len].to_vec()),
            Op::Finish { index } => {
                if !self.running.is_empty() {
                    drop(self.running.remove(index % self.running.len()));
                    self.completed += 1;
                }
            }
            Op::SetPhase { chain: c, phase } => {
                let hashes: Vec<SequenceHash> = chain(c).iter().map(|i| i.sequence_hash).collect();
                let _ = self.manager.set_phase(&hashes, phase, self.now());
            }
            Op::Advance { micros } => self.now += micros * 1_000,
            Op::FailNext { transfers } => self.manager.hardware_mut().fail_next(transfers),
        }
        self.settle();
    }

    fn request(&mut self, ids: Vec<BlockIdentity>) {
        let hashes: Vec<SequenceHash> = ids.iter().map(|i| i.sequence_hash).collect();
        let request = RequestId::new(self.next_request);
        self.next_request += 1;
        self.started += 1;
        let mut plan = self.manager.lookup(&hashes, self.now());
        if !plan.onboard_blocks().is_empty()
            && self
                .manager
                .start_onboard(request, &mut plan, self.now())
                .is_ok()
        {
            let held = plan.into_device_blocks();
            self.waiting
                .insert(request, Waiting::Onboarding { hashes: ids, held });
            return;
        }
        let held = plan.into_device_blocks();
        self.compute(ids, held);
    }

    /// Allocates and registers what the request still lacks; a request that finds no
    /// room gives up (counted as completed: it was served by recomputation elsewhere).
    fn compute(&mut self, ids: Vec<BlockIdentity>, mut held: BlockChain) {
        let missing = &ids[held.len()..];
        match self.manager.allocate(missing.len(), self.now()) {
            Ok(blocks) => {
                let complete = blocks
                    .into_iter()
                    .zip(missing)
                    .map(|(b, id)| b.apply_identity(*id))
                    .collect();
                held.append(self.manager.register(complete, self.now()));
                assert_eq!(
                    held.sequence_hashes().collect::<Vec<_>>(),
                    ids.iter().map(|i| i.sequence_hash).collect::<Vec<_>>()
                );
                self.running.push(held);
            }
            Err(_) => {
                drop(held);
                self.completed += 1;
            }
        }
    }

    fn settle(&mut self) {
        self.manager.handle_completions(self.now());
        while let Some(output) = self.manager.poll_output() {
            if let ManagerOutput::OnboardComplete {
                request, blocks, ..
            } = output
            {
                let Some(Waiting::Onboarding { hashes, mut held }) = self.waiting.remove(&request)
                else {
                    panic!("completion for unknown request {request:?}");
                };
                held.append(blocks);
                self.compute(hashes, held);
            }
        }
        for event in self.manager.take_events() {
            self.replica.apply(&event).expect("events are consistent");
        }
        for tier in Tier::ALL {
            let Some(pool) = self.manager.pool(tier) else {
                continue;
            };
            pool.check_invariants();
            let registered: Vec<SequenceHash> =
                pool.snapshot().registered.keys().copied().collect();
            let rebuilt: Vec<SequenceHash> = self.replica.hashes(tier).iter().copied().collect();
            assert_eq!(registered, rebuilt, "{tier}: events rebuild the registry");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn timed_transfers_and_faults_keep_pools_consistent_and_converge(
        setup in setup(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let mut harness = Harness::new(&setup);
        for op in &ops {
            harness.apply(op);
        }
        // Liveness: faults stop, time runs on, every request finishes.
        for _ in 0..1000 {
            if harness.waiting.is_empty() && harness.manager.transfers_in_flight() == 0 {
                break;
            }
            harness.apply(&Op::Advance { micros: 50 });
        }
        prop_assert!(harness.waiting.is_empty(), "requests still onboarding");
        prop_assert_eq!(harness.manager.transfers_in_flight(), 0);
        while !harness.running.is_empty() {
            harness.apply(&Op::Finish { index: 0 });
        }
        // Write-back may start copies when blocks become cached; let them land.
        for _ in 0..100 {
            if harness.manager.transfers_in_flight() == 0 {
                break;
            }
            harness.apply(&Op::Advance { micros: 50 });
        }
        prop_assert_eq!(harness.completed, harness.started);
        for tier in Tier::ALL {
            if let Some(pool) = harness.manager.pool(tier) {
                prop_assert_eq!(pool.counts().active, 0, "{} still holds blocks", tier);
            }
        }
    }
}
