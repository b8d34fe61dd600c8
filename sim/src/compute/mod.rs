//! How long a GPU takes for a forward pass: prefill of new tokens after a cached context,
//! or one decode step of a batch; and the static estimates `kvtwin estimate` prints.
//!
//! Owns: [`ModelSpec`], [`GpuSpec`], [`Calibration`], [`ComputeModel`], the built-in
//! profiles ([`ComputeModel::builtin`], in `builtin`), the roofline sum (`roofline`),
//! measured tables ([`table::TableModel`]) and the static estimates ([`estimate`]).
//! Never: schedules passes or keeps state; the worker decides what goes into a pass and
//! asks how long it takes.
//!
//! Models:
//! - `Roofline`: GEMMs, attention and tensor-parallel all-reduces, each the longer of its
//!   arithmetic and its memory traffic at fitted fractions of the datasheet's peaks, plus
//!   a fixed overhead per pass (see `roofline`). The built-in profiles' fractions are
//!   fitted to NVIDIA AIConfigurator's measured kernel database.
//! - `Table`: measured prefill times by prompt length and decode step times by batch and
//!   context, interpolated (see [`table`]); the shape of Dynamo's planner profiles.
//! - `Dynosim`: the default timing of NVIDIA's DynoSim, for comparison with it: prefill
//!   ms = 4.21e-7·T² + 0.01518·T + 16.5 for `T` uncached tokens; decode ms =
//!   max(1, −25.74·u² + 54.01·u + 5.74) with `u` the batch's context tokens over the
//!   device's capacity in tokens.
//! - `Linear`: fixed cost per token (the placeholder the simulator started with).

mod builtin;
pub mod estimate;
mod roofline;
pub mod table;

pub use roofline::gemm_seconds;
use roofline::roofline_work;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// A transformer's shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A name for reports.
    pub name: String,
    /// Transformer layers.
    pub layers: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Attention (query) heads.
    pub heads: u64,
    /// Key-value heads (grouped-query attention).
    pub kv_heads: u64,
    /// Dimension per head.
    pub head_dim: u64,
    /// Parameters.
    pub params: u64,
    /// Bytes per parameter and per cached value (2 for bf16).
    pub dtype_bytes: u64,
}

impl ModelSpec {
    /// Llama-3-8B in bf16.
    pub fn llama3_8b() -> Self {
        Self {
            name: "llama-3-8b".into(),
            layers: 32,
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            params: 8_030_000_000,
            dtype_bytes: 2,
        }
    }

    /// Llama-3-70B in bf16.
    pub fn llama3_70b() -> Self {
        Self {
            name: "llama-3-70b".into(),
            layers: 80,
            hidden: 8192,
            heads: 64,
            kv_heads: 8,
            head_dim: 128,
            params: 70_550_000_000,
            dtype_bytes: 2,
        }
    }

    /// KV-cache bytes per token: keys and values of every layer.
    pub fn kv_bytes_per_token(&self) -> u64 {
        2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes
    }

    /// Bytes of weights.
    pub fn weight_bytes(&self) -> u64 {
        self.params * self.dtype_bytes
    }

    /// FLOPs per (query, key) pair of attention: scores and weighted values, every layer.
    pub(crate) fn attention_flops_per_pair(&self) -> f64 {
        4.0 * (self.layers * self.heads * self.head_dim) as f64
    }
}

/// The GPUs one worker runs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// A name for reports.
    pub name: String,
    /// Dense bf16 FLOP/s of one GPU.
    pub flops_per_s: f64,
    /// HBM bytes per second of one GPU.
    pub hbm_bytes_per_s: f64,
    /// GPUs the model is split over (tensor parallel): FLOPs and bandwidth add up.
    pub count: u32,
    /// Bytes per second one GPU sends to its peers (NVLink, one direction), for the
    /// tensor-parallel all-reduces; 0: not modelled.
    #[serde(default)]
    pub link_bytes_per_s: f64,
    /// HBM bytes of one GPU, which weights and KV cache must fit in; 0: unknown (not
    /// checked).
    #[serde(default)]
    pub memory_bytes: u64,
}

impl GpuSpec {
    /// One H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s, 80 GB, NVLink 4 (450 GB/s a
    /// direction).
    pub fn h100_sxm(count: u32) -> Self {
        Self {
            name: "h100-sxm".into(),
            flops_per_s: 989e12,
            hbm_bytes_per_s: 3.35e12,
            count,
            link_bytes_per_s: 450e9,
            memory_bytes: 80_000_000_000,
        }
    }

    /// One H200: the H100's compute with 141 GB of HBM3e at 4.8 TB/s.
    pub fn h200(count: u32) -> Self {
        Self {
            name: "h200".into(),
            flops_per_s: 989e12,
            hbm_bytes_per_s: 4.8e12,
            count,
            link_bytes_per_s: 450e9,
            memory_bytes: 141_000_000_000,
        }
    }

    /// One A100 SXM 80 GB: 312 TFLOP/s bf16 dense, 2.04 TB/s, NVLink 3 (300 GB/s a
    /// direction).
    pub fn a100(count: u32) -> Self {
        Self {
            name: "a100-sxm-80gb".into(),
            flops_per_s: 312e12,
            hbm_bytes_per_s: 2.039e12,
            count,
            link_bytes_per_s: 300e9,
            memory_bytes: 80_000_000_000,
        }
    }
}

/// Share of GPU memory an engine gives the weights and the KV cache (vLLM's default
/// `gpu_memory_utilization`); activations and the CUDA context take the rest. The
/// estimate's fit check and the planner's device blocks both use it.
pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;

/// How much of the peak a real engine reaches (fit these to measurements: the built-in
/// profiles' are fitted by scripts/fit_compute_profiles.py).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Fraction of peak FLOP/s the GEMMs reach.
    pub flops_efficiency: f64,
    /// Fraction of HBM bandwidth reading the weights reaches.
    pub hbm_efficiency: f64,
    /// Fixed cost per pass (launches, sampling, scheduling), microseconds.
    pub pass_overhead_us: f64,
    /// Fixed cost of a pass without prefill, microseconds (`None`: `pass_overhead_us`):
    /// engines replay decode steps as CUDA graphs, which launch in one go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_overhead_us: Option<f64>,
    /// Fraction of peak FLOP/s attention reaches (`None`: `flops_efficiency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_flops_efficiency: Option<f64>,
    /// Fraction of HBM bandwidth reading the KV cache reaches (`None`: `hbm_efficiency`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_hbm_efficiency: Option<f64>,
    /// Fixed cost of one tensor-parallel all-reduce, microseconds.
    #[serde(default)]
    pub allreduce_latency_us: f64,
    /// Fraction of the GPU's link bandwidth an all-reduce reaches.
    #[serde(default = "one")]
    pub link_efficiency: f64,
}

fn one() -> f64 {
    1.0
}

impl Calibration {
    /// What attention reaches of peak FLOP/s.
    pub fn attention_flops_efficiency(&self) -> f64 {
        self.attention_flops_efficiency
            .unwrap_or(self.flops_efficiency)
    }

    /// What reading the KV cache reaches of HBM bandwidth.
    pub fn kv_hbm_efficiency(&self) -> f64 {
        self.kv_hbm_efficiency.unwrap_or(self.hbm_efficiency)
    }

    /// The fixed cost of a pass without prefill, microseconds.
    pub fn decode_overhead_us(&self) -> f64 {
        self.decode_overhead_us.unwrap_or(self.pass_overhead_us)
    }
}

/// For a GPU or model nobody fitted: round figures near what the fitted profiles reach.
impl Default for Calibration {
    fn default() -> Self {
        Self {
            flops_efficiency: 0.6,
            hbm_efficiency: 0.8,
            pass_overhead_us: 500.0,
            decode_overhead_us: None,
            attention_flops_efficiency: None,
            kv_hbm_efficiency: None,
            allreduce_latency_us: 0.0,
            link_efficiency: 1.0,
        }
    }
}

/// The time model of forward passes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ComputeModel {
    /// Roofline of a model on GPUs (see the module doc).
    Roofline {
        /// The model.
        model: ModelSpec,
        /// The GPUs.
        gpu: GpuSpec,
        /// Efficiencies and overhead.
        #[serde(default)]
        calibration: Calibration,
    },
    /// Measured times, interpolated (see [`table`]).
    Table(table::TableModel),
    /// DynoSim's default timing (see the module doc).
    Dynosim,
    /// A fixed cost per token.
    Linear {
        /// Per prefilled token.
        prefill_ns_per_token: u64,
        /// Per decoded token (per sequence and step).
        decode_ns_per_token: u64,
    },
}

/// A built-in profile name the model does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown compute profile {name:?}; built in: {known}")]
pub struct UnknownProfile {
    /// The name asked for.
    pub name: String,
    /// The names there are, comma separated.
    pub known: String,
}

impl ComputeModel {
    /// GPUs one replica runs on: the roofline's tensor-parallel `gpu.count`, the table's
    /// `gpus`; 1 for the DynoSim and per-token models, which model no GPU count.
    pub fn gpus(&self) -> u32 {
        match self {
            ComputeModel::Roofline { gpu, .. } => gpu.count.max(1),
            ComputeModel::Table(table) => table.gpus.max(1),
            ComputeModel::Dynosim | ComputeModel::Linear { .. } => 1,
        }
    }

    /// A pass that prefills `new_tokens` tokens after `cached_tokens` already in the KV
    /// cache (one sequence; a chunk of a longer prompt passes its earlier chunks as
    /// cached).
    pub fn prefill(&self, new_tokens: u64, cached_tokens: u64) -> Duration {
        match self {
            ComputeModel::Roofline {
                model,
                gpu,
                calibration,
            } => roofline_work(
                model,
                gpu,
                calibration,
                &[(new_tokens, cached_tokens)],
                0,
                0,
            ),
            ComputeModel::Table(table) => table.prefill(&[(new_tokens, cached_tokens)]),
            ComputeModel::Dynosim => {
                let t = new_tokens as f64;
                millis(4.21e-7 * t * t + 0.01518 * t + 16.5)
            }
            ComputeModel::Linear {
                prefill_ns_per_token,
                ..
            } => Duration::from_nanos(new_tokens.saturating_mul(*prefill_ns_per_token)),
        }
    }

    /// One decode step of `batch` sequences holding `context_tokens` tokens of KV cache
    /// between them, on a device that caches `capacity_tokens` tokens (DynoSim's
    /// utilisation term).
    pub fn decode_step(&self, batch: u64, context_tokens: u64, capacity_tokens: u64) -> Duration {
        Duration::from_nanos(self.decode_step_nanos(batch, context_tokens, capacity_tokens))
    }

    /// [`Self::decode_step`] in nanoseconds, exactly: the planned decode steps of a
    /// simulation (millions a run) add these to the clock without a `Duration` each.
    #[inline]
    pub fn decode_step_nanos(&self, batch: u64, context_tokens: u64, capacity_tokens: u64) -> u64 {
        if batch == 0 {
            return 0;
        }
        match self {
            ComputeModel::Dynosim => {
                dynosim_decode_step_nanos(batch, context_tokens, capacity_tokens)
            }
            ComputeModel::Linear {
                decode_ns_per_token,
                ..
            } => *decode_ns_per_token,
            ComputeModel::Roofline {
                model,
                gpu,
                calibration,
            } => nanos_of(roofline_work(
                model,
                gpu,
                calibration,
                &[],
                batch,
                context_tokens,
            )),
            ComputeModel::Table(table) => nanos_of(table.decode_step(batch, context_tokens)),
        }
    }
}

/// [`ComputeModel::Dynosim`]'s decode step in nanoseconds: DynoSim's utilisation curve,
/// `u` the share of the device's cache the batch holds.
#[inline]
pub(crate) fn dynosim_decode_step_nanos(
    batch: u64,
    context_tokens: u64,
    capacity_tokens: u64,
) -> u64 {
    if batch == 0 {
        return 0;
    }
    /// Counts below it convert through `i64`: one instruction on x86-64, where `u64`'s
    /// take a branch or a fix-up (millions of steps a run, issue 33). Same values: such
    /// counts are exact in an `f64` either way.
    const EXACT: u64 = 1 << 53;
    let capacity = capacity_tokens.max(1);
    let u = if context_tokens < EXACT && capacity < EXACT {
        context_tokens as i64 as f64 / capacity as i64 as f64
    } else {
        context_tokens as f64 / capacity as f64
    };
    let nanos = (-25.74 * u * u + 54.01 * u + 5.74).max(1.0) * 1e6;
    // `nanos` is at least 1e6 and below 2^62 whatever `u` is (the curve's top is 34.1e6
    // at u = 1.05, and under 1 it is clamped): `round_to_u64` without its range checks.
    let whole = nanos as i64;
    (whole + i64::from(nanos - whole as f64 >= 0.5)) as u64
}

/// A span in whole nanoseconds, saturating (what `Timestamp::saturating_add` adds).
fn nanos_of(span: Duration) -> u64 {
    u64::try_from(span.as_nanos()).unwrap_or(u64::MAX)
}

/// What one forward pass of a continuously batched worker does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    /// Prefill chunks: (new tokens, tokens already cached before them), per sequence.
    pub prefills: Vec<(u64, u64)>,
    /// Sequences decoding one token each.
    pub decodes: u64,
    /// KV tokens those sequences attend to, together.
    pub decode_context: u64,
}

/// How long a pass takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PassTime {
    /// From the pass's start until its prefill work is done: the first tokens of the
    /// sequences whose prompts finish here land then.
    pub prefill: Duration,
    /// The whole pass.
    pub total: Duration,
}

impl ComputeModel {
    /// Whether single steps stray from the model's figures: a measured table with a
    /// [`table::TableModel::step_spread`]. Only then does [`Self::step_factor`] read its draw.
    pub fn steps_vary(&self) -> bool {
        matches!(self, ComputeModel::Table(table) if table.step_spread.len() >= 2)
    }

    /// What a request spends outside its engine's steps, on its way
    /// ([`table::TableModel::request_overhead_ms`]); zero for every model but a measured
    /// table that says.
    pub fn request_overhead(&self) -> Duration {
        match self {
            ComputeModel::Table(table) => table.request_overhead(),
            _ => Duration::ZERO,
        }
    }

    /// What a request spends outside the steps of an engine already stepping for others
    /// ([`table::TableModel::request_overhead_busy`]); [`Self::request_overhead`] for
    /// every model but a measured table that says.
    pub fn request_overhead_busy(&self) -> Duration {
        match self {
            ComputeModel::Table(table) => table.request_overhead_busy(),
            _ => Duration::ZERO,
        }
    }

    /// What a request spends outside the steps of an engine busy with `held` requests
    /// ([`table::TableModel::request_overhead_beside`]); [`Self::request_overhead_busy`]
    /// for every model but a measured table that says.
    pub fn request_overhead_beside(&self, held: u64) -> Duration {
        match self {
            ComputeModel::Table(table) => table.request_overhead_beside(held),
            _ => self.request_overhead_busy(),
        }
    }

    /// What the step in flight takes longer when a request comes to its engine
    /// ([`table::TableModel::arrival_stretch`]); nothing for every model but a measured
    /// table that says.
    pub fn arrival_stretch(&self) -> Duration {
        match self {
            ComputeModel::Table(table) => table.arrival_stretch(),
            _ => Duration::ZERO,
        }
    }

    /// Whether passes stall now and then ([`table::TableModel::stalls`]). Only then does
    /// [`Self::stall`] read its draw.
    pub fn stalls_happen(&self) -> bool {
        matches!(self, ComputeModel::Table(table) if !table.stalls.is_empty())
    }

    /// What a pass stalls beyond [`Self::pass`]'s figure for a uniform draw `u` in [0, 1)
    /// ([`table::TableModel::stall`]); nothing for a model that does not stall.
    pub fn stall(&self, u: f64) -> Duration {
        match self {
            ComputeModel::Table(table) => table.stall(u),
            _ => Duration::ZERO,
        }
    }

    /// What one step takes over [`Self::pass`]'s figure for a uniform draw `u` in [0, 1)
    /// ([`table::TableModel::step_factor`]); 1 for a model whose steps do not vary.
    pub fn step_factor(&self, u: f64) -> f64 {
        match self {
            ComputeModel::Table(table) => table.step_factor(u),
            _ => 1.0,
        }
    }

    /// The time of one batched pass on a device that caches `capacity_tokens` tokens.
    ///
    /// Roofline: the whole pass is one sum of rooflines (weights read once, every token's
    /// FLOPs and KV reads); its prefill part is that of the prefill work alone. Table:
    /// the prefill chunks' times (one overhead) plus the decode step, or, where the
    /// table measured prefills beside decodes, the chunks' times by its factor. DynoSim and Linear:
    /// the prefill part (by the pass's uncached tokens) plus the decode part.
    pub fn pass(&self, pass: &Pass, capacity_tokens: u64) -> PassTime {
        let new: u64 = pass.prefills.iter().map(|(t, _)| t).sum();
        let nothing = |p: &Pass| p.prefills.is_empty() && p.decodes == 0;
        if nothing(pass) {
            return PassTime {
                prefill: Duration::ZERO,
                total: Duration::ZERO,
            };
        }
        match self {
            ComputeModel::Roofline {
                model,
                gpu,
                calibration,
            } => {
                let work = |prefills: &[(u64, u64)], decodes: u64, context: u64| {
                    roofline_work(model, gpu, calibration, prefills, decodes, context)
                };
                let prefill = if pass.prefills.is_empty() {
                    Duration::ZERO
                } else {
                    work(&pass.prefills, 0, 0)
                };
                PassTime {
                    prefill,
                    total: work(&pass.prefills, pass.decodes, pass.decode_context).max(prefill),
                }
            }
            ComputeModel::Table(_) | ComputeModel::Dynosim | ComputeModel::Linear { .. } => {
                let prefill = match self {
                    _ if pass.prefills.is_empty() => Duration::ZERO,
                    ComputeModel::Table(table) => table.prefill(&pass.prefills),
                    _ => self.prefill(new, 0),
                };
                // A prefill beside decodes as the engine measured it, where it did.
                let beside = match self {
                    ComputeModel::Table(table) if !pass.prefills.is_empty() => {
                        table.prefill_beside(pass.decodes)
                    }
                    _ => None,
                };
                if let Some((factor, extra_ms)) = beside {
                    let total = prefill.mul_f64(factor) + millis(extra_ms);
                    return PassTime {
                        prefill: total,
                        total,
                    };
                }
                let decode = match self {
                    // One pass, one fixed cost: the prefill's pays it.
                    ComputeModel::Table(table) if !pass.prefills.is_empty() => {
                        table.decode_beside_prefill(pass.decodes, pass.decode_context)
                    }
                    _ => self.decode_step(pass.decodes, pass.decode_context, capacity_tokens),
                };
                PassTime {
                    prefill,
                    total: prefill + decode,
                }
            }
        }
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_nanos(round_to_u64(ms * 1e6))
}

/// `x.round().max(0.0) as u64` (half away from zero, negatives and NaN to 0, saturating)
/// without `round`'s call into the maths library: a simulation times every decode step
/// with it (issue 33). Exact: below 2^52 the fraction `x - trunc(x)` is computed without
/// error, and above it every `f64` is a whole number.
#[inline]
pub(crate) fn round_to_u64(x: f64) -> u64 {
    // `!(x > 0.0)` also catches NaN.
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    if !(x > 0.0) {
        return 0;
    }
    if x >= u64::MAX as f64 {
        return u64::MAX;
    }
    let whole = x as u64;
    if x - whole as f64 >= 0.5 {
        whole + 1
    } else {
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_bytes_per_token_match_the_published_shapes() {
        assert_eq!(ModelSpec::llama3_8b().kv_bytes_per_token(), 128 * 1024);
        assert_eq!(ModelSpec::llama3_70b().kv_bytes_per_token(), 320 * 1024);
    }

    #[test]
    fn a_profile_written_before_the_fit_still_reads() {
        // The three coefficients a roofline had before: the others take their defaults.
        let text = "Roofline(model: (name: \"m\", layers: 2, hidden: 64, heads: 2, kv_heads: 1, \
                    head_dim: 32, params: 1000000, dtype_bytes: 2), gpu: (name: \"g\", \
                    flops_per_s: 1e12, hbm_bytes_per_s: 1e11, count: 2), calibration: \
                    (flops_efficiency: 0.5, hbm_efficiency: 0.5, pass_overhead_us: 100.0))";
        let model: ComputeModel = ron::from_str(text).unwrap();
        let ComputeModel::Roofline {
            gpu, calibration, ..
        } = &model
        else {
            panic!("{model:?}");
        };
        assert_eq!(gpu.link_bytes_per_s, 0.0);
        assert_eq!(gpu.memory_bytes, 0);
        assert_eq!(calibration.attention_flops_efficiency(), 0.5);
        assert_eq!(calibration.kv_hbm_efficiency(), 0.5);
        assert_eq!(calibration.decode_overhead_us(), 100.0);
        assert_eq!(calibration.link_efficiency, 1.0);
        assert!(model.prefill(100, 0) > Duration::from_micros(100));
        // Two GPUs with no link: no all-reduce term, half the single GPU's work.
        assert_eq!(model.gpus(), 2);
    }

    #[test]
    fn dynosim_timing_follows_its_published_formulas() {
        let dynosim = ComputeModel::Dynosim;
        // 1,000 uncached tokens: 0.421 + 15.18 + 16.5 = 32.101 ms.
        assert_eq!(dynosim.prefill(1000, 0), Duration::from_micros(32_101));
        // Half the device's tokens in the batch: −6.435 + 27.005 + 5.74 = 26.31 ms.
        assert_eq!(
            dynosim.decode_step(8, 500, 1000),
            Duration::from_micros(26_310)
        );
        // An empty device: 5.74 ms.
        assert_eq!(
            dynosim.decode_step(1, 0, 1000),
            Duration::from_micros(5_740)
        );
        assert_eq!(dynosim.decode_step(0, 0, 1000), Duration::ZERO);
    }

    #[test]
    fn builtin_profiles_resolve_and_unknown_names_list_them() {
        for name in ComputeModel::BUILTIN {
            let model = ComputeModel::builtin(name).unwrap();
            assert!(model.prefill(512, 0) > Duration::ZERO, "{name}");
            assert!(
                model.decode_step(1, 512, 1 << 20) > Duration::ZERO,
                "{name}"
            );
        }
        let error = ComputeModel::builtin("tpu").unwrap_err();
        assert!(error.to_string().contains("h100-llama3-8b"), "{error}");
        // 70B on four H100s decodes slower than 8B on one (more weights per GPU-byte).
        let small = ComputeModel::builtin("h100-llama3-8b").unwrap();
        let large = ComputeModel::builtin("h100x4-llama3-70b").unwrap();
        assert!(large.decode_step(1, 2048, 1 << 20) > small.decode_step(1, 2048, 1 << 20));
    }

    #[test]
    fn a_mixed_pass_costs_its_prefill_then_its_decode() {
        let pass = Pass {
            prefills: vec![(600, 0), (400, 0)],
            decodes: 8,
            decode_context: 500,
        };
        // DynoSim: prefill by the pass's 1,000 uncached tokens, plus the decode step.
        let time = ComputeModel::Dynosim.pass(&pass, 1000);
        assert_eq!(time.prefill, Duration::from_micros(32_101));
        assert_eq!(time.total, Duration::from_micros(32_101 + 26_310));
        // Roofline: one pass reads the weights once, so batching is cheaper than the
        // sequences one by one; the prefill part is no longer than the pass.
        let roofline = ComputeModel::builtin("h100-llama3-8b").unwrap();
        let batched = roofline.pass(&pass, 1 << 20);
        let alone = roofline.prefill(600, 0)
            + roofline.prefill(400, 0)
            + roofline.decode_step(8, 500, 1 << 20);
        assert!(batched.total < alone, "{batched:?} vs {alone:?}");
        assert!(batched.prefill <= batched.total);
        assert_eq!(roofline.pass(&Pass::default(), 1).total, Duration::ZERO);
        // A measured table: the pass's fixed cost once, in the prefill's `P(0)`.
        let ComputeModel::Table(table) = ComputeModel::Table(table::TableModel {
            name: "t".into(),
            gpus: 1,
            kv_bytes_per_token: 0,
            max_kv_tokens: 0,
            prefill_isl: vec![100, 200],
            prefill_ms: vec![30.0, 40.0],
            decode: vec![table::DecodeCurve {
                context: 500,
                batch: vec![1, 9],
                ms: vec![11.0, 19.0],
            }],
            step_spread: Vec::new(),
            request_overhead_ms: 0.0,
            request_overhead_busy_ms: 0.0,
            arrival_stretch_ms: 0.0,
            stalls: Vec::new(),
            prefill_beside_decode: Vec::new(),
        }) else {
            unreachable!()
        };
        let measured = ComputeModel::Table(table.clone());
        let time = measured.pass(&pass, 1 << 20);
        assert_eq!(time.prefill, table.prefill(&pass.prefills));
        // 8 sequences at batch 8: 18 ms alone, 10 ms at batch 0.
        assert_eq!(time.total, time.prefill + Duration::from_millis(8));
        let decodes_only = Pass {
            prefills: Vec::new(),
            ..pass
        };
        assert_eq!(
            measured.pass(&decodes_only, 1 << 20).total,
            Duration::from_millis(18)
        );
        // Measured beside decodes: the prefill's figure by the factor at 8 decodes
        // (between 4 at 1.5 and 12 at 2.0), the decodes' own share no longer added.
        let mut beside = table.clone();
        beside.prefill_beside_decode = vec![
            table::BesideDecode {
                decodes: 4,
                factor: 1.5,
                extra_ms: 0.0,
                overhead_ms: 0.0,
            },
            table::BesideDecode {
                decodes: 12,
                factor: 2.0,
                extra_ms: 0.0,
                overhead_ms: 0.0,
            },
        ];
        let beside = ComputeModel::Table(beside);
        let time = beside.pass(&pass, 1 << 20);
        assert_eq!(time.total, table.prefill(&pass.prefills).mul_f64(1.75));
        assert_eq!(time.prefill, time.total);
        assert_eq!(
            beside.pass(&decodes_only, 1 << 20).total,
            Duration::from_millis(18),
            "a pass without a prefill is a decode step"
        );
    }

    #[test]
    fn rounding_without_the_maths_library_is_rounding() {
        let mut values = vec![
            0.0,
            -0.0,
            -1.5,
            0.49999999999999994,
            0.5,
            1.5,
            2.5,
            1e15 + 0.5,
            4503599627370495.5,
            4503599627370496.0,
            9007199254740993.0,
            1.8446744073709552e19,
            1e30,
            f64::MAX,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            f64::MIN_POSITIVE,
        ];
        let mut x = 0.37f64;
        for _ in 0..100_000 {
            x = (x * 3.7 + 0.123).fract();
            values.push(x * 1e9);
            values.push(x * 10.0);
            values.push((x * 1000.0).floor() + 0.5);
        }
        for v in values {
            assert_eq!(round_to_u64(v), v.round().max(0.0) as u64, "{v:e}");
        }
    }

    proptest::proptest! {
        /// The decode step's `i64` fast path gives the formula's value through the
        /// general conversions, the largest counts (the slow path) included.
        #[test]
        fn dynosim_decode_step_is_its_formula(
            batch in 0u64..4,
            context in proptest::prop_oneof![0u64..10_000_000, (1u64 << 53) - 4..u64::MAX],
            capacity in proptest::prop_oneof![0u64..2_000_000, (1u64 << 53) - 4..u64::MAX],
        ) {
            let u = context as f64 / capacity.max(1) as f64;
            let expected = if batch == 0 {
                0
            } else {
                ((-25.74 * u * u + 54.01 * u + 5.74).max(1.0) * 1e6).round() as u64
            };
            proptest::prop_assert_eq!(dynosim_decode_step_nanos(batch, context, capacity), expected);
        }
    }

    #[test]
    fn a_pass_of_decodes_only_takes_one_decode_step() {
        // The simulator times planned decode steps with `decode_step` alone.
        let mut models: Vec<ComputeModel> = ComputeModel::BUILTIN
            .iter()
            .map(|name| ComputeModel::builtin(name).unwrap())
            .collect();
        models.push(ComputeModel::Linear {
            prefill_ns_per_token: 100,
            decode_ns_per_token: 7_000,
        });
        for model in &models {
            for (decodes, context) in [(0, 0), (1, 10), (8, 4_000), (64, 300_000)] {
                let pass = Pass {
                    prefills: Vec::new(),
                    decodes,
                    decode_context: context,
                };
                assert_eq!(
                    model.pass(&pass, 500_000).total,
                    model.decode_step(decodes, context, 500_000),
                    "{model:?} {decodes} {context}"
                );
            }
        }
    }
}
