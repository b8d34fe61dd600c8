//! The block-copy benchmark: how close batches of KV blocks come to one large copy.
//!
//! Owns: [`BlockCopyConfig`], [`run`] and its [`BlockCopyReport`]. For each direction
//! (host to device, device to host) it times, with CUDA events on one stream:
//! - `bulk`: one `cuMemcpyAsync` of the whole pinned region (the ceiling the link gives);
//! - `blocks`: the same bytes as one batch of block copies to scattered block slots, as
//!   the device tier's transfers issue them;
//!
//! and, through [`crate::host::HostHardware`] with the GPU as its device tier and pinned
//! memory as its host tier, the same blocks moved as transfers of `blocks_per_transfer`
//! (timed by the wall clock from first submit to last completion: the product's path).
//! Each figure is the median of `repeats` runs after one warm-up.
//! Never: assert a speed (it reports; BENCHMARKS.md records), or run without a GPU (it
//! returns the [`CudaError`] `CudaDevice::open` gives, as [`BenchError::Cuda`]).

use super::memory::{DeviceArena, PinnedRegion};
use super::{driver, CudaDevice, CudaError};
use crate::host::HostError;
use crate::host::{HostConfig, HostHardware, RemoteTier, TierCapacity};
use cudarc::driver::result::{self, stream::StreamKind};
use cudarc::driver::sys;
use kvtwin::hardware::{Clock, Hardware, SubmitError, TransferError, TransferRequest};
use kvtwin::ids::BlockId;
use kvtwin::tier::Tier;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The benchmark could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// CUDA could not be used (no driver, no GPU, a failed call).
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The `HostHardware` for the transfer path could not be built.
    #[error("host hardware: {0}")]
    Host(#[from] HostError),
    /// A transfer was refused.
    #[error("submit: {0}")]
    Submit(#[from] SubmitError),
    /// A transfer failed.
    #[error("transfer: {0}")]
    Transfer(#[from] TransferError),
    /// A transfer did not finish within a minute.
    #[error("a transfer did not complete within a minute")]
    Stalled,
}

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockCopyConfig {
    /// The GPU.
    pub ordinal: u32,
    /// Bytes of one block (2 MiB is the figure).
    pub block_bytes: usize,
    /// Blocks in the region copied.
    pub blocks: usize,
    /// Blocks per transfer on the `HostHardware` path.
    pub blocks_per_transfer: usize,
    /// Timed runs per figure.
    pub repeats: usize,
}

impl Default for BlockCopyConfig {
    fn default() -> Self {
        Self {
            ordinal: 0,
            block_bytes: 2 << 20,
            blocks: 512,
            blocks_per_transfer: 32,
            repeats: 10,
        }
    }
}

/// One direction's figures, in bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DirectionFigures {
    /// One copy of the whole region.
    pub bulk_bytes_per_s: f64,
    /// One batch of block copies.
    pub blocks_bytes_per_s: f64,
    /// Transfers through `HostHardware`.
    pub hardware_bytes_per_s: f64,
}

impl DirectionFigures {
    /// Block copies as a fraction of the bulk copy.
    pub fn blocks_ratio(&self) -> f64 {
        self.blocks_bytes_per_s / self.bulk_bytes_per_s
    }

    /// `HostHardware` transfers as a fraction of the bulk copy.
    pub fn hardware_ratio(&self) -> f64 {
        self.hardware_bytes_per_s / self.bulk_bytes_per_s
    }
}

/// What [`run`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockCopyReport {
    /// The GPU's name.
    pub gpu: String,
    /// The configuration.
    pub config: BlockCopyConfig,
    /// Pinned host to device.
    pub host_to_device: DirectionFigures,
    /// Device to pinned host.
    pub device_to_host: DirectionFigures,
}

/// Runs the benchmark; see the module documentation.
pub fn run(config: BlockCopyConfig) -> Result<BlockCopyReport, BenchError> {
    let device = CudaDevice::open(config.ordinal)?;
    let blocks = config.blocks.max(1);
    let repeats = config.repeats.max(1);
    let timer = EventTimer::new(&device)?;
    let host = PinnedRegion::new(&device, blocks, config.block_bytes)?;
    let mut host_blocks = host.blocks(config.block_bytes);
    let arena = DeviceArena::new(&device, blocks, config.block_bytes)?;
    let total = (blocks * config.block_bytes) as f64;
    let slot = scatter(blocks);

    let mut figures = Vec::new();
    for upload in [true, false] {
        let bulk = timer.median::<BenchError>(repeats, |stream| {
            let region = host.as_mut_ptr();
            let device = arena
                .write(block_id(0))
                .map_err(BenchError::Transfer)?
                .address;
            let bytes = blocks * config.block_bytes;
            // SAFETY: the region and the arena are `bytes` long each and contiguous, and
            // nothing but this benchmark uses them; the timer waits for the copy before
            // the next run touches them.
            unsafe {
                if upload {
                    sys::cuMemcpyHtoDAsync_v2(device, region.cast(), bytes, stream)
                        .result()
                        .map_err(driver("cuMemcpyHtoDAsync"))?;
                } else {
                    sys::cuMemcpyDtoHAsync_v2(region.cast(), device, bytes, stream)
                        .result()
                        .map_err(driver("cuMemcpyDtoHAsync"))?;
                }
            }
            Ok(())
        })?;
        let batched = timer.median::<BenchError>(repeats, |stream| {
            for (index, block) in host_blocks.iter_mut().enumerate() {
                let target = block_id(slot[index]);
                // SAFETY: one block each side, used by nothing but this benchmark; the
                // timer waits for the copies before the blocks are touched again.
                unsafe {
                    if upload {
                        let device = arena.write(target).map_err(BenchError::Transfer)?.address;
                        result::memcpy_htod_async(device, &block[..], stream)
                            .map_err(driver("cuMemcpyHtoDAsync"))?;
                    } else {
                        let device = arena.read(target).map_err(BenchError::Transfer)?.address;
                        result::memcpy_dtoh_async(&mut block[..], device, stream)
                            .map_err(driver("cuMemcpyDtoHAsync"))?;
                    }
                }
            }
            Ok(())
        })?;
        figures.push((total / bulk.as_secs_f64(), total / batched.as_secs_f64()));
    }
    drop(arena);
    drop(host_blocks);
    drop(host);

    let (upload, download) = hardware_path(&config, blocks, repeats)?;
    Ok(BlockCopyReport {
        gpu: device.name().to_string(),
        config,
        host_to_device: DirectionFigures {
            bulk_bytes_per_s: figures[0].0,
            blocks_bytes_per_s: figures[0].1,
            hardware_bytes_per_s: total / upload.as_secs_f64(),
        },
        device_to_host: DirectionFigures {
            bulk_bytes_per_s: figures[1].0,
            blocks_bytes_per_s: figures[1].1,
            hardware_bytes_per_s: total / download.as_secs_f64(),
        },
    })
}

/// Block `i` of the host goes to device slot `slot[i]`: a stride coprime with the count,
/// so consecutive host blocks land apart, as a real free list hands them out.
fn scatter(blocks: usize) -> Vec<usize> {
    let mut stride = 7 % blocks.max(1);
    while stride > 1 && gcd(stride, blocks) != 1 {
        stride -= 1;
    }
    let stride = stride.max(1);
    (0..blocks).map(|i| i * stride % blocks).collect()
}

/// Block ids are `u32`; the benchmark's block counts are far below that.
fn block_id(index: usize) -> BlockId {
    BlockId::new(u32::try_from(index).unwrap_or(u32::MAX))
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Median wall time of moving every block up (host to device), then down, through
/// `HostHardware` in transfers of `blocks_per_transfer`.
fn hardware_path(
    config: &BlockCopyConfig,
    blocks: usize,
    repeats: usize,
) -> Result<(Duration, Duration), BenchError> {
    let per = config.blocks_per_transfer.clamp(1, blocks);
    let host_config = HostConfig {
        bytes_per_block: config.block_bytes as u64,
        tiers: vec![
            TierCapacity {
                tier: Tier::Device,
                capacity_blocks: blocks,
            },
            TierCapacity {
                tier: Tier::Host,
                capacity_blocks: blocks,
            },
        ],
        disk_dir: None,
        disk_io: crate::host::DiskIo::Auto,
        disk_persistent: false,
        remote: RemoteTier::Absent,
        worker_threads: HostConfig::DEFAULT_WORKER_THREADS,
        max_in_flight: blocks.div_ceil(per),
        costs: crate::host::HostCosts::default(),
        cuda_device: Some(config.ordinal),
    };
    let mut hw = HostHardware::new(host_config)?;
    let slot = scatter(blocks);
    let mut time = |src: Tier, dst: Tier| -> Result<Duration, BenchError> {
        let mut runs = Vec::with_capacity(repeats + 1);
        for _ in 0..=repeats {
            let start = Instant::now();
            let mut pending = 0;
            for chunk in (0..blocks).collect::<Vec<_>>().chunks(per) {
                let ids = |f: &dyn Fn(usize) -> usize| {
                    chunk.iter().map(|&i| block_id(f(i))).collect::<Vec<_>>()
                };
                let (src_blocks, dst_blocks) = if src == Tier::Host {
                    (ids(&|i| i), ids(&|i| slot[i]))
                } else {
                    (ids(&|i| slot[i]), ids(&|i| i))
                };
                let request = TransferRequest {
                    src_tier: src,
                    src_blocks,
                    dst_tier: dst,
                    dst_blocks,
                    bytes: (chunk.len() * config.block_bytes) as u64,
                };
                let now = hw.clock().now();
                hw.submit(request, now)?;
                pending += 1;
            }
            while pending > 0 {
                if !hw.wait_completion(Duration::from_secs(60)) {
                    return Err(BenchError::Stalled);
                }
                let now = hw.clock().now();
                while let Some(completion) = hw.poll_completion(now) {
                    completion.result?;
                    pending -= 1;
                }
            }
            runs.push(start.elapsed());
        }
        Ok(median(&mut runs[1..]))
    };
    let upload = time(Tier::Host, Tier::Device)?;
    let download = time(Tier::Device, Tier::Host)?;
    Ok((upload, download))
}

fn median(runs: &mut [Duration]) -> Duration {
    runs.sort_unstable();
    runs[runs.len() / 2]
}

/// A stream with a start and an end event that time what is enqueued between them.
pub(crate) struct EventTimer {
    device: Arc<CudaDevice>,
    stream: sys::CUstream,
    start: sys::CUevent,
    end: sys::CUevent,
}

impl EventTimer {
    pub(crate) fn new(device: &Arc<CudaDevice>) -> Result<Self, CudaError> {
        device.bind()?;
        let stream =
            result::stream::create(StreamKind::NonBlocking).map_err(driver("cuStreamCreate"))?;
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let start = result::event::create(flags).map_err(driver("cuEventCreate"))?;
        let end = result::event::create(flags).map_err(driver("cuEventCreate"))?;
        Ok(Self {
            device: device.clone(),
            stream,
            start,
            end,
        })
    }

    /// The stream its runs are enqueued on.
    pub(crate) fn stream(&self) -> sys::CUstream {
        self.stream
    }

    /// The median GPU time of `repeats` runs of `enqueue`, after one warm-up run.
    pub(crate) fn median<E: From<CudaError>>(
        &self,
        repeats: usize,
        mut enqueue: impl FnMut(sys::CUstream) -> Result<(), E>,
    ) -> Result<Duration, E> {
        self.device.bind()?;
        let mut runs = Vec::with_capacity(repeats + 1);
        for _ in 0..=repeats {
            // SAFETY: the handles live as long as `self`; the end event is waited for
            // before the next run, so `enqueue`'s host buffers are idle when it returns.
            unsafe {
                result::event::record(self.start, self.stream).map_err(driver("cuEventRecord"))?;
                let enqueued = enqueue(self.stream);
                result::event::record(self.end, self.stream).map_err(driver("cuEventRecord"))?;
                result::event::synchronize(self.end).map_err(driver("cuEventSynchronize"))?;
                enqueued?;
                let ms = result::event::elapsed(self.start, self.end)
                    .map_err(driver("cuEventElapsedTime"))?;
                runs.push(Duration::from_secs_f64(f64::from(ms) / 1e3));
            }
        }
        Ok(median(&mut runs[1..]))
    }
}

impl Drop for EventTimer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: created in `new`, idle (every run was waited for), destroyed once.
            unsafe {
                let _ = result::event::destroy(self.start);
                let _ = result::event::destroy(self.end);
                let _ = result::stream::destroy(self.stream);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_is_a_permutation_that_spreads_neighbours() {
        for blocks in [1, 2, 3, 7, 8, 14, 512] {
            let slots = scatter(blocks);
            let mut sorted = slots.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..blocks).collect::<Vec<_>>(), "{blocks} blocks");
            if blocks > 8 {
                assert_ne!(slots[1], 1, "neighbours should not stay neighbours");
            }
        }
    }
}
