//! Validation: a script of `kvtwin_sim::validation` run on the real backend and on the
//! simulator, and the comparison.
//!
//! Owns: [`HostArm`] (a `Manager` on [`HostHardware`] driven in real time: it waits on
//! the backend's completion path, as any real driver does), [`validate`] (both arms, the
//! same script, repeated, each repeat simulated with a given profile or with a
//! calibration taken right before it, then [`compare`] per repeat and [`spread`] over
//! them) and [`ValidateError`].
//! Never: change what either arm does to make them agree: the simulator gets the profile
//! it is given, the backend its default configuration (the profile's
//! `transfer_workers` should match [`HostConfig::DEFAULT_WORKER_THREADS`]; calibration
//! writes it so).

use crate::calibrate::{calibrate, gpu_description, CalibrateError, CalibrateOptions};
use crate::host::{DiskIoMode, HostConfig, HostError, HostHardware};
use kvtwin::manager::Manager;
use kvtwin_sim::hardware::HardwareProfile;
use kvtwin_sim::validation::{
    compare, run_script, spread, Arm, Metric, MetricSpread, SimArm, Timed, Trace, ValidationError,
    ValidationScenario,
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
    /// A calibration before a repeat failed.
    #[error("calibration: {0}")]
    Calibrate(#[from] CalibrateError),
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
    /// A manager for `script` on host hardware with its disk tier in `dir` and its device
    /// tier in GPU `cuda_device`'s memory (the host tier pinned for it), or emulated in
    /// host memory when `None`.
    pub fn new(
        script: &ValidationScenario,
        dir: &Path,
        cuda_device: Option<u32>,
    ) -> Result<Self, ValidateError> {
        let config = script.manager_config();
        let hardware = HostHardware::new(HostConfig {
            cuda_device,
            ..HostConfig::for_manager(&config, Some(dir))
        })?;
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
    /// The last repeat's real phases and transfers.
    pub real: Trace,
    /// The last repeat's simulated ones.
    pub sim: Trace,
    /// Per metric over the repeats: medians, the error's range, the real spread and the
    /// verdict against the metric's target.
    pub metrics: Vec<MetricSpread>,
    /// Per repeat, every metric (real, simulated, error), in the order run.
    pub runs: Vec<Vec<Metric>>,
    /// The profile each repeat was simulated with, in the order run: one profile
    /// repeated when it was given, each repeat's own calibration otherwise.
    pub profiles: Vec<HardwareProfile>,
    /// How the real disk tier did its I/O.
    pub disk_io: Option<DiskIoMode>,
    /// The real backend's worker threads.
    pub worker_threads: usize,
    /// What the real arm's device tier was: a GPU's memory (named) or host memory.
    pub device_tier: String,
}

/// Where the simulator's profile comes from.
#[derive(Clone, Copy, Debug)]
pub enum ProfileSource<'a> {
    /// One profile for every repeat (from an earlier `kvtwin calibrate`).
    Given(&'a HardwareProfile),
    /// A calibration with these options right before each repeat's real run, so the
    /// simulator describes the machine as it is at that moment: a shared machine's memory
    /// and disk speeds drift by tens of percent within minutes.
    Calibrated(&'a CalibrateOptions),
}

/// What [`validate`] is doing, for progress lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Calibrating before repeat `n` (from 1).
    Calibrating(usize),
    /// Running repeat `n` on the real backend.
    Running(usize),
}

/// Runs `script` `repeat` times (at least once) on host hardware (disk files in `dir`,
/// the device tier in GPU `cuda_device`'s memory or emulated when `None`) and on the
/// simulator with the profile `source` gives for that repeat, and
/// summarises the repeats: each metric's median real and simulated figures, the range
/// of its error, and the real figure's own spread, which on a shared, noisy machine can
/// exceed the error being judged. `on_stage` hears of each step.
pub fn validate(
    script: &ValidationScenario,
    source: ProfileSource<'_>,
    dir: &Path,
    cuda_device: Option<u32>,
    repeat: usize,
    mut on_stage: impl FnMut(Stage),
) -> Result<Validation, ValidateError> {
    // The simulator is deterministic: with one given profile, once is enough; a
    // calibrated repeat simulates with its own.
    let mut sim = match source {
        ProfileSource::Given(profile) => simulate(script, profile)?,
        ProfileSource::Calibrated(_) => Trace::default(),
    };
    let mut runs = Vec::new();
    let mut profiles = Vec::new();
    let mut last = None;
    for n in 1..=repeat.max(1) {
        let profile = match source {
            ProfileSource::Given(profile) => profile.clone(),
            ProfileSource::Calibrated(options) => {
                on_stage(Stage::Calibrating(n));
                let profile = calibrate(options)?.profile;
                sim = simulate(script, &profile)?;
                profile
            }
        };
        on_stage(Stage::Running(n));
        let mut host = HostArm::new(script, dir, cuda_device)?;
        let real = run_script(&mut host, script).map_err(|source| ValidateError::Script {
            arm: "real",
            source: Box::new(source),
        })?;
        runs.push(compare(&real, &sim));
        profiles.push(profile);
        last = Some((real, host.disk_io(), host.worker_threads()));
    }
    let Some((real, disk_io, worker_threads)) = last else {
        unreachable!("at least one repeat ran");
    };
    Ok(Validation {
        real,
        sim,
        metrics: spread(&runs),
        runs,
        profiles,
        disk_io,
        worker_threads,
        device_tier: gpu_description(cuda_device),
    })
}

/// `script` on the simulator with `profile`.
fn simulate(
    script: &ValidationScenario,
    profile: &HardwareProfile,
) -> Result<Trace, ValidateError> {
    let script_error = |source| ValidateError::Script {
        arm: "sim",
        source: Box::new(source),
    };
    let mut arm = SimArm::new(script, profile.clone()).map_err(script_error)?;
    run_script(&mut arm, script).map_err(script_error)
}
