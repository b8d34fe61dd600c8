//! Static estimates: what one replica takes for a batch of identical requests, straight
//! from the compute model, with no simulation (no queueing, no cache, no scheduler).
//!
//! Owns: [`EstimateRequest`], [`Estimate`] (its fields named as AIConfigurator's
//! `cli estimate` names them, so the two compare one to one) and [`EstimateError`].
//! Never: parses flags or prints; `kvtwin estimate` does.
//!
//! The batch's prompts prefill together in one pass (the TTFT); then it decodes
//! `osl − 1` steps (the first token comes with the prefill), every sequence holding one
//! more token each step; the TPOT is their mean.

use super::{ComputeModel, Pass, GPU_MEMORY_UTILIZATION};
use serde::Serialize;

/// What to estimate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EstimateRequest {
    /// Prompt tokens per request, the cached prefix included.
    pub isl: u64,
    /// Output tokens per request.
    pub osl: u64,
    /// Requests together.
    pub batch: u64,
    /// Prompt tokens already in the KV cache (not prefilled).
    pub prefix: u64,
    /// KV tokens the device holds, for models that need it (DynoSim's utilisation term);
    /// `None`: what the profile says, else 1,048,576.
    pub capacity_tokens: Option<u64>,
}

/// One estimate (times in milliseconds, rates per second).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Estimate {
    /// Prompt tokens per request.
    pub isl: u64,
    /// Output tokens per request.
    pub osl: u64,
    /// Cached prompt tokens per request.
    pub prefix: u64,
    /// Requests together.
    pub batch_size: u64,
    /// GPUs of the replica (tensor parallel).
    pub tp_size: u32,
    /// Time to first token: the batch's prefill pass.
    pub ttft: f64,
    /// Time per output token after the first: the mean decode step.
    pub tpot: f64,
    /// TTFT plus the decode steps.
    pub request_latency: f64,
    /// The prefill part of the request latency (the TTFT).
    pub context_latency: f64,
    /// The decode part of the request latency.
    pub generation_latency: f64,
    /// Requests completed per second.
    pub seq_per_second: f64,
    /// Output tokens per second.
    pub tokens_per_second: f64,
    /// Output tokens per second per GPU.
    pub tokens_per_second_per_gpu: f64,
    /// Output tokens per second each request sees while decoding (0 with one output
    /// token).
    pub tokens_per_second_per_user: f64,
    /// GB of one GPU's memory for weights and the batch's KV (`None`: the profile does
    /// not say).
    pub memory: Option<f64>,
    /// KV-cache bytes of one request at its last token (`None`: the profile does not
    /// say).
    pub kv_bytes_per_sequence: Option<u64>,
}

/// A request that cannot be estimated; `field` is the request's (the flag's) name.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EstimateError {
    /// A size that must be positive is 0.
    #[error("{field} must be at least 1")]
    Zero {
        /// Which.
        field: &'static str,
    },
    /// A size past what the estimate models.
    #[error("{field} must be at most {max} (got {value})")]
    TooLarge {
        /// Which.
        field: &'static str,
        /// What was asked.
        value: u64,
        /// The most there may be.
        max: u64,
    },
    /// The cached prefix is the whole prompt or more.
    #[error("prefix ({prefix}) must be below isl ({isl}): at least one prompt token is prefilled")]
    PrefixTooLong {
        /// The prefix asked for.
        prefix: u64,
        /// The prompt length.
        isl: u64,
    },
    /// The batch's KV cache does not fit the GPUs' memory.
    #[error(
        "batch: {batch} sequences of {tokens} tokens need {needed_gb:.1} GB a GPU for \
         weights and KV, over the {usable_gb:.1} GB usable of {gpu} (90 % of its memory); \
         at most {fits} fit"
    )]
    DoesNotFit {
        /// The batch asked for.
        batch: u64,
        /// Tokens per sequence at its end (isl + osl).
        tokens: u64,
        /// GB a GPU would need.
        needed_gb: f64,
        /// GB a GPU can give.
        usable_gb: f64,
        /// The GPU (or table) named.
        gpu: String,
        /// The largest batch that fits.
        fits: u64,
    },
}

/// Sequences in one batch at most: far past any engine's (vLLM's `max_num_seqs` is 256
/// to 1,024), and the prefill pass lists them one by one.
pub const MAX_BATCH: u64 = 65_536;

/// Decode steps timed one by one at most; a longer output is sampled at this many steps
/// spread evenly over it (a step's time moves smoothly with the context).
const MAX_TIMED_STEPS: u64 = 4096;

/// What the profile says about memory: (GPUs, weight bytes per GPU, KV bytes per token
/// per GPU, usable bytes per GPU, the name); zeros where unknown.
struct Footprint {
    gpus: u32,
    weight_bytes_per_gpu: f64,
    kv_bytes_per_token: u64,
    usable_bytes_per_gpu: f64,
    name: String,
    max_kv_tokens: Option<u64>,
}

fn footprint(model: &ComputeModel) -> Footprint {
    match model {
        ComputeModel::Roofline { model, gpu, .. } => {
            let gpus = gpu.count.max(1);
            let usable = gpu.memory_bytes as f64 * GPU_MEMORY_UTILIZATION;
            let weights = model.weight_bytes() as f64 / f64::from(gpus);
            let kv = model.kv_bytes_per_token();
            let max_kv_tokens = (gpu.memory_bytes > 0 && kv > 0)
                .then(|| ((usable - weights).max(0.0) * f64::from(gpus) / kv as f64) as u64);
            Footprint {
                gpus,
                weight_bytes_per_gpu: weights,
                kv_bytes_per_token: kv,
                usable_bytes_per_gpu: usable,
                name: gpu.name.clone(),
                max_kv_tokens,
            }
        }
        ComputeModel::Table(table) => Footprint {
            gpus: table.gpus.max(1),
            weight_bytes_per_gpu: 0.0,
            kv_bytes_per_token: table.kv_bytes_per_token,
            usable_bytes_per_gpu: 0.0,
            name: table.name.clone(),
            max_kv_tokens: (table.max_kv_tokens > 0).then_some(table.max_kv_tokens),
        },
        ComputeModel::Dynosim | ComputeModel::Linear { .. } => Footprint {
            gpus: 1,
            weight_bytes_per_gpu: 0.0,
            kv_bytes_per_token: 0,
            usable_bytes_per_gpu: 0.0,
            name: "the profile".into(),
            max_kv_tokens: None,
        },
    }
}

/// The static estimate of `request` on `model` (see the module documentation).
pub fn estimate(
    model: &ComputeModel,
    request: &EstimateRequest,
) -> Result<Estimate, EstimateError> {
    for (field, value) in [
        ("isl", request.isl),
        ("osl", request.osl),
        ("batch", request.batch),
    ] {
        if value == 0 {
            return Err(EstimateError::Zero { field });
        }
    }
    if request.batch > MAX_BATCH {
        return Err(EstimateError::TooLarge {
            field: "batch",
            value: request.batch,
            max: MAX_BATCH,
        });
    }
    if request.prefix >= request.isl {
        return Err(EstimateError::PrefixTooLong {
            prefix: request.prefix,
            isl: request.isl,
        });
    }
    let footprint = footprint(model);
    let tokens = request.isl + request.osl;
    if let Some(max_kv_tokens) = footprint.max_kv_tokens {
        if request.batch.saturating_mul(tokens) > max_kv_tokens {
            let gpus = f64::from(footprint.gpus);
            let needed = footprint.weight_bytes_per_gpu
                + (request.batch * tokens * footprint.kv_bytes_per_token) as f64 / gpus;
            let usable = if footprint.usable_bytes_per_gpu > 0.0 {
                footprint.usable_bytes_per_gpu
            } else {
                (max_kv_tokens * footprint.kv_bytes_per_token) as f64 / gpus
            };
            return Err(EstimateError::DoesNotFit {
                batch: request.batch,
                tokens,
                needed_gb: needed / 1e9,
                usable_gb: usable / 1e9,
                gpu: footprint.name,
                fits: max_kv_tokens / tokens,
            });
        }
    }
    let capacity = request
        .capacity_tokens
        .or(footprint.max_kv_tokens)
        .unwrap_or(1 << 20);

    let new = request.isl - request.prefix;
    let prefill = Pass {
        prefills: vec![(new, request.prefix); request.batch as usize],
        decodes: 0,
        decode_context: 0,
    };
    let ttft = model.pass(&prefill, capacity).prefill.as_secs_f64() * 1e3;
    let steps = request.osl - 1;
    let step_ms = |step: u64| {
        let context = request
            .batch
            .saturating_mul(request.isl.saturating_add(step));
        model
            .decode_step(request.batch, context, capacity)
            .as_secs_f64()
            * 1e3
    };
    let generation: f64 = if steps <= MAX_TIMED_STEPS {
        (1..=steps).map(step_ms).sum()
    } else {
        // The mean of evenly spread steps (the middle of each of MAX_TIMED_STEPS runs),
        // times the steps.
        let run = steps as f64 / MAX_TIMED_STEPS as f64;
        let mean = (0..MAX_TIMED_STEPS)
            .map(|i| step_ms(1 + ((i as f64 + 0.5) * run) as u64))
            .sum::<f64>()
            / MAX_TIMED_STEPS as f64;
        mean * steps as f64
    };
    let tpot = if steps == 0 {
        0.0
    } else {
        generation / steps as f64
    };
    let latency = ttft + generation;
    let seq_per_second = request.batch as f64 * 1e3 / latency;
    let tokens_per_second = seq_per_second * request.osl as f64;
    let kv_bytes_per_sequence =
        (footprint.kv_bytes_per_token > 0).then(|| tokens * footprint.kv_bytes_per_token);
    let memory = (footprint.weight_bytes_per_gpu > 0.0).then(|| {
        (footprint.weight_bytes_per_gpu
            + (request.batch * tokens * footprint.kv_bytes_per_token) as f64
                / f64::from(footprint.gpus))
            / 1e9
    });
    Ok(Estimate {
        isl: request.isl,
        osl: request.osl,
        prefix: request.prefix,
        batch_size: request.batch,
        tp_size: footprint.gpus,
        ttft,
        tpot,
        request_latency: latency,
        context_latency: ttft,
        generation_latency: generation,
        seq_per_second,
        tokens_per_second,
        tokens_per_second_per_gpu: tokens_per_second / f64::from(footprint.gpus),
        tokens_per_second_per_user: if tpot > 0.0 { 1e3 / tpot } else { 0.0 },
        memory,
        kv_bytes_per_sequence,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(isl: u64, osl: u64, batch: u64) -> EstimateRequest {
        EstimateRequest {
            isl,
            osl,
            batch,
            prefix: 0,
            capacity_tokens: None,
        }
    }

    #[test]
    fn the_figures_follow_from_the_prefill_and_the_decode_steps() {
        let model = ComputeModel::builtin("h100-llama3-8b").unwrap();
        let estimate = estimate(&model, &request(4096, 128, 8)).unwrap();
        let prefill = model
            .pass(
                &Pass {
                    prefills: vec![(4096, 0); 8],
                    ..Pass::default()
                },
                1 << 20,
            )
            .prefill;
        assert!((estimate.ttft - prefill.as_secs_f64() * 1e3).abs() < 1e-9);
        // The mean step lies between the first and the last.
        let first = model.decode_step(8, 8 * 4097, 1 << 20).as_secs_f64() * 1e3;
        let last = model.decode_step(8, 8 * 4223, 1 << 20).as_secs_f64() * 1e3;
        assert!(
            first <= estimate.tpot && estimate.tpot <= last,
            "{estimate:?}"
        );
        let latency = estimate.ttft + 127.0 * estimate.tpot;
        assert!((estimate.request_latency - latency).abs() < 1e-6);
        assert!((estimate.seq_per_second - 8e3 / latency).abs() < 1e-9);
        assert!((estimate.tokens_per_second - 128.0 * 8e3 / latency).abs() < 1e-6);
        assert!((estimate.tokens_per_second_per_user - 1e3 / estimate.tpot).abs() < 1e-9);
        assert_eq!(estimate.kv_bytes_per_sequence, Some(4224 * 131_072));
        // 16.06 GB of weights and 8 × 4,224 × 128 KiB of KV.
        let memory = (16.06e9 + 8.0 * 4224.0 * 131_072.0) / 1e9;
        assert!((estimate.memory.unwrap() - memory).abs() < 1e-9);
    }

    #[test]
    fn a_long_output_is_sampled_and_matches_the_step_by_step_mean() {
        let model = ComputeModel::builtin("h100-llama3-8b").unwrap();
        // 4,096 steps are timed one by one; 40,000 are sampled at 4,096.
        let exact = estimate(&model, &request(1024, 4097, 4)).unwrap();
        let sampled = estimate(&model, &request(1024, 40_001, 4)).unwrap();
        let exact_long: f64 = (1..=40_000u64)
            .map(|step| {
                model
                    .decode_step(4, 4 * (1024 + step), 1 << 20)
                    .as_secs_f64()
                    * 1e3
            })
            .sum::<f64>()
            / 40_000.0;
        assert!(
            (sampled.tpot / exact_long - 1.0).abs() < 1e-3,
            "{sampled:?}"
        );
        assert!(sampled.tpot > exact.tpot, "longer contexts, slower steps");
        // A billion output tokens (on a profile that checks no memory) take no longer to
        // estimate than 4,096.
        let huge = estimate(&ComputeModel::Dynosim, &request(1024, 1_000_000_000, 1)).unwrap();
        assert!(huge.tpot > 0.0 && huge.request_latency > 1e6);
    }

    #[test]
    fn one_output_token_has_no_decode() {
        let model = ComputeModel::builtin("h100-llama3-8b").unwrap();
        let estimate = estimate(&model, &request(1024, 1, 1)).unwrap();
        assert_eq!(estimate.tpot, 0.0);
        assert_eq!(estimate.tokens_per_second_per_user, 0.0);
        assert_eq!(estimate.request_latency, estimate.ttft);
    }

    #[test]
    fn a_cached_prefix_is_not_prefilled_but_attended_to() {
        let model = ComputeModel::builtin("h100-llama3-8b").unwrap();
        let whole = estimate(&model, &request(8192, 1, 1)).unwrap();
        let cached = estimate(
            &model,
            &EstimateRequest {
                prefix: 4096,
                ..request(8192, 1, 1)
            },
        )
        .unwrap();
        let half = estimate(&model, &request(4096, 1, 1)).unwrap();
        assert!(
            cached.ttft < whole.ttft && cached.ttft > half.ttft,
            "{cached:?}"
        );
    }

    #[test]
    fn impossible_requests_name_what_is_wrong() {
        let model = ComputeModel::builtin("h100-llama3-8b").unwrap();
        for (bad, field) in [
            (request(0, 1, 1), "isl"),
            (request(1, 0, 1), "osl"),
            (request(1, 1, 0), "batch"),
        ] {
            assert_eq!(
                estimate(&model, &bad).unwrap_err(),
                EstimateError::Zero { field }
            );
        }
        let error = estimate(
            &model,
            &EstimateRequest {
                prefix: 1024,
                ..request(1024, 1, 1)
            },
        )
        .unwrap_err();
        assert!(
            matches!(error, EstimateError::PrefixTooLong { .. }),
            "{error}"
        );
        // Past any engine's batch: refused before the pass is listed.
        let error = estimate(&ComputeModel::Dynosim, &request(100, 2, 1 << 40)).unwrap_err();
        assert!(
            matches!(error, EstimateError::TooLarge { field: "batch", .. }),
            "{error}"
        );
        // 512 sequences of 8 K tokens: 550 GB of KV on an 80 GB H100.
        let error = estimate(&model, &request(8192, 1, 512)).unwrap_err();
        let EstimateError::DoesNotFit { fits, .. } = &error else {
            panic!("{error}");
        };
        // (72 − 16.06) GB over 8,193 tokens × 128 KiB: 52 sequences.
        assert_eq!(*fits, 52, "{error}");
        assert!(
            error.to_string().starts_with("batch: 512 sequences"),
            "{error}"
        );
        // The 70B on four H100s holds more of them.
        let large = ComputeModel::builtin("h100x4-llama3-70b").unwrap();
        assert!(estimate(&large, &request(8192, 1, 52)).is_ok());
    }
}
