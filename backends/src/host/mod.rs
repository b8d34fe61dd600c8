//! `HostHardware`: a [`Hardware`] that moves real bytes on any machine, with no GPU.
//!
//! Owns: [`HostHardware`], its configuration ([`HostConfig`], [`TierCapacity`],
//! [`RemoteTier`], [`HostCosts`]), its errors ([`HostError`] at construction,
//! [`BlockAccessError`] for direct block access), [`HostClock`] and [`HostCounters`].
//!
//! Tiers: the device tier is emulated in host memory, the host tier is host memory (not
//! pinned: there is no GPU to pin it for), unless [`HostConfig::cuda_device`] names a GPU
//! (feature `cuda`): then the device tier is that GPU's memory and the host tier is
//! page-locked, and transfers between them run as batches on CUDA streams. The disk tier is one extent file under a
//! configured directory with a BLAKE3 per block (see the `disk` module; direct I/O
//! where the filesystem allows it), and the remote tier is frames on an in-process
//! [`InProcessFabric`], or absent ([`RemoteTier::Absent`]: transfers touching it are
//! refused with [`SubmitError::TierUnavailable`]).
//!
//! Transfers: `submit` checks the request and the in-flight bound
//! ([`SubmitError::QueueFull`] is the backpressure) and hands it to a bounded pool of
//! worker threads; each finished transfer is queued with the time it finished, and
//! `poll_completion(now)` hands out those finished by `now` (take `now` from
//! [`Hardware::clock`]). [`Hardware::next_deadline`] is `None` (real hardware does not
//! know when it will finish): a driver waits with [`HostHardware::wait_completion`].
//! A disk or remote read whose checksum fails completes with
//! [`TransferError::Corrupt`], is counted, and its bytes never reach the destination.
//! Dropping the hardware lets the transfers already submitted finish, joins the threads
//! and removes the extent file.
//!
//! Never: panic on a configuration or a request (both are checked and answered with
//! errors), or block the caller of `submit` / `poll_completion` on I/O.

#[cfg(feature = "cuda")]
pub(crate) mod device;
mod disk;
#[cfg(feature = "cuda")]
mod gpu;
mod memory;
mod remote;
mod store;
mod workers;

pub use disk::{DiskIo, DiskIoMode, DiskStorage, DIRECT_IO_ALIGN, KEPT_FILE, TRAILER_LEN};

use disk::{AlignedBuf, DiskExtent};
use kvtwin::fabric::InProcessFabric;
use kvtwin::hardware::{Clock, Completion, Hardware, SubmitError, TransferError, TransferRequest};
use kvtwin::ids::{BlockId, Timestamp, TransferId};
use kvtwin::manager::ManagerConfig;
use kvtwin::tier::Tier;
use kvtwin::wire;
use memory::MemoryArena;
use remote::RemoteStore;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};
use store::{Counters, Stores, TierStore};
use workers::{Completions, Job, Shared, Workers};

/// Locks `mutex`, even if a thread panicked holding it: every structure behind these
/// locks stays consistent between statements, and a panicked copy is reported failed.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// A monotonic clock: nanoseconds since it was made.
#[derive(Clone, Copy, Debug)]
pub struct HostClock {
    epoch: Instant,
}

impl HostClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }
}

impl Default for HostClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for HostClock {
    fn now(&self) -> Timestamp {
        let nanos = self.epoch.elapsed().as_nanos();
        Timestamp::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }
}

/// One present tier and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TierCapacity {
    /// The tier.
    pub tier: Tier,
    /// Its number of blocks (block ids `0..capacity_blocks`).
    pub capacity_blocks: usize,
}

/// Whether the remote tier exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RemoteTier {
    /// No remote tier: transfers touching it are refused.
    Absent,
    /// Remote blocks are frames on an in-process fabric of this many bytes.
    InProcess {
        /// The fabric's bound.
        capacity_bytes: u64,
    },
}

/// What `estimate_transfer` and `estimate_recompute` answer the manager's cost-aware
/// onboarding with. The defaults are round figures for a current server until
/// calibration measures this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostCosts {
    /// Copies between memory tiers (device and host).
    pub memory_bytes_per_s: u64,
    /// Reads of the disk tier.
    pub disk_read_bytes_per_s: u64,
    /// Writes of the disk tier.
    pub disk_write_bytes_per_s: u64,
    /// Reads and writes of the remote tier.
    pub remote_bytes_per_s: u64,
    /// Recomputing (prefilling) one block.
    pub recompute_per_block: Duration,
}

impl Default for HostCosts {
    fn default() -> Self {
        Self {
            memory_bytes_per_s: 10_000_000_000,
            disk_read_bytes_per_s: 2_000_000_000,
            disk_write_bytes_per_s: 1_000_000_000,
            remote_bytes_per_s: 5_000_000_000,
            recompute_per_block: Duration::from_millis(1),
        }
    }
}

/// How to build a [`HostHardware`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Bytes of one block (all layers), as the manager's `bytes_per_block`.
    pub bytes_per_block: u64,
    /// The present tiers, each once, in any order.
    pub tiers: Vec<TierCapacity>,
    /// Where the disk tier's extent file goes (an existing directory); needed when a
    /// disk tier is present.
    pub disk_dir: Option<PathBuf>,
    /// Direct I/O or not, for the disk tier.
    pub disk_io: DiskIo,
    /// Keeps the disk tier's file ([`KEPT_FILE`] in `disk_dir`) when the hardware drops,
    /// and opens the one there at start, its slots as they were: a disk tier that
    /// outlives a process (whoever drives the manager keeps the index of what each slot
    /// holds, and adopts them). Locked while open: one live backend per file.
    pub disk_persistent: bool,
    /// The remote tier's fabric, or none.
    pub remote: RemoteTier,
    /// Worker threads running transfers.
    pub worker_threads: usize,
    /// Transfers submitted and not yet polled at most; beyond it `submit` answers
    /// `QueueFull`.
    pub max_in_flight: usize,
    /// Cost estimates.
    pub costs: HostCosts,
    /// The GPU whose memory is the device tier (its ordinal), with the host tier pinned
    /// for it; `None` emulates the device tier in host memory. Needs feature `cuda`.
    pub cuda_device: Option<u32>,
}

impl HostConfig {
    /// Worker threads unless told otherwise.
    pub const DEFAULT_WORKER_THREADS: usize = 4;

    /// The hardware `config`'s manager needs: its tiers and capacities, its block size
    /// and its in-flight bound; a remote tier (if the manager has one) on an in-process
    /// fabric big enough for all its blocks; the disk tier's file in `disk_dir`.
    pub fn for_manager(config: &ManagerConfig, disk_dir: Option<&Path>) -> Self {
        let tiers: Vec<TierCapacity> = config
            .tiers
            .iter()
            .map(|t| TierCapacity {
                tier: t.tier,
                capacity_blocks: t.capacity_blocks,
            })
            .collect();
        let remote = match tiers.iter().find(|t| t.tier == Tier::Remote) {
            Some(remote) => RemoteTier::InProcess {
                capacity_bytes: config
                    .bytes_per_block
                    .saturating_add(wire::HEADER_LEN as u64)
                    .saturating_mul(remote.capacity_blocks as u64),
            },
            None => RemoteTier::Absent,
        };
        Self {
            bytes_per_block: config.bytes_per_block,
            tiers,
            disk_dir: disk_dir.map(Path::to_path_buf),
            disk_io: DiskIo::Auto,
            disk_persistent: false,
            remote,
            worker_threads: Self::DEFAULT_WORKER_THREADS,
            max_in_flight: config.max_inflight_transfers,
            costs: HostCosts::default(),
            cuda_device: None,
        }
    }
}

/// A [`HostHardware`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// Blocks of zero bytes.
    #[error("bytes_per_block must be at least 1")]
    NoBlockBytes,
    /// A tier listed twice.
    #[error("tier {0} is listed more than once")]
    RepeatedTier(Tier),
    /// No worker threads.
    #[error("worker_threads must be at least 1")]
    NoWorkers,
    /// No transfers allowed in flight.
    #[error("max_in_flight must be at least 1")]
    NoTransfers,
    /// A tier's size does not fit this machine's address space or file offsets.
    #[error("{tier}: capacity × block size does not fit")]
    TooLarge {
        /// The tier.
        tier: Tier,
    },
    /// The system refused a tier's memory.
    #[error("{tier}: could not allocate {bytes} bytes")]
    OutOfMemory {
        /// The tier (staging buffers count as the disk's).
        tier: Tier,
        /// Bytes asked for.
        bytes: u64,
    },
    /// A disk tier without `disk_dir`.
    #[error("a disk tier needs disk_dir")]
    NoDiskDirectory,
    /// The disk directory is missing, not a directory, or not writable.
    #[error("disk directory {path}: {source}")]
    DiskDirectory {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The disk tier's kept file is open in another process.
    #[error("disk extent {path} is in use by another process (one backend per file)")]
    DiskInUse {
        /// The file.
        path: PathBuf,
    },
    /// The extent file could not be sized or probed.
    #[error("disk extent {path}: {source}")]
    DiskFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A worker thread could not be started.
    #[error("could not start a worker thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// `cuda_device` was set in a build without feature `cuda`.
    #[error("a GPU device tier needs kvtwin-backends built with feature `cuda`")]
    CudaNotBuilt,
    /// The GPU could not be opened or its memory allocated.
    #[cfg(feature = "cuda")]
    #[error("GPU: {0}")]
    Cuda(#[from] crate::cuda::CudaError),
}

/// Direct access to one block's bytes ([`HostHardware::write_block`],
/// [`HostHardware::read_block`]) failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockAccessError {
    /// The hardware has no such tier.
    #[error("tier {0} is not present")]
    TierAbsent(Tier),
    /// The block id is beyond the tier.
    #[error("{tier} has {capacity} blocks, no block {block}")]
    BlockOutOfRange {
        /// The tier.
        tier: Tier,
        /// The block.
        block: BlockId,
        /// The tier's blocks.
        capacity: usize,
    },
    /// The buffer is not one block long.
    #[error("buffer of {actual} bytes, a block is {expected}")]
    WrongLength {
        /// Bytes of one block.
        expected: usize,
        /// Bytes given.
        actual: usize,
    },
    /// No memory for the staging buffer.
    #[error("could not allocate a staging buffer")]
    OutOfMemory,
    /// The read or write failed (a disk block whose checksum fails is `Corrupt`).
    #[error(transparent)]
    Transfer(#[from] TransferError),
}

/// Cumulative counters of a [`HostHardware`]; arrays are indexed by `Tier::index`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Transfers accepted by `submit`.
    pub transfers_submitted: u64,
    /// Transfers that finished well.
    pub transfers_completed: u64,
    /// Transfers that failed (an I/O error, a checksum, an absent block).
    pub transfers_failed: u64,
    /// Bytes copied, by `[src][dst]`.
    pub bytes: [[u64; 4]; 4],
    /// Blocks copied, by `[src][dst]`.
    pub blocks: [[u64; 4]; 4],
    /// Reads whose checksum failed, by tier.
    pub checksum_failures: [u64; 4],
    /// How the disk tier does its I/O, when there is one.
    pub disk_io: Option<DiskIoMode>,
}

impl HostCounters {
    /// Bytes copied from `src` to `dst`.
    pub fn bytes_between(&self, src: Tier, dst: Tier) -> u64 {
        self.bytes[src.index()][dst.index()]
    }

    /// Blocks copied from `src` to `dst`.
    pub fn blocks_between(&self, src: Tier, dst: Tier) -> u64 {
        self.blocks[src.index()][dst.index()]
    }

    /// Reads of `tier` whose checksum failed.
    pub fn checksum_failures(&self, tier: Tier) -> u64 {
        self.checksum_failures[tier.index()]
    }
}

/// Real hardware in host memory and files; see the module documentation.
#[derive(Debug)]
pub struct HostHardware {
    config: HostConfig,
    clock: HostClock,
    fabric: Arc<InProcessFabric>,
    storage: DiskStorage,
    shared: Arc<Shared>,
    workers: Workers,
    next_id: u64,
    in_flight: usize,
    submitted: u64,
}

impl HostHardware {
    /// Allocates the memory tiers, creates the disk tier's file and starts the workers.
    pub fn new(config: HostConfig) -> Result<Self, HostError> {
        if config.bytes_per_block == 0 {
            return Err(HostError::NoBlockBytes);
        }
        if config.worker_threads == 0 {
            return Err(HostError::NoWorkers);
        }
        if config.max_in_flight == 0 {
            return Err(HostError::NoTransfers);
        }
        let block_bytes = usize::try_from(config.bytes_per_block)
            .map_err(|_| HostError::TooLarge { tier: Tier::Device })?;
        let capacity_bytes = match config.remote {
            RemoteTier::InProcess { capacity_bytes } => capacity_bytes,
            RemoteTier::Absent => 0,
        };
        let fabric = Arc::new(InProcessFabric::new(capacity_bytes));
        // Where `host` reaches into `cuda` (with `HostError::Cuda`, the error it may
        // return): it picks the implementation of the `device` traits; everything after
        // names only those traits.
        #[cfg(feature = "cuda")]
        let gpu = config.cuda_device.map(crate::cuda::open_gpu).transpose()?;
        #[cfg(not(feature = "cuda"))]
        if config.cuda_device.is_some() {
            return Err(HostError::CudaNotBuilt);
        }
        let mut tiers: [Option<TierStore>; 4] = Default::default();
        for TierCapacity {
            tier,
            capacity_blocks,
        } in config.tiers.iter().copied()
        {
            if tiers[tier.index()].is_some() {
                return Err(HostError::RepeatedTier(tier));
            }
            if capacity_blocks.checked_mul(block_bytes).is_none() {
                return Err(HostError::TooLarge { tier });
            }
            tiers[tier.index()] = match tier {
                #[cfg(feature = "cuda")]
                Tier::Device if gpu.is_some() => {
                    let gpu = gpu.as_ref().ok_or(HostError::CudaNotBuilt)?;
                    Some(TierStore::Gpu(
                        gpu.device_memory(capacity_blocks, block_bytes)?,
                    ))
                }
                #[cfg(feature = "cuda")]
                Tier::Host if gpu.is_some() => {
                    let gpu = gpu.as_ref().ok_or(HostError::CudaNotBuilt)?;
                    Some(TierStore::Memory(MemoryArena::pinned(
                        tier,
                        capacity_blocks,
                        block_bytes,
                        &**gpu,
                    )?))
                }
                Tier::Device | Tier::Host => Some(TierStore::Memory(MemoryArena::new(
                    tier,
                    capacity_blocks,
                    block_bytes,
                )?)),
                Tier::Disk => {
                    let dir = config
                        .disk_dir
                        .as_deref()
                        .ok_or(HostError::NoDiskDirectory)?;
                    Some(TierStore::Disk(DiskExtent::create(
                        dir,
                        capacity_blocks,
                        block_bytes,
                        config.disk_io,
                        config.disk_persistent,
                    )?))
                }
                Tier::Remote => match config.remote {
                    RemoteTier::Absent => None,
                    RemoteTier::InProcess { .. } => Some(TierStore::Remote(RemoteStore::new(
                        fabric.clone(),
                        capacity_blocks,
                    ))),
                },
            };
        }
        let stores = Stores {
            block_bytes,
            tiers,
            counters: Counters::default(),
        };
        let storage = match stores.disk() {
            Some(extent) => DiskStorage::new(Some(extent.raw_handle().map_err(|source| {
                HostError::DiskFile {
                    path: extent.path().to_path_buf(),
                    source,
                }
            })?)),
            None => DiskStorage::new(None),
        };
        let staging_bytes = stores.staging_bytes();
        let staging = (0..config.worker_threads)
            .map(|_| {
                AlignedBuf::new(staging_bytes).ok_or(HostError::OutOfMemory {
                    tier: Tier::Disk,
                    bytes: staging_bytes as u64,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let clock = HostClock::new();
        let shared = Arc::new(Shared {
            stores,
            completions: Completions::default(),
            clock,
        });
        let workers = Workers::spawn(&shared, staging).map_err(HostError::Spawn)?;
        Ok(Self {
            config,
            clock,
            fabric,
            storage,
            shared,
            workers,
            next_id: 0,
            in_flight: 0,
            submitted: 0,
        })
    }

    /// [`HostHardware::new`] with [`HostConfig::for_manager`].
    pub fn for_manager(config: &ManagerConfig, disk_dir: Option<&Path>) -> Result<Self, HostError> {
        Self::new(HostConfig::for_manager(config, disk_dir))
    }

    /// The configuration.
    pub fn config(&self) -> &HostConfig {
        &self.config
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.shared.stores.block_bytes
    }

    /// Transfers submitted and not yet polled.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Waits up to `timeout` for a transfer to finish; whether a completion is ready to
    /// poll. Returns `false` at once when nothing is in flight.
    pub fn wait_completion(&self, timeout: Duration) -> bool {
        self.in_flight > 0 && self.shared.completions.wait(timeout)
    }

    /// The counters so far.
    pub fn counters(&self) -> HostCounters {
        let counters = &self.shared.stores.counters;
        let load = |value: &std::sync::atomic::AtomicU64| value.load(Ordering::Relaxed);
        let matrix = |values: &[[std::sync::atomic::AtomicU64; 4]; 4]| {
            values.each_ref().map(|row| row.each_ref().map(load))
        };
        HostCounters {
            transfers_submitted: self.submitted,
            transfers_completed: load(&counters.transfers_completed),
            transfers_failed: load(&counters.transfers_failed),
            bytes: matrix(&counters.bytes),
            blocks: matrix(&counters.blocks),
            checksum_failures: counters.checksum_failures.each_ref().map(load),
            disk_io: self.disk_io_mode(),
        }
    }

    /// How the disk tier does its I/O, when there is one.
    pub fn disk_io_mode(&self) -> Option<DiskIoMode> {
        self.shared.stores.disk().map(DiskExtent::mode)
    }

    /// Whether the disk tier's kept file was found at start (`disk_persistent`) with
    /// this tier's size, its slots as the last process left them.
    pub fn disk_reopened(&self) -> bool {
        self.shared.stores.disk().is_some_and(DiskExtent::reopened)
    }

    /// The disk tier's extent file, when there is one.
    pub fn disk_path(&self) -> Option<&Path> {
        self.shared.stores.disk().map(DiskExtent::path)
    }

    /// Where block `block` of the disk tier starts in its file (its slot is
    /// `stride` bytes: the block, then its trailer).
    pub fn disk_block_offset(&self, block: BlockId) -> Option<u64> {
        let extent = self.shared.stores.disk()?;
        (block.index() < extent.capacity()).then(|| block.index() as u64 * extent.stride() as u64)
    }

    fn staging_for(
        &self,
        tier: Tier,
        block: BlockId,
        len: usize,
    ) -> Result<AlignedBuf, BlockAccessError> {
        let store = self
            .shared
            .stores
            .get(tier)
            .ok_or(BlockAccessError::TierAbsent(tier))?;
        if block.index() >= store.capacity() {
            return Err(BlockAccessError::BlockOutOfRange {
                tier,
                block,
                capacity: store.capacity(),
            });
        }
        let expected = self.block_bytes();
        if len != expected {
            return Err(BlockAccessError::WrongLength {
                expected,
                actual: len,
            });
        }
        AlignedBuf::new(self.shared.stores.staging_bytes()).ok_or(BlockAccessError::OutOfMemory)
    }

    /// Writes `data` (one block) as block `block` of `tier`, as a transfer would (the
    /// disk adds its checksum): how a driver or a test puts computed KV in place. The
    /// caller must own the block (the manager is not copying it).
    pub fn write_block(
        &self,
        tier: Tier,
        block: BlockId,
        data: &[u8],
    ) -> Result<(), BlockAccessError> {
        let mut staging = self.staging_for(tier, block, data.len())?;
        staging.as_mut_slice()[..data.len()].copy_from_slice(data);
        self.shared.stores.store(tier, block, &mut staging)?;
        Ok(())
    }

    /// Reads block `block` of `tier` into `out` (one block), verified as a transfer
    /// would verify it; `out` is untouched when the read fails.
    pub fn read_block(
        &self,
        tier: Tier,
        block: BlockId,
        out: &mut [u8],
    ) -> Result<(), BlockAccessError> {
        let mut staging = self.staging_for(tier, block, out.len())?;
        self.shared.stores.load(tier, block, &mut staging)?;
        out.copy_from_slice(&staging.as_slice()[..out.len()]);
        Ok(())
    }

    fn bandwidth(&self, tier: Tier, reading: bool) -> u64 {
        let costs = &self.config.costs;
        match tier {
            Tier::Device | Tier::Host => costs.memory_bytes_per_s,
            Tier::Disk if reading => costs.disk_read_bytes_per_s,
            Tier::Disk => costs.disk_write_bytes_per_s,
            Tier::Remote => costs.remote_bytes_per_s,
        }
    }
}

impl Hardware for HostHardware {
    type Clock = HostClock;
    type Fabric = InProcessFabric;
    type Storage = DiskStorage;

    fn clock(&self) -> &HostClock {
        &self.clock
    }

    fn fabric(&self) -> &InProcessFabric {
        &self.fabric
    }

    fn storage(&mut self) -> &mut DiskStorage {
        &mut self.storage
    }

    fn submit(
        &mut self,
        request: TransferRequest,
        _now: Timestamp,
    ) -> Result<TransferId, SubmitError> {
        request.check_shape()?;
        for tier in [request.src_tier, request.dst_tier] {
            if self.shared.stores.get(tier).is_none() {
                return Err(SubmitError::TierUnavailable(tier));
            }
        }
        if self.in_flight >= self.config.max_in_flight {
            return Err(SubmitError::QueueFull {
                depth: self.in_flight,
            });
        }
        let id = TransferId::new(self.next_id);
        self.next_id += 1;
        self.in_flight += 1;
        self.submitted += 1;
        if let Err(job) = self.workers.send(Job { id, request }) {
            // Every worker is gone (they outlive the hardware unless they could not
            // run): the transfer fails like any other, through the completion path.
            let result = Err(TransferError::Failed {
                tier: job.request.src_tier,
            });
            self.shared
                .stores
                .counters
                .transfers_failed
                .fetch_add(1, Ordering::Relaxed);
            self.shared
                .completions
                .push(&self.clock, Completion { id, result });
        }
        Ok(id)
    }

    fn poll_completion(&mut self, now: Timestamp) -> Option<Completion> {
        let completion = self.shared.completions.pop_due(now)?;
        self.in_flight -= 1;
        Some(completion)
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        None
    }

    fn estimate_transfer(&self, src: Tier, dst: Tier, bytes: u64) -> Duration {
        let bytes_per_s = self.bandwidth(src, true).min(self.bandwidth(dst, false));
        if bytes_per_s == 0 {
            return Duration::MAX;
        }
        let nanos = u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_s);
        Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
    }

    fn estimate_recompute(&self, blocks: usize) -> Duration {
        self.config
            .costs
            .recompute_per_block
            .saturating_mul(u32::try_from(blocks).unwrap_or(u32::MAX))
    }
}

#[cfg(test)]
mod tests;
