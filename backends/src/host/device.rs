//! The seam between the host backend and a GPU (feature `cuda`): what `host` needs of GPU
//! memory, as traits that the `cuda` module implements, so that `host` names no CUDA type
//! and the dependency runs one way, `cuda` → `host`.
//!
//! Owns: [`Gpu`] (one GPU as a source of tier memory: the device tier's arena and the
//! host tier's page-locked blocks), [`DeviceMemory`] (the device tier's blocks, each
//! behind its own lock, and the per-worker [`CopyEngine`] that reaches them),
//! [`BlockCopy`] (one block copy of a batch), [`LockedBlock`] (a device block's address
//! while its lock is held) and [`HostBlock`] (a block of host memory that is not on the
//! Rust heap).
//!
//! Invariant: a device address is used only while the lock of its block is held
//! ([`LockedBlock`] ties the two together), and a batch of copies has finished, on the
//! device, before [`CopyEngine::run`] returns, so no copy outlives the borrow of the host
//! bytes it reads or writes.
//! Never: open a GPU or call the driver (the implementations do), or decide lock order
//! (module `gpu` does, for every batch).

use super::{read, write, HostError};
use kvtwin::hardware::TransferError;
use kvtwin::ids::BlockId;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One GPU, as the host backend builds tiers on it.
pub(crate) trait Gpu {
    /// `capacity` zeroed blocks of `block_bytes` in GPU memory: the device tier.
    fn device_memory(
        &self,
        capacity: usize,
        block_bytes: usize,
    ) -> Result<Box<dyn DeviceMemory>, HostError>;

    /// `capacity` zeroed, page-locked host blocks of `block_bytes`, in block order: the
    /// host tier, so that copies to and from the GPU run by DMA at the link's speed.
    fn pinned_blocks(
        &self,
        capacity: usize,
        block_bytes: usize,
    ) -> Result<Vec<Box<dyn HostBlock>>, HostError>;
}

/// A block of host memory that is not on the Rust heap (a slice of a page-locked region);
/// a memory tier treats it as plain bytes.
pub(crate) trait HostBlock:
    Deref<Target = [u8]> + DerefMut + fmt::Debug + Send + Sync
{
}

impl<T: Deref<Target = [u8]> + DerefMut + fmt::Debug + Send + Sync> HostBlock for T {}

/// The device tier's blocks in GPU memory, each behind its own read-write lock, as a
/// memory tier's are.
pub(crate) trait DeviceMemory: fmt::Debug + Send + Sync {
    /// Blocks in the arena.
    fn capacity(&self) -> usize;

    /// Bytes of one block.
    fn block_bytes(&self) -> usize;

    /// Shared access to a block: its device address while the guard lives.
    fn read(&self, block: BlockId) -> Result<LockedBlock<'_>, TransferError>;

    /// Exclusive access to a block: its device address while the guard lives.
    fn write(&self, block: BlockId) -> Result<LockedBlock<'_>, TransferError>;

    /// Copies block `block` into `out` (one block) synchronously, on the calling thread.
    fn load(&self, block: BlockId, out: &mut [u8]) -> Result<(), TransferError>;

    /// Copies `data` (one block) into block `block` synchronously, on the calling thread.
    fn store(&self, block: BlockId, data: &[u8]) -> Result<(), TransferError>;

    /// A copy engine for the calling worker thread (made there, where the GPU's context
    /// must be current).
    fn copy_engine(&self) -> Result<Box<dyn CopyEngine>, TransferError>;
}

/// One worker's way of running batches of block copies (a CUDA stream and its event).
pub(crate) trait CopyEngine: fmt::Debug + Send {
    /// Enqueues `copies` in order, then waits until every one enqueued has finished, even
    /// when enqueueing failed half way. Any failure is the device tier's.
    ///
    /// # Safety
    /// Every device address must name live device memory of the copy's length, held by
    /// the caller through a [`LockedBlock`] until this returns: write-locked where the
    /// copy writes, read-locked where it reads.
    unsafe fn run(&mut self, copies: Vec<BlockCopy<'_>>) -> Result<(), TransferError>;
}

/// One block copy of a batch; device addresses come from [`LockedBlock::address`].
#[derive(Debug)]
pub(crate) enum BlockCopy<'h> {
    /// Host bytes to the `src.len()` bytes at `dst`.
    HostToDevice {
        /// Device address written.
        dst: u64,
        /// Host bytes read.
        src: &'h [u8],
    },
    /// The `dst.len()` bytes at `src` to host bytes.
    DeviceToHost {
        /// Host bytes written.
        dst: &'h mut [u8],
        /// Device address read.
        src: u64,
    },
    /// `len` bytes from one device address to another.
    DeviceToDevice {
        /// Device address written.
        dst: u64,
        /// Device address read.
        src: u64,
        /// Bytes copied.
        len: usize,
    },
}

/// A device block's address, valid while its lock is held.
#[derive(Debug)]
pub(crate) struct LockedBlock<'a> {
    /// The block's first byte in device memory.
    pub(crate) address: u64,
    _guard: BlockGuard<'a>,
}

/// A held block lock of either kind.
#[derive(Debug)]
#[allow(dead_code)] // Held for its drop only.
enum BlockGuard<'a> {
    Read(RwLockReadGuard<'a, ()>),
    Write(RwLockWriteGuard<'a, ()>),
}

impl<'a> LockedBlock<'a> {
    /// Read-locks `lock` (waiting for writers) and pairs it with `address`.
    pub(crate) fn read(lock: &'a RwLock<()>, address: u64) -> Self {
        Self {
            address,
            _guard: BlockGuard::Read(read(lock)),
        }
    }

    /// Write-locks `lock` (waiting for everyone else) and pairs it with `address`.
    pub(crate) fn write(lock: &'a RwLock<()>, address: u64) -> Self {
        Self {
            address,
            _guard: BlockGuard::Write(write(lock)),
        }
    }
}
