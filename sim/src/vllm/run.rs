//! A scenario whose workers are vLLM engines (`worker.engine: Vllm((...))`): its
//! requests through the twin cluster of [`super::serve`], and the report of that run.
//!
//! Owns: [`VllmEngineSpec`] (the engine's scheduler settings a scenario states),
//! [`check`] (what such a scenario must and must not say: one device tier, KV routing,
//! no faults, disaggregation or autoscaling, which the twin does not model),
//! [`simulate`] and [`VllmRunReport`] (requests, cached tokens and hit ratio, requests
//! per engine, TTFT, ITL and end-to-end percentiles, throughput). The engine's cache is
//! the worker's device tier, its `capacity_blocks` the usable blocks (vLLM keeps one
//! more, its null block); its timing is the hardware's compute model (a `Table` that
//! `kvtwin profile --engine` measured, say); the router's weights, temperature and seed
//! are `cluster.scheduler` as given, not mixed with the run's seed, so a twin of a
//! `kvtwin router` (seed 0) tie-breaks as it does; the run's seed seeds the steps'
//! draws from a measured table's spread.
//! Never: read a clock or touch the kvtwin worker's `Cluster`.

use super::cache::VllmCacheConfig;
use super::connector::ConnectorTiers;
use super::scheduler::VllmSchedulerConfig;
use super::serve::{TwinArrivals, TwinCluster, TwinClusterConfig, TwinRequest, TwinRun};
use crate::scenario::{Routing, Scenario};
use crate::workload::Request;
use kvtwin::ids::WorkerId;
use kvtwin::stats::LatencySummary;
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// A vLLM engine's scheduler, as its command line sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct VllmEngineSpec {
    /// `--max-num-seqs` (vLLM's default on CPU: 128).
    pub max_num_seqs: usize,
    /// `--max-num-batched-tokens` (vLLM's default on CPU: 2048).
    pub max_num_batched_tokens: u64,
    /// Chunked prefill (on by default in vLLM V1).
    pub chunked_prefill: bool,
    /// `--max-model-len`: the longest sequence it takes.
    pub max_model_len: u64,
    /// kvtwin's connector in front of it (`--kv-transfer-config`), with its tiers in
    /// blocks; `None` (the default): the engine's own cache only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connector: Option<ConnectorTiers>,
}

impl Default for VllmEngineSpec {
    /// vLLM 0.32's defaults on CPU, and scripts/engines' `--max-model-len` 2048.
    fn default() -> Self {
        Self {
            max_num_seqs: 128,
            max_num_batched_tokens: 2048,
            chunked_prefill: true,
            max_model_len: 2048,
            connector: None,
        }
    }
}

/// Why a scenario cannot run on the twin of vLLM engines; `None` when it can.
pub fn check(scenario: &Scenario, spec: &VllmEngineSpec) -> Option<String> {
    let tiers = &scenario.worker.tiers;
    if tiers.len() != 1 || tiers[0].tier != Tier::Device {
        return Some(
            "engine: Vllm models vLLM's one KV cache: tiers must be one Device tier".into(),
        );
    }
    if tiers[0].capacity_blocks == 0 || tiers[0].capacity_blocks >= u32::MAX as usize {
        return Some("engine: Vllm needs a device tier of 1 to 2³² - 2 blocks".into());
    }
    if spec.max_num_seqs == 0 || spec.max_num_batched_tokens == 0 || spec.max_model_len == 0 {
        return Some(
            "engine: Vllm's max_num_seqs, max_num_batched_tokens and max_model_len must be at least 1"
                .into(),
        );
    }
    if spec.connector.is_some_and(|tiers| tiers.memory_blocks == 0) {
        return Some(
            "engine: Vllm's connector needs host memory: memory_blocks of 1 or more".into(),
        );
    }
    if scenario.cluster.routing != Routing::Kv {
        return Some("engine: Vllm runs behind the KV router: cluster.routing must be Kv".into());
    }
    if scenario.cluster.disaggregation.is_some()
        || scenario.autoscale.is_some()
        || !scenario.faults.is_empty()
    {
        return Some(
            "engine: Vllm models aggregated engines that stay up: no disaggregation, autoscale or faults"
                .into(),
        );
    }
    None
}

/// What a run of the twin says.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VllmRunReport {
    /// The scenario's name.
    pub scenario: String,
    /// Engines.
    pub engines: usize,
    /// Requests that arrived.
    pub arrived: usize,
    /// Requests served to their last token.
    pub completed: usize,
    /// Prompt tokens of the completed requests.
    pub prompt_tokens: u64,
    /// Of those, found in an engine's prefix cache.
    pub cached_tokens: u64,
    /// Times requests were preempted (and recomputed).
    pub preemptions: u64,
    /// Requests each engine served (engines numbered from 0).
    pub requests_per_engine: BTreeMap<u64, u64>,
    /// Arrival to first token, ms: p50, p90, p99.
    pub ttft_ms: [f64; 3],
    /// Each request's mean gap between tokens, ms: p50, p90, p99.
    pub itl_ms: [f64; 3],
    /// Arrival to last token, ms: p50, p90, p99.
    pub e2e_ms: [f64; 3],
    /// Output tokens per second over the run.
    pub output_tokens_per_s: f64,
    /// Engine steps, all engines together.
    pub steps: u64,
    /// From the first arrival to the last token, seconds.
    pub makespan_s: f64,
    /// With kvtwin's connector: the prompt tokens its tiers served, by tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connector: Option<ConnectorHits>,
}

/// Prompt tokens kvtwin's connector served beyond the engines' own prefix hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ConnectorHits {
    /// From its host memory.
    pub memory_tokens: u64,
    /// From its disk tier.
    pub disk_tokens: u64,
}

impl VllmRunReport {
    /// Cached tokens over prompt tokens (0 with no prompt).
    pub fn hit_ratio(&self) -> f64 {
        self.cached_tokens as f64 / self.prompt_tokens.max(1) as f64
    }
}

/// Runs `requests` (in arrival order) on the twin of `scenario`'s engines.
pub fn simulate(scenario: &Scenario, spec: &VllmEngineSpec, requests: &[Request]) -> VllmRunReport {
    let block_size = scenario.worker.block_size_tokens.max(1) as u64;
    let capacity = scenario
        .worker
        .tiers
        .first()
        .map_or(0, |t| t.capacity_blocks);
    let config = TwinClusterConfig {
        workers: (0..scenario.cluster.workers as u64)
            .map(WorkerId::new)
            .collect(),
        scheduler: VllmSchedulerConfig {
            max_num_seqs: spec.max_num_seqs,
            max_num_batched_tokens: spec.max_num_batched_tokens,
            enable_chunked_prefill: spec.chunked_prefill,
            long_prefill_token_threshold: 0,
            reserve_full_isl: true,
        },
        cache: VllmCacheConfig {
            num_gpu_blocks: u32::try_from(capacity + 1).unwrap_or(u32::MAX),
            block_size,
            max_model_len: spec.max_model_len,
            watermark: 0.0,
        },
        connector: spec.connector,
        routing: scenario.cluster.scheduler,
        compute: scenario
            .hardware
            .compute_model()
            .expect("Scenario::load checked the compute profile"),
        engine_compute: BTreeMap::new(),
        seed: scenario.seed,
    };
    let twin_requests: Vec<TwinRequest> = requests
        .iter()
        .enumerate()
        .map(|(index, request)| {
            TwinRequest::new(
                index,
                Duration::from_nanos(request.arrival.as_nanos()),
                &request.blocks,
                request.input_tokens,
                request.output_tokens,
                block_size,
            )
        })
        .collect();
    let run = TwinCluster::new(config).serve(&twin_requests, TwinArrivals::Open);
    report(scenario, requests, &run, spec.connector)
}

fn report(
    scenario: &Scenario,
    requests: &[Request],
    run: &TwinRun,
    spec_connector: Option<ConnectorTiers>,
) -> VllmRunReport {
    let served: Vec<_> = run
        .served
        .iter()
        .zip(requests)
        .filter_map(|(s, r)| Some((s.as_ref()?, r)))
        .collect();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let triple = |summary: LatencySummary| [ms(summary.p50), ms(summary.p90), ms(summary.p99)];
    let outputs: u64 = served.iter().map(|(_, r)| r.output_tokens.max(1)).sum();
    let makespan_s = run.makespan.as_secs_f64();
    VllmRunReport {
        scenario: scenario.name.clone(),
        engines: scenario.cluster.workers,
        arrived: requests.len(),
        completed: served.len(),
        prompt_tokens: served.iter().map(|(_, r)| r.input_tokens).sum(),
        cached_tokens: served.iter().map(|(s, _)| s.cached_tokens).sum(),
        preemptions: served.iter().map(|(s, _)| u64::from(s.preemptions)).sum(),
        requests_per_engine: run
            .requests_per_worker()
            .into_iter()
            .map(|(worker, n)| (worker.get(), n))
            .collect(),
        ttft_ms: triple(LatencySummary::of(served.iter().map(|(s, _)| s.ttft))),
        itl_ms: triple(LatencySummary::of(served.iter().filter_map(|(s, _)| s.itl))),
        e2e_ms: triple(LatencySummary::of(served.iter().map(|(s, _)| s.e2e))),
        output_tokens_per_s: if makespan_s > 0.0 {
            outputs as f64 / makespan_s
        } else {
            0.0
        },
        steps: run.steps,
        makespan_s,
        connector: spec_connector.map(|_| {
            let block_size = scenario.worker.block_size_tokens as u64;
            ConnectorHits {
                memory_tokens: served.iter().map(|(s, _)| s.loaded.memory).sum::<u64>()
                    * block_size,
                disk_tokens: served.iter().map(|(s, _)| s.loaded.disk).sum::<u64>() * block_size,
            }
        }),
    }
}

impl fmt::Display for VllmRunReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {} vLLM engine(s), twin (sim/src/vllm)",
            self.scenario, self.engines
        )?;
        writeln!(
            f,
            "requests: {} arrived, {} completed, {} preemptions",
            self.arrived, self.completed, self.preemptions
        )?;
        writeln!(
            f,
            "prefix cache: {} of {} prompt tokens cached (hit ratio {:.4})",
            self.cached_tokens,
            self.prompt_tokens,
            self.hit_ratio()
        )?;
        let per_engine: Vec<String> = self
            .requests_per_engine
            .iter()
            .map(|(engine, n)| format!("{engine}: {n}"))
            .collect();
        writeln!(f, "requests per engine: {}", per_engine.join(", "))?;
        if let Some(hits) = &self.connector {
            writeln!(
                f,
                "kvtwin connector: {} prompt tokens from host memory, {} from disk",
                hits.memory_tokens, hits.disk_tokens
            )?;
        }
        for (name, [p50, p90, p99]) in [
            ("ttft", self.ttft_ms),
            ("itl", self.itl_ms),
            ("e2e", self.e2e_ms),
        ] {
            writeln!(f, "{name} ms: p50 {p50:.3}, p90 {p90:.3}, p99 {p99:.3}")?;
        }
        write!(
            f,
            "throughput: {:.2} output tokens/s over {:.3} s ({} engine steps)",
            self.output_tokens_per_s, self.makespan_s, self.steps
        )
    }
}
