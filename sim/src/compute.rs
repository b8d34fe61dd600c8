//! How long a GPU takes for a forward pass: prefill of new tokens after a cached context,
//! or one decode step of a batch.
//!
//! Owns: [`ModelSpec`], [`GpuSpec`], [`Calibration`], [`ComputeModel`] and the built-in
//! profiles ([`ComputeModel::builtin`]). Never: schedules passes or keeps state; the
//! worker decides what goes into a pass and asks how long it takes.
//!
//! Models:
//! - `Roofline`: a pass takes the longer of its arithmetic (FLOPs over the GPUs' peak,
//!   scaled by `Calibration::flops_efficiency`) and its memory traffic (bytes over HBM
//!   bandwidth, scaled by `Calibration::hbm_efficiency`), plus a fixed overhead. FLOPs:
//!   `2 × params` per token (the linear term) plus attention, `4 × layers × heads ×
//!   head_dim` per (query, key) pair (the quadratic term: a prefill of `T` tokens after
//!   `C` cached ones has `T × C + T² / 2` pairs). Bytes: the weights once per pass plus the
//!   KV cache read (`2 × layers × kv_heads × head_dim × dtype` per token of context).
//!   Decode is memory bound for realistic batches, prefill compute bound.
//! - `Dynosim`: the default timing of NVIDIA's DynoSim, for comparison with it: prefill
//!   ms = 4.21e-7·T² + 0.01518·T + 16.5 for `T` uncached tokens; decode ms =
//!   max(1, −25.74·u² + 54.01·u + 5.74) with `u` the batch's context tokens over the
//!   device's capacity in tokens.
//! - `Linear`: fixed cost per token (the placeholder the simulator started with).

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
    fn attention_flops_per_pair(&self) -> f64 {
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
}

impl GpuSpec {
    /// One H100 SXM: 989 TFLOP/s bf16 dense, 3.35 TB/s.
    pub fn h100_sxm(count: u32) -> Self {
        Self {
            name: "h100-sxm".into(),
            flops_per_s: 989e12,
            hbm_bytes_per_s: 3.35e12,
            count,
        }
    }

    /// One H200: the H100's compute with 4.8 TB/s of HBM3e.
    pub fn h200(count: u32) -> Self {
        Self {
            name: "h200".into(),
            flops_per_s: 989e12,
            hbm_bytes_per_s: 4.8e12,
            count,
        }
    }

    /// One A100 SXM 80 GB: 312 TFLOP/s bf16 dense, 2.04 TB/s.
    pub fn a100(count: u32) -> Self {
        Self {
            name: "a100-sxm-80gb".into(),
            flops_per_s: 312e12,
            hbm_bytes_per_s: 2.039e12,
            count,
        }
    }
}

/// How much of the peak a real engine reaches (fit these to measurements).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Fraction of peak FLOP/s reached.
    pub flops_efficiency: f64,
    /// Fraction of HBM bandwidth reached.
    pub hbm_efficiency: f64,
    /// Fixed cost per pass (launches, sampling, scheduling), microseconds.
    pub pass_overhead_us: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            flops_efficiency: 0.6,
            hbm_efficiency: 0.8,
            pass_overhead_us: 500.0,
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
    /// The built-in profiles' names.
    pub const BUILTIN: [&'static str; 7] = [
        "h100-llama3-8b",
        "h100x4-llama3-70b",
        "h200-llama3-8b",
        "h200x2-llama3-70b",
        "a100-llama3-8b",
        "a100x8-llama3-70b",
        "dynosim",
    ];

    /// A built-in profile: a GPU and model pair with default calibration (70B on enough
    /// GPUs for its weights), or `dynosim`.
    pub fn builtin(name: &str) -> Result<Self, UnknownProfile> {
        let roofline = |gpu: GpuSpec, model: ModelSpec| ComputeModel::Roofline {
            model,
            gpu,
            calibration: Calibration::default(),
        };
        Ok(match name {
            "h100-llama3-8b" => roofline(GpuSpec::h100_sxm(1), ModelSpec::llama3_8b()),
            "h100x4-llama3-70b" => roofline(GpuSpec::h100_sxm(4), ModelSpec::llama3_70b()),
            "h200-llama3-8b" => roofline(GpuSpec::h200(1), ModelSpec::llama3_8b()),
            "h200x2-llama3-70b" => roofline(GpuSpec::h200(2), ModelSpec::llama3_70b()),
            "a100-llama3-8b" => roofline(GpuSpec::a100(1), ModelSpec::llama3_8b()),
            "a100x8-llama3-70b" => roofline(GpuSpec::a100(8), ModelSpec::llama3_70b()),
            "dynosim" => ComputeModel::Dynosim,
            _ => {
                return Err(UnknownProfile {
                    name: name.into(),
                    known: Self::BUILTIN.join(", "),
                })
            }
        })
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
        if batch == 0 {
            return Duration::ZERO;
        }
        match self {
            ComputeModel::Roofline {
                model,
                gpu,
                calibration,
            } => roofline_work(model, gpu, calibration, &[], batch, context_tokens),
            ComputeModel::Dynosim => {
                let u = context_tokens as f64 / capacity_tokens.max(1) as f64;
                millis((-25.74 * u * u + 54.01 * u + 5.74).max(1.0))
            }
            ComputeModel::Linear {
                decode_ns_per_token,
                ..
            } => Duration::from_nanos(*decode_ns_per_token),
        }
    }
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
    /// The time of one batched pass on a device that caches `capacity_tokens` tokens.
    ///
    /// Roofline: the whole pass is one roofline (weights read once, every token's FLOPs
    /// and KV reads); its prefill part is the roofline of the prefill work alone. DynoSim
    /// and Linear: the prefill part (by the pass's uncached tokens) plus the decode part.
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
            ComputeModel::Dynosim | ComputeModel::Linear { .. } => {
                let prefill = if pass.prefills.is_empty() {
                    Duration::ZERO
                } else {
                    self.prefill(new, 0)
                };
                let decode = self.decode_step(pass.decodes, pass.decode_context, capacity_tokens);
                PassTime {
                    prefill,
                    total: prefill + decode,
                }
            }
        }
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_nanos((ms * 1e6).round().max(0.0) as u64)
}

/// The roofline time of prefill chunks `(new, cached)` and `decodes` sequences attending
/// to `context` tokens in one pass: weights read once, every token's FLOPs and KV reads.
fn roofline_work(
    model: &ModelSpec,
    gpu: &GpuSpec,
    calibration: &Calibration,
    prefills: &[(u64, u64)],
    decodes: u64,
    context: u64,
) -> Duration {
    let pairs: f64 = prefills
        .iter()
        .map(|(t, c)| *t as f64 * *c as f64 + (*t as f64).powi(2) / 2.0)
        .sum();
    let tokens: u64 = prefills.iter().map(|(t, _)| t).sum::<u64>() + decodes;
    let kv: u64 = prefills.iter().map(|(t, c)| t + c).sum::<u64>() + context;
    let flops = 2.0 * model.params as f64 * tokens as f64
        + model.attention_flops_per_pair() * (pairs + context as f64);
    let bytes = (model.weight_bytes() + kv * model.kv_bytes_per_token()) as f64;
    roofline_time(flops, bytes, gpu, calibration)
}

fn roofline_time(flops: f64, bytes: f64, gpu: &GpuSpec, calibration: &Calibration) -> Duration {
    let count = f64::from(gpu.count.max(1));
    let compute_s = flops / (gpu.flops_per_s * count * calibration.flops_efficiency.max(1e-6));
    let memory_s = bytes / (gpu.hbm_bytes_per_s * count * calibration.hbm_efficiency.max(1e-6));
    let seconds = compute_s.max(memory_s) + calibration.pass_overhead_us * 1e-6;
    Duration::from_nanos((seconds * 1e9).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ideal(gpu: GpuSpec, model: ModelSpec) -> ComputeModel {
        ComputeModel::Roofline {
            model,
            gpu,
            calibration: Calibration {
                flops_efficiency: 1.0,
                hbm_efficiency: 1.0,
                pass_overhead_us: 0.0,
            },
        }
    }

    #[test]
    fn kv_bytes_per_token_match_the_published_shapes() {
        assert_eq!(ModelSpec::llama3_8b().kv_bytes_per_token(), 128 * 1024);
        assert_eq!(ModelSpec::llama3_70b().kv_bytes_per_token(), 320 * 1024);
    }

    #[test]
    fn decode_is_weights_and_kv_over_hbm_bandwidth() {
        let model = ideal(GpuSpec::h100_sxm(1), ModelSpec::llama3_8b());
        // 16.06 GB of weights + 32 sequences × 2,048 tokens × 128 KiB (8.59 GB) at
        // 3.35 TB/s: 7.36 ms, memory bound (the FLOPs take 0.55 ms).
        let step = model.decode_step(32, 32 * 2048, 1 << 20);
        let expected = (16.06e9 + 32.0 * 2048.0 * 131072.0) / 3.35e12;
        assert!((step.as_secs_f64() - expected).abs() < 1e-6, "{step:?}");
        // Twice the bandwidth (H200 has 4.8 TB/s): proportionally faster.
        let h200 = ideal(GpuSpec::h200(1), ModelSpec::llama3_8b());
        let ratio = step.as_secs_f64() / h200.decode_step(32, 32 * 2048, 1 << 20).as_secs_f64();
        assert!((ratio - 4.8 / 3.35).abs() < 1e-6);
    }

    #[test]
    fn prefill_has_a_linear_and_a_quadratic_term() {
        let model = ideal(GpuSpec::h100_sxm(1), ModelSpec::llama3_8b());
        // 8,192 new tokens: 2 × 8.03e9 × 8192 = 131.6 TFLOP linear, plus 4 × 32 × 32 ×
        // 128 × 8192² / 2 = 17.6 TFLOP of attention, at 989 TFLOP/s: 151 ms.
        let t = 8192.0;
        let flops = 2.0 * 8.03e9 * t + 4.0 * 32.0 * 32.0 * 128.0 * t * t / 2.0;
        let pass = model.prefill(8192, 0);
        assert!(
            (pass.as_secs_f64() - flops / 989e12).abs() < 1e-6,
            "{pass:?}"
        );
        // The same tokens after a long cached context cost more (attention over it).
        assert!(model.prefill(8192, 32_768) > pass);
        // Four GPUs in tensor parallel: a quarter of the time.
        let four = ideal(GpuSpec::h100_sxm(4), ModelSpec::llama3_8b());
        let ratio = pass.as_secs_f64() / four.prefill(8192, 0).as_secs_f64();
        assert!((ratio - 4.0).abs() < 1e-6);
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
    }
}
