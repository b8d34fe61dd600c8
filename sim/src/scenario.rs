//! Scenarios: everything a run needs, in one RON file.
//!
//! Owns: [`Scenario`] and its parts, strict parsing (`deny_unknown_fields`: a misspelt
//! field is an error, not a default; read and parsed by [`crate::ron_file`]) and
//! [`ScenarioError`], which names the file, the line and column, and what was wrong
//! there.
//! Never: run anything.

use crate::autoscale::AutoscaleSpec;
use crate::hardware::{HardwareProfile, Link};
use crate::mooncake::{TraceCheck, TraceMismatch};
use crate::ron_file::{self, RonFileError};
use crate::shared::SharedTierSpec;
use crate::traffic::{TrafficError, TrafficSpec};
use crate::workload::{ConversationSpec, ReasoningSpec, Request};
use kvtwin::ids::WorkerId;
use kvtwin::manager::{ManagerConfig, ManagerConfigError, OnboardPolicy, TierConfig};
use kvtwin::router::scheduler::SchedulerConfig;
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One simulated worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSpec {
    /// Tokens per block.
    pub block_size_tokens: usize,
    /// Bytes of one block (all layers).
    pub bytes_per_block: u64,
    /// Tiers, fastest first.
    pub tiers: Vec<TierConfig>,
    /// When lower-tier hits are onboarded.
    pub onboard: OnboardPolicy,
    /// Transfers in flight at most.
    pub max_inflight_transfers: usize,
    /// How the worker batches forward passes.
    #[serde(default)]
    pub batching: Batching,
    /// Whether a prompt's partial last block is cached (registered and findable) like a
    /// full one. Engines cache full blocks only (off, the default); the Mooncake LRU
    /// reference treats every hash id as a cacheable block (on).
    #[serde(default)]
    pub cache_partial_blocks: bool,
    /// Whether blocks filled by generated tokens are cached too, as engines with prefix
    /// caching do (vLLM registers every full block). No later prompt hits them unless it
    /// repeats the output, but they take room in the cache like any other; reasoning
    /// blocks are tagged by phase for the priority policy (`Request::think_tokens`).
    /// Off by default: only prompt blocks are cached. Needs `batching.decode_blocks` and
    /// no `cache_partial_blocks`.
    #[serde(default)]
    pub cache_output_blocks: bool,
    /// What each worker is: kvtwin's own (the default: a `Manager` over `tiers`), or the
    /// twin of a vLLM V1 engine (`Vllm(())` for vLLM's CPU defaults, or
    /// `Vllm((max_num_seqs: 64, ...))`; see [`crate::vllm::run`]), which `kvtwin run`
    /// serves block for block as vLLM's scheduler and prefix cache do, its device tier
    /// the engine's cache. Left out of the JSON form when it is kvtwin's.
    #[serde(default, skip_serializing_if = "WorkerEngine::is_kvtwin")]
    pub engine: WorkerEngine,
}

/// What a scenario's workers are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkerEngine {
    /// kvtwin's worker: the block manager over the tiers, with its batching.
    #[default]
    Kvtwin,
    /// The twin of a vLLM engine with these scheduler settings.
    Vllm(crate::vllm::run::VllmEngineSpec),
}

impl WorkerEngine {
    /// Whether it is kvtwin's own worker.
    pub fn is_kvtwin(&self) -> bool {
        *self == WorkerEngine::Kvtwin
    }
}

/// Continuous batching: what one forward pass may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Batching {
    /// Sequences in one pass at most.
    pub max_seqs: usize,
    /// Tokens in one pass at most (decoding sequences count one each).
    pub max_batch_tokens: usize,
    /// Whether a prompt may be prefilled over several passes.
    pub chunked_prefill: bool,
    /// Whether generated tokens take device blocks (and so can force preemption). Off,
    /// the device holds prompts only: the cache-sizing view of the Mooncake reference.
    pub decode_blocks: bool,
    /// Whether runs of decode passes in which nothing but token counts changes are
    /// simulated as one event. The report is the same either way (a test checks it);
    /// only `engine_events` and the wall time differ. Off is for that check.
    pub plan_decode_steps: bool,
}

impl Default for Batching {
    /// vLLM's and DynoSim's defaults: 256 sequences, 8,192 tokens, chunked prefill.
    fn default() -> Self {
        Self {
            max_seqs: 256,
            max_batch_tokens: 8192,
            chunked_prefill: true,
            decode_blocks: true,
            plan_decode_steps: true,
        }
    }
}

impl WorkerSpec {
    /// The manager configuration of this worker.
    pub fn manager_config(&self) -> ManagerConfig {
        ManagerConfig {
            worker_id: WorkerId::new(0),
            dp_rank: 0,
            block_size_tokens: self.block_size_tokens,
            bytes_per_block: self.bytes_per_block,
            tiers: self.tiers.clone(),
            onboard: self.onboard,
            max_inflight_transfers: self.max_inflight_transfers,
        }
    }
}

/// How requests are spread over the workers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Routing {
    /// The KV-aware router: the scheduler's cost over the indexer's overlaps and the
    /// workers' load ([`kvtwin::router::scheduler`]).
    #[default]
    Kv,
    /// Each request to the next worker in turn (DynoSim's deterministic baseline).
    RoundRobin,
}

/// How KV events travel from the workers to the router.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventPlaneSpec {
    /// Time from a worker emitting an event to the router applying it.
    pub delay_us: u64,
    /// Probability that an event is lost on the way (drawn from the run's seed).
    pub drop_probability: f64,
    /// Every this many milliseconds each worker tells the router the id of its latest
    /// event (over the same plane), so that the router notices lost events even when
    /// nothing follows them; 0: never. A router that finds itself behind, or sees a gap
    /// in a worker's event ids, asks the worker for a snapshot of its caches.
    pub heartbeat_ms: u64,
}

/// Something that goes wrong during a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// When, from the start of the run.
    pub at_ms: u64,
    /// What.
    pub kind: FaultKind,
}

/// The faults a timeline can hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum FaultKind {
    /// The worker stops: its requests go back to the router (which forgets the worker)
    /// and start again elsewhere, and its caches are lost. It comes back empty after
    /// `down_ms`. Disaggregated, the KV handoffs from or to it are aborted, and its
    /// requests are prefilled again (see `crate::cluster`).
    WorkerCrash {
        /// Which worker (from 0).
        worker: usize,
        /// How long it stays down.
        down_ms: u64,
    },
    /// A link of one worker's node, or of every node, runs at `factor` of its speed for
    /// `for_ms` (an SSD failing slowly, a congested PCIe switch).
    LinkSlowdown {
        /// Which worker's node; every node if absent.
        worker: Option<usize>,
        /// Which link.
        link: Link,
        /// Its speed meanwhile, as a fraction (above 0).
        factor: f64,
        /// For how long.
        for_ms: u64,
    },
    /// Events are lost with `probability` (at least) for `for_ms`.
    EventLoss {
        /// The chance that an event is lost.
        probability: f64,
        /// For how long.
        for_ms: u64,
    },
    /// Events take `delay_us` longer for `for_ms`.
    EventLag {
        /// The extra delay.
        delay_us: u64,
        /// For how long.
        for_ms: u64,
    },
    /// The router loses its state; every worker then sends it a snapshot of its caches.
    RouterRestart,
    /// A worker's NVMe SSD fails: every block of its disk tier is lost (the router hears
    /// of it through `Removed` events), its transfers to or from the disk fail (an
    /// onboarding from disk falls back to recomputing), and while it is down nothing is
    /// written to it or read from it (the worker serves from device and host and
    /// recomputes the rest). It comes back empty after `down_ms`. The worker must have a
    /// disk tier.
    SsdFailure {
        /// Which worker (from 0).
        worker: usize,
        /// How long the disk stays down.
        down_ms: u64,
    },
}

impl FaultKind {
    /// What makes this fault impossible in a cluster of `workers` workers whose workers
    /// have a disk tier or not; `None` when it fits.
    pub fn problem(&self, workers: usize, has_disk: bool) -> Option<&'static str> {
        match self {
            FaultKind::WorkerCrash { worker, .. }
            | FaultKind::SsdFailure { worker, .. }
            | FaultKind::LinkSlowdown {
                worker: Some(worker),
                ..
            } if *worker >= workers => Some("names a worker the cluster does not have"),
            FaultKind::LinkSlowdown { factor, .. } if !(*factor > 0.0 && factor.is_finite()) => {
                Some("factor must be above 0")
            }
            FaultKind::EventLoss { probability, .. } if !(0.0..=1.0).contains(probability) => {
                Some("probability must be within 0..=1")
            }
            FaultKind::SsdFailure { .. } if !has_disk => {
                Some("an SSD failure needs a worker with a disk tier")
            }
            _ => None,
        }
    }
}

/// The cluster around the workers: how many, and how requests reach them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSpec {
    /// Identical workers, each on its own node of `hardware` (numbered from 0).
    pub workers: usize,
    /// How each request picks its worker.
    pub routing: Routing,
    /// The KV router's cost weights. Its `seed` is mixed with the scenario's seed, so one
    /// seed still fixes the run.
    pub scheduler: SchedulerConfig,
    /// The event plane between the workers and the router.
    pub event_plane: EventPlaneSpec,
    /// Separate prefill and decode pools, with the KV handoff over the fabric; absent
    /// (the default), every worker prefills and decodes its own requests.
    pub disaggregation: Option<Disaggregation>,
    /// A store every worker writes its blocks to and reads prefixes from (G4, see
    /// [`crate::shared`]); its capacity is 0 by default: none.
    pub shared_tier: SharedTierSpec,
}

impl Default for ClusterSpec {
    /// One worker behind the KV router, events delivered at once.
    fn default() -> Self {
        Self {
            workers: 1,
            routing: Routing::Kv,
            scheduler: SchedulerConfig::default(),
            event_plane: EventPlaneSpec::default(),
            disaggregation: None,
            shared_tier: SharedTierSpec::default(),
        }
    }
}

/// Prefill and decode on separate pools of workers (as Dynamo's disaggregated serving
/// does). Workers `0..prefill_workers` form the prefill pool, the rest the decode pool.
/// The router sends each request to a prefill worker; once its prompt is prefilled (the
/// first token lands then), its prompt blocks go to the least loaded decode worker over
/// the fabric as MRDN frames, and that worker generates the other tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Disaggregation {
    /// Workers in the prefill pool (the first ones); at least 1, and fewer than
    /// `cluster.workers` so the decode pool has one too.
    pub prefill_workers: usize,
    /// Blocks in one MRDN frame of the handoff (the last frame may hold fewer); each
    /// frame is its blocks' bytes plus the 32-byte MRDN header on the wire.
    #[serde(default = "default_frame_blocks")]
    pub frame_blocks: usize,
    /// Bandwidth of the switch every handoff crosses, bytes per second (one link shared
    /// by all of them); 0: a non-blocking switch, so only the NICs limit a handoff.
    #[serde(default)]
    pub switch_bytes_per_s: u64,
    /// Latency the switch adds to each frame, on top of the NIC latency.
    #[serde(default)]
    pub switch_latency_ns: u64,
}

fn default_frame_blocks() -> usize {
    16
}

/// Where the requests come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum WorkloadSpec {
    /// Synthetic multi-turn conversations.
    Conversations(ConversationSpec),
    /// A Mooncake-format trace; a relative path is taken from the scenario's folder.
    MooncakeTrace {
        /// The trace file.
        path: PathBuf,
        /// What to do with a row whose `input_length` and `hash_ids` disagree at the
        /// worker's block size (default `Error`; see [`crate::mooncake`]).
        #[serde(default, skip_serializing_if = "is_default_mismatch")]
        mismatch: TraceMismatch,
    },
    /// Synthetic multi-turn conversations with a reasoning model: each turn thinks,
    /// then answers, and the next turn's prompt carries the answer but not the thinking.
    Reasoning(ReasoningSpec),
}

fn is_default_mismatch(mismatch: &TraceMismatch) -> bool {
    *mismatch == TraceMismatch::default()
}

impl WorkloadSpec {
    /// How a trace's rows are checked at `block_size_tokens` a block: the trace's own
    /// policy, the default for a synthetic workload (a `--trace` given on the command
    /// line in its place).
    pub fn trace_check(&self, block_size_tokens: usize) -> TraceCheck {
        let mismatch = match self {
            WorkloadSpec::MooncakeTrace { mismatch, .. } => *mismatch,
            _ => TraceMismatch::default(),
        };
        TraceCheck {
            block_tokens: block_size_tokens as u64,
            mismatch,
        }
    }

    /// The requests of a synthetic workload, in arrival order, or `None` for a trace
    /// (which a run reads as it goes).
    pub fn generate(&self, seed: u64, block_size_tokens: usize) -> Option<Vec<Request>> {
        match self {
            WorkloadSpec::Conversations(spec) => Some(spec.generate(seed, block_size_tokens)),
            WorkloadSpec::Reasoning(spec) => Some(spec.generate(seed, block_size_tokens)),
            WorkloadSpec::MooncakeTrace { .. } => None,
        }
    }

    /// Keeps one conversation in `divisor` (at least one) of a synthetic workload, for
    /// quick runs of a scenario's shape; a trace is left as it is.
    pub fn thin_out(&mut self, divisor: u32) {
        let conversations = match self {
            WorkloadSpec::Conversations(spec) => &mut spec.conversations,
            WorkloadSpec::Reasoning(spec) => &mut spec.conversations,
            WorkloadSpec::MooncakeTrace { .. } => return,
        };
        *conversations = (*conversations / divisor.max(1)).max(1);
    }
}

/// A simulation input.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name for reports.
    pub name: String,
    /// The run's one seed.
    pub seed: u64,
    /// The node.
    pub hardware: HardwareProfile,
    /// The worker (every worker of the cluster is configured alike).
    pub worker: WorkerSpec,
    /// How many workers, and how requests and events reach them.
    #[serde(default)]
    pub cluster: ClusterSpec,
    /// Faults on a timeline, applied in time order.
    #[serde(default)]
    pub faults: Vec<Fault>,
    /// The requests.
    pub workload: WorkloadSpec,
    /// How the requests are reshaped in time (looped, retimed from a rate curve, sped
    /// up); absent, they arrive as the workload has them. Left out of the JSON form
    /// when absent, so scenarios without it read and override as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<TrafficSpec>,
    /// A planner that adds and removes workers as the run goes
    /// ([`crate::autoscale`]); absent, the cluster keeps the workers it starts with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleSpec>,
}

/// A scenario could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScenarioError {
    /// The file could not be read, or its RON is malformed or does not fit the
    /// scenario's shape (the error names the file, and the line and column).
    #[error(transparent)]
    File(#[from] RonFileError),
    /// The hardware profile names a compute profile that is not built in.
    #[error("{path}: hardware.compute: {source}", path = path.display())]
    UnknownCompute {
        /// The file.
        path: PathBuf,
        /// Which name, and the ones there are.
        source: crate::compute::UnknownProfile,
    },
    /// The hardware profile's measured compute table cannot be interpolated.
    #[error("{path}: hardware.compute: {source}", path = path.display())]
    ComputeTable {
        /// The file.
        path: PathBuf,
        /// Which field, and what is wrong with it.
        source: crate::compute::table::TableError,
    },
    /// A fault of the timeline is not applicable.
    #[error("{path}: faults[{index}]: {reason}", path = path.display())]
    Fault {
        /// The file.
        path: PathBuf,
        /// Which fault, from 0.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The cluster section is not runnable.
    #[error("{path}: cluster: {reason}", path = path.display())]
    Cluster {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The worker's options contradict each other.
    #[error("{path}: worker: {reason}", path = path.display())]
    Worker {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The traffic section cannot reshape the workload.
    #[error("{path}: {source}", path = path.display())]
    Traffic {
        /// The file.
        path: PathBuf,
        /// Which field, and why.
        source: TrafficError,
    },
    /// The autoscale section is not runnable.
    #[error("{path}: autoscale: {reason}", path = path.display())]
    Autoscale {
        /// The file.
        path: PathBuf,
        /// Which field, and why.
        reason: String,
    },
    /// The worker configuration is not runnable.
    #[error("{path}: worker: {source}", path = path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// Why.
        source: ManagerConfigError,
    },
}

impl Scenario {
    /// Reads and validates the scenario at `path`.
    pub fn load(path: &Path) -> Result<Self, ScenarioError> {
        Self::parse(&ron_file::read(path)?, path)
    }

    /// Parses and validates scenario text; `path` is for error messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ScenarioError> {
        let scenario: Scenario = ron_file::parse(text, path)?;
        scenario.validate(path)?;
        Ok(scenario)
    }

    /// Checks what parsing cannot: the worker is runnable, the compute profile exists,
    /// the cluster has workers and the event plane a probability.
    fn validate(&self, path: &Path) -> Result<(), ScenarioError> {
        let cluster = |reason: &str| ScenarioError::Cluster {
            path: path.to_owned(),
            reason: reason.to_string(),
        };
        if self.cluster.workers == 0 {
            return Err(cluster("workers must be at least 1"));
        }
        if self.worker.cache_output_blocks
            && (self.worker.cache_partial_blocks || !self.worker.batching.decode_blocks)
        {
            return Err(ScenarioError::Worker {
                path: path.to_owned(),
                reason: "cache_output_blocks needs batching.decode_blocks and no \
                         cache_partial_blocks (generated tokens fill the blocks it caches)"
                    .to_string(),
            });
        }
        if let WorkerEngine::Vllm(spec) = &self.worker.engine {
            if let Some(reason) = crate::vllm::run::check(self, spec) {
                return Err(ScenarioError::Worker {
                    path: path.to_owned(),
                    reason,
                });
            }
        }
        let drop = self.cluster.event_plane.drop_probability;
        if !(0.0..=1.0).contains(&drop) {
            return Err(cluster("event_plane.drop_probability must be within 0..=1"));
        }
        if let Some(disaggregation) = &self.cluster.disaggregation {
            let prefill = disaggregation.prefill_workers;
            if prefill == 0 || prefill >= self.cluster.workers {
                return Err(cluster(&format!(
                    "disaggregation.prefill_workers must be within 1..{} so that both \
                     the prefill and the decode pool have a worker (got {prefill})",
                    self.cluster.workers
                )));
            }
            if disaggregation.frame_blocks == 0 {
                return Err(cluster("disaggregation.frame_blocks must be at least 1"));
            }
            let body =
                (disaggregation.frame_blocks as u64).saturating_mul(self.worker.bytes_per_block);
            if body > kvtwin::wire::MAX_BODY_LEN as u64 {
                return Err(cluster(&format!(
                    "disaggregation.frame_blocks: a frame of {body} bytes exceeds the MRDN \
                     body limit of {} bytes",
                    kvtwin::wire::MAX_BODY_LEN
                )));
            }
        }
        if let Some(reason) = self.cluster.shared_tier.problem() {
            return Err(cluster(&format!("shared_tier.{reason}")));
        }
        if let Some(traffic) = &self.traffic {
            traffic.check().map_err(|source| ScenarioError::Traffic {
                path: path.to_owned(),
                source,
            })?;
        }
        if let Some(autoscale) = &self.autoscale {
            let pools = match &self.cluster.disaggregation {
                Some(d) => vec![d.prefill_workers, self.cluster.workers - d.prefill_workers],
                None => vec![self.cluster.workers],
            };
            autoscale
                .check(&pools)
                .map_err(|reason| ScenarioError::Autoscale {
                    path: path.to_owned(),
                    reason,
                })?;
        }
        for (index, fault) in self.faults.iter().enumerate() {
            let bad = |reason: &str| ScenarioError::Fault {
                path: path.to_owned(),
                index,
                reason: reason.to_string(),
            };
            let has_disk = self.worker.tiers.iter().any(|t| t.tier == Tier::Disk);
            if let Some(reason) = fault.kind.problem(self.cluster.workers, has_disk) {
                return Err(bad(reason));
            }
        }
        self.worker
            .manager_config()
            .validate()
            .map_err(|source| ScenarioError::Invalid {
                path: path.to_owned(),
                source,
            })?;
        let compute =
            self.hardware
                .compute_model()
                .map_err(|source| ScenarioError::UnknownCompute {
                    path: path.to_owned(),
                    source,
                })?;
        if let crate::compute::ComputeModel::Table(table) = &compute {
            table
                .validate()
                .map_err(|source| ScenarioError::ComputeTable {
                    path: path.to_owned(),
                    source,
                })?;
        }
        Ok(())
    }
}

impl Scenario {
    /// The requests of a synthetic workload, reshaped by the traffic section, in arrival
    /// order (ties in the order generated); `None` for a trace, which a run reads as it
    /// goes (or whole, to reshape it: [`Scenario::shape_traffic`]).
    pub fn synthetic_requests(&self) -> Result<Option<Vec<Request>>, TrafficError> {
        let Some(requests) = self
            .workload
            .generate(self.seed, self.worker.block_size_tokens)
        else {
            return Ok(None);
        };
        let mut requests = self.shape_traffic(requests)?;
        requests.sort_by_key(|r| r.arrival);
        Ok(Some(requests))
    }

    /// `requests` (in arrival order) reshaped by the traffic section; as they are
    /// without one. The rate curve's draws have their own seed, from the scenario's.
    pub fn shape_traffic(&self, requests: Vec<Request>) -> Result<Vec<Request>, TrafficError> {
        match &self.traffic {
            None => Ok(requests),
            // "traffic" in ASCII: the curve draws apart from every other stream.
            Some(traffic) => traffic.apply(requests, self.seed ^ 0x0074_7261_6666_6963),
        }
    }
}

/// A `--set FIELD=VALUE` override could not be applied.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OverrideError {
    /// Not of the form `FIELD=VALUE`.
    #[error("--set {0:?}: expected FIELD=VALUE, a dotted path and a value")]
    Syntax(String),
    /// The path names no field of the scenario.
    #[error("--set {path}: no such field; valid paths: {valid}")]
    UnknownPath {
        /// The path given.
        path: String,
        /// Every path there is, comma separated.
        valid: String,
    },
    /// The value does not fit the field.
    #[error("--set {path}={value}: {reason}")]
    BadValue {
        /// The path.
        path: String,
        /// The value given.
        value: String,
        /// Why it does not fit.
        reason: String,
    },
    /// The scenario with every override is not runnable.
    #[error("after --set: {0}")]
    Invalid(ScenarioError),
}

/// The field at dotted `path` of `value` (object keys, array indices).
fn field_mut<'v>(
    value: &'v mut serde_json::Value,
    path: &str,
) -> Option<&'v mut serde_json::Value> {
    path.split('.').try_fold(value, |value, key| match value {
        serde_json::Value::Object(map) => map.get_mut(key),
        serde_json::Value::Array(items) => key.parse::<usize>().ok().and_then(|i| items.get_mut(i)),
        _ => None,
    })
}

/// Every dotted path to a field that holds a value (not an object or array), sorted.
fn leaf_paths(value: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
    let join = |key: &str| {
        if prefix.is_empty() {
            key.to_string()
        } else {
            format!("{prefix}.{key}")
        }
    };
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                leaf_paths(value, &join(key), out);
            }
        }
        serde_json::Value::Array(items) => {
            for (i, value) in items.iter().enumerate() {
                leaf_paths(value, &join(&i.to_string()), out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

impl Scenario {
    /// This scenario with `FIELD=VALUE` overrides applied in order, then validated.
    ///
    /// `FIELD` is a dotted path through the scenario as its JSON form has it: struct
    /// fields by name, list items by index, an enum by its variant
    /// (`hardware.pcie_bytes_per_s`, `worker.tiers.0.capacity_blocks`,
    /// `workload.Conversations.conversations`). `VALUE` is JSON (`64000000000`,
    /// `{"Builtin":"dynosim"}`, `"text"`); anything that is not JSON is taken as a string,
    /// so a unit variant needs no quotes (`worker.tiers.0.eviction=Lru`).
    pub fn with_overrides(&self, sets: &[String]) -> Result<Scenario, OverrideError> {
        let mut value = serde_json::to_value(self).map_err(|e| OverrideError::BadValue {
            path: String::new(),
            value: String::new(),
            reason: e.to_string(),
        })?;
        for set in sets {
            let (path, raw) = set
                .split_once('=')
                .filter(|(path, _)| !path.is_empty())
                .ok_or_else(|| OverrideError::Syntax(set.clone()))?;
            let new = serde_json::from_str(raw)
                .unwrap_or_else(|_| serde_json::Value::String(raw.to_string()));
            let Some(field) = field_mut(&mut value, path) else {
                let mut valid = Vec::new();
                leaf_paths(&value, "", &mut valid);
                return Err(OverrideError::UnknownPath {
                    path: path.to_string(),
                    valid: valid.join(", "),
                });
            };
            *field = new;
            // Check now, so that an error names this override and not a later one.
            serde_json::from_value::<Scenario>(value.clone()).map_err(|e| {
                OverrideError::BadValue {
                    path: path.to_string(),
                    value: raw.to_string(),
                    reason: e.to_string(),
                }
            })?;
        }
        let scenario: Scenario =
            serde_json::from_value(value).map_err(|e| OverrideError::BadValue {
                path: String::new(),
                value: String::new(),
                reason: e.to_string(),
            })?;
        scenario
            .validate(Path::new("--set"))
            .map_err(OverrideError::Invalid)?;
        Ok(scenario)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::ComputeModel;

    const GOOD: &str = r#"(
        name: "t",
        seed: 1,
        hardware: (
            name: "h", pcie_bytes_per_s: 1, pcie_latency_ns: 1, nvme_read_bytes_per_s: 1,
            nvme_write_bytes_per_s: 1, nvme_latency_ns: 1, nic_bytes_per_s: 1,
            nic_latency_ns: 1, prefill_ns_per_token: 1, decode_ns_per_token: 1,
            max_inflight_transfers: 4,
        ),
        worker: (
            block_size_tokens: 16, bytes_per_block: 1024, onboard: CostAware,
            max_inflight_transfers: 4,
            tiers: [(tier: Device, capacity_blocks: 8)],
        ),
        workload: MooncakeTrace(path: "trace.jsonl"),
    )"#;

    #[test]
    fn a_trace_workload_checks_its_rows_at_the_workers_block_size_with_its_own_policy() {
        let scenario = Scenario::parse(GOOD, Path::new("t.ron")).unwrap();
        assert_eq!(scenario.workload.trace_check(16), TraceCheck::strict(16));
        let extend = GOOD.replace(
            r#"MooncakeTrace(path: "trace.jsonl")"#,
            r#"MooncakeTrace(path: "trace.jsonl", mismatch: Extend)"#,
        );
        let scenario = Scenario::parse(&extend, Path::new("t.ron")).unwrap();
        let check = scenario
            .workload
            .trace_check(scenario.worker.block_size_tokens);
        assert_eq!(
            (check.block_tokens, check.mismatch),
            (16, TraceMismatch::Extend)
        );
        let bad = GOOD.replace(
            r#"MooncakeTrace(path: "trace.jsonl")"#,
            r#"MooncakeTrace(path: "trace.jsonl", mismatch: Ignore)"#,
        );
        let error = Scenario::parse(&bad, Path::new("t.ron")).unwrap_err();
        assert!(error.to_string().contains("Ignore"), "{error}");
    }

    proptest::proptest! {
        #[test]
        fn parsing_arbitrary_text_never_panics(text in ".{0,300}") {
            let _ = Scenario::parse(&text, Path::new("fuzz.ron"));
        }

        #[test]
        fn every_truncation_of_a_valid_scenario_is_an_error(cut in 0usize..600) {
            let cut = cut.min(GOOD.len() - 1);
            if GOOD.is_char_boundary(cut) {
                proptest::prop_assert!(Scenario::parse(&GOOD[..cut], Path::new("cut.ron")).is_err());
            }
        }
    }

    #[test]
    fn a_valid_scenario_parses() {
        let scenario = Scenario::parse(GOOD, Path::new("good.ron")).unwrap();
        assert_eq!(scenario.worker.tiers[0].capacity_blocks, 8);
    }

    #[test]
    fn an_unknown_field_is_an_error_naming_file_line_and_field() {
        let text = GOOD.replace("seed: 1,", "seed: 1,\n        sede: 2,");
        let error = Scenario::parse(&text, Path::new("typo.ron")).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("typo.ron:4:"), "{message}");
        assert!(message.contains("sede"), "{message}");
    }

    #[test]
    fn disaggregation_defaults_to_frames_of_16_blocks_and_no_switch() {
        let text = GOOD.replace(
            "workload:",
            "cluster: (workers: 3, disaggregation: Some((prefill_workers: 1))),\n        workload:",
        );
        let scenario = Scenario::parse(&text, Path::new("d.ron")).unwrap();
        let disaggregation = scenario.cluster.disaggregation.unwrap();
        assert_eq!(
            disaggregation,
            Disaggregation {
                prefill_workers: 1,
                frame_blocks: 16,
                switch_bytes_per_s: 0,
                switch_latency_ns: 0,
            }
        );
        // Without the section, every worker is aggregated.
        let plain = Scenario::parse(GOOD, Path::new("good.ron")).unwrap();
        assert_eq!(plain.cluster.disaggregation, None);
        // Workers of either pool may crash.
        let crash = text.replace(
            "workload:",
            "faults: [(at_ms: 1, kind: WorkerCrash(worker: 0, down_ms: 1)), \
             (at_ms: 2, kind: WorkerCrash(worker: 2, down_ms: 1))],\n        workload:",
        );
        assert!(Scenario::parse(&crash, Path::new("c.ron")).is_ok());
    }

    #[test]
    fn an_unrunnable_worker_is_an_error() {
        let text = GOOD.replace("tier: Device", "tier: Host");
        let error = Scenario::parse(&text, Path::new("bad.ron")).unwrap_err();
        assert!(
            matches!(
                error,
                ScenarioError::Invalid {
                    source: ManagerConfigError::NoDeviceTier,
                    ..
                }
            ),
            "{error}"
        );
    }

    #[test]
    fn compute_profiles_are_built_in_or_given_in_full_and_unknown_names_are_listed() {
        let with = |compute: &str| {
            GOOD.replace(
                "max_inflight_transfers: 4,\n        ),\n        worker",
                &format!("max_inflight_transfers: 4, compute: Some({compute}),\n        ),\n        worker"),
            )
        };
        let builtin = Scenario::parse(&with(r#"Builtin("dynosim")"#), Path::new("d.ron")).unwrap();
        assert_eq!(
            builtin.hardware.compute_model().unwrap(),
            ComputeModel::Dynosim
        );
        let custom = with(r#"Custom(Linear(prefill_ns_per_token: 7, decode_ns_per_token: 9))"#);
        let custom = Scenario::parse(&custom, Path::new("c.ron")).unwrap();
        assert_eq!(
            custom.hardware.compute_model().unwrap().prefill(3, 0),
            std::time::Duration::from_nanos(21)
        );
        // A measured table, and one whose prompt lengths go backwards.
        let table = |isl: &str| {
            with(&format!(
                "Custom(Table((name: \"lab\", prefill_isl: {isl}, prefill_ms: [20.0, 80.0], \
                 decode: [(context: 1024, batch: [1], ms: [6.0])])))"
            ))
        };
        let measured = Scenario::parse(&table("[1000, 4000]"), Path::new("t.ron")).unwrap();
        assert_eq!(
            measured.hardware.compute_model().unwrap().prefill(4000, 0),
            std::time::Duration::from_millis(80)
        );
        let error = Scenario::parse(&table("[4000, 1000]"), Path::new("t.ron")).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("t.ron: hardware.compute: compute table \"lab\": prefill_isl"),
            "{message}"
        );
        let error = Scenario::parse(&with(r#"Builtin("tpu-v9")"#), Path::new("u.ron")).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("u.ron: hardware.compute:"), "{message}");
        assert!(
            message.contains("tpu-v9") && message.contains("h100-llama3-8b"),
            "{message}"
        );
    }

    #[test]
    fn overrides_set_fields_by_dotted_path_and_name_what_is_wrong() {
        let scenario = Scenario::parse(GOOD, Path::new("good.ron")).unwrap();
        let sets = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let changed = scenario
            .with_overrides(&sets(&[
                "hardware.pcie_bytes_per_s=64000000000",
                "worker.tiers.0.capacity_blocks=16",
                "worker.tiers.0.eviction=Lru",
                r#"hardware.compute={"Builtin":"dynosim"}"#,
                "name=what-if",
            ]))
            .unwrap();
        assert_eq!(changed.hardware.pcie_bytes_per_s, 64_000_000_000);
        assert_eq!(changed.worker.tiers[0].capacity_blocks, 16);
        assert_eq!(
            changed.hardware.compute_model().unwrap(),
            ComputeModel::Dynosim
        );
        assert_eq!(changed.name, "what-if");
        assert_eq!(changed.seed, scenario.seed);

        let unknown = scenario
            .with_overrides(&sets(&["hardware.pcie_gbps=1"]))
            .unwrap_err();
        let message = unknown.to_string();
        assert!(
            message.contains("hardware.pcie_gbps: no such field"),
            "{message}"
        );
        assert!(message.contains("hardware.pcie_bytes_per_s"), "{message}");
        assert!(
            message.contains("worker.tiers.0.capacity_blocks"),
            "{message}"
        );

        let bad = scenario.with_overrides(&sets(&["seed=soon"])).unwrap_err();
        assert!(bad.to_string().starts_with("--set seed=soon:"), "{bad}");
        assert!(matches!(
            scenario.with_overrides(&sets(&["seed"])),
            Err(OverrideError::Syntax(_))
        ));
        let unrunnable = scenario
            .with_overrides(&sets(&["worker.tiers.0.tier=Host"]))
            .unwrap_err();
        assert!(
            matches!(unrunnable, OverrideError::Invalid(_)),
            "{unrunnable}"
        );
    }
}
