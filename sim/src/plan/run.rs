//! One point of a design space: a scenario with overrides and a seed, run on its
//! requests (all of them, or the first part for screening).
//!
//! Owns: [`configure`] (the point's scenario), [`Workload`] (requests loaded once and
//! shared by every run, or generated per run from the scenario), [`run_point`] and
//! [`run`] (a run and its [`RunSummary`]).
//! Never: read files or choose points: sweeps and the planner do.

use super::summary::{RunSummary, CDF_PERCENTS};
use crate::autoscale::Autoscaled;
use crate::cluster::{Cluster, Latency, Report, SimError};
use crate::scenario::{OverrideError, Scenario};
use crate::workload::Request;
use std::borrow::Cow;
use std::sync::Arc;

/// Where a point's requests come from.
#[derive(Clone, Debug)]
pub enum Workload {
    /// A trace read once, shared by every run (the scenario's own workload is ignored).
    Trace(Arc<[Request]>),
    /// The scenario's synthetic workload, generated for each run from its seed and block
    /// size (a point may change either).
    Synthetic,
}

impl Workload {
    /// The requests of `scenario` under this workload, reshaped by its traffic section,
    /// in arrival order (ties in the order generated); a scenario whose workload is a trace has none unless the trace
    /// was loaded ([`Workload::Trace`]).
    pub fn requests<'w>(&'w self, scenario: &Scenario) -> Cow<'w, [Request]> {
        let requests = match self {
            Workload::Trace(requests) => Cow::Borrowed(&requests[..]),
            Workload::Synthetic => Cow::Owned(
                scenario
                    .workload
                    .generate(scenario.seed, scenario.worker.block_size_tokens)
                    .unwrap_or_default(),
            ),
        };
        let requests = match &scenario.traffic {
            None => requests,
            // A validated scenario's traffic section always applies.
            Some(_) => Cow::Owned(
                scenario
                    .shape_traffic(requests.into_owned())
                    .expect("the traffic section was checked with the scenario"),
            ),
        };
        if requests.windows(2).all(|w| w[0].arrival <= w[1].arrival) {
            return requests;
        }
        let mut sorted = requests.into_owned();
        // Stable: ties keep their order, as `simulate` has them.
        sorted.sort_by_key(|r| r.arrival);
        Cow::Owned(sorted)
    }
}

/// `base` with the point's `sets` (`PATH=VALUE`, as `kvtwin run --set`) applied in order
/// and `seed` as its seed.
pub fn configure(base: &Scenario, sets: &[String], seed: u64) -> Result<Scenario, OverrideError> {
    let mut scenario = if sets.is_empty() {
        base.clone()
    } else {
        base.with_overrides(sets)?
    };
    scenario.seed = seed;
    Ok(scenario)
}

/// Runs `requests` (in arrival order) through `scenario`, and summarises the run; the
/// report is byte for byte [`crate::cluster::simulate`]'s.
pub fn run(scenario: &Scenario, requests: &[Request]) -> Result<(Report, RunSummary), SimError> {
    if scenario.autoscale.is_some() {
        let mut run = Autoscaled::new(scenario, requests.iter().cloned())?;
        while run.step().is_some() {}
        let (ttft, tpot) = cdfs(|latency, qs| run.latency_quantiles(latency, qs));
        let report = run.into_report();
        let summary = RunSummary::of(&report, ttft, tpot);
        return Ok((report, summary));
    }
    let mut cluster = Cluster::new(scenario, requests.iter().cloned())?;
    while cluster.step() {}
    Ok(finish(cluster))
}

/// The TTFT and TPOT quantiles of the summary's CDFs, from `quantiles`.
fn cdfs(mut quantiles: impl FnMut(Latency, &[f64]) -> Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    let qs: Vec<f64> = CDF_PERCENTS.iter().map(|p| p / 100.0).collect();
    (quantiles(Latency::Ttft, &qs), quantiles(Latency::Tpot, &qs))
}

/// The report and summary of a cluster whose run is over.
pub(super) fn finish(mut cluster: Cluster<'_>) -> (Report, RunSummary) {
    let (ttft, tpot) = cdfs(|latency, qs| cluster.latency_quantiles(latency, qs));
    let report = cluster.into_report();
    let summary = RunSummary::of(&report, ttft, tpot);
    (report, summary)
}

/// The first `fraction` (0 < fraction ≤ 1) of `requests` by arrival, at least one: the
/// prefix a screening run uses.
pub fn prefix(requests: &[Request], fraction: f64) -> &[Request] {
    let keep = ((requests.len() as f64 * fraction).ceil() as usize).clamp(1, requests.len());
    &requests[..keep.min(requests.len())]
}

/// A point's scenario and its run on `workload` (all of it, or its first `fraction`).
pub fn run_point(
    base: &Scenario,
    sets: &[String],
    seed: u64,
    workload: &Workload,
    fraction: f64,
) -> Result<(Report, RunSummary), PointError> {
    let scenario = configure(base, sets, seed)?;
    let requests = workload.requests(&scenario);
    let requests = if fraction < 1.0 {
        prefix(&requests, fraction)
    } else {
        &requests[..]
    };
    Ok(run(&scenario, requests)?)
}

/// A point could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PointError {
    /// An override does not fit the scenario.
    #[error(transparent)]
    Override(#[from] OverrideError),
    /// The cluster could not be built.
    #[error(transparent)]
    Sim(#[from] SimError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::simulate;
    use std::path::Path;

    fn scenario() -> Scenario {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/cluster-kv.ron");
        let mut scenario = Scenario::load(&path).unwrap();
        scenario.workload.thin_out(10);
        scenario
    }

    #[test]
    fn a_point_reports_what_simulate_reports() {
        let base = scenario();
        let sets = vec!["cluster.workers=3".to_string()];
        let (report, summary) = run_point(&base, &sets, 5, &Workload::Synthetic, 1.0).unwrap();
        let scenario = configure(&base, &sets, 5).unwrap();
        let requests = Workload::Synthetic.requests(&scenario);
        assert_eq!(report, simulate(&scenario, &requests).unwrap());
        assert_eq!(report.workers, 3);
        assert_eq!(report.seed, 5);
        assert_eq!(summary.ttft_cdf_ms.len(), CDF_PERCENTS.len());
        assert_eq!(summary.ttft_cdf_ms[20], report.ttft.p99_ms);
        assert_eq!(summary.ttft_cdf_ms[21], report.ttft.max_ms);
        assert!(summary.ttft_cdf_ms.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn a_screening_run_takes_the_first_arrivals() {
        let base = scenario();
        let (full, _) = run_point(&base, &[], 1, &Workload::Synthetic, 1.0).unwrap();
        let (screen, _) = run_point(&base, &[], 1, &Workload::Synthetic, 0.25).unwrap();
        assert_eq!(screen.requests, full.requests.div_ceil(4));
        let error = run_point(
            &base,
            &["cluster.wrokers=3".into()],
            1,
            &Workload::Synthetic,
            1.0,
        )
        .unwrap_err();
        assert!(error.to_string().contains("cluster.wrokers"), "{error}");
    }
}
