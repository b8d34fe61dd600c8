//! Calibration: microbenchmarks of this machine through `HostHardware`'s own transfer
//! path, and the simulator's [`HardwareProfile`] fitted to them.
//!
//! Owns: [`CalibrateOptions`], [`Calibration`] (the samples, the fitted figures, the
//! profile and its RON with the method in comments), [`Sample`], [`LinkFit`],
//! [`CalibrateError`]; the fitting math is in `fit` ([`fit_link`],
//! [`fit_aggregate_bandwidth`], [`transfer_rate_at`], [`servers_for`]; quantiles are
//! nearest-rank, `kvtwin::stats::nearest_rank`).
//!
//! Method: every figure is a run of real transfers on a [`HostHardware`] (submit, wait
//! on the completion path, poll), so what is measured is what the backend achieves, thread
//! pool, staging copies and BLAKE3 included, not a bare `memcpy` or `pwrite`:
//! - per tier pair (host→device and device→host: the emulated device's "PCIe" links;
//!   host→disk and disk→device: the disk links), one transfer at a time at block sizes
//!   from 64 KiB to 64 MiB; a weighted least-squares fit of `time = latency + bytes /
//!   bandwidth` over the medians gives each link's per-transfer latency and the rate of
//!   one transfer (one worker thread); given the caller's transfer shape (blocks of
//!   `aggregate_block_bytes`, `blocks_per_transfer` of them, one I/O each), one
//!   transfer's rate is taken at that shape instead;
//! - the same pairs at that shape with 1, 2 and 4 worker threads each kept busy, and 16
//!   transfers in flight on the default pool: the aggregate bandwidth a link reaches when several
//!   transfers share it (on a machine with fewer cores than workers, the cores bound it);
//! - the disk pairs again with buffered I/O (page cache), for comparison only, and small
//!   transfers at full concurrency for the disk's operations per second.
//!
//! Never: change the machine (files go in a temporary directory under the one given and
//! are removed), or guess a figure it did not measure (no GPU here means no CUDA figures,
//! and the output says so).

use crate::host::{
    DiskIo, DiskIoMode, HostConfig, HostError, HostHardware, RemoteTier, TierCapacity,
};
use kvtwin::hardware::{Clock, Hardware, SubmitError, TransferRequest};
use kvtwin::ids::{BlockId, Timestamp};
use kvtwin::stats::nearest_rank;
use kvtwin::tier::Tier;
use kvtwin_sim::hardware::HardwareProfile;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod fit;
pub use fit::{
    fit_aggregate_bandwidth, fit_latency_bandwidth, fit_link, servers_for, transfer_rate_at,
    STREAMING_BYTES,
};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
/// The bench hardware's in-flight bound.
const MAX_IN_FLIGHT: usize = 64;

/// The tier pairs calibration measures: the two memory links of the emulated device and
/// the two disk links the manager uses (offload to disk, onboard from disk).
pub const PAIRS: [(Tier, Tier); 4] = [
    (Tier::Host, Tier::Device),
    (Tier::Device, Tier::Host),
    (Tier::Host, Tier::Disk),
    (Tier::Disk, Tier::Device),
];

/// What to measure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CalibrateOptions {
    /// Where the disk tier's files go (an existing, writable directory).
    pub dir: PathBuf,
    /// A few seconds in all: fewer sizes and fewer bytes per point (for tests).
    pub quick: bool,
    /// Worker threads of the pool the profile describes (the backend's default unless
    /// told otherwise).
    pub worker_threads: usize,
    /// The GPU whose memory is the device tier while measuring (feature `cuda`), so the
    /// host↔device links are PCIe / NVLink-C2C H2D and D2H; `None` emulates the device
    /// in host memory.
    pub cuda_device: Option<u32>,
    /// The transfer size of the points with many transfers in flight, which fit each
    /// link's aggregate rate and servers (default 4 MiB, 1 MiB quick): a disk's rate at
    /// depth depends on the size of its I/O, so a validation calibrates at its script's.
    /// When given, one transfer's rate is also taken at this size (see `fit_pair`).
    pub aggregate_block_bytes: Option<u64>,
    /// Blocks each transfer of those points moves (at least 1): a manager moves a chain
    /// of blocks as one transfer, one I/O per block, and a disk serves two 4 MiB writes
    /// differently from one of 8 MiB.
    pub blocks_per_transfer: usize,
}

impl CalibrateOptions {
    /// The full calibration in `dir`, for the backend's default pool, on GPU 0 when this
    /// build has feature `cuda` and GPU 0 opens.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            quick: false,
            worker_threads: HostConfig::DEFAULT_WORKER_THREADS,
            cuda_device: first_gpu(),
            aggregate_block_bytes: None,
            blocks_per_transfer: 1,
        }
    }
}

/// GPU 0 if this build can use it.
pub fn first_gpu() -> Option<u32> {
    #[cfg(feature = "cuda")]
    if crate::cuda::CudaDevice::open(0).is_ok() {
        return Some(0);
    }
    None
}

/// What the calibration (or a validation's real arm) says about the GPU whose memory is
/// its device tier, or why there is none.
pub fn gpu_description(cuda_device: Option<u32>) -> String {
    #[cfg(feature = "cuda")]
    {
        match cuda_device.map(crate::cuda::CudaDevice::open) {
            Some(Ok(device)) => format!(
                "GPU {} ({}, {} GiB): the device tier is its memory and the host tier is \
                 pinned, so host↔device figures are CUDA H2D / D2H",
                device.ordinal(),
                device.name(),
                device.total_memory() >> 30
            ),
            Some(Err(error)) => format!("no GPU measured: {error}"),
            None => match crate::cuda::CudaDevice::open(0) {
                Ok(_) => "no GPU measured (not asked for); the device tier is emulated in \
                          host memory"
                    .to_string(),
                Err(error) => format!(
                    "no GPU: CUDA H2D/D2H not measured ({error}); the device tier is \
                     emulated in host memory"
                ),
            },
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = cuda_device;
        "no GPU: CUDA H2D/D2H not measured (this build has no cuda feature); the device \
         tier is emulated in host memory"
            .to_string()
    }
}

/// Calibration could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrateError {
    /// The hardware under test could not be built.
    #[error("building the host hardware: {0}")]
    Host(#[from] HostError),
    /// A transfer was refused.
    #[error("submitting a transfer: {0}")]
    Submit(#[from] SubmitError),
    /// A transfer failed.
    #[error("transfer {src}→{dst} failed: {reason}")]
    Transfer {
        /// Source tier.
        src: Tier,
        /// Destination tier.
        dst: Tier,
        /// Why.
        reason: String,
    },
    /// A transfer did not finish within a minute.
    #[error("transfer {src}→{dst} did not finish")]
    Stuck {
        /// Source tier.
        src: Tier,
        /// Destination tier.
        dst: Tier,
    },
    /// The directory could not hold the calibration's files.
    #[error("{path}: {source}", path = path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A link had too few usable samples to fit.
    #[error("too few samples to fit {0}")]
    NoFit(&'static str),
    /// The profile could not be written as RON.
    #[error("writing the profile: {0}")]
    Ron(#[from] ron::Error),
}

/// One measured point: `transfers` transfers of one block each, `in_flight` at a time.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Source tier.
    pub src: Tier,
    /// Destination tier.
    pub dst: Tier,
    /// Disk I/O mode, when a disk tier is involved.
    pub disk_io: Option<DiskIoMode>,
    /// Bytes of each block.
    pub block_bytes: u64,
    /// Blocks each transfer moves.
    pub blocks: usize,
    /// Worker threads of the pool.
    pub threads: usize,
    /// Transfers kept in flight.
    pub in_flight: usize,
    /// Transfers timed.
    pub transfers: usize,
    /// From the first submission to the last completion.
    pub elapsed: Duration,
    /// Median time from submission to completion.
    pub latency_p50: Duration,
    /// 99th percentile of the same.
    pub latency_p99: Duration,
}

impl Sample {
    /// Bytes per second over the whole point.
    pub fn bytes_per_s(&self) -> f64 {
        let bytes = self.transfer_bytes() as f64 * self.transfers as f64;
        bytes / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Bytes of each transfer.
    pub fn transfer_bytes(&self) -> u64 {
        self.block_bytes.saturating_mul(self.blocks as u64)
    }

    /// Whether the point is of `src → dst`.
    fn is(&self, src: Tier, dst: Tier) -> bool {
        self.src == src && self.dst == dst
    }
}

/// What calibration fitted for one link.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFit {
    /// Per-transfer latency (the intercept of the fit): submission, hand-off to a worker,
    /// completion and the driver's wake-up.
    pub latency: Duration,
    /// Rate of one transfer alone (one worker thread), bytes per second.
    pub transfer_bytes_per_s: f64,
    /// Rate the link reaches with the pool busy, bytes per second.
    pub aggregate_bytes_per_s: f64,
}

/// The outcome: every sample, the fits and the profile.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// Every point measured, in the order measured.
    pub samples: Vec<Sample>,
    /// Fitted figures per tier pair of [`PAIRS`].
    pub fits: BTreeMap<(Tier, Tier), LinkFit>,
    /// How the disk tier did its I/O in the fitted runs.
    pub disk_io: Option<DiskIoMode>,
    /// Small disk transfers per second at full concurrency (read, write).
    pub disk_ops_per_s: (f64, f64),
    /// Cores this process may run on (the pool shares them).
    pub cores: usize,
    /// What was said about the GPU: the one measured, or why none was.
    pub gpu: String,
    /// Whether the device tier was a GPU's memory (CUDA H2D / D2H), not host memory
    /// emulating one.
    pub on_gpu: bool,
    /// The profile for the simulator.
    pub profile: HardwareProfile,
}

/// Runs the calibration.
pub fn calibrate(options: &CalibrateOptions) -> Result<Calibration, CalibrateError> {
    let dir = tempdir_in(&options.dir)?;
    let result = run(options, dir.path());
    drop(dir);
    result
}

/// A directory removed on drop (the extent files inside are removed by their tiers).
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir_in(parent: &Path) -> Result<TempDir, CalibrateError> {
    let path = parent.join(format!("kvtwin-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&path).map_err(|source| CalibrateError::Dir {
        path: path.clone(),
        source,
    })?;
    Ok(TempDir(path))
}

/// Bytes each point moves at least (the largest blocks move a few transfers more).
fn bytes_per_point(quick: bool) -> u64 {
    if quick {
        8 * MIB
    } else {
        192 * MIB
    }
}

/// Blocks per tier: enough that the transfers of a point touch more memory (and file)
/// than the CPU's caches hold, as a manager's pools do; at least 16 so that transfers in
/// flight never share a block.
fn slots(block: u64, quick: bool) -> usize {
    let working_set = if quick { 32 * MIB } else { 512 * MIB };
    (working_set / block.max(1)).clamp(16, 4096) as usize
}

fn block_sizes(quick: bool) -> Vec<u64> {
    if quick {
        vec![64 * KIB, MIB, 4 * MIB]
    } else {
        vec![64 * KIB, 256 * KIB, MIB, 4 * MIB, 16 * MIB, 64 * MIB]
    }
}

fn run(options: &CalibrateOptions, dir: &Path) -> Result<Calibration, CalibrateError> {
    let quick = options.quick;
    let workers = options.worker_threads.max(1);
    let mut samples = Vec::new();
    // Latency and one transfer's rate: one at a time, every size, direct I/O.
    for &block in &block_sizes(quick) {
        let mut bench = Bench::new(
            options,
            dir,
            (block, 1),
            workers,
            DiskIo::Auto,
            slots(block, quick),
        )?;
        for (src, dst) in PAIRS {
            samples.push(bench.point(src, dst, 1, quick)?);
        }
    }
    // Aggregate rates: 1, 2, 4 threads each kept busy, then many in flight.
    let agg_block = options
        .aggregate_block_bytes
        .filter(|bytes| *bytes > 0)
        .unwrap_or(if quick { MIB } else { 4 * MIB });
    let chain = options.blocks_per_transfer.max(1);
    let shape = (agg_block, chain);
    let agg_slots = slots(agg_block, quick).max(16 * chain);
    let mut thread_counts = vec![1, 2, 4];
    if !thread_counts.contains(&workers) {
        thread_counts.push(workers);
    }
    for &threads in &thread_counts {
        let mut bench = Bench::new(options, dir, shape, threads, DiskIo::Auto, agg_slots)?;
        for (src, dst) in PAIRS {
            samples.push(bench.point(src, dst, threads, quick)?);
        }
    }
    let mut bench = Bench::new(options, dir, shape, workers, DiskIo::Auto, agg_slots)?;
    let disk_io = bench.hw.disk_io_mode();
    for (src, dst) in PAIRS {
        samples.push(bench.point(src, dst, 16, quick)?);
    }
    drop(bench);
    // Buffered disk I/O for comparison (the page cache serves the reads).
    let mut bench = Bench::new(options, dir, shape, workers, DiskIo::Buffered, agg_slots)?;
    for (src, dst) in [(Tier::Host, Tier::Disk), (Tier::Disk, Tier::Device)] {
        samples.push(bench.point(src, dst, 1, quick)?);
        samples.push(bench.point(src, dst, workers, quick)?);
    }
    drop(bench);
    // Small disk operations at full concurrency.
    let mut bench = Bench::new(
        options,
        dir,
        (64 * KIB, 1),
        workers,
        DiskIo::Auto,
        slots(64 * KIB, quick),
    )?;
    let write = bench.point(Tier::Host, Tier::Disk, 16, quick)?;
    let read = bench.point(Tier::Disk, Tier::Device, 16, quick)?;
    let ops = |s: &Sample| s.transfers as f64 / s.elapsed.as_secs_f64().max(1e-9);
    let disk_ops_per_s = (ops(&read), ops(&write));
    samples.push(write);
    samples.push(read);
    drop(bench);

    // A transfer size the caller named is where the profile must be right: one
    // transfer's rate is taken there, not from the line through every size.
    let operating = options
        .aggregate_block_bytes
        .filter(|bytes| *bytes > 0)
        .map(|bytes| (bytes, chain));
    let mut fits = BTreeMap::new();
    for (src, dst) in PAIRS {
        let fit = fit_pair(&samples, src, dst, workers, disk_io, operating)?;
        fits.insert((src, dst), fit);
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let gpu = gpu_description(options.cuda_device);
    let profile = profile_from(&fits, workers);
    Ok(Calibration {
        samples,
        fits,
        disk_io,
        disk_ops_per_s,
        cores,
        gpu,
        on_gpu: options.cuda_device.is_some(),
        profile,
    })
}

/// The fit of one pair from the samples: latency and one transfer's rate from the line
/// through the sizes measured one at a time, or, with an `operating` transfer size, the
/// rate that line must have to give the mean time measured one at a time at that size
/// (a disk's rate is not linear in the size of its I/O: on the machine of BENCHMARKS.md,
/// 8 MiB writes ran at 1.05 GB/s where the line through 64 KiB–64 MiB said 1.59).
fn fit_pair(
    samples: &[Sample],
    src: Tier,
    dst: Tier,
    workers: usize,
    disk_io: Option<DiskIoMode>,
    operating: Option<(u64, usize)>,
) -> Result<LinkFit, CalibrateError> {
    let direct = |s: &&Sample| s.is(src, dst) && (s.disk_io.is_none() || s.disk_io == disk_io);
    let alone: Vec<(f64, f64)> = samples
        .iter()
        .filter(direct)
        .filter(|s| s.in_flight == 1 && s.threads == workers && s.blocks == 1)
        .map(|s| (s.block_bytes as f64, s.latency_p50.as_secs_f64()))
        .collect();
    let name = pair_name(src, dst);
    let (latency_s, line_bytes_per_s) = fit_link(&alone).ok_or(CalibrateError::NoFit(name))?;
    let at_operating: Vec<(f64, f64, usize)> = samples
        .iter()
        .filter(direct)
        .filter(|s| s.in_flight == 1 && Some((s.block_bytes, s.blocks)) == operating)
        .map(|s| {
            let bytes = s.transfer_bytes() as f64 * s.transfers as f64;
            (bytes, s.elapsed.as_secs_f64(), s.transfers)
        })
        .collect();
    let transfer_bytes_per_s =
        transfer_rate_at(&at_operating, latency_s).unwrap_or(line_bytes_per_s);
    let busy: Vec<(f64, f64, usize)> = samples
        .iter()
        .filter(direct)
        .filter(|s| s.threads == workers && s.in_flight >= workers && s.transfer_bytes() >= MIB)
        .map(|s| {
            (
                s.transfer_bytes() as f64 * s.transfers as f64,
                s.elapsed.as_secs_f64(),
                s.transfers.div_ceil(s.in_flight),
            )
        })
        .collect();
    let aggregate_bytes_per_s = fit_aggregate_bandwidth(&busy, latency_s)
        .unwrap_or(transfer_bytes_per_s)
        .max(transfer_bytes_per_s);
    Ok(LinkFit {
        latency: Duration::from_secs_f64(latency_s),
        transfer_bytes_per_s,
        aggregate_bytes_per_s,
    })
}

/// The name of a tier pair in tables and metrics.
pub fn pair_name(src: Tier, dst: Tier) -> &'static str {
    match (src, dst) {
        (Tier::Host, Tier::Device) => "host->device",
        (Tier::Device, Tier::Host) => "device->host",
        (Tier::Host, Tier::Disk) => "host->disk",
        (Tier::Disk, Tier::Device) => "disk->device",
        (Tier::Device, Tier::Disk) => "device->disk",
        (Tier::Disk, Tier::Host) => "disk->host",
        _ => "other",
    }
}

/// One `HostHardware` with device, host and disk tiers of `capacity` blocks.
struct Bench {
    hw: HostHardware,
    capacity: usize,
    /// Blocks each transfer moves (consecutive slots).
    blocks_per_transfer: usize,
    disk_written: bool,
    /// The next block to use: slots go round robin across runs, so a timed run does not
    /// start on the blocks its warm-up just touched.
    cursor: usize,
}

impl Bench {
    fn new(
        options: &CalibrateOptions,
        dir: &Path,
        (block_bytes, blocks_per_transfer): (u64, usize),
        threads: usize,
        disk_io: DiskIo,
        capacity: usize,
    ) -> Result<Self, CalibrateError> {
        let tiers = [Tier::Device, Tier::Host, Tier::Disk]
            .into_iter()
            .map(|tier| TierCapacity {
                tier,
                capacity_blocks: capacity,
            })
            .collect();
        let hw = HostHardware::new(HostConfig {
            bytes_per_block: block_bytes,
            tiers,
            disk_dir: Some(dir.to_path_buf()),
            disk_io,
            disk_persistent: false,
            remote: RemoteTier::Absent,
            worker_threads: threads,
            max_in_flight: MAX_IN_FLIGHT,
            costs: Default::default(),
            cuda_device: options.cuda_device,
        })?;
        Ok(Self {
            hw,
            capacity,
            blocks_per_transfer: blocks_per_transfer.clamp(1, capacity.max(1)),
            disk_written: false,
            cursor: 0,
        })
    }

    /// Times `src → dst` with `in_flight` one-block transfers kept in flight.
    fn point(
        &mut self,
        src: Tier,
        dst: Tier,
        in_flight: usize,
        quick: bool,
    ) -> Result<Sample, CalibrateError> {
        if src == Tier::Disk && !self.disk_written {
            // Reads need blocks with valid checksums: write every slot once.
            let chains = self.capacity.div_ceil(self.blocks_per_transfer);
            self.run(Tier::Host, Tier::Disk, chains, 16)?;
        }
        let block = self.hw.block_bytes() as u64;
        let transfer_bytes = block.saturating_mul(self.blocks_per_transfer as u64);
        let transfers = (bytes_per_point(quick) / transfer_bytes.max(1))
            .clamp(if quick { 3 } else { 5 }, 512) as usize;
        let transfers = transfers.max(in_flight * 2);
        // One untimed round warms the pool and the caches.
        self.run(src, dst, in_flight.min(transfers), in_flight)?;
        let (elapsed, mut latencies) = self.run(src, dst, transfers, in_flight)?;
        latencies.sort_by(f64::total_cmp);
        Ok(Sample {
            src,
            dst,
            disk_io: (src == Tier::Disk || dst == Tier::Disk)
                .then(|| self.hw.disk_io_mode())
                .flatten(),
            block_bytes: block,
            blocks: self.blocks_per_transfer,
            threads: self.hw.config().worker_threads,
            in_flight,
            transfers,
            elapsed,
            latency_p50: Duration::from_secs_f64(nearest_rank(&latencies, 0.5).unwrap_or(0.0)),
            latency_p99: Duration::from_secs_f64(nearest_rank(&latencies, 0.99).unwrap_or(0.0)),
        })
    }

    /// Runs `transfers` transfers of the bench's blocks per transfer (consecutive slots),
    /// `in_flight` at a time, on distinct blocks (round robin, so no two in flight touch
    /// the same block); the time from the first submission to the last completion and
    /// each transfer's latency in seconds.
    fn run(
        &mut self,
        src: Tier,
        dst: Tier,
        transfers: usize,
        in_flight: usize,
    ) -> Result<(Duration, Vec<f64>), CalibrateError> {
        // Distinct blocks in flight, and within the hardware's bound.
        let chain = self.blocks_per_transfer;
        let in_flight = in_flight.clamp(1, (self.capacity / chain).clamp(1, MAX_IN_FLIGHT));
        let mut started: BTreeMap<u64, Timestamp> = BTreeMap::new();
        let mut latencies = Vec::with_capacity(transfers);
        let mut next = 0usize;
        let first = self.hw.clock().now();
        let mut last = first;
        while latencies.len() < transfers {
            while next < transfers && started.len() < in_flight {
                if self.cursor % self.capacity + chain > self.capacity {
                    // A chain never wraps: its blocks stay consecutive.
                    self.cursor += self.capacity - self.cursor % self.capacity;
                }
                let first_slot = self.cursor % self.capacity;
                self.cursor += chain;
                let slots: Vec<BlockId> = (first_slot..first_slot + chain)
                    .map(|slot| BlockId::new(slot as u32))
                    .collect();
                let request = TransferRequest {
                    src_tier: src,
                    src_blocks: slots.clone(),
                    dst_tier: dst,
                    dst_blocks: slots,
                    bytes: (self.hw.block_bytes() * chain) as u64,
                };
                let now = self.hw.clock().now();
                let id = self.hw.submit(request, now)?;
                started.insert(id.get(), now);
                next += 1;
            }
            if !self.hw.wait_completion(Duration::from_secs(60)) {
                return Err(CalibrateError::Stuck { src, dst });
            }
            let now = self.hw.clock().now();
            while let Some(done) = self.hw.poll_completion(now) {
                if let Err(error) = done.result {
                    return Err(CalibrateError::Transfer {
                        src,
                        dst,
                        reason: error.to_string(),
                    });
                }
                if let Some(at) = started.remove(&done.id.get()) {
                    let span = now.saturating_duration_since(at);
                    latencies.push(span.as_secs_f64());
                }
                last = now;
            }
        }
        if dst == Tier::Disk && transfers * chain >= self.capacity {
            self.disk_written = true;
        }
        Ok((last.saturating_duration_since(first), latencies))
    }
}

/// The simulator's profile from the fits: the memory pairs are the emulated device's
/// PCIe links (one figure for both directions, their mean), host→disk is the NVMe write
/// link and disk→device the NVMe read link (a disk read and the copy out of the staging
/// buffer, as the backend does them, measured as one); the worker pool bounds the
/// transfers in service (`transfer_workers`), so no NVMe queue depth and no IOPS limit
/// are set (a small transfer's fixed cost is in the latency).
fn profile_from(fits: &BTreeMap<(Tier, Tier), LinkFit>, workers: usize) -> HardwareProfile {
    let fit = |src, dst| fits.get(&(src, dst)).copied();
    let none = LinkFit {
        latency: Duration::ZERO,
        transfer_bytes_per_s: 1.0,
        aggregate_bytes_per_s: 1.0,
    };
    let h2d = fit(Tier::Host, Tier::Device).unwrap_or(none);
    let d2h = fit(Tier::Device, Tier::Host).unwrap_or(none);
    let write = fit(Tier::Host, Tier::Disk).unwrap_or(none);
    let read = fit(Tier::Disk, Tier::Device).unwrap_or(none);
    let mean = |a: f64, b: f64| (a + b) / 2.0;
    let pcie_latency = mean(h2d.latency.as_secs_f64(), d2h.latency.as_secs_f64());
    // A disk read to the device crosses NVMe and PCIe in the model, so it lands after
    // both latencies: the NVMe's is what is left of the read's own.
    let nvme_latency = mean(
        write.latency.as_secs_f64(),
        (read.latency.as_secs_f64() - pcie_latency).max(0.0),
    );
    let rate = |v: f64| v.round().max(1.0) as u64;
    let ns = |s: f64| (s * 1e9).round() as u64;
    let pcie_aggregate = mean(h2d.aggregate_bytes_per_s, d2h.aggregate_bytes_per_s);
    let pcie_transfer = mean(h2d.transfer_bytes_per_s, d2h.transfer_bytes_per_s);
    // Each link as servers: as many transfers in service as one transfer's rate fits
    // into the aggregate (0, the fluid link, when the pool's workers are fewer anyway).
    let servers = |aggregate: f64, transfer: f64| {
        let n = servers_for(aggregate, transfer);
        if n >= workers {
            0
        } else {
            n
        }
    };
    HardwareProfile {
        name: "host-calibrated".into(),
        pcie_bytes_per_s: rate(pcie_aggregate),
        pcie_latency_ns: ns(pcie_latency),
        nvme_read_bytes_per_s: rate(read.aggregate_bytes_per_s),
        nvme_write_bytes_per_s: rate(write.aggregate_bytes_per_s),
        nvme_latency_ns: ns(nvme_latency),
        nvme_read_iops: 0,
        nvme_write_iops: 0,
        nvme_max_io_bytes: 1 << 20,
        // One depth for both directions: the larger.
        nvme_queue_depth: servers(read.aggregate_bytes_per_s, read.transfer_bytes_per_s).max(
            servers(write.aggregate_bytes_per_s, write.transfer_bytes_per_s),
        ),
        // No network here: the remote tier is in-process memory, like the PCIe links.
        nic_bytes_per_s: rate(pcie_aggregate),
        nic_latency_ns: ns(pcie_latency),
        // Not measured (no GPU): the default scenario's figures for an H100 serving
        // Llama-3-8B, so that a profile runs a full scenario too.
        prefill_ns_per_token: 50_000,
        decode_ns_per_token: 12_000_000,
        compute: None,
        max_inflight_transfers: 256,
        pcie_transfer_bytes_per_s: rate(pcie_transfer.min(pcie_aggregate)),
        nvme_read_transfer_bytes_per_s: rate(
            read.transfer_bytes_per_s.min(read.aggregate_bytes_per_s),
        ),
        nvme_write_transfer_bytes_per_s: rate(
            write.transfer_bytes_per_s.min(write.aggregate_bytes_per_s),
        ),
        transfer_workers: workers,
        pcie_servers: servers(pcie_aggregate, pcie_transfer),
    }
}

impl Calibration {
    /// The profile as RON, opened by comments that say how it was measured and what was
    /// fitted; `Scenario`'s `hardware` section and `kvtwin validate --profile` load it.
    pub fn profile_ron(&self) -> Result<String, CalibrateError> {
        let body = ron::ser::to_string_pretty(&self.profile, ron::ser::PrettyConfig::new())?;
        let mut out = String::new();
        let io = match self.disk_io {
            Some(DiskIoMode::Direct) => "direct I/O (O_DIRECT)",
            Some(DiskIoMode::Buffered) => "buffered I/O (the filesystem refused O_DIRECT)",
            None => "no disk",
        };
        let pcie = if self.on_gpu {
            "- pcie_*: host<->device copies, CUDA H2D / D2H between pinned host memory and the GPU;"
        } else {
            "- pcie_*: host<->device copies of the emulated device (memory to memory);"
        };
        let lines = [
            "A HardwareProfile measured by `kvtwin calibrate` through HostHardware's own".to_string(),
            "transfer path (submit, worker thread, completion queue, the driver's wake-up):".to_string(),
            pcie.to_string(),
            "  latency and pcie_transfer_bytes_per_s from a weighted least-squares fit of".to_string(),
            "  time = latency + bytes / rate over one-at-a-time transfers of 64 KiB..64 MiB".to_string(),
            "  (medians); pcie_bytes_per_s from the pool kept busy (the link's aggregate).".to_string(),
            format!("- nvme_write_*: host->disk, nvme_read_*: disk->device, the extent file with {io},"),
            "  BLAKE3 per block and the staging copy included; nvme_latency_ns is the disk".to_string(),
            "  transfers' latency less the PCIe latency a disk->device transfer also pays.".to_string(),
            format!("- transfer_workers: the backend's {} worker threads (a queue every transfer", self.profile.transfer_workers),
            format!("  waits in); this process may run on {} cores.", self.cores),
            "- pcie_servers, nvme_queue_depth: each link as servers, each moving one transfer at".to_string(),
            "  its single-transfer rate in arrival order under the aggregate: aggregate / per".to_string(),
            "  transfer, rounded up past a tenth; 0 (every transfer in flight shares the link)".to_string(),
            "  when the worker threads are fewer. A transfer waiting for one keeps its worker.".to_string(),
            format!(
                "- small (64 KiB) disk transfers at 16 in flight: {:.0} reads/s, {:.0} writes/s; not set",
                self.disk_ops_per_s.0, self.disk_ops_per_s.1
            ),
            "  as IOPS: a transfer's fixed cost is its latency, and the pool bounds concurrency.".to_string(),
            format!("- {}.", self.gpu),
            "- nic_*: not measured (no network; the remote tier is in-process memory): the PCIe".to_string(),
            "  figures. prefill/decode: not measured (calibrate times transfers, not a model's".to_string(),
            "  compute): the default scenario's figures.".to_string(),
            "Fitted per tier pair (latency, one transfer's rate, aggregate rate):".to_string(),
        ];
        for line in lines {
            let _ = writeln!(out, "// {line}");
        }
        for ((src, dst), fit) in &self.fits {
            let _ = writeln!(
                out,
                "//   {:<13} {:>9}  {:>7.3} GB/s  {:>7.3} GB/s",
                pair_name(*src, *dst),
                duration_label(fit.latency),
                fit.transfer_bytes_per_s / 1e9,
                fit.aggregate_bytes_per_s / 1e9
            );
        }
        out.push_str(&body);
        out.push('\n');
        Ok(out)
    }

    /// The fitted figures as a table.
    pub fn fit_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<14} {:>11} {:>16} {:>16} {:>8}",
            "fitted", "latency", "per transfer", "aggregate", "servers"
        );
        for ((src, dst), fit) in &self.fits {
            let _ = writeln!(
                out,
                "{:<14} {:>11} {:>11.3} GB/s {:>11.3} GB/s {:>8}",
                pair_name(*src, *dst),
                duration_label(fit.latency),
                fit.transfer_bytes_per_s / 1e9,
                fit.aggregate_bytes_per_s / 1e9,
                servers_for(fit.aggregate_bytes_per_s, fit.transfer_bytes_per_s)
            );
        }
        out
    }
}

/// The human table of a calibration.
pub fn table(calibration: &Calibration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:>8} {:>9} {:>7} {:>8} {:>9} {:>11} {:>11} {:>10}",
        "link", "io", "block", "threads", "inflight", "transfers", "p50", "p99", "GB/s"
    );
    for s in &calibration.samples {
        let io = match s.disk_io {
            Some(DiskIoMode::Direct) => "direct",
            Some(DiskIoMode::Buffered) => "buffered",
            None => "-",
        };
        let _ = writeln!(
            out,
            "{:<14} {:>8} {:>9} {:>7} {:>8} {:>9} {:>11} {:>11} {:>10.3}",
            pair_name(s.src, s.dst),
            io,
            block_label(s.block_bytes, s.blocks),
            s.threads,
            s.in_flight,
            s.transfers,
            duration_label(s.latency_p50),
            duration_label(s.latency_p99),
            s.bytes_per_s() / 1e9
        );
    }
    out
}

/// A point's transfer shape: the block size, times the blocks when more than one.
fn block_label(bytes: u64, blocks: usize) -> String {
    match blocks {
        1 => bytes_label(bytes),
        n => format!("{}×{n}", bytes_label(bytes)),
    }
}

fn bytes_label(bytes: u64) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{} KiB", bytes / KIB)
    }
}

fn duration_label(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 10_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}
