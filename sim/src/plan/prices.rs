//! What a configuration costs per hour: GPUs by type, host DRAM and SSD by the GB.
//!
//! Owns: [`Prices`] (a RON file, or [`Prices::default`] with its sources), the GPU
//! memory table the planner checks device blocks against ([`hbm_bytes`]), and
//! [`GpuShape`], the GPUs one worker runs on as a compute model names them.
//! Never: include what a cluster pays regardless of its size (network, power, staff):
//! prices compare configurations, they do not make an invoice.
//!
//! The defaults are on-demand list prices in US dollars, late 2025, rounded; check your
//! own provider's and pass them with `--prices`:
//! - GPUs, per GPU-hour: H100 SXM 2.99 and A100 SXM 80 GB 1.79 (Lambda's on-demand
//!   8-GPU instances, per GPU), H200 3.79 (the H100's price plus the 0.90–1.20 $/h
//!   premium H200s carried in neoclouds' lists of late 2025, e.g. deploybase.ai's "H100
//!   vs H200", September 2025). Quotes for one GPU span 0.5 to 15 $/h with commitment,
//!   availability and platform, so these only rank configurations; pass yours. A compute
//!   model without a GPU (`dynosim`, `Linear`) is priced as one `default_gpu`.
//! - DRAM: 0.0036 per GB-hour, the difference between AWS us-east-1 r7i.xlarge (32 GiB,
//!   0.2646 $/h) and c7i.xlarge (8 GiB, 0.1785 $/h), the same vCPUs, over 24 GiB.
//! - SSD: 0.00011 per GB-hour, AWS EBS gp3 at 0.08 per GB-month (730 hours); local NVMe
//!   costs about the same per GB in instance prices.

pub use crate::compute::GPU_MEMORY_UTILIZATION;
use crate::compute::{ComputeModel, GpuSpec};
use crate::ron_file::{self, RonFileError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Prices per hour, in US dollars.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Prices {
    /// Per GPU-hour, by GPU name as the compute model has it (`h100-sxm`, `h200`,
    /// `a100-sxm-80gb`, or a custom model's `gpu.name`).
    pub gpu_usd_per_hour: BTreeMap<String, f64>,
    /// The GPU a compute model without one (`dynosim`, `Linear`) is priced as.
    #[serde(default = "default_gpu")]
    pub default_gpu: String,
    /// Host DRAM per GB-hour (10⁹ bytes).
    pub dram_usd_per_gb_hour: f64,
    /// SSD per GB-hour (10⁹ bytes).
    pub ssd_usd_per_gb_hour: f64,
}

fn default_gpu() -> String {
    "h100-sxm".into()
}

impl Default for Prices {
    /// The list prices of the module doc.
    fn default() -> Self {
        Self {
            gpu_usd_per_hour: BTreeMap::from([
                ("h100-sxm".to_string(), 2.99),
                ("h200".to_string(), 3.79),
                ("a100-sxm-80gb".to_string(), 1.79),
            ]),
            default_gpu: default_gpu(),
            dram_usd_per_gb_hour: 0.0036,
            ssd_usd_per_gb_hour: 0.00011,
        }
    }
}

/// A prices file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PriceError {
    /// Unreadable, malformed, or a field missing or unknown (names file, line, column).
    #[error(transparent)]
    File(#[from] RonFileError),
    /// A price that is negative or not a number.
    #[error("{file}: {field}: {value} is not a price (a finite number ≥ 0)")]
    NotAPrice {
        /// The file.
        file: String,
        /// The field.
        field: String,
        /// Its value.
        value: f64,
    },
    /// A GPU the space uses has no price.
    #[error("{file}: gpu_usd_per_hour has no price for GPU {gpu:?} (it has: {known})")]
    UnknownGpu {
        /// The file.
        file: String,
        /// The GPU.
        gpu: String,
        /// The GPUs priced, comma separated.
        known: String,
    },
}

impl Prices {
    /// The prices of a RON file, checked.
    pub fn load(path: &Path) -> Result<Self, PriceError> {
        let prices: Prices = ron_file::load(path)?;
        prices.check(&path.display().to_string())?;
        Ok(prices)
    }

    /// Every price is a finite number ≥ 0; `file` names the source in errors.
    pub fn check(&self, file: &str) -> Result<(), PriceError> {
        let fields = self
            .gpu_usd_per_hour
            .iter()
            .map(|(gpu, price)| (format!("gpu_usd_per_hour[{gpu:?}]"), *price))
            .chain([
                (
                    "dram_usd_per_gb_hour".to_string(),
                    self.dram_usd_per_gb_hour,
                ),
                ("ssd_usd_per_gb_hour".to_string(), self.ssd_usd_per_gb_hour),
            ]);
        for (field, value) in fields {
            if !(value.is_finite() && value >= 0.0) {
                return Err(PriceError::NotAPrice {
                    file: file.to_string(),
                    field,
                    value,
                });
            }
        }
        Ok(())
    }

    /// Per hour for one GPU named `gpu`; `file` names the prices' source in errors.
    pub fn gpu(&self, gpu: &str, file: &str) -> Result<f64, PriceError> {
        self.gpu_usd_per_hour
            .get(gpu)
            .copied()
            .ok_or_else(|| PriceError::UnknownGpu {
                file: file.to_string(),
                gpu: gpu.to_string(),
                known: self
                    .gpu_usd_per_hour
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }
}

/// The GPUs one worker runs on, and the model's weights on them.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuShape {
    /// The GPU's name (a key of [`Prices::gpu_usd_per_hour`]).
    pub name: String,
    /// GPUs per worker (tensor parallel).
    pub count: u32,
    /// Bytes of weights over all of them; 0 when the compute model has no model.
    pub weight_bytes: u64,
}

impl GpuShape {
    /// The GPUs of `model`: a roofline's, or one `default_gpu` for the others.
    pub fn of(model: &ComputeModel, default_gpu: &str) -> Self {
        match model {
            ComputeModel::Roofline { model, gpu, .. } => Self {
                name: gpu.name.clone(),
                count: gpu.count.max(1),
                weight_bytes: model.weight_bytes(),
            },
            _ => Self {
                name: default_gpu.to_string(),
                count: 1,
                weight_bytes: 0,
            },
        }
    }

    /// Bytes the KV cache may take on the device: `GPU_MEMORY_UTILIZATION` of the HBM
    /// less the weights, or `None` for a GPU whose memory is not known.
    pub fn kv_bytes(&self) -> Option<u64> {
        let hbm = hbm_bytes(&self.name)? * u64::from(self.count);
        Some(((hbm as f64 * GPU_MEMORY_UTILIZATION) as u64).saturating_sub(self.weight_bytes))
    }
}

/// HBM bytes of one GPU of the built-in profiles, by name: their `GpuSpec`s'
/// `memory_bytes` (vendors' data sheets).
pub fn hbm_bytes(gpu: &str) -> Option<u64> {
    [GpuSpec::h100_sxm(1), GpuSpec::h200(1), GpuSpec::a100(1)]
        .into_iter()
        .find(|spec| spec.name == gpu)
        .map(|spec| spec.memory_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_files_are_checked_and_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.ron");
        std::fs::write(
            &path,
            r#"(gpu_usd_per_hour: {"h100-sxm": 2.5}, dram_usd_per_gb_hour: 0.004, ssd_usd_per_gb_hour: 0.0001)"#,
        )
        .unwrap();
        let prices = Prices::load(&path).unwrap();
        assert_eq!(prices.gpu("h100-sxm", "p").unwrap(), 2.5);
        assert_eq!(prices.default_gpu, "h100-sxm");
        let unknown = prices.gpu("b200", "p.ron").unwrap_err().to_string();
        assert!(
            unknown.contains("b200") && unknown.contains("h100-sxm"),
            "{unknown}"
        );

        std::fs::write(
            &path,
            r#"(gpu_usd_per_hour: {}, dram_usd_per_gb_hour: 0.1)"#,
        )
        .unwrap();
        let missing = Prices::load(&path).unwrap_err().to_string();
        assert!(missing.contains("ssd_usd_per_gb_hour"), "{missing}");
        std::fs::write(
            &path,
            r#"(gpu_usd_per_hour: {"h200": -1.0}, dram_usd_per_gb_hour: 0.1, ssd_usd_per_gb_hour: 0.1)"#,
        )
        .unwrap();
        let negative = Prices::load(&path).unwrap_err().to_string();
        assert!(
            negative.contains("gpu_usd_per_hour[\"h200\"]"),
            "{negative}"
        );
        std::fs::write(&path, "(gpu_usd_per_hour: {\"h200\": 1.0}, dram: 1)").unwrap();
        let unknown_field = Prices::load(&path).unwrap_err().to_string();
        assert!(unknown_field.contains("p.ron:1:"), "{unknown_field}");
        Prices::default().check("defaults").unwrap();
    }

    #[test]
    fn the_shipped_prices_file_holds_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plans/prices.ron");
        assert_eq!(Prices::load(&path).unwrap(), Prices::default());
    }

    #[test]
    fn device_memory_is_the_hbm_share_less_the_weights() {
        let h100 = GpuShape::of(&ComputeModel::builtin("h100-llama3-8b").unwrap(), "x");
        assert_eq!(h100.name, "h100-sxm");
        let kv = h100.kv_bytes().unwrap();
        assert_eq!(kv, 72_000_000_000 - h100.weight_bytes);
        let dynosim = GpuShape::of(&ComputeModel::Dynosim, "h200");
        assert_eq!((dynosim.name.as_str(), dynosim.count), ("h200", 1));
        assert!(GpuShape::of(&ComputeModel::Dynosim, "tpu")
            .kv_bytes()
            .is_none());
    }
}
