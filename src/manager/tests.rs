//! Unit tests of the manager with `TestHardware`.

use super::*;
use crate::block::BlockIdentity;
use crate::events::{KvCacheEventData, RegistryReplica};
use crate::hardware::SubmitError;
use crate::ids::{LocalBlockHash, WorkerId};
use crate::phase::Phase;
use crate::pool::{AllocError, EvictionPolicyKind, ImmutableBlock};
use crate::testing::{TestHardware, TransferTiming};
use std::collections::BTreeSet;
use std::time::Duration;

const MS: Duration = Duration::from_millis(1);

fn tier(tier: Tier, capacity: usize, offload: OffloadPolicy) -> TierConfig {
    TierConfig {
        tier,
        capacity_blocks: capacity,
        eviction: EvictionPolicyKind::Lru,
        offload,
    }
}

fn config(tiers: Vec<TierConfig>, onboard: OnboardPolicy) -> ManagerConfig {
    ManagerConfig {
        worker_id: WorkerId::new(1),
        dp_rank: 0,
        block_size_tokens: 16,
        bytes_per_block: 1 << 20,
        tiers,
        onboard,
        max_inflight_transfers: 64,
    }
}

fn manager(tiers: Vec<TierConfig>, timing: TransferTiming) -> Manager<TestHardware> {
    Manager::new(
        TestHardware::new(timing),
        config(tiers, OnboardPolicy::Always),
    )
    .unwrap()
}

fn chain(seed: u64, n: u64) -> Vec<BlockIdentity> {
    BlockIdentity::chain(
        &(0..n)
            .map(|i| LocalBlockHash::new(seed * 1000 + i))
            .collect::<Vec<_>>(),
    )
}

fn hashes(ids: &[BlockIdentity]) -> Vec<SequenceHash> {
    ids.iter().map(|i| i.sequence_hash).collect()
}

/// Computes and registers `ids` on device, then lets go of them.
fn compute(m: &mut Manager<TestHardware>, ids: &[BlockIdentity], now: Timestamp) {
    let blocks = m.allocate(ids.len(), now).unwrap();
    let complete = blocks
        .into_iter()
        .zip(ids)
        .map(|(b, id)| b.apply_identity(*id))
        .collect();
    let registered = m.register(complete, now);
    m.device().release(registered);
}

/// Computes `first`, lets its copies land, then computes `second` so that it takes the
/// device and pushes `first` down to the lower tiers.
fn cache_then_displace(
    m: &mut Manager<TestHardware>,
    first: &[BlockIdentity],
    second: &[BlockIdentity],
) {
    compute(m, first, at(0));
    let _ = drain(m, at(0));
    compute(m, second, at(0));
    let _ = drain(m, at(0));
}

fn drain(m: &mut Manager<TestHardware>, now: Timestamp) -> Vec<ManagerOutput> {
    m.handle_completions(now);
    std::iter::from_fn(|| m.poll_output()).collect()
}

fn at(ms: u64) -> Timestamp {
    Timestamp::from_nanos(ms * 1_000_000)
}

#[test]
fn config_validation_names_the_problem() {
    let no_device = config(
        vec![tier(Tier::Host, 4, OffloadPolicy::None)],
        OnboardPolicy::Always,
    );
    assert_eq!(no_device.validate(), Err(ManagerConfigError::NoDeviceTier));
    let out_of_order = config(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::None),
            tier(Tier::Disk, 4, OffloadPolicy::None),
            tier(Tier::Host, 4, OffloadPolicy::None),
        ],
        OnboardPolicy::Always,
    );
    assert_eq!(
        out_of_order.validate(),
        Err(ManagerConfigError::TierOrder(Tier::Host))
    );
    let nowhere = config(
        vec![tier(Tier::Device, 4, OffloadPolicy::WriteThrough)],
        OnboardPolicy::Always,
    );
    assert_eq!(
        nowhere.validate(),
        Err(ManagerConfigError::NoLowerTier(Tier::Device))
    );
    let watermark = config(
        vec![
            tier(
                Tier::Device,
                4,
                OffloadPolicy::WriteBack {
                    low_watermark_blocks: 4,
                },
            ),
            tier(Tier::Host, 4, OffloadPolicy::None),
        ],
        OnboardPolicy::Always,
    );
    assert!(matches!(
        watermark.validate(),
        Err(ManagerConfigError::WatermarkTooHigh { .. })
    ));
}

#[test]
fn write_through_copies_registered_blocks_down_every_tier() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 8, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 8, OffloadPolicy::WriteThrough),
            tier(Tier::Disk, 8, OffloadPolicy::None),
        ],
        TransferTiming::Fixed(MS),
    );
    let ids = chain(1, 3);
    compute(&mut m, &ids, at(0));
    assert!(
        drain(&mut m, at(0)).is_empty(),
        "nothing finishes before its deadline"
    );
    let outputs = drain(&mut m, at(1));
    assert!(matches!(
        outputs[..],
        [ManagerOutput::Offloaded {
            from: Tier::Device,
            to: Tier::Host,
            blocks: 3
        }]
    ));
    let outputs = drain(&mut m, at(2));
    assert!(matches!(
        outputs[..],
        [ManagerOutput::Offloaded {
            from: Tier::Host,
            to: Tier::Disk,
            blocks: 3
        }]
    ));
    for t in [Tier::Host, Tier::Disk] {
        assert_eq!(m.pool(t).unwrap().prefix_len(&hashes(&ids)), 3);
    }
    assert_eq!(m.stats().offloaded_blocks, [0, 3, 3, 0]);
    assert_eq!(m.stats().bytes_submitted, 6 << 20);
}

#[test]
fn lookup_plans_device_hits_then_lower_tier_onboards_then_compute() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 16, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    let ids = chain(1, 6);
    compute(&mut m, &ids[..4], at(0));
    let _ = drain(&mut m, at(0));
    // Another request takes the device: blocks 2 and 3 (the leaves) are evicted first.
    let other = chain(2, 2);
    compute(&mut m, &other, at(1));
    let _ = drain(&mut m, at(1));
    let plan = m.lookup(&hashes(&ids), at(2));
    assert_eq!(plan.device_blocks().len(), 2);
    assert_eq!(plan.onboard_count(Tier::Host), 2);
    assert_eq!(plan.blocks_to_compute(), 2);
}

#[test]
fn onboarding_brings_lower_tier_hits_to_device_and_reports_them_in_order() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 16, OffloadPolicy::None),
        ],
        TransferTiming::Fixed(MS),
    );
    let ids = chain(1, 4);
    compute(&mut m, &ids, at(0));
    let _ = drain(&mut m, at(1));
    compute(&mut m, &chain(2, 4), at(2));
    let _ = drain(&mut m, at(3));
    assert_eq!(
        m.device().prefix_len(&hashes(&ids)),
        0,
        "evicted from device"
    );
    let mut plan = m.lookup(&hashes(&ids), at(4));
    assert_eq!(plan.onboard_count(Tier::Host), 4);
    assert_eq!(m.start_onboard(RequestId::new(7), &mut plan, at(4)), Ok(1));
    assert!(plan.onboard_blocks().is_empty());
    assert!(drain(&mut m, at(4)).is_empty());
    let outputs = drain(&mut m, at(5));
    let [ManagerOutput::OnboardComplete {
        request,
        blocks,
        failed_blocks,
    }] = &outputs[..]
    else {
        panic!("expected one OnboardComplete, got {outputs:?}");
    };
    assert_eq!((*request, *failed_blocks), (RequestId::new(7), 0));
    assert_eq!(blocks.sequence_hashes().collect::<Vec<_>>(), hashes(&ids));
    assert_eq!(blocks.tier(), Some(Tier::Device));
    assert_eq!(m.stats().onboarded_blocks[Tier::Host.index()], 4);
}

#[test]
fn failed_onboarding_reports_the_blocks_to_compute_and_leaks_nothing() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 16, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    let ids = chain(1, 4);
    cache_then_displace(&mut m, &ids, &chain(2, 4));
    let mut plan = m.lookup(&hashes(&ids), at(1));
    m.hardware_mut().fail_next(1);
    m.start_onboard(RequestId::new(1), &mut plan, at(1))
        .unwrap();
    let outputs = drain(&mut m, at(1));
    assert!(
        matches!(&outputs[..], [ManagerOutput::OnboardComplete { blocks, failed_blocks: 4, .. }] if blocks.is_empty())
    );
    drop(plan);
    let counts = m.device().check_invariants();
    assert_eq!(counts.active, 0);
    assert_eq!(m.stats().onboard_failed_blocks, 4);
}

#[test]
fn a_corrupt_onboard_forgets_the_bad_copies_so_that_a_recompute_replaces_them() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 16, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    let ids = chain(1, 4);
    let wanted: BTreeSet<SequenceHash> = hashes(&ids).into_iter().collect();
    cache_then_displace(&mut m, &ids, &chain(2, 4));
    // A plain failure leaves the copies where they are.
    let mut plan = m.lookup(&hashes(&ids), at(1));
    m.hardware_mut().fail_next(1);
    m.start_onboard(RequestId::new(1), &mut plan, at(1))
        .unwrap();
    let _ = drain(&mut m, at(1));
    drop(plan);
    assert!(registered(&m, Tier::Host).is_superset(&wanted));
    let _ = m.take_events();
    // Bytes that fail their checksum are no copy: forgotten, with Removed events.
    let mut plan = m.lookup(&hashes(&ids), at(2));
    assert_eq!(plan.onboard_count(Tier::Host), 4);
    m.hardware_mut().corrupt_next(1);
    m.start_onboard(RequestId::new(2), &mut plan, at(2))
        .unwrap();
    let outputs = drain(&mut m, at(2));
    assert!(
        matches!(&outputs[..], [ManagerOutput::OnboardComplete { blocks, failed_blocks: 4, .. }] if blocks.is_empty())
    );
    drop(plan);
    assert_eq!(m.stats().corrupt_blocks_forgotten, 4);
    assert!(registered(&m, Tier::Host).is_disjoint(&wanted));
    let removed: BTreeSet<SequenceHash> = m
        .take_events()
        .into_iter()
        .flat_map(|event| match event.data {
            KvCacheEventData::Removed {
                block_hashes,
                tier: Tier::Host,
            } => block_hashes,
            _ => Vec::new(),
        })
        .collect();
    assert_eq!(removed, wanted);
    let counts = m.pool(Tier::Host).unwrap().check_invariants();
    assert_eq!(counts.active, 0);
    // The next lookup misses, and the recomputed blocks are copied down afresh.
    let plan = m.lookup(&hashes(&ids), at(3));
    assert_eq!(plan.blocks_to_compute(), 4);
    drop(plan);
    compute(&mut m, &ids, at(3));
    let _ = drain(&mut m, at(3));
    assert!(registered(&m, Tier::Host).is_superset(&wanted));
}

/// Device (4) and host (4) hold chain 2, disk holds chains 1 and 2; disk costs
/// `disk_per_block` to read, recomputing costs 10 µs a block.
fn chain_one_only_on_disk(disk_per_block: Duration) -> Manager<TestHardware> {
    let hardware = TestHardware::new(TransferTiming::Instant)
        .with_transfer_cost(Tier::Host, Duration::from_micros(1), 1 << 20)
        .with_transfer_cost(Tier::Disk, disk_per_block, 1 << 20)
        .with_recompute_cost(Duration::from_micros(10));
    let tiers = vec![
        tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Host, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Disk, 16, OffloadPolicy::None),
    ];
    let mut m = Manager::new(hardware, config(tiers, OnboardPolicy::CostAware)).unwrap();
    cache_then_displace(&mut m, &chain(1, 4), &chain(2, 4));
    m
}

#[test]
fn cost_aware_onboarding_recomputes_when_the_transfer_is_slower() {
    let ids = hashes(&chain(1, 4));
    let mut m = chain_one_only_on_disk(Duration::from_micros(50));
    assert_eq!(m.pool(Tier::Host).unwrap().prefix_len(&ids), 0);
    assert_eq!(m.pool(Tier::Disk).unwrap().prefix_len(&ids), 4);
    let plan = m.lookup(&ids, at(1));
    assert_eq!(plan.onboard_blocks().len(), 0);
    assert_eq!(plan.recomputed_hits(), 4);
    assert_eq!(plan.blocks_to_compute(), 4);
    assert_eq!(m.stats().recomputed_hit_blocks, 4);
}

#[test]
fn cost_aware_onboarding_reads_the_disk_when_that_is_faster() {
    let ids = hashes(&chain(1, 4));
    let mut m = chain_one_only_on_disk(Duration::from_micros(5));
    let plan = m.lookup(&ids, at(1));
    assert_eq!(plan.onboard_count(Tier::Disk), 4);
    assert_eq!(plan.recomputed_hits(), 0);
    assert_eq!(plan.blocks_to_compute(), 0);
}

#[test]
fn write_back_copies_the_coldest_blocks_before_they_are_evicted() {
    let mut m = manager(
        vec![
            tier(
                Tier::Device,
                4,
                OffloadPolicy::WriteBack {
                    low_watermark_blocks: 2,
                },
            ),
            tier(Tier::Host, 16, OffloadPolicy::None),
        ],
        TransferTiming::Fixed(MS),
    );
    let ids = chain(1, 4);
    compute(&mut m, &ids, at(0));
    // All four are cached, none free: the next poll writes the two coldest (the leaves)
    // back, and they land a millisecond later.
    assert!(drain(&mut m, at(0)).is_empty());
    assert_eq!(m.transfers_in_flight(), 1);
    let outputs = drain(&mut m, at(1));
    assert!(
        matches!(
            outputs[..],
            [ManagerOutput::Offloaded {
                from: Tier::Device,
                to: Tier::Host,
                blocks: 2
            }]
        ),
        "{outputs:?}"
    );
    let host = m.pool(Tier::Host).unwrap();
    assert!(host.contains(ids[3].sequence_hash) && host.contains(ids[2].sequence_hash));
    assert!(!host.contains(ids[0].sequence_hash));
    // The written-back blocks are the next victims.
    let _blocks = m.allocate(2, at(1)).unwrap();
    assert_eq!(m.device().prefix_len(&hashes(&ids)), 2);
}

#[test]
fn events_rebuild_every_tier_registry() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 6, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    let mut replica = RegistryReplica::new();
    for seed in 0..5 {
        compute(&mut m, &chain(seed, 3), at(seed));
        let _ = drain(&mut m, at(seed));
        for event in m.take_events() {
            replica.apply(&event).unwrap();
        }
    }
    for t in [Tier::Device, Tier::Host] {
        let registry: BTreeSet<SequenceHash> = m
            .pool(t)
            .unwrap()
            .snapshot()
            .registered
            .keys()
            .copied()
            .collect();
        assert_eq!(registry, replica.hashes(t), "{t}");
    }
    m.reset_cache(at(10)).unwrap();
    let events = m.take_events();
    assert_eq!(
        events.last().map(|e| &e.data),
        Some(&KvCacheEventData::Cleared)
    );
    for event in &events {
        replica.apply(event).unwrap();
    }
    assert!(replica.hashes(Tier::Device).is_empty() && replica.hashes(Tier::Host).is_empty());
}

#[test]
fn reset_cache_refuses_while_blocks_are_referenced() {
    let mut m = manager(
        vec![tier(Tier::Device, 4, OffloadPolicy::None)],
        TransferTiming::Instant,
    );
    let ids = chain(1, 1);
    let blocks = m.allocate(1, at(0)).unwrap();
    let held = m.register(
        blocks
            .into_iter()
            .map(|b| b.apply_identity(ids[0]))
            .collect(),
        at(0),
    );
    assert!(matches!(
        m.reset_cache(at(0)),
        Err(ClearError::InUse {
            tier: Tier::Device,
            ..
        })
    ));
    drop(held);
    assert_eq!(m.reset_cache(at(0)), Ok(()));
}

#[test]
fn onboarding_refuses_cleanly_when_the_device_is_full() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 2, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 8, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    let ids = chain(1, 2);
    cache_then_displace(&mut m, &ids, &chain(2, 2));
    let _hold = m.allocate(1, at(0)).unwrap();
    let mut plan = m.lookup(&hashes(&ids), at(0));
    assert_eq!(plan.onboard_blocks().len(), 2);
    let error = m
        .start_onboard(RequestId::new(1), &mut plan, at(0))
        .unwrap_err();
    assert!(matches!(
        error,
        OnboardError::Alloc(AllocError::Exhausted { requested: 2, .. })
    ));
    assert_eq!(plan.onboard_blocks().len(), 2, "the plan is unchanged");
}

#[test]
fn cost_aware_onboarding_cuts_between_a_cheap_host_run_and_a_slow_disk_run() {
    let hardware = TestHardware::new(TransferTiming::Instant)
        .with_transfer_cost(Tier::Host, Duration::from_micros(1), 1 << 20)
        .with_transfer_cost(Tier::Disk, Duration::from_micros(50), 1 << 20)
        .with_recompute_cost(Duration::from_micros(10));
    let tiers = vec![
        tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Host, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Disk, 16, OffloadPolicy::None),
    ];
    let mut m = Manager::new(hardware, config(tiers, OnboardPolicy::CostAware)).unwrap();
    let ids = chain(1, 4);
    cache_then_displace(&mut m, &ids, &chain(2, 4));
    // Bring the first two blocks back to host only: host = [1.0, 1.1, 2.2, 2.3].
    let host = m.pool(Tier::Host).unwrap().clone();
    let copies: Vec<_> = host
        .allocate(2)
        .unwrap()
        .into_iter()
        .zip(&ids[..2])
        .map(|(b, id)| b.apply_identity(*id))
        .collect();
    drop(host.register_chain(copies));
    let plan = m.lookup(&hashes(&ids), at(1));
    // Host blocks at 1 µs beat recomputing at 10 µs; disk blocks at 50 µs do not.
    assert_eq!(plan.onboard_count(Tier::Host), 2);
    assert_eq!(plan.onboard_count(Tier::Disk), 0);
    assert_eq!(plan.recomputed_hits(), 2);
    assert_eq!(plan.blocks_to_compute(), 2);
}

#[test]
fn write_back_with_the_priority_policy_offloads_finished_reasoning_first() {
    let tiers = vec![
        TierConfig {
            tier: Tier::Device,
            capacity_blocks: 6,
            eviction: EvictionPolicyKind::Priority,
            offload: OffloadPolicy::WriteBack {
                low_watermark_blocks: 1,
            },
        },
        tier(Tier::Host, 16, OffloadPolicy::None),
    ];
    let mut m = Manager::new(
        TestHardware::new(TransferTiming::Instant),
        config(tiers, OnboardPolicy::Always),
    )
    .unwrap();
    let answer = chain(1, 2);
    let thinking = chain(2, 2);
    compute(&mut m, &answer, at(0));
    compute(&mut m, &thinking, at(0));
    // The reasoning finished: its blocks are known cold although they are the newest.
    assert_eq!(
        m.set_phase(&hashes(&thinking), Phase::ThinkComplete, at(1)),
        2
    );
    assert!(drain(&mut m, at(1)).is_empty(), "two blocks are still free");
    // Taking the last free blocks makes the next victim worth writing back.
    let _held = m.allocate(2, at(2)).unwrap();
    let _ = drain(&mut m, at(2));
    let host = m.pool(Tier::Host).unwrap();
    assert!(
        host.contains(thinking[1].sequence_hash),
        "the leaf of the finished reasoning went first"
    );
    assert_eq!(host.counts().cached, 1);
}

/// (kind, tier) of each event: what the order test compares.
fn kinds(events: &[KvCacheEvent]) -> Vec<(&'static str, Tier)> {
    events
        .iter()
        .map(|e| match &e.data {
            KvCacheEventData::Stored { tier, .. } => ("stored", *tier),
            KvCacheEventData::Removed { tier, .. } => ("removed", *tier),
            KvCacheEventData::Cleared => ("cleared", Tier::Device),
        })
        .collect()
}

#[test]
fn events_of_all_tiers_come_in_the_order_they_happened() {
    // X fills the device and is written through to host; then Y evicts X's leaf from the
    // device. Listed tier by tier, the device's removal would come before the host's
    // store, and a router would see X's leaf leave the worker before it reached host.
    let mut m = manager(
        vec![
            tier(Tier::Device, 2, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 8, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    compute(&mut m, &chain(1, 2), at(0));
    let _ = drain(&mut m, at(0));
    compute(&mut m, &chain(2, 1), at(1));
    let events = m.take_events();
    assert_eq!(
        kinds(&events),
        vec![
            ("stored", Tier::Device),
            ("stored", Tier::Host),
            ("removed", Tier::Device),
            ("stored", Tier::Device),
        ],
        "{events:?}"
    );
    assert!(events
        .windows(2)
        .all(|w| w[1].event_id == w[0].event_id + 1));
}

/// A device of 3 blocks and a host of 1: chain a→b computed, a copied to host, then x
/// takes the host's only block (a leaves host) and a block for y evicts a from the
/// device. Returns the manager, [a, b], x and the handle that keeps b on the device: b
/// is an orphan, its parent in no tier.
fn orphaned() -> (
    Manager<TestHardware>,
    Vec<BlockIdentity>,
    Vec<BlockIdentity>,
    ImmutableBlock,
) {
    let mut m = manager(
        vec![
            tier(Tier::Device, 3, OffloadPolicy::None),
            tier(Tier::Host, 1, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    let ab = chain(1, 2);
    compute(&mut m, &ab, at(0));
    let a = m.device().pin(ab[0].sequence_hash).unwrap();
    m.offload(Tier::Device, vec![a], at(0));
    let _ = drain(&mut m, at(0));
    let b = m.device().pin(ab[1].sequence_hash).unwrap();
    let x = chain(2, 1);
    compute(&mut m, &x, at(1));
    let x_block = m.device().pin(x[0].sequence_hash).unwrap();
    m.offload(Tier::Device, vec![x_block], at(1));
    let _ = drain(&mut m, at(1));
    let _y = m.allocate(1, at(2)).unwrap();
    assert!(!m.holds_anywhere(ab[0].sequence_hash));
    (m, ab, x, b)
}

#[test]
fn a_block_whose_parent_left_every_tier_is_not_offloaded() {
    let (mut m, ab, _, b) = orphaned();
    m.offload(Tier::Device, vec![b], at(2));
    let _ = drain(&mut m, at(2));
    assert_eq!(m.stats().orphans_not_offloaded, 1);
    assert!(!m.pool(Tier::Host).unwrap().contains(ab[1].sequence_hash));
    assert_eq!(m.transfers_in_flight(), 0);
}

#[test]
fn a_copy_whose_parent_left_every_tier_in_flight_is_not_registered() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 3, OffloadPolicy::None),
            tier(Tier::Host, 1, OffloadPolicy::None),
        ],
        TransferTiming::Fixed(MS),
    );
    let ab = chain(1, 2);
    compute(&mut m, &ab, at(0));
    let a = m.device().pin(ab[0].sequence_hash).unwrap();
    m.offload(Tier::Device, vec![a], at(0));
    let _ = drain(&mut m, at(1));
    // b's copy takes the host's only block (a leaves host) and is in flight when two
    // device allocations evict a from the device.
    let b = m.device().pin(ab[1].sequence_hash).unwrap();
    m.offload(Tier::Device, vec![b], at(1));
    assert_eq!(m.transfers_in_flight(), 1);
    let _two = m.allocate(2, at(1)).unwrap();
    assert!(!m.holds_anywhere(ab[0].sequence_hash));
    let _ = drain(&mut m, at(2));
    assert_eq!(m.stats().orphans_not_offloaded, 1);
    assert!(!m.pool(Tier::Host).unwrap().contains(ab[1].sequence_hash));
    // The target block went back: host has room again.
    assert_eq!(m.pool(Tier::Host).unwrap().counts().free, 1);
}

/// The registry a fresh replica rebuilds from `events`, renumbered from 0 (a replica
/// refuses to start mid-stream).
fn rebuilt(events: &[KvCacheEvent]) -> [BTreeSet<SequenceHash>; 2] {
    let mut replica = RegistryReplica::new();
    for (id, event) in events.iter().enumerate() {
        let mut event = event.clone();
        event.event_id = id as u64;
        replica.apply(&event).unwrap();
    }
    [replica.hashes(Tier::Device), replica.hashes(Tier::Host)]
}

fn registered(m: &Manager<TestHardware>, tier: Tier) -> BTreeSet<SequenceHash> {
    m.pool(tier)
        .unwrap()
        .snapshot()
        .registered
        .into_keys()
        .collect()
}

#[test]
fn a_snapshot_republishes_every_reachable_block_after_a_cleared() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 8, OffloadPolicy::None),
        ],
        TransferTiming::Instant,
    );
    compute(&mut m, &chain(1, 3), at(0));
    let _ = drain(&mut m, at(0));
    compute(&mut m, &chain(2, 2), at(1));
    let _ = drain(&mut m, at(1));
    let history = m.take_events();
    assert_eq!(m.publish_snapshot(), 4 + 5);
    let snapshot = m.take_events();
    assert!(matches!(snapshot[0].data, KvCacheEventData::Cleared));
    // Numbered on from the history: a consumer sees no gap.
    assert_eq!(snapshot[0].event_id, history.last().unwrap().event_id + 1);
    let expected = [registered(&m, Tier::Device), registered(&m, Tier::Host)];
    assert_eq!(rebuilt(&snapshot), expected);
    assert_eq!(rebuilt(&[history, snapshot].concat()), expected);
}

#[test]
fn a_snapshot_leaves_out_blocks_whose_prefix_left_every_tier() {
    let (mut m, ab, x, _b) = orphaned();
    // b is on the device, its parent a nowhere: b is left out, x (device and host) not.
    let _ = m.take_events();
    assert_eq!(m.publish_snapshot(), 2);
    let [device, host] = rebuilt(&m.take_events());
    assert!(registered(&m, Tier::Device).contains(&ab[1].sequence_hash));
    assert!(!device.contains(&ab[1].sequence_hash));
    assert_eq!(
        (device, host),
        (
            BTreeSet::from([x[0].sequence_hash]),
            BTreeSet::from([x[0].sequence_hash])
        )
    );
}

#[test]
fn a_failed_disk_loses_its_blocks_fails_its_transfers_and_comes_back_empty() {
    let mut m = manager(
        vec![
            tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 4, OffloadPolicy::WriteThrough),
            tier(Tier::Disk, 16, OffloadPolicy::None),
        ],
        TransferTiming::Fixed(MS),
    );
    let (one, two) = (chain(1, 4), chain(2, 4));
    // Both chains written through to disk; chain two then displaces chain one from the
    // device and the host, so chain one is on disk only.
    compute(&mut m, &one, at(0));
    let _ = drain(&mut m, at(1));
    let _ = drain(&mut m, at(2));
    compute(&mut m, &two, at(2));
    let _ = drain(&mut m, at(3));
    let _ = drain(&mut m, at(4));
    assert_eq!(registered(&m, Tier::Disk).len(), 8);
    // An onboarding from disk in flight, and a plan naming the same disk blocks.
    let mut plan = m.lookup(&hashes(&one), at(4));
    assert_eq!(plan.onboard_count(Tier::Disk), 4);
    assert_eq!(m.start_onboard(RequestId::new(1), &mut plan, at(4)), Ok(1));
    let mut stale = m.lookup(&hashes(&one), at(4));
    assert_eq!(stale.onboard_count(Tier::Disk), 4);
    let mut history = m.take_events();

    let failure = m.fail_tier(Tier::Disk, at(4)).unwrap();
    assert_eq!(
        failure,
        TierFailure {
            blocks_lost: 8,
            transfers_failed: 1
        }
    );
    assert!(m.tier_is_down(Tier::Disk));
    // The onboarding failed: its blocks are to be computed.
    let outputs = drain(&mut m, at(4));
    assert!(
        matches!(&outputs[..], [ManagerOutput::OnboardComplete { blocks, failed_blocks: 4, .. }] if blocks.is_empty()),
        "{outputs:?}"
    );
    // One Removed for every disk block, and nothing else.
    let events = m.take_events();
    assert_eq!(kinds(&events), vec![("removed", Tier::Disk)]);
    let KvCacheEventData::Removed { block_hashes, .. } = &events[0].data else {
        unreachable!("checked above");
    };
    assert_eq!(block_hashes.len(), 8);
    history.extend(events);
    assert!(registered(&m, Tier::Disk).is_empty());
    // The plan made before the failure cannot start; dropping it frees its blocks.
    assert_eq!(
        m.start_onboard(RequestId::new(2), &mut stale, at(4)),
        Err(OnboardError::Submit(SubmitError::TierUnavailable(
            Tier::Disk
        )))
    );
    drop(stale);
    assert_eq!(m.pool(Tier::Disk).unwrap().check_invariants().free, 16);

    // While down: lookups do not plan from disk, and nothing is written to it.
    let plan = m.lookup(&hashes(&one), at(5));
    assert_eq!(
        (plan.onboard_blocks().len(), plan.blocks_to_compute()),
        (0, 4)
    );
    drop(plan);
    let to_disk = |m: &Manager<TestHardware>| {
        m.hardware()
            .submitted()
            .iter()
            .filter(|t| t.dst_tier == Tier::Disk)
            .count()
    };
    let (writes, skipped) = (to_disk(&m), m.stats().offload_skipped_blocks);
    compute(&mut m, &chain(3, 4), at(5));
    let outputs = drain(&mut m, at(6));
    assert!(matches!(
        outputs[..],
        [ManagerOutput::Offloaded {
            to: Tier::Host,
            blocks: 4,
            ..
        }]
    ));
    assert_eq!(to_disk(&m), writes);
    assert_eq!(m.stats().offload_skipped_blocks, skipped + 4);
    assert!(registered(&m, Tier::Disk).is_empty());

    // Back, empty, and written to again.
    m.restore_tier(Tier::Disk, at(6)).unwrap();
    assert!(!m.tier_is_down(Tier::Disk));
    let four = chain(4, 4);
    compute(&mut m, &four, at(6));
    let _ = drain(&mut m, at(7));
    let _ = drain(&mut m, at(8));
    assert_eq!(
        registered(&m, Tier::Disk),
        hashes(&four).into_iter().collect()
    );
    // The event stream still rebuilds every tier.
    history.extend(m.take_events());
    let mut replica = RegistryReplica::new();
    for event in &history {
        replica.apply(event).unwrap();
    }
    for t in [Tier::Device, Tier::Host, Tier::Disk] {
        assert_eq!(replica.hashes(t), registered(&m, t), "{t}");
    }
    assert_eq!(
        m.fail_tier(Tier::Device, at(8)),
        Err(TierFaultError::Device)
    );
    assert_eq!(
        m.fail_tier(Tier::Remote, at(8)),
        Err(TierFaultError::NotPresent(Tier::Remote))
    );
}
