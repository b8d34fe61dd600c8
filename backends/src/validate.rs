//! Validation: a script of `kvtwin_sim::validation` run on the real backend and on the
//! simulator, and the comparison.
//!
//! Owns: [`HostArm`] (a `Manager` on [`HostHardware`] driven in real time: it waits on
//! the backend's completion path, as any real driver does), [`validate`] (both arms, the
//! same script, then [`compare`]) and [`ValidateError`].
//! Never: change what either arm does to make them agree: the simulator gets the profile
//! it is given, the backend its default configuration (the profile's
//! `transfer_workers` should match [`HostConfig::DEFAULT_WORKER_THREADS`]; calibration
//! writes it so).

use crate::host::{DiskIoMode, HostConfig, HostError, HostHardware};
use kvtwin::manager::Manager;
use kvtwin::stats::nearest_rank;
use kvtwin_sim::hardware::HardwareProfile;
use kvtwin_sim::validation::{
    compare, run_script, Arm, Metric, SimArm, Timed, Trace, ValidationError, ValidationScenario,
};
use std::path::Path;
use std::time::{Duration, Instant};

/// A validation could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ValidateError {
    /// The real backend could not be built.
    #[error("host hardware: {0}")]
    Host(#[from] HostError),
    /// The script failed on one arm.
    #[error("{arm} arm: {source}")]
    Script {
        /// `real` or `sim`.
        arm: &'static str,
        /// Why.
        source: Box<ValidationError>,
    },
}

/// The real arm: a manager on host hardware, in real time.
#[derive(Debug)]
pub struct HostArm {
    manager: Manager<Timed<HostHardware>>,
    /// How long a wait may last before the arm gives up on a transfer.
    patience: Duration,
    waited_since: Option<Instant>,
}

impl HostArm {
    /// A manager for `script` on host hardware with its disk tier in `dir`.
    pub fn new(script: &ValidationScenario, dir: &Path) -> Result<Self, ValidateError> {
        let config = script.manager_config();
        let hardware = HostHardware::new(HostConfig::for_manager(&config, Some(dir)))?;
        let manager =
            Manager::new(Timed::new(hardware), config).map_err(|source| ValidateError::Script {
                arm: "real",
                source: Box::new(source.into()),
            })?;
        Ok(Self {
            manager,
            patience: Duration::from_secs(60),
            waited_since: None,
        })
    }

    /// How the disk tier does its I/O.
    pub fn disk_io(&self) -> Option<DiskIoMode> {
        self.manager.hardware().inner().disk_io_mode()
    }

    /// The backend's worker threads.
    pub fn worker_threads(&self) -> usize {
        self.manager.hardware().inner().config().worker_threads
    }
}

impl Arm for HostArm {
    type H = HostHardware;

    fn manager(&mut self) -> &mut Manager<Timed<HostHardware>> {
        &mut self.manager
    }

    fn wait(&mut self) -> bool {
        let hardware = self.manager.hardware().inner();
        if hardware.wait_completion(Duration::from_millis(100)) {
            self.waited_since = None;
            return true;
        }
        if hardware.in_flight() == 0 {
            return false;
        }
        // Nothing yet: keep waiting, up to the arm's patience in all.
        let since = *self.waited_since.get_or_insert_with(Instant::now);
        since.elapsed() < self.patience
    }
}

/// What a validation found.
#[derive(Clone, Debug)]
pub struct Validation {
    /// The real arm's phases and transfers.
    pub real: Trace,
    /// The simulator's.
    pub sim: Trace,
    /// Per metric: real, simulated, error.
    pub metrics: Vec<Metric>,
    /// How the real disk tier did its I/O.
    pub disk_io: Option<DiskIoMode>,
    /// The real backend's worker threads.
    pub worker_threads: usize,
}

/// Runs `script` on host hardware (disk files in `dir`) `repeat` times (at least once)
/// and once on the simulator with `profile` (it is deterministic), and compares them:
/// each real figure is the median over the repeats, which a shared, noisy machine
/// needs; `real` is the last repeat's trace.
pub fn validate(
    script: &ValidationScenario,
    profile: &HardwareProfile,
    dir: &Path,
    repeat: usize,
) -> Result<Validation, ValidateError> {
    let script_error = |source| ValidateError::Script {
        arm: "sim",
        source: Box::new(source),
    };
    let mut sim_arm = SimArm::new(script, profile.clone()).map_err(script_error)?;
    let sim = run_script(&mut sim_arm, script).map_err(script_error)?;
    let mut runs: Vec<Vec<Metric>> = Vec::new();
    let mut last = None;
    for _ in 0..repeat.max(1) {
        let mut host = HostArm::new(script, dir)?;
        let real = run_script(&mut host, script).map_err(|source| ValidateError::Script {
            arm: "real",
            source: Box::new(source),
        })?;
        runs.push(compare(&real, &sim));
        last = Some((real, host.disk_io(), host.worker_threads()));
    }
    let Some((real, disk_io, worker_threads)) = last else {
        unreachable!("at least one repeat ran");
    };
    Ok(Validation {
        real,
        sim,
        metrics: median_metrics(&runs),
        disk_io,
        worker_threads,
    })
}

/// Per metric of the first run, the median real figure over the runs that have it, and
/// the error against the (same) simulated figure.
pub fn median_metrics(runs: &[Vec<Metric>]) -> Vec<Metric> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|metric| {
            let mut reals: Vec<f64> = runs
                .iter()
                .filter_map(|run| run.iter().find(|m| m.name == metric.name))
                .map(|m| m.real)
                .collect();
            reals.sort_by(f64::total_cmp);
            Metric::new(
                metric.name.clone(),
                nearest_rank(&reals, 0.5).unwrap_or(0.0),
                metric.sim,
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_figures_are_the_median_of_the_repeats() {
        let run = |real: f64| vec![Metric::new("t".into(), real, 10.0)];
        let metrics = median_metrics(&[run(9.0), run(30.0), run(11.0)]);
        assert_eq!(metrics.len(), 1);
        assert_eq!(metrics[0].real, 11.0);
        assert!((metrics[0].error_pct - (10.0 - 11.0) / 11.0 * 100.0).abs() < 1e-9);
        assert!(median_metrics(&[]).is_empty());
    }
}
