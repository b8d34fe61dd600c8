//! Conformance: the same test bodies on two arms, the simulator's `SimHardware` and the
//! real `HostHardware` (memory and files), must give the same block states, the same
//! events and the same plans; the real arm also checks every onboarded byte.
//!
//! What may differ between the arms, and how the bodies keep it out: time (the arms
//! complete transfers on their own clocks, so a body waits until nothing is in flight
//! before it records anything), the order in which concurrent transfers complete (a
//! phase's events are compared as a sorted list; their numbering is compared as a
//! whole: one per event, no gap), and cost estimates (onboarding is `Always`, so a plan
//! never depends on what a transfer is predicted to cost).

mod common;

use kvtwin::block::BlockIdentity;
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::hardware::{Clock, Hardware};
use kvtwin::ids::{LocalBlockHash, RequestId, SequenceHash, Timestamp};
use kvtwin::layout::{DType, LayoutConfig};
use kvtwin::manager::{Manager, ManagerConfig, ManagerOutput};
use kvtwin::pool::BlockChain;
use kvtwin::tier::Tier;
use kvtwin_backends::content::KvContent;
use kvtwin_backends::host::HostHardware;
use kvtwin_sim::hardware::SimHardware;
use kvtwin_sim::scenario::Scenario;
use std::path::Path;
use std::time::{Duration, Instant};

/// 4 layers of 16 tokens × 2 KV heads × 16 dims × 2 (K and V) in f16: 8 KiB a block.
fn layout() -> LayoutConfig {
    LayoutConfig::for_model(4, 16, 2, 16, DType::F16).unwrap()
}

/// A small worker: 8 device blocks writing through to 10 host blocks, which write
/// through to 32 disk blocks; onboarding always (see the module doc).
fn scenario() -> Scenario {
    let bytes = layout().block_bytes().unwrap();
    let text = format!(
        r#"(
            name: "conformance", seed: 1,
            hardware: (
                name: "h", pcie_bytes_per_s: 1000000000, pcie_latency_ns: 1000,
                nvme_read_bytes_per_s: 1000000000, nvme_write_bytes_per_s: 1000000000,
                nvme_latency_ns: 10000, nic_bytes_per_s: 1000000000, nic_latency_ns: 1000,
                prefill_ns_per_token: 1000, decode_ns_per_token: 100000,
                max_inflight_transfers: 64,
            ),
            worker: (
                block_size_tokens: 16, bytes_per_block: {bytes}, onboard: Always,
                max_inflight_transfers: 64,
                tiers: [
                    (tier: Device, capacity_blocks: 8, eviction: Lru, offload: WriteThrough),
                    (tier: Host, capacity_blocks: 10, eviction: Lru, offload: WriteThrough),
                    (tier: Disk, capacity_blocks: 32, eviction: Lru),
                ],
            ),
            workload: MooncakeTrace(path: "unused.jsonl"),
        )"#
    );
    Scenario::parse(&text, Path::new("conformance.ron")).unwrap()
}

/// One way of moving bytes under a `Manager`.
trait Arm {
    type H: Hardware;
    fn manager(&self) -> &Manager<Self::H>;
    fn manager_mut(&mut self) -> &mut Manager<Self::H>;
    fn now(&self) -> Timestamp;
    /// Lets time pass until nothing is in flight, handing completions to the manager.
    fn settle(&mut self) -> Vec<ManagerOutput>;
    /// Gives device block `block` the content of `hash` (the real arm writes bytes).
    fn fill(&mut self, block: kvtwin::ids::BlockId, hash: SequenceHash);
    /// Checks that device blocks hold their content (the real arm reads bytes back).
    fn check(&self, chain: &BlockChain);
}

struct SimArm {
    m: Manager<SimHardware>,
}

impl SimArm {
    fn new(scenario: &Scenario) -> Self {
        let hardware =
            SimHardware::new(scenario.hardware.clone(), scenario.worker.block_size_tokens);
        let m = Manager::new(hardware, scenario.worker.manager_config()).unwrap();
        Self { m }
    }
}

impl Arm for SimArm {
    type H = SimHardware;
    fn manager(&self) -> &Manager<SimHardware> {
        &self.m
    }
    fn manager_mut(&mut self) -> &mut Manager<SimHardware> {
        &mut self.m
    }
    fn now(&self) -> Timestamp {
        self.m.hardware().clock().now()
    }
    fn settle(&mut self) -> Vec<ManagerOutput> {
        let mut outputs = Vec::new();
        loop {
            let now = self.now();
            self.m.handle_completions(now);
            outputs.extend(std::iter::from_fn(|| self.m.poll_output()));
            let Some(next) = self.m.hardware().next_deadline() else {
                assert_eq!(
                    self.m.transfers_in_flight(),
                    0,
                    "a transfer without deadline"
                );
                return outputs;
            };
            self.m.hardware().clock().set(next.max(now));
        }
    }
    fn fill(&mut self, _block: kvtwin::ids::BlockId, _hash: SequenceHash) {}
    fn check(&self, _chain: &BlockChain) {}
}

struct HostArm {
    m: Manager<HostHardware>,
    content: KvContent,
    _dir: tempfile::TempDir,
}

impl HostArm {
    fn new(config: &ManagerConfig) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let hardware = HostHardware::for_manager(config, Some(dir.path())).unwrap();
        Self {
            m: Manager::new(hardware, config.clone()).unwrap(),
            content: KvContent::for_layout(&layout()).unwrap(),
            _dir: dir,
        }
    }
}

impl Arm for HostArm {
    type H = HostHardware;
    fn manager(&self) -> &Manager<HostHardware> {
        &self.m
    }
    fn manager_mut(&mut self) -> &mut Manager<HostHardware> {
        &mut self.m
    }
    fn now(&self) -> Timestamp {
        self.m.hardware().clock().now()
    }
    fn settle(&mut self) -> Vec<ManagerOutput> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut outputs = Vec::new();
        loop {
            let now = self.now();
            self.m.handle_completions(now);
            outputs.extend(std::iter::from_fn(|| self.m.poll_output()));
            if self.m.transfers_in_flight() == 0 {
                return outputs;
            }
            assert!(Instant::now() < deadline, "transfers did not finish");
            self.m
                .hardware()
                .wait_completion(Duration::from_millis(100));
        }
    }
    fn fill(&mut self, block: kvtwin::ids::BlockId, hash: SequenceHash) {
        let bytes = self.content.block(hash);
        self.m
            .hardware()
            .write_block(Tier::Device, block, &bytes)
            .unwrap();
    }
    fn check(&self, chain: &BlockChain) {
        let mut bytes = vec![0; self.content.block_bytes()];
        for (block, hash) in chain.block_ids().zip(chain.sequence_hashes()) {
            self.m
                .hardware()
                .read_block(Tier::Device, block, &mut bytes)
                .unwrap();
            assert_eq!(self.content.check(hash, &bytes), Ok(()), "{block:?}");
        }
    }
}

fn chain(first_local: u64, len: u64) -> Vec<BlockIdentity> {
    let locals: Vec<LocalBlockHash> = (first_local..first_local + len)
        .map(LocalBlockHash::new)
        .collect();
    BlockIdentity::chain(&locals)
}

fn hashes(ids: &[BlockIdentity]) -> Vec<SequenceHash> {
    ids.iter().map(|b| b.sequence_hash).collect()
}

/// What a body saw, one line per fact; both arms must write the same lines.
#[derive(Debug, Default)]
struct Record {
    lines: Vec<String>,
    events: Vec<KvCacheEvent>,
}

impl Record {
    fn line(&mut self, line: String) {
        self.lines.push(line);
    }

    /// Takes the manager's events and writes the phase's, sorted.
    fn events<H: Hardware>(&mut self, phase: &str, m: &mut Manager<H>) {
        let events = m.take_events();
        let mut described: Vec<String> = events.iter().map(describe).collect();
        described.sort();
        for event in described {
            self.lines.push(format!("{phase}: {event}"));
        }
        self.events.extend(events);
    }

    /// Writes every tier's registry, sorted.
    fn registries<H: Hardware>(&mut self, phase: &str, m: &Manager<H>) {
        for tier in Tier::ALL {
            if let Some(pool) = m.pool(tier) {
                let mut registered: Vec<u64> =
                    pool.snapshot().registered.keys().map(|h| h.get()).collect();
                registered.sort_unstable();
                self.lines
                    .push(format!("{phase}: {tier} holds {registered:?}"));
            }
        }
    }
}

fn describe(event: &KvCacheEvent) -> String {
    match &event.data {
        KvCacheEventData::Stored {
            parent_hash,
            blocks,
            tier,
        } => {
            let hashes: Vec<u64> = blocks.iter().map(|b| b.block_hash.get()).collect();
            format!(
                "stored {tier} under {:?}: {hashes:?}",
                parent_hash.map(|h| h.get())
            )
        }
        KvCacheEventData::Removed { block_hashes, tier } => {
            let hashes: Vec<u64> = block_hashes.iter().map(|h| h.get()).collect();
            format!("removed {tier}: {hashes:?}")
        }
        KvCacheEventData::Cleared => "cleared".to_string(),
    }
}

/// Computes `ids` on device (allocate, fill, register) and lets them go.
fn compute<A: Arm>(arm: &mut A, ids: &[BlockIdentity]) {
    let now = arm.now();
    let blocks = arm.manager_mut().allocate(ids.len(), now).unwrap();
    for (block, id) in blocks.iter().zip(ids) {
        arm.fill(block.block_id(), id.sequence_hash);
    }
    let complete = blocks
        .into_iter()
        .zip(ids)
        .map(|(block, id)| block.apply_identity(*id))
        .collect();
    let registered = arm.manager_mut().register(complete, now);
    arm.manager().device().release(registered);
}

/// Looks `ids` up and onboards the lower-tier hits; records the plan and the outcome
/// and checks the onboarded bytes.
fn look_up_and_onboard<A: Arm>(arm: &mut A, ids: &[BlockIdentity], record: &mut Record) {
    let now = arm.now();
    let mut plan = arm.manager_mut().lookup(&hashes(ids), now);
    record.line(format!(
        "plan: {} on device, {} from host, {} from disk, {} to compute",
        plan.device_blocks().len(),
        plan.onboard_count(Tier::Host),
        plan.onboard_count(Tier::Disk),
        plan.blocks_to_compute()
    ));
    arm.check(plan.device_blocks());
    if plan.onboard_blocks().is_empty() {
        return;
    }
    let started = arm
        .manager_mut()
        .start_onboard(RequestId::new(7), &mut plan, now);
    record.line(format!("onboard started: {started:?}"));
    let device = plan.into_device_blocks();
    for output in arm.settle() {
        if let ManagerOutput::OnboardComplete {
            blocks,
            failed_blocks,
            ..
        } = output
        {
            record.line(format!(
                "onboarded {} blocks, {failed_blocks} failed",
                blocks.len()
            ));
            arm.check(&blocks);
            arm.manager().device().release(blocks);
        }
    }
    arm.manager().device().release(device);
}

/// The body both arms run: three chains through a device of 8 blocks and a host of 10,
/// every block written through to disk; then each chain is looked up and onboarded from
/// wherever it still is (the first only on disk by then).
fn body<A: Arm>(arm: &mut A) -> Record {
    let mut record = Record::default();
    let (a, b, c) = (chain(100, 6), chain(200, 8), chain(300, 6));
    for (name, ids) in [("a", &a), ("b", &b), ("c", &c)] {
        compute(arm, ids);
        let outputs = arm.settle();
        record.line(format!("{name}: {} outputs", outputs.len()));
        record.events(name, arm.manager_mut());
        record.registries(name, arm.manager());
    }
    for (name, ids) in [("lookup a", &a), ("lookup c", &c), ("lookup b", &b)] {
        look_up_and_onboard(arm, ids, &mut record);
        let _ = arm.settle();
        record.events(name, arm.manager_mut());
        record.registries(name, arm.manager());
    }
    let stats = arm.manager().stats();
    record.line(format!("stats: {stats:?}"));
    record
}

#[test]
fn the_simulator_and_host_hardware_give_the_same_states_events_and_plans() {
    let scenario = scenario();
    let mut sim = SimArm::new(&scenario);
    let mut host = HostArm::new(&scenario.worker.manager_config());
    let simulated = body(&mut sim);
    let real = body(&mut host);
    if std::env::var("KVTWIN_SHOW").is_ok() {
        eprintln!("{:#?}", simulated.lines);
    }
    for (line, (s, r)) in simulated.lines.iter().zip(&real.lines).enumerate() {
        assert_eq!(s, r, "line {line} differs");
    }
    assert_eq!(simulated.lines.len(), real.lines.len());
    // Events are numbered one by one from 0 on both arms.
    for record in [&simulated, &real] {
        let ids: Vec<u64> = record.events.iter().map(|e| e.event_id).collect();
        assert_eq!(ids, (0..ids.len() as u64).collect::<Vec<_>>());
    }
    // The body reached every tier: the first chain was onboarded from disk.
    assert!(
        simulated
            .lines
            .iter()
            .any(|l| l.starts_with("plan:") && !l.contains(" 0 from disk")),
        "{:#?}",
        simulated.lines
    );
    // Host transfers moved real bytes: onboards were checked by `HostArm::check`.
    let counters = host.manager().hardware().counters();
    assert!(counters.bytes_between(Tier::Disk, Tier::Device) > 0);
    assert!(counters.bytes_between(Tier::Host, Tier::Device) > 0);
}
