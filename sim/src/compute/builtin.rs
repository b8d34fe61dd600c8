//! The built-in compute profiles: datasheet GPUs and published model shapes, with
//! roofline coefficients fitted to NVIDIA AIConfigurator's measured kernel database.
//!
//! Owns: [`ComputeModel::BUILTIN`], [`ComputeModel::builtin`] and the fitted
//! coefficients. Never: fits anything at run time; scripts/fit_compute_profiles.py fits
//! them (to sim/data/aiconfigurator-vllm.csv, from scripts/aiconfigurator_grid.py) and
//! the numbers below are what it printed. Refit and paste them when the table changes;
//! tests/compute_estimate.rs checks the result against the same table.

use super::{Calibration, ComputeModel, GpuSpec, ModelSpec, UnknownProfile};

/// A profile's fitted coefficients, in the fit script's order.
struct Fitted {
    pass_overhead_us: f64,
    decode_overhead_us: f64,
    flops_efficiency: f64,
    hbm_efficiency: f64,
    attention_flops_efficiency: f64,
    kv_hbm_efficiency: f64,
    allreduce_latency_us: f64,
    link_efficiency: f64,
}

impl Fitted {
    fn calibration(&self) -> Calibration {
        Calibration {
            flops_efficiency: self.flops_efficiency,
            hbm_efficiency: self.hbm_efficiency,
            pass_overhead_us: self.pass_overhead_us,
            decode_overhead_us: Some(self.decode_overhead_us),
            attention_flops_efficiency: Some(self.attention_flops_efficiency),
            kv_hbm_efficiency: Some(self.kv_hbm_efficiency),
            allreduce_latency_us: self.allreduce_latency_us,
            link_efficiency: self.link_efficiency,
        }
    }
}

// Fitted to AIConfigurator 0.12.0, SILICON database, vLLM backend (its database 0.24.0
// for H100 SXM and H200, 0.14.0 for A100 SXM), Llama-3.1-8B at TP1 and Llama-3.1-70B at
// the profile's TP, queried 2026-11-26 (scripts/aiconfigurator_grid.py); residuals in
// BENCHMARKS.md ("Compute profiles fitted to AIConfigurator").
const H100_LLAMA3_8B: Fitted = Fitted {
    pass_overhead_us: 464.0,
    decode_overhead_us: 0.0,
    flops_efficiency: 0.811,
    hbm_efficiency: 0.751,
    attention_flops_efficiency: 0.641,
    kv_hbm_efficiency: 0.816,
    allreduce_latency_us: 0.0,
    link_efficiency: 1.0,
};
const H100X4_LLAMA3_70B: Fitted = Fitted {
    pass_overhead_us: 835.0,
    decode_overhead_us: 0.0,
    flops_efficiency: 0.887,
    hbm_efficiency: 0.698,
    attention_flops_efficiency: 0.63,
    kv_hbm_efficiency: 0.883,
    allreduce_latency_us: 0.0,
    link_efficiency: 0.404,
};
const H200_LLAMA3_8B: Fitted = Fitted {
    pass_overhead_us: 186.0,
    decode_overhead_us: 0.0,
    flops_efficiency: 0.799,
    hbm_efficiency: 0.67,
    attention_flops_efficiency: 0.641,
    kv_hbm_efficiency: 0.844,
    allreduce_latency_us: 0.0,
    link_efficiency: 1.0,
};
const H200X2_LLAMA3_70B: Fitted = Fitted {
    pass_overhead_us: 0.0,
    decode_overhead_us: 1750.0,
    flops_efficiency: 0.724,
    hbm_efficiency: 0.756,
    attention_flops_efficiency: 0.539,
    kv_hbm_efficiency: 0.999,
    allreduce_latency_us: 0.0,
    link_efficiency: 1.0,
};
const A100_LLAMA3_8B: Fitted = Fitted {
    pass_overhead_us: 4360.0,
    decode_overhead_us: 3940.0,
    flops_efficiency: 0.9,
    hbm_efficiency: 1.0,
    attention_flops_efficiency: 0.606,
    kv_hbm_efficiency: 0.784,
    allreduce_latency_us: 0.0,
    link_efficiency: 1.0,
};
const A100X8_LLAMA3_70B: Fitted = Fitted {
    pass_overhead_us: 3770.0,
    decode_overhead_us: 2590.0,
    flops_efficiency: 0.638,
    hbm_efficiency: 1.0,
    attention_flops_efficiency: 1.0,
    kv_hbm_efficiency: 0.703,
    allreduce_latency_us: 41.3,
    link_efficiency: 1.0,
};

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

    /// A built-in profile: a GPU and model pair with its fitted calibration (70B on
    /// enough GPUs for its weights), or `dynosim`.
    pub fn builtin(name: &str) -> Result<Self, UnknownProfile> {
        let roofline = |gpu: GpuSpec, model: ModelSpec, fitted: &Fitted| ComputeModel::Roofline {
            model,
            gpu,
            calibration: fitted.calibration(),
        };
        let (l8, l70) = (ModelSpec::llama3_8b, ModelSpec::llama3_70b);
        Ok(match name {
            "h100-llama3-8b" => roofline(GpuSpec::h100_sxm(1), l8(), &H100_LLAMA3_8B),
            "h100x4-llama3-70b" => roofline(GpuSpec::h100_sxm(4), l70(), &H100X4_LLAMA3_70B),
            "h200-llama3-8b" => roofline(GpuSpec::h200(1), l8(), &H200_LLAMA3_8B),
            "h200x2-llama3-70b" => roofline(GpuSpec::h200(2), l70(), &H200X2_LLAMA3_70B),
            "a100-llama3-8b" => roofline(GpuSpec::a100(1), l8(), &A100_LLAMA3_8B),
            "a100x8-llama3-70b" => roofline(GpuSpec::a100(8), l70(), &A100X8_LLAMA3_70B),
            "dynosim" => ComputeModel::Dynosim,
            _ => {
                return Err(UnknownProfile {
                    name: name.into(),
                    known: Self::BUILTIN.join(", "),
                })
            }
        })
    }
}
