//! Per-replica capacity tables from the simulator, as NVIDIA Dynamo's SLA planner reads
//! them from its profiler: prefill TTFT and throughput per GPU by input length, and
//! decode ITL and throughput per GPU by KV usage and context length.
//!
//! Owns: [`PrefillProfile`] and [`DecodeProfile`], how they are measured on one replica
//! of a scenario ([`profile_prefill`], [`profile_decode`], [`default_grid`]), how they
//! are read between their points ([`PrefillProfile::ttft_ms_at`],
//! [`DecodeProfile::best_thpt_per_gpu`], ...), and their files in Dynamo's layout
//! ([`write_profiles`], [`load_profiles`]; the formats are in `files` and `npy`), and
//! a loaded pair as a measured compute table ([`table_from_profiles`]).
//!
//! The planner's side was checked against ai-dynamo/dynamo:
//! `components/planner/src/dynamo/planner/utils/perf_interpolation.py` (later moved to
//! `components/src/dynamo/planner/core/throughput/interpolation.py`), which reads the
//! tables, and `benchmarks/profiler/utils/profile_prefill.py` and `profile_decode.py`,
//! which write them; `docs/architecture/pre_deployment_profiling.md` gives the units.
//! Units as there: ISL and context in tokens, TTFT and ITL in milliseconds, throughput
//! in tokens per second per GPU, KV usage as a fraction of the decode engine's KV tokens.
//! As Dynamo's profiler does, a decode point's context length is the prompt plus half
//! the output (`isl + osl / 2`), the mean context while it decodes.
//!
//! Every number is a prediction of the simulator's model (the scenario's compute model
//! and hardware), measured by running the simulator, not by a formula: a planner fed
//! these tables plans for the model, and the tables are only as good as its calibration.
//! Never: run more than one worker, faults or disaggregation; read a clock.

mod files;
mod npy;
mod table;

pub use files::{
    decode_from_json, decode_from_npz, load_profiles, prefill_from_json, prefill_from_npz,
    write_profiles, DECODE_JSON, DECODE_KEYS, DECODE_NPZ, PREFILL_JSON, PREFILL_KEYS, PREFILL_NPZ,
};
pub use npy::{NpyArray, NpyData, NpyError};
pub use table::table_from_profiles;

use crate::cluster::{simulate, SimError};
use crate::compute::UnknownProfile;
use crate::scenario::{ClusterSpec, Scenario};
use crate::workload::Request;
use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Output tokens of each request of a decode point: enough steps for a stable mean
/// ITL, few enough that the batch's context barely grows (Dynamo's profiler uses 500
/// on real engines, where the noise is larger).
pub const DECODE_OSL: usize = 64;

/// Prefill capacity of one replica by input length (Dynamo's `prefill_raw_data`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PrefillProfile {
    /// Input lengths profiled, tokens (`prefill_isl`).
    pub isl: Vec<f64>,
    /// Time to first token of one request of that length alone on the replica,
    /// milliseconds (`prefill_ttft`).
    pub ttft_ms: Vec<f64>,
    /// Prefill tokens per second per GPU at that length (`prefill_thpt_per_gpu`).
    pub thpt_per_gpu: Vec<f64>,
}

/// Decode capacity of one replica by KV usage and context length (Dynamo's
/// `decode_raw_data`): one entry per operating point, the arrays of equal length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DecodeProfile {
    /// KV tokens the replica's device holds (`max_kv_tokens`).
    pub max_kv_tokens: u64,
    /// Fraction of them the batch's contexts take (`x_kv_usage`).
    pub kv_usage: Vec<f64>,
    /// Mean context length of a sequence while it decodes, tokens (`y_context_length`).
    pub context_length: Vec<f64>,
    /// Inter-token latency, milliseconds (`z_itl`).
    pub itl_ms: Vec<f64>,
    /// Output tokens per second per GPU (`z_thpt_per_gpu`).
    pub thpt_per_gpu: Vec<f64>,
}

/// Profiling failed, or a profile file is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    /// The scenario's worker cannot be simulated.
    #[error("simulating one replica: {0}")]
    Sim(#[from] SimError),
    /// The scenario names a compute profile that is not built in.
    #[error("hardware.compute: {0}")]
    Compute(#[from] UnknownProfile),
    /// The worker has no device tier, so it has no KV capacity to profile.
    #[error("worker.tiers: no Device tier, so no KV tokens to profile")]
    NoDeviceTier,
    /// A grid value is unusable (an input length of 0, a KV usage outside (0, 1]).
    #[error("{grid}: {value} is not a usable value ({reason})")]
    BadGrid {
        /// Which grid: `isl`, `context` or `kv_usage`.
        grid: &'static str,
        /// The value.
        value: f64,
        /// What a value must be.
        reason: &'static str,
    },
    /// No point of a grid fits the replica, so the table would be empty.
    #[error("{table}: no profiled point fits the replica ({max_kv_tokens} KV tokens)")]
    NoPoints {
        /// `prefill` or `decode`.
        table: &'static str,
        /// The replica's KV tokens.
        max_kv_tokens: u64,
    },
    /// The simulation did not serve every request of a point (which a point chosen to
    /// fit should never do: a bug of the profile or of the simulator).
    #[error("{table} point at {tokens} tokens: {completed} of {requests} requests served")]
    Unserved {
        /// `prefill` or `decode`.
        table: &'static str,
        /// The point's input length (prefill) or context length (decode).
        tokens: usize,
        /// Requests served.
        completed: u64,
        /// Requests sent.
        requests: u64,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// An `.npz` file is not a readable zip archive.
    #[error("{path}: not a readable .npz (zip) archive: {source}", path = path.display())]
    Zip {
        /// The file.
        path: PathBuf,
        /// Why.
        source: zip::result::ZipError,
    },
    /// An array of an `.npz` file is not a `.npy` array this reader understands.
    #[error("{path}: {field}: {source}", path = path.display())]
    Npy {
        /// The file.
        path: PathBuf,
        /// The array's key.
        field: &'static str,
        /// Why.
        source: NpyError,
    },
    /// A JSON file is not JSON.
    #[error("{path}: {source}", path = path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A field the planner reads is missing.
    #[error("{path}: no {field} (Dynamo's planner reads it)", path = path.display())]
    Missing {
        /// The file.
        path: PathBuf,
        /// The key.
        field: &'static str,
    },
    /// A field is not of the shape or type the planner reads.
    #[error("{path}: {field}: {expected}", path = path.display())]
    Shape {
        /// The file.
        path: PathBuf,
        /// The key.
        field: &'static str,
        /// What it must be.
        expected: &'static str,
    },
    /// An array's length differs from the table's first array.
    #[error("{path}: {field} has {len} values, {first} has {expected}", path = path.display())]
    Length {
        /// The file.
        path: PathBuf,
        /// The key.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The first array's key.
        first: &'static str,
        /// The first array's length.
        expected: usize,
    },
    /// A value is NaN or infinite (or, for `max_kv_tokens`, not a positive integer).
    #[error(
        "{path}: {field}[{index}] = {value} is not usable (values must be finite, \
         max_kv_tokens a positive integer)",
        path = path.display()
    )]
    NotFinite {
        /// The file.
        path: PathBuf,
        /// The key.
        field: &'static str,
        /// Which value, from 0.
        index: usize,
        /// The value.
        value: f64,
    },
}

/// The scenario reduced to one aggregated replica: one worker, no disaggregation, no
/// faults, no autoscaling or traffic section, events delivered at once; its hardware, compute model and worker unchanged.
fn one_replica(scenario: &Scenario) -> Scenario {
    let mut one = scenario.clone();
    one.cluster = ClusterSpec {
        workers: 1,
        disaggregation: None,
        ..ClusterSpec::default()
    };
    one.faults.clear();
    // The profile measures one fixed replica: no planner (whose profiled capacity would
    // profile again) and no reshaped traffic.
    one.autoscale = None;
    one.traffic = None;
    one
}

/// GPUs one replica runs on ([`crate::compute::ComputeModel::gpus`]).
pub fn gpus_per_replica(scenario: &Scenario) -> Result<u32, ProfileError> {
    Ok(scenario.hardware.compute_model()?.gpus())
}

/// KV tokens of the replica's device tier (`capacity_blocks × block_size_tokens`).
pub fn max_kv_tokens(scenario: &Scenario) -> Result<u64, ProfileError> {
    let device = scenario
        .worker
        .tiers
        .iter()
        .find(|t| t.tier == Tier::Device)
        .ok_or(ProfileError::NoDeviceTier)?;
    Ok(device.capacity_blocks as u64 * scenario.worker.block_size_tokens as u64)
}

/// A request of `tokens` prompt tokens whose full blocks are its own: block hashes
/// `tag << 32 | i` never repeat across tags, so nothing but the same tag hits.
fn request(id: u64, tag: u64, tokens: usize, output: usize, block_size: usize) -> Request {
    let locals: Vec<LocalBlockHash> = (0..(tokens / block_size.max(1)) as u64)
        .map(|b| LocalBlockHash::new(((tag + 1) << 32) | b))
        .collect();
    Request {
        id: RequestId::new(id),
        arrival: Timestamp::ZERO,
        blocks: BlockIdentity::chain(&locals),
        input_tokens: tokens as u64,
        output_tokens: output as u64,
        think_tokens: 0,
    }
}

/// Grids for a scenario: input lengths, context lengths and KV usages.
///
/// Input lengths 128 to 16,384 by powers of two, context lengths 512 to 16,384, each
/// kept while it fits the device with room to spare (an input length below the device's
/// KV tokens; a context length at most half of them, so that two sequences fit); KV
/// usages from 5 % to 90 %. Dynamo's profiler sweeps linearly up to the engine's
/// maximum context; powers of two cover the same range with fewer points where the
/// curves are straight.
pub fn default_grid(scenario: &Scenario) -> (Vec<usize>, Vec<usize>, Vec<f64>) {
    let max = max_kv_tokens(scenario).unwrap_or(0) as usize;
    let powers = |from: usize| (0..).map(move |i| from << i).take_while(|t| *t <= 16_384);
    let isls = powers(128).filter(|t| *t < max).collect();
    let contexts = powers(512).filter(|t| 2 * t <= max).collect();
    let usages = vec![0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9];
    (isls, contexts, usages)
}

/// The prefill table of one replica of `scenario`.
///
/// For each input length (sorted, deduplicated), one request of that length and one
/// output token runs alone on an empty replica, with blocks of its own (no prefix
/// hits): its TTFT is the point's, and `isl / ttft / gpus` its throughput per GPU (as
/// Dynamo's profiler computes it; an engine prefilling back to back sustains that rate).
/// Lengths that do not fit the device are left out.
pub fn profile_prefill(
    scenario: &Scenario,
    isls: &[usize],
) -> Result<PrefillProfile, ProfileError> {
    let one = one_replica(scenario);
    let gpus = f64::from(gpus_per_replica(&one)?);
    let max = max_kv_tokens(&one)?;
    let block_size = one.worker.block_size_tokens;
    let mut isls = isls.to_vec();
    isls.sort_unstable();
    isls.dedup();
    let mut profile = PrefillProfile {
        isl: Vec::new(),
        ttft_ms: Vec::new(),
        thpt_per_gpu: Vec::new(),
    };
    for isl in isls {
        if isl == 0 {
            return Err(ProfileError::BadGrid {
                grid: "isl",
                value: 0.0,
                reason: "an input length is at least 1 token",
            });
        }
        // The prompt and its one output token must fit the device at once.
        if isl as u64 + 1 > max {
            continue;
        }
        let report = simulate(&one, &[request(0, 0, isl, 1, block_size)])?;
        if report.completed != 1 {
            return Err(ProfileError::Unserved {
                table: "prefill",
                tokens: isl,
                completed: report.completed,
                requests: 1,
            });
        }
        let ttft_ms = report.ttft.mean_ms;
        profile.isl.push(isl as f64);
        profile.ttft_ms.push(ttft_ms);
        profile
            .thpt_per_gpu
            .push(isl as f64 / (ttft_ms / 1e3) / gpus);
    }
    if profile.isl.is_empty() {
        return Err(ProfileError::NoPoints {
            table: "prefill",
            max_kv_tokens: max,
        });
    }
    Ok(profile)
}

/// The decode table of one replica of `scenario`.
///
/// For each context length `c` and target KV usage `u`, a batch of `B` sequences, with
/// `B × c ≈ u × max_kv_tokens`, decodes [`DECODE_OSL`] tokens each, all arriving
/// together. `B` is at least 1 and at most `batching.max_seqs`, and small enough that
/// the batch's blocks (prompt and output) fit the device, so nothing is preempted; the
/// point records the usage `B × c / max_kv_tokens` actually reached, and a `(c, B)`
/// reached by two targets is measured once. A point whose context does not fit is left
/// out.
///
/// As Dynamo's profiler warms the engine with the prompts so that the measured run does
/// not prefill, the batch's prompts (`c − osl / 2` tokens each) are first sent alone with
/// one output token; once they are served, the batch arrives and finds them cached,
/// computing only each prompt's last partial block. ITL is the run's mean time per output
/// token (only the batch decodes more than one token); throughput per GPU is
/// `B / ITL / gpus`.
pub fn profile_decode(
    scenario: &Scenario,
    context_lengths: &[usize],
    kv_usages: &[f64],
) -> Result<DecodeProfile, ProfileError> {
    let one = one_replica(scenario);
    let gpus = f64::from(gpus_per_replica(&one)?);
    let max = max_kv_tokens(&one)?;
    let block_size = one.worker.block_size_tokens.max(1);
    let capacity_blocks = max as usize / block_size;
    for &usage in kv_usages {
        if !(usage > 0.0 && usage <= 1.0) {
            return Err(ProfileError::BadGrid {
                grid: "kv_usage",
                value: usage,
                reason: "a KV usage is a fraction within (0, 1]",
            });
        }
    }
    let mut contexts = context_lengths.to_vec();
    contexts.sort_unstable();
    contexts.dedup();
    let mut usages = kv_usages.to_vec();
    usages.sort_by(f64::total_cmp);
    let mut profile = DecodeProfile {
        max_kv_tokens: max,
        kv_usage: Vec::new(),
        context_length: Vec::new(),
        itl_ms: Vec::new(),
        thpt_per_gpu: Vec::new(),
    };
    for context in contexts {
        let half = DECODE_OSL / 2;
        if context <= half {
            return Err(ProfileError::BadGrid {
                grid: "context",
                value: context as f64,
                reason: "a context length exceeds half the decode output (32 tokens)",
            });
        }
        let prompt = context - half;
        let blocks_each = (prompt + DECODE_OSL).div_ceil(block_size);
        let fit = (capacity_blocks / blocks_each).min(one.worker.batching.max_seqs);
        let mut measured = Vec::new();
        for &usage in &usages {
            let wanted = (usage * max as f64 / context as f64).round().max(1.0) as usize;
            let batch = wanted.min(fit);
            if batch == 0 || measured.contains(&batch) {
                continue;
            }
            measured.push(batch);
            let itl_ms = decode_itl_ms(&one, prompt, batch)?;
            profile.kv_usage.push((batch * context) as f64 / max as f64);
            profile.context_length.push(context as f64);
            profile.itl_ms.push(itl_ms);
            profile
                .thpt_per_gpu
                .push(batch as f64 / (itl_ms / 1e3) / gpus);
        }
    }
    if profile.kv_usage.is_empty() {
        return Err(ProfileError::NoPoints {
            table: "decode",
            max_kv_tokens: max,
        });
    }
    Ok(profile)
}

/// The mean ITL of `batch` sequences of `prompt` prompt tokens decoding together on the
/// replica, their prompts cached by a warm-up run first (see [`profile_decode`]).
fn decode_itl_ms(one: &Scenario, prompt: usize, batch: usize) -> Result<f64, ProfileError> {
    let block_size = one.worker.block_size_tokens;
    let warm: Vec<Request> = (0..batch)
        .map(|i| request(i as u64, i as u64, prompt, 1, block_size))
        .collect();
    let served = |report: &crate::cluster::Report, requests: usize| {
        if report.completed == requests as u64 {
            Ok(())
        } else {
            Err(ProfileError::Unserved {
                table: "decode",
                tokens: prompt + DECODE_OSL / 2,
                completed: report.completed,
                requests: requests as u64,
            })
        }
    };
    let warmed = simulate(one, &warm)?;
    served(&warmed, batch)?;
    // The batch arrives a millisecond after the warm-up's last event.
    let at = Timestamp::from_nanos((warmed.simulated_s * 1e9) as u64 + 1_000_000);
    let mut requests = warm;
    requests.extend((0..batch).map(|i| Request {
        id: RequestId::new((batch + i) as u64),
        arrival: at,
        ..request(0, i as u64, prompt, DECODE_OSL, block_size)
    }));
    let report = simulate(one, &requests)?;
    served(&report, 2 * batch)?;
    Ok(report.tpot.mean_ms)
}

/// `y` at `x` on the polyline through `points` (sorted by x), constant beyond its ends;
/// NaN when there are no points.
fn polyline(points: &[(f64, f64)], x: f64) -> f64 {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return f64::NAN;
    };
    if x <= first.0 {
        return first.1;
    }
    if x >= last.0 {
        return last.1;
    }
    let right = points.partition_point(|p| p.0 <= x);
    let (x0, y0) = points[right - 1];
    let (x1, y1) = points[right];
    if x1 == x0 {
        return y1;
    }
    y0 + (y1 - y0) * (x - x0) / (x1 - x0)
}

/// `(x, y)` pairs sorted by x (ties keep their order).
fn sorted(xs: &[f64], ys: &[f64]) -> Vec<(f64, f64)> {
    let mut points: Vec<(f64, f64)> = xs.iter().copied().zip(ys.iter().copied()).collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
}

impl PrefillProfile {
    /// TTFT at input length `isl`, milliseconds: piecewise linear between the profiled
    /// lengths, clamped to the first and last beyond them (Dynamo clamps the same way but
    /// fits a cubic; a polyline never overshoots between points). NaN for an empty table.
    pub fn ttft_ms_at(&self, isl: f64) -> f64 {
        polyline(&sorted(&self.isl, &self.ttft_ms), isl)
    }

    /// Prefill throughput per GPU at input length `isl`, tokens/s (as
    /// [`PrefillProfile::ttft_ms_at`] interpolates).
    pub fn thpt_per_gpu_at(&self, isl: f64) -> f64 {
        polyline(&sorted(&self.isl, &self.thpt_per_gpu), isl)
    }
}

/// One profiled context length's operating points, sorted by KV usage:
/// `(usage, itl_ms, thpt_per_gpu)`.
type Curve = Vec<(f64, f64, f64)>;

impl DecodeProfile {
    /// The profiled context lengths, ascending, each with its curve over KV usage.
    fn curves(&self) -> Vec<(f64, Curve)> {
        let mut curves: Vec<(f64, Curve)> = Vec::new();
        let n = self
            .kv_usage
            .len()
            .min(self.context_length.len())
            .min(self.itl_ms.len())
            .min(self.thpt_per_gpu.len());
        for i in 0..n {
            let point = (self.kv_usage[i], self.itl_ms[i], self.thpt_per_gpu[i]);
            match curves
                .iter_mut()
                .find(|(c, _)| *c == self.context_length[i])
            {
                Some((_, curve)) => curve.push(point),
                None => curves.push((self.context_length[i], vec![point])),
            }
        }
        curves.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (_, curve) in &mut curves {
            curve.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        curves
    }

    /// The profiled context lengths around `context_length` and the weight of the upper
    /// one: the two that bracket it, or the nearest one (weight 0) beyond the ends.
    fn around(curves: &[(f64, Curve)], context_length: f64) -> Option<(usize, usize, f64)> {
        let last = curves.len().checked_sub(1)?;
        let upper = curves.partition_point(|(c, _)| *c < context_length);
        Some(if upper == 0 {
            (0, 0, 0.0)
        } else if upper > last {
            (last, last, 0.0)
        } else {
            let (c0, c1) = (curves[upper - 1].0, curves[upper].0);
            (upper - 1, upper, (context_length - c0) / (c1 - c0))
        })
    }

    /// ITL at `kv_usage` and `context_length`, milliseconds.
    ///
    /// Bilinear over the scattered points: on each of the two profiled context lengths
    /// that bracket `context_length`, ITL is piecewise linear in KV usage (clamped at that
    /// curve's ends); the two are blended linearly by context length. Beyond the profiled
    /// context lengths, the nearest curve alone. NaN for an empty table. (Dynamo
    /// triangulates the scatter with a cubic and falls back to the nearest point; on
    /// tables measured on a grid of context lengths the two agree at the points.)
    pub fn itl_ms_at(&self, kv_usage: f64, context_length: f64) -> f64 {
        let curves = self.curves();
        let Some((lo, hi, w)) = Self::around(&curves, context_length) else {
            return f64::NAN;
        };
        let at = |i: usize| {
            let points: Vec<(f64, f64)> = curves[i].1.iter().map(|p| (p.0, p.1)).collect();
            polyline(&points, kv_usage)
        };
        blend(at(lo), at(hi), w)
    }

    /// The highest decode throughput per GPU (tokens/s) at which ITL stays within
    /// `itl_ms_target` for sequences of `context_length` tokens: the planner's answer to
    /// "how much can one replica decode under the ITL SLA".
    ///
    /// On each of the two profiled context lengths that bracket `context_length` (the
    /// nearest one beyond the ends), the curve over KV usage is read piecewise linearly
    /// and its best throughput with ITL within the target is taken: at a profiled point,
    /// or where a segment crosses the target. The two are blended linearly by context
    /// length. A curve on which no point meets the target gives its lowest-usage
    /// throughput, as Dynamo's planner does (it then scales for the least loaded point
    /// rather than for none). NaN for an empty table.
    pub fn best_thpt_per_gpu(&self, itl_ms_target: f64, context_length: f64) -> f64 {
        let curves = self.curves();
        let Some((lo, hi, w)) = Self::around(&curves, context_length) else {
            return f64::NAN;
        };
        let best = |i: usize| best_on_curve(&curves[i].1, itl_ms_target);
        blend(best(lo), best(hi), w)
    }
}

/// `a` and `b` mixed with weight `w` on `b`.
fn blend(a: f64, b: f64, w: f64) -> f64 {
    if w == 0.0 {
        a
    } else {
        a + (b - a) * w
    }
}

/// The best throughput on one curve (sorted by usage) with ITL within `target`.
fn best_on_curve(curve: &Curve, target: f64) -> f64 {
    let mut best: Option<f64> = None;
    let mut keep = |thpt: f64| best = Some(best.map_or(thpt, |b: f64| b.max(thpt)));
    for (i, &(_, itl, thpt)) in curve.iter().enumerate() {
        if itl <= target {
            keep(thpt);
        }
        // Where the segment to the next point crosses the target, the polyline's
        // throughput there is feasible too.
        if let Some(&(_, itl1, thpt1)) = curve.get(i + 1) {
            if (itl - target) * (itl1 - target) < 0.0 {
                let t = (target - itl) / (itl1 - itl);
                keep(thpt + (thpt1 - thpt) * t);
            }
        }
    }
    best.or(curve.first().map(|p| p.2)).unwrap_or(f64::NAN)
}

#[cfg(test)]
mod tests;
