//! Forward-pass times measured on a real engine, interpolated: the `Table` compute
//! profile, for an operator who timed their own deployment.
//!
//! Owns: [`TableModel`] (prefill time by prompt length; decode step time by batch, one
//! curve per context length: the shape of Dynamo's planner profiles, whose KV usage is
//! a batch once divided by the context), its checks ([`TableError`]) and its
//! interpolation. Never: measures, reads Dynamo's files (`autoscale::profile` does, and
//! makes a table of them), or fills holes with a model; between points it is piecewise
//! linear, beyond the ends it carries the last segment's slope on, and a curve of one
//! point is constant.
//!
//! A decode step of `B` sequences at `k` tokens each reads each context's curve at `B`,
//! then goes linearly between the two contexts around `k`.
//!
//! A prefill chunk of `T` tokens after `C` cached costs `P(C + T) − P(C)`, where `P` is
//! the measured prompt time with `P(0)` the intercept of its first two points (the fixed
//! cost of a pass): one pass pays that once, however many chunks it holds.
//!
//! A table may also carry how much single steps stray from its figures
//! ([`TableModel::step_spread`], measured by `kvtwin profile --engine`): quantiles of a
//! step's time over the figure. The interpolation never uses them; a driver that wants
//! steps to vary as the engine's did draws from them with its own seeded RNG
//! ([`TableModel::step_factor`]). Without them every step takes the figure.
//!
//! Apart from that spread, a table may say how often the engine stalled
//! ([`TableModel::stalls`]): passes held far beyond any figure (vLLM's CPU build on the
//! 2-core VM held about one output gap in 300 for 0.1 to 2.5 s, its processes sharing
//! two cores), each as a length and the share of passes it befell. A driver draws them
//! too ([`TableModel::stall`]); the spread is the body of a step's time, the stalls its
//! tail.
//!
//! Two more figures are for an engine whose serving processes share the CPU with its
//! pass (vLLM's CPU build): a pass that prefills beside `k` decodes may be priced at the
//! prefill's figure times a measured factor ([`TableModel::prefill_beside_decode`], in
//! place of the prefill plus the decodes' share of a step), and a request coming to a
//! stepping engine may lengthen the step in flight ([`TableModel::arrival_stretch_ms`],
//! which a driver applies; the interpolation never does).

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Measured prefill and decode times (RON: `Table((name: ..., prefill_isl: [...], ...))`
/// inside a hardware profile's `compute: Some(Custom(...))`, or a file of its own for
/// `kvtwin estimate --compute`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableModel {
    /// What was measured (engine, model, GPUs), for reports.
    pub name: String,
    /// GPUs one replica runs on (throughput per GPU divides by it).
    #[serde(default = "one_gpu")]
    pub gpus: u32,
    /// KV-cache bytes per token of the model (0: unknown; the estimate's KV figures and
    /// its fit check need it).
    #[serde(default)]
    pub kv_bytes_per_token: u64,
    /// KV tokens one replica holds at most (0: unknown, not checked).
    #[serde(default)]
    pub max_kv_tokens: u64,
    /// Prompt lengths prefilled alone on an empty cache, tokens, ascending.
    pub prefill_isl: Vec<u64>,
    /// Their times (the time to first token), milliseconds.
    pub prefill_ms: Vec<f64>,
    /// Decode step times, one curve per context length, contexts ascending.
    pub decode: Vec<DecodeCurve>,
    /// How single steps stray from the figures above: the quantiles of a measured
    /// step's time over its point's median, at evenly spaced probabilities from 0 (the
    /// fastest step seen) to 1 (the slowest), ascending. Empty (the default): every step
    /// takes the figure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub step_spread: Vec<f64>,
    /// Milliseconds a request spends outside the engine's steps on its way through
    /// (HTTP, a router, the tokenizer, the queues between an engine's processes): a
    /// lone request's time to first token less the engine's own queue and prefill
    /// times, as `kvtwin profile --engine` measures it on vLLM. With it, `prefill_ms`
    /// are the engine's own prefill times; the vLLM twin delays each request's arrival
    /// at its engine by it (and the cluster simulator, which has no such path, ignores
    /// it). 0 (the default): the prefills are whole TTFTs.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request_overhead_ms: f64,
    /// Milliseconds a request spends outside the engine's steps when it reaches an
    /// engine that is stepping for others, if that is more than `request_overhead_ms`:
    /// vLLM's API server and engine core then share the CPU with the forward pass (on
    /// the 2-core VM, 4 ms alone and 8 to 10 ms beside a decode, each engine on a core
    /// of its own). Less the wait for the step in flight, which the twin's engine
    /// makes a request arriving mid-step serve anyway. 0 (the default): as alone.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub request_overhead_busy_ms: f64,
    /// Milliseconds the step in flight takes longer when a request comes to an engine
    /// stepping for others: its way in and out run on the CPU the pass runs on (vLLM's
    /// CPU build, its API server on the engine's core), as `kvtwin profile --engine`
    /// measures it (a decode's steps around a probe against its steps in as long a
    /// window without). 0 (the default): requests cost the steps nothing.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub arrival_stretch_ms: f64,
    /// Stalls: how long the engine held a pass beyond its figure, and the share of
    /// passes each length befell, as `kvtwin profile --engine` reads them off vLLM's
    /// own inter-token latency histogram. Shorter stalls first. Empty (the default):
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stalls: Vec<Stall>,
    /// How much longer a pass that prefills takes when sequences decode beside the
    /// prefill, by how many decode: the pass over the same prefill alone, as `kvtwin
    /// profile --engine` measures it (a prompt sent while the engine streams answers,
    /// against the same prompt alone). On vLLM's CPU build the API server and the engine
    /// core take the core from the forward pass while others' answers stream, so a
    /// prefill beside two decodes took 1.3 to 1.7 times as long (2-core VM, each engine
    /// on a core of its own), where the decodes' own work adds a few percent. Decodes
    /// ascending; 1 below the first (linearly from 1 at none), the last beyond it.
    /// Empty (the default): such a pass is the prefill's figure plus the decodes' share
    /// of a step ([`Self::decode_beside_prefill`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefill_beside_decode: Vec<BesideDecode>,
}

/// A prefill's pass beside `decodes` decoding sequences against the prefill alone: the
/// prefill's figure times `factor`, plus `extra_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BesideDecode {
    /// Sequences decoding in the pass, at least 1.
    pub decodes: u64,
    /// The pass's time over the prefill's figure alone, before `extra_ms` (1, the
    /// default, where the profile measured what the decodes add as time).
    #[serde(default = "unit", skip_serializing_if = "is_unit")]
    pub factor: f64,
    /// Milliseconds the decodes add to the pass whatever the prefill's length: their
    /// own work and their answers' streaming on the pass's CPU. `kvtwin profile
    /// --engine` measures this: on the 2-core VM a 64-token and a 320-token prompt
    /// both took 1.5 ms longer beside one decode (×1.17 and ×1.08), 2.3 and 3.2 ms
    /// beside two. 0 (the default): none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub extra_ms: f64,
    /// Milliseconds the request spends outside the engine's steps when it comes to an
    /// engine holding this many requests, the wait for the step in flight taken off (the
    /// twin's engine makes it wait anyway): vLLM's API server streams each of them on
    /// the CPU the request's way in runs on (the 2-core VM: 7.6 ms beside one, 11 ms
    /// beside four). 0 (the default): [`TableModel::request_overhead_busy_ms`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub overhead_ms: f64,
}

/// One length of stall and how often the engine stalled that long.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stall {
    /// Milliseconds a stalled pass takes beyond its figure.
    pub ms: f64,
    /// The share of passes (0 to 1) that stall this long.
    pub share: f64,
}

fn is_zero(ms: &f64) -> bool {
    *ms == 0.0
}

fn unit() -> f64 {
    1.0
}

fn is_unit(factor: &f64) -> bool {
    *factor == 1.0
}

/// Decode step times at one context length.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecodeCurve {
    /// Context tokens per decoding sequence.
    pub context: u64,
    /// Batch sizes, ascending.
    pub batch: Vec<u64>,
    /// Their step times, milliseconds.
    pub ms: Vec<f64>,
}

fn one_gpu() -> u32 {
    1
}

/// A table that cannot be used, naming the field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("compute table {name:?}: {field}: {reason}")]
pub struct TableError {
    /// The table's name.
    pub name: String,
    /// The field at fault.
    pub field: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl TableModel {
    /// Checks what the interpolation needs: points present, strictly ascending
    /// coordinates, times finite and not negative, one time per coordinate.
    pub fn validate(&self) -> Result<(), TableError> {
        let error = |field: &'static str, reason: String| TableError {
            name: self.name.clone(),
            field,
            reason,
        };
        ascending("prefill_isl", &self.prefill_isl).map_err(|r| error("prefill_isl", r))?;
        if self.prefill_ms.len() != self.prefill_isl.len() {
            return Err(error(
                "prefill_ms",
                format!(
                    "{} times for {} prompt lengths",
                    self.prefill_ms.len(),
                    self.prefill_isl.len()
                ),
            ));
        }
        times(&self.prefill_ms).map_err(|r| error("prefill_ms", r))?;
        if self.decode.is_empty() {
            return Err(error("decode", "needs at least one curve".to_string()));
        }
        let contexts: Vec<u64> = self.decode.iter().map(|curve| curve.context).collect();
        ascending("decode context", &contexts).map_err(|r| error("decode", r))?;
        for curve in &self.decode {
            let at =
                |reason: String| error("decode", format!("context {}: {reason}", curve.context));
            ascending("batch", &curve.batch).map_err(at)?;
            if curve.ms.len() != curve.batch.len() {
                return Err(at(format!(
                    "{} times for {} batch sizes",
                    curve.ms.len(),
                    curve.batch.len()
                )));
            }
            times(&curve.ms).map_err(at)?;
        }
        for (field, ms) in [
            ("request_overhead_ms", self.request_overhead_ms),
            ("request_overhead_busy_ms", self.request_overhead_busy_ms),
            ("arrival_stretch_ms", self.arrival_stretch_ms),
        ] {
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(error(
                    field,
                    format!("{ms} (must be a finite number of milliseconds, 0 or more)"),
                ));
            }
        }
        if self.gpus == 0 {
            return Err(error("gpus", "must be at least 1".to_string()));
        }
        if self.step_spread.len() == 1 {
            return Err(error(
                "step_spread",
                "needs at least two quantiles (the fastest and the slowest step), or none"
                    .to_string(),
            ));
        }
        if let Some(at) = self
            .step_spread
            .iter()
            .position(|q| !q.is_finite() || *q <= 0.0)
        {
            return Err(error(
                "step_spread",
                format!(
                    "quantile {at} is {} (must be a positive finite ratio)",
                    self.step_spread[at]
                ),
            ));
        }
        if let Some(pair) = self.step_spread.windows(2).find(|pair| pair[1] < pair[0]) {
            return Err(error(
                "step_spread",
                format!("quantiles must ascend ({} then {})", pair[0], pair[1]),
            ));
        }
        for (at, stall) in self.stalls.iter().enumerate() {
            let fine = stall.ms.is_finite()
                && stall.ms > 0.0
                && stall.share.is_finite()
                && (0.0..=1.0).contains(&stall.share);
            if !fine {
                return Err(error(
                    "stalls",
                    format!(
                        "stall {at}: {} ms for a share of {} (must be a positive number of \
                         milliseconds and a share from 0 to 1)",
                        stall.ms, stall.share
                    ),
                ));
            }
        }
        let decodes: Vec<u64> = self
            .prefill_beside_decode
            .iter()
            .map(|b| b.decodes)
            .collect();
        if !decodes.is_empty() {
            ascending("decodes", &decodes).map_err(|r| error("prefill_beside_decode", r))?;
        }
        for beside in &self.prefill_beside_decode {
            if beside.decodes == 0
                || !(beside.factor.is_finite() && beside.factor > 0.0)
                || !(beside.extra_ms.is_finite() && beside.extra_ms >= 0.0)
                || !(beside.overhead_ms.is_finite() && beside.overhead_ms >= 0.0)
            {
                return Err(error(
                    "prefill_beside_decode",
                    format!(
                        "{} decodes, factor {}, extra {} ms, overhead {} ms (must be at \
                         least 1 decode, a positive finite factor, and finite times of 0 \
                         or more)",
                        beside.decodes, beside.factor, beside.extra_ms, beside.overhead_ms
                    ),
                ));
            }
        }
        let share: f64 = self.stalls.iter().map(|stall| stall.share).sum();
        if share > 1.0 + 1e-9 {
            return Err(error(
                "stalls",
                format!("their shares add up to {share} (at most 1: every pass stalled)"),
            ));
        }
        Ok(())
    }

    /// The same engine running `factor` times slower (above 1) or faster: every time the
    /// table holds (prefills, decode steps, a request's way in and what it takes from
    /// the step in flight, stalls) times `factor`; the ratios (the step spread, the
    /// prefill-beside-decodes factors) as they are. `kvtwin validate --engine
    /// --speed-check` re-levels a profile with it on a machine whose speed moved since
    /// it was measured (a shared 2-core VM: 20 % within three minutes).
    pub fn at_speed(&self, factor: f64) -> TableModel {
        let mut table = self.clone();
        table.prefill_ms.iter_mut().for_each(|ms| *ms *= factor);
        for curve in &mut table.decode {
            curve.ms.iter_mut().for_each(|ms| *ms *= factor);
        }
        table.request_overhead_ms *= factor;
        table.request_overhead_busy_ms *= factor;
        table.arrival_stretch_ms *= factor;
        for beside in &mut table.prefill_beside_decode {
            beside.extra_ms *= factor;
            beside.overhead_ms *= factor;
        }
        table.stalls.iter_mut().for_each(|stall| stall.ms *= factor);
        table
    }

    /// What a pass stalls beyond its figure when `u` (in [0, 1)) is drawn uniformly:
    /// the first of [`Self::stalls`] whose running share passes `u`, else nothing.
    pub fn stall(&self, u: f64) -> Duration {
        let mut below = 0.0;
        for stall in &self.stalls {
            below += stall.share;
            if u < below {
                return millis(stall.ms);
            }
        }
        Duration::ZERO
    }

    /// What a step takes over the table's figure when `u` (in [0, 1)) is drawn uniformly:
    /// the inverse of [`Self::step_spread`]'s distribution, linear between quantiles; 1
    /// without a spread.
    pub fn step_factor(&self, u: f64) -> f64 {
        let quantiles = &self.step_spread;
        if quantiles.len() < 2 {
            return 1.0;
        }
        let at = u.clamp(0.0, 1.0) * (quantiles.len() - 1) as f64;
        let lower = (at.floor() as usize).min(quantiles.len() - 2);
        let fraction = at - lower as f64;
        quantiles[lower] + (quantiles[lower + 1] - quantiles[lower]) * fraction
    }

    /// What the step in flight takes longer when a request comes
    /// ([`Self::arrival_stretch_ms`]).
    pub fn arrival_stretch(&self) -> Duration {
        millis(self.arrival_stretch_ms)
    }

    /// A prefill's pass beside `decodes` decoding sequences against the prefill alone
    /// ([`Self::prefill_beside_decode`]): the factor on the prefill's figure and the
    /// milliseconds added, each linear from none (1 and 0) at no decodes to the
    /// measured counts, the last count's beyond it; `None` when the table has no such
    /// figures or nothing decodes.
    pub fn prefill_beside(&self, decodes: u64) -> Option<(f64, f64)> {
        let last = self.prefill_beside_decode.last()?;
        if decodes == 0 {
            return None;
        }
        if decodes >= last.decodes {
            return Some((last.factor, last.extra_ms));
        }
        let xs: Vec<u64> = std::iter::once(0)
            .chain(self.prefill_beside_decode.iter().map(|b| b.decodes))
            .collect();
        let series = |pick: fn(&BesideDecode) -> f64, none: f64| -> Vec<f64> {
            std::iter::once(none)
                .chain(self.prefill_beside_decode.iter().map(pick))
                .collect()
        };
        let at = decodes as f64;
        Some((
            interpolate(&xs, &series(|b| b.factor, 1.0), at),
            interpolate(&xs, &series(|b| b.extra_ms, 0.0), at),
        ))
    }

    /// What a request spends outside the engine's steps ([`Self::request_overhead_ms`]).
    pub fn request_overhead(&self) -> Duration {
        millis(self.request_overhead_ms)
    }

    /// What a request spends outside the steps of an engine busy stepping for others
    /// ([`Self::request_overhead_busy_ms`], never less than the overhead alone).
    pub fn request_overhead_busy(&self) -> Duration {
        millis(self.request_overhead_ms.max(self.request_overhead_busy_ms))
    }

    /// What a request spends outside the steps of an engine busy with `held` requests
    /// ([`BesideDecode::overhead_ms`]): linear between the measured counts, the nearest
    /// one's beyond them; [`Self::request_overhead_busy`] for a table without them. Never
    /// less than the overhead alone.
    pub fn request_overhead_beside(&self, held: u64) -> Duration {
        let (xs, ys): (Vec<u64>, Vec<f64>) = self
            .prefill_beside_decode
            .iter()
            .filter(|beside| beside.overhead_ms > 0.0)
            .map(|beside| (beside.decodes, beside.overhead_ms))
            .unzip();
        let (Some(&first), Some(&last)) = (xs.first(), xs.last()) else {
            return self.request_overhead_busy();
        };
        let ms = if held <= first {
            ys[0]
        } else if held >= last {
            ys[ys.len() - 1]
        } else {
            interpolate(&xs, &ys, held as f64)
        };
        millis(self.request_overhead_ms.max(ms))
    }

    /// One pass's prefill chunks `(new, cached)`: the fixed cost once, plus each chunk's
    /// share of the prompt curve.
    pub fn prefill(&self, chunks: &[(u64, u64)]) -> Duration {
        if chunks.is_empty() {
            return Duration::ZERO;
        }
        let curve = |tokens: u64| self.prompt_ms(tokens);
        let ms = curve(0)
            + chunks
                .iter()
                .map(|&(new, cached)| curve(cached + new) - curve(cached))
                .sum::<f64>();
        millis(ms)
    }

    /// One decode step of `batch` sequences holding `context_tokens` between them.
    pub fn decode_step(&self, batch: u64, context_tokens: u64) -> Duration {
        if batch == 0 {
            return Duration::ZERO;
        }
        millis(self.across_contexts(batch, context_tokens, |curve| {
            interpolate(&curve.batch, &curve.ms, batch as f64)
        }))
    }

    /// `at(curve)` of each context's curve, then linearly between the two contexts
    /// around the batch's tokens per sequence.
    fn across_contexts(
        &self,
        batch: u64,
        context_tokens: u64,
        at: impl Fn(&DecodeCurve) -> f64,
    ) -> f64 {
        let per_sequence = context_tokens as f64 / batch as f64;
        let contexts: Vec<u64> = self.decode.iter().map(|curve| curve.context).collect();
        let values: Vec<f64> = self.decode.iter().map(at).collect();
        interpolate(&contexts, &values, per_sequence)
    }

    /// What `batch` decoding sequences (holding `context_tokens` between them) add to a
    /// pass that also prefills: [`Self::decode_step`] less the fixed cost of a pass, which
    /// the prefill's `P(0)` pays already. The fixed cost is each curve's intercept at
    /// batch 0 (its first two points', as `P(0)`; a curve of one point is all fixed
    /// cost), between contexts as [`Self::decode_step`] goes. Measured on vLLM's CPU
    /// build: a 48-token prefill beside one decoding sequence took one pass of 57.7 ms,
    /// about the prefill's alone, where that sequence's steps alone took 12.5 ms.
    pub fn decode_beside_prefill(&self, batch: u64, context_tokens: u64) -> Duration {
        if batch == 0 {
            return Duration::ZERO;
        }
        let fixed = self.across_contexts(batch, context_tokens, |curve| {
            let first = curve.ms.first().copied().unwrap_or(0.0);
            interpolate(&curve.batch, &curve.ms, 0.0).min(first)
        });
        self.decode_step(batch, context_tokens)
            .saturating_sub(millis(fixed))
    }

    /// The prompt curve `P(tokens)`, with `P(0)` the intercept of its first two points.
    fn prompt_ms(&self, tokens: u64) -> f64 {
        let (xs, ys) = (&self.prefill_isl, &self.prefill_ms);
        let intercept = match (xs.first(), ys.first(), xs.get(1), ys.get(1)) {
            (Some(&x0), Some(&y0), Some(&x1), Some(&y1)) if x1 > x0 => {
                (y0 - (y1 - y0) / (x1 - x0) as f64 * x0 as f64).max(0.0)
            }
            (_, Some(&y0), _, _) => y0,
            _ => return 0.0,
        };
        let mut with_zero_x = vec![0];
        let mut with_zero_y = vec![intercept];
        for (&x, &y) in xs.iter().zip(ys) {
            if x > 0 {
                with_zero_x.push(x);
                with_zero_y.push(y);
            }
        }
        interpolate(&with_zero_x, &with_zero_y, tokens as f64)
    }
}

/// Piecewise linear through `(xs, ys)`, the end segments carried on beyond them; one
/// point is constant, none is 0. Never below 0.
fn interpolate(xs: &[u64], ys: &[f64], x: f64) -> f64 {
    let n = xs.len().min(ys.len());
    match n {
        0 => return 0.0,
        1 => return ys[0].max(0.0),
        _ => {}
    }
    // The segment holding x, or the end one nearest it.
    let upper = xs[..n]
        .partition_point(|&point| (point as f64) < x)
        .clamp(1, n - 1);
    let (x0, x1) = (xs[upper - 1] as f64, xs[upper] as f64);
    let (y0, y1) = (ys[upper - 1], ys[upper]);
    let slope = if x1 > x0 { (y1 - y0) / (x1 - x0) } else { 0.0 };
    (y0 + slope * (x - x0)).max(0.0)
}

fn ascending(field: &str, values: &[u64]) -> Result<(), String> {
    if values.is_empty() {
        return Err("needs at least one point".to_string());
    }
    if let Some(pair) = values.windows(2).find(|pair| pair[1] <= pair[0]) {
        return Err(format!(
            "{field} must ascend strictly ({} then {})",
            pair[0], pair[1]
        ));
    }
    Ok(())
}

fn times(values: &[f64]) -> Result<(), String> {
    match values.iter().position(|ms| !ms.is_finite() || *ms < 0.0) {
        Some(at) => Err(format!(
            "time {at} is {} (must be a finite number of milliseconds, not negative)",
            values[at]
        )),
        None => Ok(()),
    }
}

fn millis(ms: f64) -> Duration {
    Duration::from_nanos(super::round_to_u64(ms.max(0.0) * 1e6))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TableModel {
        TableModel {
            name: "measured".into(),
            gpus: 1,
            kv_bytes_per_token: 131_072,
            max_kv_tokens: 500_000,
            prefill_isl: vec![1000, 2000, 4000],
            prefill_ms: vec![25.0, 45.0, 95.0],
            decode: vec![
                DecodeCurve {
                    context: 1000,
                    batch: vec![1, 16],
                    ms: vec![6.0, 9.0],
                },
                DecodeCurve {
                    context: 3000,
                    batch: vec![1, 16],
                    ms: vec![7.0, 13.0],
                },
            ],
            step_spread: Vec::new(),
            request_overhead_ms: 0.0,
            request_overhead_busy_ms: 0.0,
            arrival_stretch_ms: 0.0,
            stalls: Vec::new(),
            prefill_beside_decode: Vec::new(),
        }
    }

    #[test]
    fn a_busy_engine_s_overhead_is_its_own_figure_or_the_overhead_alone() {
        let mut measured = table();
        measured.request_overhead_ms = 4.0;
        assert_eq!(measured.request_overhead_busy(), Duration::from_millis(4));
        measured.request_overhead_busy_ms = 9.5;
        assert_eq!(
            measured.request_overhead_busy(),
            Duration::from_micros(9_500)
        );
        assert_eq!(measured.request_overhead(), Duration::from_millis(4));
        measured.request_overhead_busy_ms = f64::NAN;
        let error = measured.validate().unwrap_err().to_string();
        assert!(error.contains("request_overhead_busy_ms"), "{error}");
    }

    #[test]
    fn a_pass_stalls_as_often_as_each_stall_s_share_says() {
        let mut measured = table();
        measured.stalls = vec![
            Stall {
                ms: 125.0,
                share: 0.002,
            },
            Stall {
                ms: 1750.0,
                share: 0.001,
            },
        ];
        measured.validate().unwrap();
        assert_eq!(measured.stall(0.0), Duration::from_millis(125));
        assert_eq!(measured.stall(0.0019), Duration::from_millis(125));
        assert_eq!(measured.stall(0.002), Duration::from_millis(1750));
        assert_eq!(measured.stall(0.0029), Duration::from_millis(1750));
        assert_eq!(measured.stall(0.003), Duration::ZERO);
        assert_eq!(measured.stall(0.99), Duration::ZERO);
        assert_eq!(table().stall(0.0), Duration::ZERO);
        // Shares over 1, or a stall of no length, are not a table.
        measured.stalls[1].share = 0.999;
        let error = measured.validate().unwrap_err().to_string();
        assert!(
            error.contains("stalls") && error.contains("add up to"),
            "{error}"
        );
        measured.stalls[1] = Stall {
            ms: 0.0,
            share: 0.001,
        };
        let error = measured.validate().unwrap_err().to_string();
        assert!(error.contains("stall 1: 0 ms"), "{error}");
    }

    fn ms(duration: Duration) -> f64 {
        duration.as_secs_f64() * 1e3
    }

    #[test]
    fn decodes_beside_a_prefill_add_their_steps_less_the_fixed_cost_of_a_pass() {
        let table = table();
        // At context 1000: 6 ms at batch 1, 9 at 16, so 5.8 ms at batch 0, the fixed
        // cost; 16 sequences add 3.2 ms to a pass that prefills.
        assert!((ms(table.decode_beside_prefill(16, 16_000)) - 3.2).abs() < 1e-6);
        assert!((ms(table.decode_beside_prefill(1, 1000)) - 0.2).abs() < 1e-6);
        // At context 2000, halfway between the curves' intercepts (5.8 and 6.6 ms).
        let step = ms(table.decode_step(16, 32_000));
        assert!((ms(table.decode_beside_prefill(16, 32_000)) - (step - 6.2)).abs() < 1e-6);
        assert_eq!(table.decode_beside_prefill(0, 0), Duration::ZERO);
        // A curve of one point is all fixed cost.
        let mut flat = table.clone();
        flat.decode = vec![DecodeCurve {
            context: 1000,
            batch: vec![4],
            ms: vec![6.0],
        }];
        assert_eq!(flat.decode_beside_prefill(4, 4000), Duration::ZERO);
    }

    #[test]
    fn a_prompt_is_interpolated_and_extrapolated_along_the_curve() {
        let table = table();
        assert!((ms(table.prefill(&[(2000, 0)])) - 45.0).abs() < 1e-6);
        assert!((ms(table.prefill(&[(3000, 0)])) - 70.0).abs() < 1e-6);
        // Past the last point the last slope (25 ms a thousand tokens) goes on.
        assert!((ms(table.prefill(&[(6000, 0)])) - 145.0).abs() < 1e-6);
        // Below the first: towards the intercept of the first two points, 5 ms.
        assert!((ms(table.prefill(&[(500, 0)])) - 15.0).abs() < 1e-6);
        assert_eq!(table.prefill(&[]), Duration::ZERO);
    }

    #[test]
    fn chunks_after_a_cache_cost_their_share_and_one_fixed_cost() {
        let table = table();
        // 2,000 new tokens after 2,000 cached: P(4000) − P(2000) plus P(0) = 50 + 5.
        assert!((ms(table.prefill(&[(2000, 2000)])) - 55.0).abs() < 1e-6);
        // Two prompts of 1,000 in one pass: 2 × (25 − 5) + 5.
        assert!((ms(table.prefill(&[(1000, 0), (1000, 0)])) - 45.0).abs() < 1e-6);
        // A prompt in two chunks costs what it costs whole, plus the second pass's 5 ms.
        let whole = ms(table.prefill(&[(4000, 0)]));
        let split = ms(table.prefill(&[(2000, 0)])) + ms(table.prefill(&[(2000, 2000)]));
        assert!((split - whole - 5.0).abs() < 1e-6);
    }

    #[test]
    fn a_decode_step_reads_each_context_curve_at_the_batch_then_goes_between_contexts() {
        let table = table();
        assert!((ms(table.decode_step(1, 1000)) - 6.0).abs() < 1e-6);
        assert!((ms(table.decode_step(16, 16 * 3000)) - 13.0).abs() < 1e-6);
        // Batch 8 is 7/15 of the way along each curve (7.4 ms at 1,000 tokens, 9.8 ms at
        // 3,000); 2,000 tokens is halfway between them.
        let step = table.decode_step(8, 8 * 2000);
        let at_1000 = 6.0 + 3.0 * 7.0 / 15.0;
        let at_3000 = 7.0 + 6.0 * 7.0 / 15.0;
        assert!(
            (ms(step) - (at_1000 + at_3000) / 2.0).abs() < 1e-6,
            "{step:?}"
        );
        // Curves need not share their batch sizes (a profiler's sweep seldom does).
        let mut uneven = table.clone();
        uneven.decode[1] = DecodeCurve {
            context: 3000,
            batch: vec![2, 4, 32],
            ms: vec![7.0, 8.0, 15.0],
        };
        let at_3000 = 8.0 + 7.0 * 4.0 / 28.0;
        let step = uneven.decode_step(8, 8 * 3000);
        assert!((ms(step) - at_3000).abs() < 1e-6, "{step:?}");
        assert_eq!(table.decode_step(0, 0), Duration::ZERO);
    }

    #[test]
    fn bad_tables_are_refused_naming_the_field() {
        let mut unsorted = table();
        unsorted.prefill_isl = vec![2000, 1000, 4000];
        let error = unsorted.validate().unwrap_err();
        assert_eq!(error.field, "prefill_isl");
        assert!(error.to_string().contains("2000 then 1000"), "{error}");

        let mut short = table();
        short.decode[1].ms.pop();
        let error = short.validate().unwrap_err();
        assert_eq!(error.field, "decode");
        assert!(
            error
                .to_string()
                .contains("context 3000: 1 times for 2 batch sizes"),
            "{error}"
        );

        let mut negative = table();
        negative.prefill_ms[0] = -1.0;
        let error = negative.validate().unwrap_err();
        assert!(error.to_string().contains("-1"), "{error}");

        let mut empty = table();
        empty.decode.clear();
        assert_eq!(empty.validate().unwrap_err().field, "decode");
        let mut backwards = table();
        backwards.decode.reverse();
        let error = backwards.validate().unwrap_err();
        assert!(error.to_string().contains("3000 then 1000"), "{error}");
        assert!(table().validate().is_ok());
    }

    #[test]
    fn a_table_reads_from_ron() {
        let text = r#"(
            name: "vllm-0.11 llama-3-8b h100",
            prefill_isl: [1000, 2000],
            prefill_ms: [25.0, 45.0],
            decode: [(context: 1000, batch: [1], ms: [6.0])],
        )"#;
        let table: TableModel = ron::from_str(text).unwrap();
        assert_eq!(table.gpus, 1);
        assert!(table.validate().is_ok());
        // One decode point: the same step at every batch and context.
        assert_eq!(table.decode_step(64, 64 * 8000), Duration::from_millis(6));
    }

    #[test]
    fn a_step_factor_is_the_inverse_of_the_measured_spread() {
        let mut measured = table();
        // Without a spread every step takes the figure.
        assert_eq!(measured.step_factor(0.0), 1.0);
        assert_eq!(measured.step_factor(0.7), 1.0);
        // Quantiles at 0, 1/2 and 1: linear between them.
        measured.step_spread = vec![0.5, 1.0, 3.0];
        assert_eq!(measured.validate(), Ok(()));
        assert_eq!(measured.step_factor(0.0), 0.5);
        assert!((measured.step_factor(0.25) - 0.75).abs() < 1e-12);
        assert_eq!(measured.step_factor(0.5), 1.0);
        assert!((measured.step_factor(0.75) - 2.0).abs() < 1e-12);
        // The slowest step seen is the most a draw gives.
        assert_eq!(measured.step_factor(1.0), 3.0);
        assert!(measured.step_factor(0.999_999_9) <= 3.0);
    }

    #[test]
    fn a_spread_that_is_not_a_distribution_is_refused_by_name() {
        for (spread, says) in [
            (vec![1.0], "at least two quantiles"),
            (vec![0.5, 0.0], "quantile 1 is 0"),
            (vec![0.5, f64::NAN], "quantile 1 is NaN"),
            (vec![1.2, 0.9], "must ascend (1.2 then 0.9)"),
        ] {
            let mut measured = table();
            measured.step_spread = spread;
            let error = measured.validate().expect_err("refused");
            assert_eq!(error.field, "step_spread");
            assert!(error.reason.contains(says), "{}", error.reason);
        }
    }

    #[test]
    fn a_table_without_a_spread_writes_no_spread_and_reads_as_before() {
        let text = ron::to_string(&table()).expect("writes");
        assert!(!text.contains("step_spread"), "{text}");
        assert!(!text.contains("request_overhead_ms"), "{text}");
        let back: TableModel = ron::from_str(&text).expect("reads");
        assert_eq!(back, table());
    }

    #[test]
    fn a_request_overhead_is_milliseconds_or_refused_by_name() {
        let mut measured = table();
        assert_eq!(measured.request_overhead(), Duration::ZERO);
        measured.request_overhead_ms = 48.5;
        assert_eq!(measured.validate(), Ok(()));
        assert_eq!(measured.request_overhead(), Duration::from_micros(48_500));
        let text = ron::to_string(&measured).expect("writes");
        assert_eq!(ron::from_str::<TableModel>(&text).expect("reads"), measured);
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            measured.request_overhead_ms = bad;
            let error = measured.validate().expect_err("refused");
            assert_eq!(error.field, "request_overhead_ms");
        }
    }

    #[test]
    fn the_way_in_beside_requests_follows_the_measured_counts_and_never_undercuts_alone() {
        let mut measured = table();
        measured.request_overhead_ms = 4.0;
        measured.request_overhead_busy_ms = 7.0;
        // No counts measured: the busy figure, whatever the engine holds.
        assert_eq!(measured.request_overhead_beside(3), millis(7.0));
        measured.prefill_beside_decode = [(1, 6.0), (4, 12.0)]
            .into_iter()
            .map(|(decodes, overhead_ms)| BesideDecode {
                decodes,
                factor: 1.0,
                extra_ms: 0.0,
                overhead_ms,
            })
            .collect();
        assert_eq!(measured.request_overhead_beside(1), millis(6.0));
        assert_eq!(measured.request_overhead_beside(2), millis(8.0));
        assert_eq!(
            measured.request_overhead_beside(9),
            millis(12.0),
            "the last beyond"
        );
        measured.prefill_beside_decode[0].overhead_ms = 1.0;
        assert_eq!(
            measured.request_overhead_beside(1),
            millis(4.0),
            "never under alone"
        );
        // At another speed, every time with it.
        let slower = measured.at_speed(2.0);
        assert_eq!(slower.request_overhead_beside(9), millis(24.0));
    }

    #[test]
    fn prefills_beside_decodes_go_from_one_through_the_measured_factors() {
        let mut measured = table();
        assert_eq!(measured.prefill_beside(2), None, "no figures");
        measured.prefill_beside_decode = vec![
            BesideDecode {
                decodes: 2,
                factor: 1.4,
                extra_ms: 2.0,
                overhead_ms: 0.0,
            },
            BesideDecode {
                decodes: 4,
                factor: 1.6,
                extra_ms: 3.0,
                overhead_ms: 0.0,
            },
        ];
        assert_eq!(measured.validate(), Ok(()));
        assert_eq!(measured.prefill_beside(0), None, "nothing decodes");
        let near = |(factor, extra): (f64, f64), (f, e): (f64, f64)| {
            (factor - f).abs() < 1e-12 && (extra - e).abs() < 1e-12
        };
        assert!(near(measured.prefill_beside(1).unwrap(), (1.2, 1.0)));
        assert!(near(measured.prefill_beside(3).unwrap(), (1.5, 2.5)));
        assert_eq!(
            measured.prefill_beside(9),
            Some((1.6, 3.0)),
            "the last beyond it"
        );
        let text = ron::to_string(&measured).expect("writes");
        assert_eq!(ron::from_str::<TableModel>(&text).expect("reads"), measured);
        assert!(!ron::to_string(&table())
            .expect("writes")
            .contains("prefill_beside_decode"));
        for (bad, says) in [
            ((0, 1.2), "at least 1 decode"),
            ((2, 0.0), "positive finite factor"),
            ((2, f64::NAN), "positive finite factor"),
            ((5, 1.5), "must ascend strictly (5 then 4)"),
        ] {
            let mut wrong = measured.clone();
            wrong.prefill_beside_decode[0] = BesideDecode {
                decodes: bad.0,
                factor: bad.1,
                extra_ms: 0.0,
                overhead_ms: 0.0,
            };
            let error = wrong.validate().expect_err("refused");
            assert_eq!(error.field, "prefill_beside_decode");
            assert!(error.reason.contains(says), "{}", error.reason);
        }
        // A factor left out reads as 1; negative or unknown times are refused.
        let added: BesideDecode =
            ron::from_str("(decodes: 1, extra_ms: 1.5, overhead_ms: 8.0)").expect("reads");
        assert_eq!(
            (added.factor, added.extra_ms, added.overhead_ms),
            (1.0, 1.5, 8.0)
        );
        assert!(!ron::to_string(&added).expect("writes").contains("factor"));
        for (extra_ms, overhead_ms) in [
            (-1.0, 0.0),
            (f64::NAN, 0.0),
            (0.0, -2.0),
            (0.0, f64::INFINITY),
        ] {
            let mut wrong = measured.clone();
            wrong.prefill_beside_decode[0].extra_ms = extra_ms;
            wrong.prefill_beside_decode[0].overhead_ms = overhead_ms;
            let error = wrong.validate().expect_err("refused");
            assert_eq!(error.field, "prefill_beside_decode");
            assert!(
                error.reason.contains("times of 0 or more"),
                "{}",
                error.reason
            );
        }
    }
}
