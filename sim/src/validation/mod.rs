//! Validation scripts: the same transfer-heavy script on any two `Hardware`s, and the
//! comparison of what they did.
//!
//! Owns: [`ValidationScenario`] (the RON type of `scenarios/validate_*.ron`, strict:
//! unknown fields rejected, errors name file, line and column), [`load_profile`] (a
//! [`HardwareProfile`] file, as `kvtwin calibrate` writes it), [`Timed`] (a `Hardware`
//! wrapper that records every transfer's tiers, bytes, submission and completion),
//! [`run_script`] (the script, driven through a `Manager` on any [`Arm`]), and
//! [`compare`] (per metric: real, simulated, error); repeated runs are summarised in
//! [`spread`] (error range beside the machine's own spread, verdicts against the targets).
//!
//! The script: a worker whose device writes through to host and host through to disk;
//! per level of concurrency, new chains are computed on the device (each registration
//! copies the chain device → host, then host → disk), then their device copies are
//! dropped and they are onboarded from host, then their device and host copies are
//! dropped and they are onboarded from disk; at most `in_flight` transfers in flight at
//! any time (a new chain or onboarding starts whenever fewer are). Each phase ends when
//! nothing is in flight, so arms that run at different speeds still move the same blocks
//! between the same tiers.
//!
//! Files named `validate_*.ron` in `scenarios/` are validation scripts, not simulation
//! scenarios: [`is_validation_file`] says which, so that the tests that load every
//! scenario as a [`crate::scenario::Scenario`] leave them to `kvtwin validate`.
//! Never: read a clock (an arm's clock is its own: simulated here, real in the backend's
//! arm) or know about real hardware (that arm lives in `kvtwin-backends`).

mod spread;

pub use spread::{spread, target_pct, MetricSpread, Verdict};

use crate::hardware::{HardwareProfile, SimHardware};
use crate::ron_file::{self, RonFileError};
use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEvent;
use kvtwin::hardware::{Clock, Completion, Hardware, SubmitError, TransferRequest};
use kvtwin::ids::{LocalBlockHash, RequestId, SequenceHash, Timestamp, TransferId, WorkerId};
use kvtwin::manager::{
    settle, Driver, Manager, ManagerConfig, ManagerConfigError, ManagerOutput, OffloadPolicy,
    OnboardError, OnboardPolicy, TierConfig,
};
use kvtwin::pool::{AllocError, EvictionPolicyKind};
use kvtwin::stats::nearest_rank;
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The worker a validation script runs on: device → host → disk, write-through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationWorker {
    /// Bytes of one block.
    pub bytes_per_block: u64,
    /// Device blocks (at least `in_flight × chain_blocks` of every level).
    pub device_blocks: usize,
    /// Host blocks (at least `chains × chain_blocks` of every level).
    pub host_blocks: usize,
    /// Disk blocks (at least `chains × chain_blocks` of every level).
    pub disk_blocks: usize,
    /// Transfers in flight at most (the manager's and the hardware's bound).
    pub max_inflight_transfers: usize,
}

/// One level of concurrency.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Level {
    /// Transfers kept in flight.
    pub in_flight: usize,
    /// New chains this level computes, offloads and onboards.
    pub chains: usize,
}

/// A step of each level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PhaseKind {
    /// Compute the level's chains on the device: device → host, then host → disk.
    Offload,
    /// Drop their device copies and onboard them from host: host → device.
    OnboardFromHost,
    /// Drop their device and host copies and onboard them from disk: disk → device.
    OnboardFromDisk,
}

impl PhaseKind {
    /// The phase's name in metrics.
    pub const fn name(self) -> &'static str {
        match self {
            PhaseKind::Offload => "offload",
            PhaseKind::OnboardFromHost => "onboard_host",
            PhaseKind::OnboardFromDisk => "onboard_disk",
        }
    }
}

/// A validation script (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationScenario {
    /// Name for reports.
    pub name: String,
    /// The worker.
    pub worker: ValidationWorker,
    /// Blocks per chain (one transfer moves a chain).
    pub chain_blocks: usize,
    /// The levels, run in order.
    pub levels: Vec<Level>,
    /// The phases of each level, run in order; `OnboardFromHost` and `OnboardFromDisk`
    /// need an `Offload` before them.
    pub phases: Vec<PhaseKind>,
}

/// A validation script or profile could not be loaded, or the script could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValidationError {
    /// The file could not be read, or its RON is malformed or does not fit the type
    /// (the error names the file, and the line and column).
    #[error(transparent)]
    File(#[from] RonFileError),
    /// The script is not runnable.
    #[error("{path}: {field}: {reason}", path = path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Which field.
        field: String,
        /// What is wrong.
        reason: String,
    },
    /// The worker configuration is not runnable.
    #[error("worker: {0}")]
    Config(#[from] ManagerConfigError),
    /// The device had no room for a chain.
    #[error("allocating a chain: {0}")]
    Alloc(#[from] AllocError),
    /// An onboarding could not start.
    #[error("onboarding: {0}")]
    Onboard(#[from] OnboardError),
    /// A chain was not where the script put it.
    #[error("{phase}: chain {chain}: {reason}")]
    Misplaced {
        /// The phase.
        phase: &'static str,
        /// Which chain of the level.
        chain: usize,
        /// What was found.
        reason: String,
    },
    /// A transfer failed.
    #[error("{phase}: {blocks} blocks failed to transfer")]
    Failed {
        /// The phase.
        phase: &'static str,
        /// Blocks lost.
        blocks: usize,
    },
    /// Transfers in flight never finished.
    #[error("{phase}: {in_flight} transfers did not finish")]
    Stuck {
        /// The phase.
        phase: &'static str,
        /// Transfers still in flight.
        in_flight: usize,
    },
}

/// Reads a hardware profile (a `HardwareProfile` in RON, as `kvtwin calibrate` writes).
pub fn load_profile(path: &Path) -> Result<HardwareProfile, ValidationError> {
    Ok(ron_file::load(path)?)
}

/// Whether `path` names a validation script by the convention of `scenarios/`:
/// `validate_*.ron`.
pub fn is_validation_file(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.starts_with("validate_") && name.ends_with(".ron"))
}

impl ValidationScenario {
    /// Reads and checks the script at `path`.
    pub fn load(path: &Path) -> Result<Self, ValidationError> {
        Self::parse(&ron_file::read(path)?, path)
    }

    /// Parses and checks script text; `path` is for error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ValidationError> {
        let script: Self = ron_file::parse(text, path)?;
        script.check(path)?;
        Ok(script)
    }

    fn check(&self, path: &Path) -> Result<(), ValidationError> {
        let invalid = |field: &str, reason: String| ValidationError::Invalid {
            path: path.to_owned(),
            field: field.to_string(),
            reason,
        };
        let w = &self.worker;
        if self.chain_blocks == 0 {
            return Err(invalid("chain_blocks", "must be at least 1".into()));
        }
        if self.levels.is_empty() {
            return Err(invalid("levels", "at least one level".into()));
        }
        if self.phases.first() != Some(&PhaseKind::Offload) {
            return Err(invalid("phases", "must start with Offload".into()));
        }
        for (index, level) in self.levels.iter().enumerate() {
            let field = format!("levels[{index}]");
            if level.in_flight == 0 || level.chains == 0 {
                return Err(invalid(
                    &field,
                    "in_flight and chains must be at least 1".into(),
                ));
            }
            if level.in_flight > w.max_inflight_transfers {
                return Err(invalid(
                    &field,
                    format!(
                        "in_flight {} exceeds worker.max_inflight_transfers {}",
                        level.in_flight, w.max_inflight_transfers
                    ),
                ));
            }
            let blocks = level.chains.saturating_mul(self.chain_blocks);
            let in_flight = level.in_flight.saturating_mul(self.chain_blocks);
            if w.device_blocks < in_flight.saturating_mul(2) {
                return Err(invalid(
                    "worker.device_blocks",
                    format!("{field} needs at least {}", in_flight.saturating_mul(2)),
                ));
            }
            for (name, have) in [
                ("worker.host_blocks", w.host_blocks),
                ("worker.disk_blocks", w.disk_blocks),
            ] {
                if have < blocks {
                    return Err(invalid(name, format!("{field} needs at least {blocks}")));
                }
            }
        }
        self.manager_config()
            .validate()
            .map_err(|source| invalid("worker", source.to_string()))
    }

    /// The manager configuration of the script's worker.
    pub fn manager_config(&self) -> ManagerConfig {
        let w = &self.worker;
        let tier = |tier, capacity_blocks, offload| TierConfig {
            tier,
            capacity_blocks,
            eviction: EvictionPolicyKind::Lru,
            offload,
        };
        ManagerConfig {
            worker_id: WorkerId::new(0),
            dp_rank: 0,
            block_size_tokens: 16,
            bytes_per_block: w.bytes_per_block,
            tiers: vec![
                tier(Tier::Device, w.device_blocks, OffloadPolicy::WriteThrough),
                tier(Tier::Host, w.host_blocks, OffloadPolicy::WriteThrough),
                tier(Tier::Disk, w.disk_blocks, OffloadPolicy::None),
            ],
            onboard: OnboardPolicy::Always,
            max_inflight_transfers: w.max_inflight_transfers,
        }
    }
}

/// One transfer as a [`Timed`] hardware saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferRecord {
    /// The phase it was submitted in (index into [`Trace::phases`]).
    pub phase: usize,
    /// Source tier.
    pub src: Tier,
    /// Destination tier.
    pub dst: Tier,
    /// Bytes moved.
    pub bytes: u64,
    /// When it was submitted.
    pub submitted: Timestamp,
    /// When the manager was handed its completion.
    pub completed: Timestamp,
}

/// A `Hardware` that records every transfer (see [`TransferRecord`]) and otherwise
/// passes everything to the hardware it wraps.
#[derive(Debug)]
pub struct Timed<H> {
    inner: H,
    phase: usize,
    open: BTreeMap<u64, (usize, Tier, Tier, u64, Timestamp)>,
    records: Vec<TransferRecord>,
}

impl<H> Timed<H> {
    /// Wraps `inner`.
    pub fn new(inner: H) -> Self {
        Self {
            inner,
            phase: 0,
            open: BTreeMap::new(),
            records: Vec::new(),
        }
    }

    /// The wrapped hardware.
    pub fn inner(&self) -> &H {
        &self.inner
    }

    /// Transfers submitted from now on belong to `phase`.
    pub fn set_phase(&mut self, phase: usize) {
        self.phase = phase;
    }

    /// Every completed transfer so far, in completion order.
    pub fn records(&self) -> &[TransferRecord] {
        &self.records
    }
}

impl<H: Hardware> Hardware for Timed<H> {
    type Clock = H::Clock;
    type Fabric = H::Fabric;
    type Storage = H::Storage;

    fn clock(&self) -> &H::Clock {
        self.inner.clock()
    }

    fn fabric(&self) -> &H::Fabric {
        self.inner.fabric()
    }

    fn storage(&mut self) -> &mut H::Storage {
        self.inner.storage()
    }

    fn submit(
        &mut self,
        request: TransferRequest,
        now: Timestamp,
    ) -> Result<TransferId, SubmitError> {
        let (src, dst, bytes) = (request.src_tier, request.dst_tier, request.bytes);
        let id = self.inner.submit(request, now)?;
        self.open
            .insert(id.get(), (self.phase, src, dst, bytes, now));
        Ok(id)
    }

    fn poll_completion(&mut self, now: Timestamp) -> Option<Completion> {
        let completion = self.inner.poll_completion(now)?;
        if let Some((phase, src, dst, bytes, submitted)) = self.open.remove(&completion.id.get()) {
            self.records.push(TransferRecord {
                phase,
                src,
                dst,
                bytes,
                submitted,
                completed: now,
            });
        }
        Some(completion)
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        self.inner.next_deadline()
    }

    fn estimate_transfer(&self, src: Tier, dst: Tier, bytes: u64) -> Duration {
        self.inner.estimate_transfer(src, dst, bytes)
    }

    fn estimate_recompute(&self, blocks: usize) -> Duration {
        self.inner.estimate_recompute(blocks)
    }

    fn single_threaded(&self) -> bool {
        self.inner.single_threaded()
    }
}

/// One way of letting time pass under a `Manager<Timed<H>>`.
pub trait Arm {
    /// The hardware.
    type H: Hardware;
    /// The manager.
    fn manager(&mut self) -> &mut Manager<Timed<Self::H>>;
    /// Lets time pass until a transfer in flight may have finished; `false` when none
    /// will (nothing in flight, or the hardware gave up waiting).
    fn wait(&mut self) -> bool;
}

/// The simulator's arm: time jumps to the hardware's next deadline.
#[derive(Debug)]
pub struct SimArm {
    manager: Manager<Timed<SimHardware>>,
}

impl SimArm {
    /// A manager for `script` on a `SimHardware` with `profile`.
    pub fn new(
        script: &ValidationScenario,
        profile: HardwareProfile,
    ) -> Result<Self, ValidationError> {
        let config = script.manager_config();
        let hardware = SimHardware::new(profile, config.block_size_tokens);
        Ok(Self {
            manager: Manager::new(Timed::new(hardware), config)?,
        })
    }
}

impl Arm for SimArm {
    type H = SimHardware;

    fn manager(&mut self) -> &mut Manager<Timed<SimHardware>> {
        &mut self.manager
    }

    fn wait(&mut self) -> bool {
        let hardware = self.manager.hardware();
        let now = hardware.clock().now();
        match hardware.next_deadline() {
            Some(next) => {
                hardware.inner().clock().set(next.max(now));
                true
            }
            None => false,
        }
    }
}

/// One phase as run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhaseRecord {
    /// Its level's transfers in flight.
    pub in_flight: usize,
    /// What it did.
    pub kind: PhaseKind,
}

/// What an arm did: its phases and every transfer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The phases in order.
    pub phases: Vec<PhaseRecord>,
    /// Every transfer, in completion order.
    pub transfers: Vec<TransferRecord>,
}

enum Op {
    Compute(usize),
    Onboard(usize),
}

fn chains(first: u64, count: usize, blocks: usize) -> Vec<Vec<BlockIdentity>> {
    (0..count as u64)
        .map(|c| {
            let base = first + c * blocks as u64;
            let locals: Vec<LocalBlockHash> = (base..base + blocks as u64)
                .map(LocalBlockHash::new)
                .collect();
            BlockIdentity::chain(&locals)
        })
        .collect()
}

/// Runs `script` on `arm`: every phase of every level, each to its end.
pub fn run_script<A: Arm>(
    arm: &mut A,
    script: &ValidationScenario,
) -> Result<Trace, ValidationError> {
    let mut trace = Trace::default();
    let mut next_local = 1u64;
    let mut request = 0u64;
    for level in &script.levels {
        let level_chains = chains(next_local, level.chains, script.chain_blocks);
        next_local += (level.chains * script.chain_blocks) as u64;
        for &kind in &script.phases {
            arm.manager().hardware_mut().set_phase(trace.phases.len());
            trace.phases.push(PhaseRecord {
                in_flight: level.in_flight,
                kind,
            });
            let hashes: Vec<Vec<SequenceHash>> = level_chains
                .iter()
                .map(|c| c.iter().map(|b| b.sequence_hash).collect())
                .collect();
            let ops: VecDeque<Op> = match kind {
                PhaseKind::Offload => (0..level.chains).map(Op::Compute).collect(),
                PhaseKind::OnboardFromHost | PhaseKind::OnboardFromDisk => {
                    let drop_from: &[Tier] = if kind == PhaseKind::OnboardFromHost {
                        &[Tier::Device]
                    } else {
                        &[Tier::Device, Tier::Host]
                    };
                    let m = arm.manager();
                    for tier in drop_from {
                        if let Some(pool) = m.pool(*tier) {
                            for chain in &hashes {
                                pool.invalidate(chain);
                            }
                        }
                    }
                    let _ = m.take_events();
                    (0..level.chains).map(Op::Onboard).collect()
                }
            };
            run_phase(
                arm,
                kind,
                level.in_flight,
                ops,
                &level_chains,
                &hashes,
                &mut request,
            )?;
        }
    }
    trace.transfers = arm.manager().hardware().records().to_vec();
    Ok(trace)
}

fn run_phase<A: Arm>(
    arm: &mut A,
    kind: PhaseKind,
    in_flight: usize,
    mut ops: VecDeque<Op>,
    chains: &[Vec<BlockIdentity>],
    hashes: &[Vec<SequenceHash>],
    request: &mut u64,
) -> Result<(), ValidationError> {
    let phase = kind.name();
    let from = match kind {
        PhaseKind::OnboardFromHost => Tier::Host,
        _ => Tier::Disk,
    };
    loop {
        let now = arm.manager().hardware().clock().now();
        let mut phase_driver = PhaseDriver {
            manager: arm.manager(),
            failed_blocks: 0,
        };
        // The events are not needed: the script measures transfers.
        let _ = settle(&mut phase_driver, now);
        if phase_driver.failed_blocks > 0 {
            return Err(ValidationError::Failed {
                phase,
                blocks: phase_driver.failed_blocks,
            });
        }
        let m = arm.manager();
        while m.transfers_in_flight() < in_flight {
            let Some(op) = ops.pop_front() else { break };
            match op {
                Op::Compute(chain) => {
                    let ids = &chains[chain];
                    let blocks = m.allocate(ids.len(), now)?;
                    let complete = blocks
                        .into_iter()
                        .zip(ids)
                        .map(|(block, id)| block.apply_identity(*id))
                        .collect();
                    let registered = m.register(complete, now);
                    m.device().release(registered);
                }
                Op::Onboard(chain) => {
                    let mut plan = m.lookup(&hashes[chain], now);
                    let found = plan.onboard_count(from);
                    if found != hashes[chain].len() {
                        return Err(ValidationError::Misplaced {
                            phase,
                            chain,
                            reason: format!(
                                "{found} of {} blocks found on {from}",
                                hashes[chain].len()
                            ),
                        });
                    }
                    *request += 1;
                    m.start_onboard(RequestId::new(*request), &mut plan, now)?;
                    m.device().release(plan.into_device_blocks());
                }
            }
        }
        if ops.is_empty() && m.transfers_in_flight() == 0 {
            return Ok(());
        }
        let in_flight = m.transfers_in_flight();
        if !arm.wait() {
            return Err(ValidationError::Stuck { phase, in_flight });
        }
    }
}

/// A phase's manager as the drain loop drives it: finished onboardings let their blocks
/// go, and failures are kept for the phase to report.
struct PhaseDriver<'m, H: Hardware> {
    manager: &'m mut Manager<Timed<H>>,
    /// Blocks that failed to transfer (onboardings that did not arrive, offloads lost).
    failed_blocks: usize,
}

impl<H: Hardware> Driver for PhaseDriver<'_, H> {
    type Hardware = Timed<H>;

    fn manager(&mut self) -> &mut Manager<Timed<H>> {
        self.manager
    }

    fn on_output(&mut self, output: ManagerOutput) {
        match output {
            ManagerOutput::OnboardComplete {
                blocks,
                failed_blocks,
                ..
            } => {
                self.manager.device().release(blocks);
                self.failed_blocks += failed_blocks;
            }
            ManagerOutput::OffloadFailed { blocks, .. } => self.failed_blocks += blocks,
            ManagerOutput::Offloaded { .. } => {}
        }
    }

    fn on_event(&mut self, _event: KvCacheEvent) {}
}

/// One compared figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metric {
    /// What it measures (unit in the name).
    pub name: String,
    /// On the real backend.
    pub real: f64,
    /// On the simulator.
    pub sim: f64,
    /// `(sim − real) / real × 100`.
    pub error_pct: f64,
}

impl Metric {
    /// A metric with its error computed (100 % when only the real figure is 0).
    pub fn new(name: String, real: f64, sim: f64) -> Self {
        let error_pct = if real != 0.0 {
            (sim - real) / real * 100.0
        } else if sim == 0.0 {
            0.0
        } else {
            100.0
        };
        Self {
            name,
            real,
            sim,
            error_pct,
        }
    }
}

/// The name of a tier pair in metrics.
pub fn pair_name(src: Tier, dst: Tier) -> String {
    format!(
        "{}->{}",
        src.to_string().to_lowercase(),
        dst.to_string().to_lowercase()
    )
}

/// Total length of the union of `[start, end)` intervals, in nanoseconds.
pub fn union_ns(mut intervals: Vec<(u64, u64)>) -> u64 {
    intervals.sort_unstable();
    let mut total = 0u64;
    let mut current: Option<(u64, u64)> = None;
    for (start, end) in intervals {
        current = match current {
            Some((s, e)) if start <= e => Some((s, e.max(end))),
            Some((s, e)) => {
                total += e - s;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total + current.map_or(0, |(s, e)| e - s)
}

/// The figures of one trace, by metric name (see [`compare`]).
fn figures(trace: &Trace) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let span = |records: &[&TransferRecord]| -> f64 {
        let start = records.iter().map(|r| r.submitted.as_nanos()).min();
        let end = records.iter().map(|r| r.completed.as_nanos()).max();
        match (start, end) {
            (Some(s), Some(e)) => (e - s) as f64,
            _ => 0.0,
        }
    };
    let mut total_ns = 0.0;
    for (index, phase) in trace.phases.iter().enumerate() {
        let records: Vec<&TransferRecord> = trace
            .transfers
            .iter()
            .filter(|r| r.phase == index)
            .collect();
        let ns = span(&records);
        total_ns += ns;
        out.insert(
            format!("time_ms.c{}.{}", phase.in_flight, phase.kind.name()),
            ns / 1e6,
        );
    }
    out.insert("time_ms.total".to_string(), total_ns / 1e6);
    let mut pairs: BTreeMap<(Tier, Tier), Vec<&TransferRecord>> = BTreeMap::new();
    for record in &trace.transfers {
        pairs
            .entry((record.src, record.dst))
            .or_default()
            .push(record);
    }
    let latency_us = |r: &&TransferRecord| {
        r.completed
            .saturating_duration_since(r.submitted)
            .as_nanos() as f64
            / 1e3
    };
    for ((src, dst), records) in &pairs {
        let pair = pair_name(*src, *dst);
        let mut all: Vec<f64> = records.iter().map(latency_us).collect();
        all.sort_by(f64::total_cmp);
        out.insert(
            format!("latency_p50_us.{pair}"),
            nearest_rank(&all, 0.5).unwrap_or(0.0),
        );
        out.insert(
            format!("latency_p99_us.{pair}"),
            nearest_rank(&all, 0.99).unwrap_or(0.0),
        );
        let mut levels: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for record in records {
            let level = trace.phases.get(record.phase).map_or(0, |p| p.in_flight);
            levels.entry(level).or_default().push(latency_us(record));
        }
        for (level, mut values) in levels {
            values.sort_by(f64::total_cmp);
            out.insert(
                format!("latency_p50_us.c{level}.{pair}"),
                nearest_rank(&values, 0.5).unwrap_or(0.0),
            );
            out.insert(
                format!("latency_p99_us.c{level}.{pair}"),
                nearest_rank(&values, 0.99).unwrap_or(0.0),
            );
        }
        let bytes: u64 = records.iter().map(|r| r.bytes).sum();
        let busy = union_ns(
            records
                .iter()
                .map(|r| (r.submitted.as_nanos(), r.completed.as_nanos()))
                .collect(),
        );
        out.insert(
            format!("bandwidth_gbps.{pair}"),
            bytes as f64 / (busy.max(1) as f64),
        );
    }
    out
}

/// Per metric, the real and the simulated figure and the error, in a fixed order: total
/// time, each phase's time, then per tier pair the latency p50 and p99 (all levels, then
/// per level) and the bandwidth it achieved while its transfers were in flight. A metric
/// only one trace has is compared with 0.
pub fn compare(real: &Trace, sim: &Trace) -> Vec<Metric> {
    let (real, sim) = (figures(real), figures(sim));
    let mut names: Vec<&String> = real.keys().chain(sim.keys()).collect();
    names.sort_by_key(|name| (metric_rank(name), (*name).clone()));
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            Metric::new(
                name.clone(),
                real.get(name).copied().unwrap_or(0.0),
                sim.get(name).copied().unwrap_or(0.0),
            )
        })
        .collect()
}

fn metric_rank(name: &str) -> u8 {
    match name {
        "time_ms.total" => 0,
        n if n.starts_with("time_ms.") => 1,
        n if n.starts_with("latency_p50_us.c") => 3,
        n if n.starts_with("latency_p50_us.") => 2,
        n if n.starts_with("latency_p99_us.c") => 5,
        n if n.starts_with("latency_p99_us.") => 4,
        _ => 6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script() -> ValidationScenario {
        ValidationScenario::parse(
            r#"(
                name: "t",
                worker: (bytes_per_block: 1000000, device_blocks: 16, host_blocks: 16,
                         disk_blocks: 16, max_inflight_transfers: 8),
                chain_blocks: 2,
                levels: [(in_flight: 1, chains: 3), (in_flight: 4, chains: 6)],
                phases: [Offload, OnboardFromHost, OnboardFromDisk],
            )"#,
            Path::new("t.ron"),
        )
        .unwrap()
    }

    fn profile() -> HardwareProfile {
        ron::from_str(
            r#"(name: "p", pcie_bytes_per_s: 1000000000, pcie_latency_ns: 1000,
                nvme_read_bytes_per_s: 500000000, nvme_write_bytes_per_s: 250000000,
                nvme_latency_ns: 10000, nic_bytes_per_s: 1, nic_latency_ns: 0,
                prefill_ns_per_token: 0, decode_ns_per_token: 0, max_inflight_transfers: 64,
                transfer_workers: 2)"#,
        )
        .unwrap()
    }

    #[test]
    fn the_script_moves_every_chain_through_every_tier_pair() {
        let script = script();
        let mut arm = SimArm::new(&script, profile()).unwrap();
        let trace = run_script(&mut arm, &script).unwrap();
        assert_eq!(trace.phases.len(), 6);
        let count = |src, dst| {
            trace
                .transfers
                .iter()
                .filter(|r| r.src == src && r.dst == dst)
                .count()
        };
        for (src, dst) in [
            (Tier::Device, Tier::Host),
            (Tier::Host, Tier::Disk),
            (Tier::Host, Tier::Device),
            (Tier::Disk, Tier::Device),
        ] {
            assert_eq!(count(src, dst), 9, "{src}->{dst}");
        }
        // One chain at a time: a host-to-device onboarding of 2 MB takes 2 ms + 1 µs.
        let h2d: Vec<u64> = trace
            .transfers
            .iter()
            .filter(|r| r.src == Tier::Host && r.dst == Tier::Device && r.phase == 1)
            .map(|r| {
                r.completed
                    .saturating_duration_since(r.submitted)
                    .as_nanos() as u64
            })
            .collect();
        assert_eq!(h2d, vec![2_001_000; 3]);
        // A trace compared with itself: every error is 0 and every figure finite.
        let metrics = compare(&trace, &trace);
        assert_eq!(metrics[0].name, "time_ms.total");
        assert!(metrics
            .iter()
            .all(|m| m.error_pct == 0.0 && m.real.is_finite() && m.sim.is_finite()));
        assert!(metrics
            .iter()
            .any(|m| m.name == "bandwidth_gbps.disk->device"));
    }

    #[test]
    fn unions_merge_overlaps_and_errors_are_relative() {
        assert_eq!(union_ns(vec![(5, 10), (0, 2), (1, 3), (9, 12)]), 3 + 7);
        assert!((Metric::new("x".into(), 10.0, 11.0).error_pct - 10.0).abs() < 1e-9);
        assert_eq!(Metric::new("x".into(), 0.0, 0.0).error_pct, 0.0);
    }

    #[test]
    fn bad_scripts_name_the_file_and_field() {
        let text = r#"(name: "t", worker: (bytes_per_block: 1, device_blocks: 1, host_blocks: 1,
            disk_blocks: 1, max_inflight_transfers: 1, extra: 2), chain_blocks: 1,
            levels: [], phases: [])"#;
        let error = ValidationScenario::parse(text, Path::new("x.ron")).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("x.ron:2:"), "{message}");
        assert!(message.contains("extra"), "{message}");
        let text = text
            .replace(", extra: 2", "")
            .replace("levels: []", "levels: [(in_flight: 4, chains: 2)]")
            .replace("phases: []", "phases: [Offload]");
        let error = ValidationScenario::parse(&text, Path::new("x.ron")).unwrap_err();
        assert!(error.to_string().contains("in_flight 4 exceeds"), "{error}");
        assert!(is_validation_file(Path::new(
            "scenarios/validate_host_disk.ron"
        )));
        assert!(!is_validation_file(Path::new("scenarios/default.ron")));
    }
}
