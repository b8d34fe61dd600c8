//! The roofline time of one forward pass: GEMMs, attention and tensor-parallel
//! all-reduces, each bounded by the GPUs' arithmetic or their memory traffic.
//!
//! Owns: [`roofline_work`]. Never: decides what goes into a pass, or where the
//! coefficients come from (the built-in ones are fitted by
//! scripts/fit_compute_profiles.py, which computes this same sum: keep the two alike).
//!
//! A pass of prefill chunks `(new T, cached C)` and `B` decoding sequences attending to
//! `K` context tokens in all, on `n` GPUs in tensor parallel, takes
//! - the per-pass overhead (launches, sampling, scheduling; `decode_overhead_us` for a
//!   pass with no prefill, which engines replay as one CUDA graph), plus
//! - the GEMMs: `2 × params × tokens` FLOPs at `flops_efficiency` of the GPUs' peak
//!   against the weights read once at `hbm_efficiency` of their bandwidth (memory bound
//!   for a decode batch, compute bound for a prompt), plus
//! - attention: `4 × layers × heads × head_dim` FLOPs per (query, key) pair (`T × C +
//!   T² / 2` per chunk, one per context token when decoding) at
//!   `attention_flops_efficiency`, against the KV cache read (`T + C` and `K` tokens) at
//!   `kv_hbm_efficiency`; plus
//! - on more than one GPU, two ring all-reduces of the tokens' hidden states per layer,
//!   each `allreduce_latency_us` plus `2 (n − 1) / n` of the message over the GPU's
//!   link at `link_efficiency`.
//!
//! The kernels of a pass run one after another, so their times add; each alone is a
//! roofline, softened: arithmetic `a` against memory `m` take `√(a² + m²)` rather than
//! `max(a, m)`, because near the ridge neither unit is kept busy all the time (measured
//! GEMMs of a few hundred tokens are slower than either limit). (Before the fit, one
//! hard roofline covered the whole pass; it could not be right both for prompts, whose
//! attention is slower than their GEMMs, and for decode steps.)

use super::{Calibration, GpuSpec, ModelSpec};
use std::time::Duration;

/// The roofline time of prefill chunks `(new, cached)` and `decodes` sequences attending
/// to `context` tokens in one pass (see the module documentation).
pub(crate) fn roofline_work(
    model: &ModelSpec,
    gpu: &GpuSpec,
    calibration: &Calibration,
    prefills: &[(u64, u64)],
    decodes: u64,
    context: u64,
) -> Duration {
    let count = f64::from(gpu.count.max(1));
    let flops_per_s = gpu.flops_per_s * count;
    let hbm_bytes_per_s = gpu.hbm_bytes_per_s * count;
    let efficiency = |fraction: f64| fraction.max(1e-6);

    let tokens = (prefills.iter().map(|(t, _)| t).sum::<u64>() + decodes) as f64;
    let pairs: f64 = prefills
        .iter()
        .map(|(t, c)| *t as f64 * *c as f64 + (*t as f64).powi(2) / 2.0)
        .sum::<f64>()
        + context as f64;
    let kv_tokens = (prefills.iter().map(|(t, c)| t + c).sum::<u64>() + context) as f64;

    let gemm = gemm_seconds(model, gpu, calibration, tokens);
    let attention = soft_roofline(
        model.attention_flops_per_pair() * pairs
            / (flops_per_s * efficiency(calibration.attention_flops_efficiency())),
        kv_tokens * model.kv_bytes_per_token() as f64
            / (hbm_bytes_per_s * efficiency(calibration.kv_hbm_efficiency())),
    );
    let allreduce = if gpu.count > 1 && gpu.link_bytes_per_s > 0.0 {
        let message =
            tokens * (model.hidden * model.dtype_bytes) as f64 * 2.0 * (count - 1.0) / count;
        2.0 * model.layers as f64
            * (calibration.allreduce_latency_us * 1e-6
                + message / (gpu.link_bytes_per_s * efficiency(calibration.link_efficiency)))
    } else {
        0.0
    };
    let overhead_us = if prefills.is_empty() {
        calibration.decode_overhead_us()
    } else {
        calibration.pass_overhead_us
    };
    let seconds = overhead_us * 1e-6 + gemm + attention + allreduce;
    Duration::from_nanos(super::round_to_u64(seconds * 1e9))
}

/// The GEMM part of a pass of `tokens` tokens, seconds: their FLOPs against the weights
/// read once (what `kvtwin bench gemm` measures on a GPU).
pub fn gemm_seconds(
    model: &ModelSpec,
    gpu: &GpuSpec,
    calibration: &Calibration,
    tokens: f64,
) -> f64 {
    let count = f64::from(gpu.count.max(1));
    soft_roofline(
        2.0 * model.params as f64 * tokens
            / (gpu.flops_per_s * count * calibration.flops_efficiency.max(1e-6)),
        model.weight_bytes() as f64
            / (gpu.hbm_bytes_per_s * count * calibration.hbm_efficiency.max(1e-6)),
    )
}

/// Arithmetic time against memory time: the roofline's `max`, softened (module doc).
fn soft_roofline(arithmetic_s: f64, memory_s: f64) -> f64 {
    arithmetic_s.hypot(memory_s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ideal() -> Calibration {
        Calibration {
            flops_efficiency: 1.0,
            hbm_efficiency: 1.0,
            pass_overhead_us: 0.0,
            decode_overhead_us: None,
            attention_flops_efficiency: None,
            kv_hbm_efficiency: None,
            allreduce_latency_us: 0.0,
            link_efficiency: 1.0,
        }
    }

    #[test]
    fn decode_reads_the_weights_and_the_kv_cache() {
        let (model, gpu) = (ModelSpec::llama3_8b(), GpuSpec::h100_sxm(1));
        // 16.06 GB of weights at 3.35 TB/s against the 32 tokens' 0.51 TFLOP at 989
        // TFLOP/s, then 32 × 2,048 tokens × 128 KiB of KV (8.59 GB) at 3.35 TB/s against
        // their 34 GFLOP of attention.
        let step = roofline_work(&model, &gpu, &ideal(), &[], 32, 32 * 2048).as_secs_f64();
        let gemm = f64::hypot(16.06e9 / 3.35e12, 2.0 * 8.03e9 * 32.0 / 989e12);
        let attention = f64::hypot(
            32.0 * 2048.0 * 131_072.0 / 3.35e12,
            4.0 * 32.0 * 32.0 * 128.0 * 32.0 * 2048.0 / 989e12,
        );
        assert!((step - gemm - attention).abs() < 2e-9, "{step}");
        // Memory bound: the softened roofline is within 1 % of the hard one.
        let hard = 16.06e9 / 3.35e12 + 32.0 * 2048.0 * 131_072.0 / 3.35e12;
        assert!(step > hard && step < hard * 1.01, "{step} vs {hard}");
    }

    #[test]
    fn a_prompt_costs_its_gemm_flops_and_its_attention_flops() {
        let (model, gpu) = (ModelSpec::llama3_8b(), GpuSpec::h100_sxm(1));
        // 8,192 new tokens: 2 × 8.03e9 × 8192 = 131.6 TFLOP of GEMMs, then 4 × 32 × 32 ×
        // 128 × 8192² / 2 = 17.6 TFLOP of attention, at 989 TFLOP/s.
        // The weights (4.8 ms) and the KV (0.3 ms) soften it by under 0.1 %.
        let t = 8192.0;
        let gemm = f64::hypot(2.0 * 8.03e9 * t / 989e12, 16.06e9 / 3.35e12);
        let kv_read = t * 131_072.0 / 3.35e12;
        let attention_flops = 4.0 * 32.0 * 32.0 * 128.0 * t * t / 2.0 / 989e12;
        let pass = roofline_work(&model, &gpu, &ideal(), &[(8192, 0)], 0, 0).as_secs_f64();
        let expected = gemm + attention_flops.hypot(kv_read);
        assert!((pass - expected).abs() < 2e-9, "{pass} vs {expected}");
        // Attention at half the efficiency of the GEMMs doubles its arithmetic only.
        let slow = Calibration {
            attention_flops_efficiency: Some(0.5),
            ..ideal()
        };
        let slower = roofline_work(&model, &gpu, &slow, &[(8192, 0)], 0, 0).as_secs_f64();
        let expected = gemm + (2.0 * attention_flops).hypot(kv_read);
        assert!((slower - expected).abs() < 2e-9, "{slower} vs {expected}");
        // The same tokens after a cached context attend to it as well.
        assert!(
            roofline_work(&model, &gpu, &ideal(), &[(8192, 32_768)], 0, 0).as_secs_f64() > pass
        );
    }

    #[test]
    fn tensor_parallel_splits_the_work_and_adds_two_allreduces_a_layer() {
        let model = ModelSpec::llama3_8b();
        let one = roofline_work(&model, &GpuSpec::h100_sxm(1), &ideal(), &[(4096, 0)], 0, 0)
            .as_secs_f64();
        // Without a link the four GPUs are a quarter of the time.
        let unlinked = GpuSpec {
            link_bytes_per_s: 0.0,
            ..GpuSpec::h100_sxm(4)
        };
        let four = roofline_work(&model, &unlinked, &ideal(), &[(4096, 0)], 0, 0).as_secs_f64();
        assert!((one / four - 4.0).abs() < 1e-6);
        // Over NVLink: 64 all-reduces of 4,096 × 4,096 × 2 bytes, each GPU sending 3/4 of
        // twice that, at 450 GB/s, plus 10 µs each.
        let calibration = Calibration {
            allreduce_latency_us: 10.0,
            ..ideal()
        };
        let linked = roofline_work(
            &model,
            &GpuSpec::h100_sxm(4),
            &calibration,
            &[(4096, 0)],
            0,
            0,
        )
        .as_secs_f64();
        let message = 4096.0 * 4096.0 * 2.0 * 2.0 * 3.0 / 4.0;
        let expected = four + 64.0 * (10e-6 + message / 450e9);
        assert!((linked - expected).abs() < 2e-9, "{linked} vs {expected}");
    }

    #[test]
    fn a_pass_without_prefill_pays_the_decode_overhead() {
        let (model, gpu) = (ModelSpec::llama3_8b(), GpuSpec::h100_sxm(1));
        let calibration = Calibration {
            pass_overhead_us: 1000.0,
            decode_overhead_us: Some(200.0),
            ..Calibration::default()
        };
        let plain = Calibration {
            pass_overhead_us: 0.0,
            decode_overhead_us: Some(0.0),
            ..calibration.clone()
        };
        let at = |c: &Calibration, prefills: &[(u64, u64)], decodes| {
            roofline_work(&model, &gpu, c, prefills, decodes, decodes * 1024).as_secs_f64()
        };
        assert!((at(&calibration, &[], 8) - at(&plain, &[], 8) - 200e-6).abs() < 2e-9);
        let mixed = [(512, 0)];
        assert!((at(&calibration, &mixed, 8) - at(&plain, &mixed, 8) - 1000e-6).abs() < 2e-9);
        // Unset, the decode overhead is the pass overhead.
        let unset = Calibration {
            decode_overhead_us: None,
            ..calibration
        };
        assert!((at(&unset, &[], 8) - at(&plain, &[], 8) - 1000e-6).abs() < 2e-9);
    }
}
