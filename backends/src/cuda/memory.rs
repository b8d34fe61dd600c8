//! GPU memory and pinned host memory, cut into blocks.
//!
//! Owns: [`DeviceArena`] (one device allocation holding every block of the device tier,
//! block `i` at `i × block_bytes`, each block behind its own read-write lock as
//! `MemoryArena`'s are) and [`PinnedRegion`] / [`PinnedBlock`] (one page-locked host
//! allocation, handed out as disjoint block slices that a `MemoryArena` locks like heap
//! blocks), and their implementations of the host backend's `device` traits
//! ([`Gpu`] for a [`CudaDevice`], [`DeviceMemory`] for a [`DeviceArena`]), through which
//! `host` uses them without naming them. One allocation per tier, not one per block: the driver's allocations are
//! slow and few, and DMA from page-locked memory is what lets H2D/D2H copies run at the
//! link's speed.
//! Never: copy bytes (module `stream` does), or free memory a copy may still read: the
//! worker waits on its copy's event before it releases a block's lock, and an arena is
//! dropped only after the workers are joined.

use super::stream::CopyStream;
use super::{driver, region_bytes, CudaDevice, CudaError};
use crate::host::device::{CopyEngine, DeviceMemory, Gpu, HostBlock, LockedBlock};
use crate::host::HostError;
use cudarc::driver::{result, sys};
use kvtwin::hardware::TransferError;
use kvtwin::ids::BlockId;
use kvtwin::tier::Tier;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, RwLock};

impl Gpu for Arc<CudaDevice> {
    fn device_memory(
        &self,
        capacity: usize,
        block_bytes: usize,
    ) -> Result<Box<dyn DeviceMemory>, HostError> {
        Ok(Box::new(DeviceArena::new(self, capacity, block_bytes)?))
    }

    fn pinned_blocks(
        &self,
        capacity: usize,
        block_bytes: usize,
    ) -> Result<Vec<Box<dyn HostBlock>>, HostError> {
        let region = PinnedRegion::new(self, capacity, block_bytes)?;
        // An empty tier still allocates one byte, which holds no block.
        Ok(region
            .blocks(block_bytes)
            .into_iter()
            .take(capacity)
            .map(|block| Box::new(block) as Box<dyn HostBlock>)
            .collect())
    }
}

/// The device tier's blocks in GPU memory.
#[derive(Debug)]
pub(crate) struct DeviceArena {
    device: Arc<CudaDevice>,
    base: sys::CUdeviceptr,
    block_bytes: usize,
    locks: Box<[RwLock<()>]>,
}

impl DeviceArena {
    /// `capacity` zeroed blocks of `block_bytes` on `device`.
    pub(crate) fn new(
        device: &Arc<CudaDevice>,
        capacity: usize,
        block_bytes: usize,
    ) -> Result<Self, CudaError> {
        let bytes = region_bytes("device tier", capacity, block_bytes)?.max(1);
        device.bind()?;
        // SAFETY: the context is current; the pointer is freed once, in `drop`.
        let base = unsafe { result::malloc_sync(bytes) }.map_err(driver("cuMemAlloc"))?;
        let arena = Self {
            device: device.clone(),
            base,
            block_bytes,
            locks: (0..capacity).map(|_| RwLock::new(())).collect(),
        };
        // SAFETY: `base` holds `bytes` bytes. Zeroed like the emulated arena, so a block
        // read before it is written reads the same on every backend.
        unsafe { result::memset_d8_sync(arena.base, 0, bytes) }.map_err(driver("cuMemsetD8"))?;
        Ok(arena)
    }

    fn lock(&self, block: BlockId) -> Result<&RwLock<()>, TransferError> {
        self.locks
            .get(block.index())
            .ok_or(TransferError::Failed { tier: Tier::Device })
    }

    /// Shared access to a block: its device address while the guard lives.
    pub(crate) fn read(&self, block: BlockId) -> Result<LockedBlock<'_>, TransferError> {
        Ok(LockedBlock::read(self.lock(block)?, self.address(block)))
    }

    /// Exclusive access to a block: its device address while the guard lives.
    pub(crate) fn write(&self, block: BlockId) -> Result<LockedBlock<'_>, TransferError> {
        Ok(LockedBlock::write(self.lock(block)?, self.address(block)))
    }

    fn address(&self, block: BlockId) -> sys::CUdeviceptr {
        // In range: `lock` checked the index, and `new` checked the product fits.
        self.base + (block.index() * self.block_bytes) as sys::CUdeviceptr
    }
}

impl Drop for DeviceArena {
    fn drop(&mut self) {
        // Nothing can be copying: the workers that copy are joined before the stores
        // drop. A failure leaks the memory to the process's end.
        if self.device.bind().is_ok() {
            // SAFETY: allocated in `new`, freed once here.
            let _ = unsafe { result::free_sync(self.base) };
        }
    }
}

impl DeviceMemory for DeviceArena {
    fn capacity(&self) -> usize {
        self.locks.len()
    }

    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn read(&self, block: BlockId) -> Result<LockedBlock<'_>, TransferError> {
        DeviceArena::read(self, block)
    }

    fn write(&self, block: BlockId) -> Result<LockedBlock<'_>, TransferError> {
        DeviceArena::write(self, block)
    }

    fn load(&self, block: BlockId, out: &mut [u8]) -> Result<(), TransferError> {
        let failed = TransferError::Failed { tier: Tier::Device };
        let source = self.read(block)?;
        self.device.bind().map_err(|_| failed.clone())?;
        // SAFETY: the block is read-locked and `out` is one block long (`Stores` slices
        // it so); the copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(&mut out[..self.block_bytes], source.address) }
            .map_err(|_| failed)
    }

    fn store(&self, block: BlockId, data: &[u8]) -> Result<(), TransferError> {
        let failed = TransferError::Failed { tier: Tier::Device };
        let target = self.write(block)?;
        self.device.bind().map_err(|_| failed.clone())?;
        // SAFETY: the block is write-locked and `data` one block long; synchronous.
        unsafe { result::memcpy_htod_sync(target.address, &data[..self.block_bytes]) }
            .map_err(|_| failed)
    }

    fn copy_engine(&self) -> Result<Box<dyn CopyEngine>, TransferError> {
        let stream = CopyStream::new(&self.device)
            .map_err(|_| TransferError::Failed { tier: Tier::Device })?;
        Ok(Box::new(stream))
    }
}

/// One page-locked host allocation.
#[derive(Debug)]
pub(crate) struct PinnedRegion {
    device: Arc<CudaDevice>,
    base: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory; access to its bytes goes through `PinnedBlock`s,
// each behind its own lock in a `MemoryArena`.
unsafe impl Send for PinnedRegion {}
// SAFETY: as above.
unsafe impl Sync for PinnedRegion {}

impl PinnedRegion {
    /// `capacity` zeroed, page-locked blocks of `block_bytes`, portable across contexts.
    pub(crate) fn new(
        device: &Arc<CudaDevice>,
        capacity: usize,
        block_bytes: usize,
    ) -> Result<Arc<Self>, CudaError> {
        let len = region_bytes("pinned host tier", capacity, block_bytes)?.max(1);
        device.bind()?;
        // SAFETY: the context is current; freed once, in `drop`.
        let base = unsafe { result::malloc_host(len, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(driver("cuMemHostAlloc"))?
            .cast::<u8>();
        // SAFETY: `base` is `len` writable bytes just allocated.
        unsafe { std::ptr::write_bytes(base, 0, len) };
        Ok(Arc::new(Self {
            device: device.clone(),
            base,
            len,
        }))
    }

    /// The region's first byte (it is `block × count` bytes long, contiguous).
    pub(crate) fn as_mut_ptr(&self) -> *mut u8 {
        self.base
    }

    /// The blocks of the region, in order; each keeps the region alive.
    pub(crate) fn blocks(self: &Arc<Self>, block_bytes: usize) -> Vec<PinnedBlock> {
        let count = self.len.checked_div(block_bytes).unwrap_or(0);
        (0..count)
            .map(|index| PinnedBlock {
                // SAFETY: `index × block_bytes + block_bytes <= len`.
                ptr: unsafe { self.base.add(index * block_bytes) },
                len: block_bytes,
                _region: self.clone(),
            })
            .collect()
    }
}

impl Drop for PinnedRegion {
    fn drop(&mut self) {
        // Every block holds the region, so no slice of it outlives this.
        if self.device.bind().is_ok() {
            // SAFETY: allocated by `malloc_host` in `new`, freed once here.
            let _ = unsafe { result::free_host(self.base.cast()) };
        }
    }
}

/// One block of a pinned region: `len` bytes no other `PinnedBlock` overlaps.
#[derive(Debug)]
pub(crate) struct PinnedBlock {
    ptr: *mut u8,
    len: usize,
    _region: Arc<PinnedRegion>,
}

// SAFETY: a `PinnedBlock` owns its disjoint range exclusively (it is never cloned), so
// moving it to or sharing it with another thread is like doing so with a `Box<[u8]>`.
unsafe impl Send for PinnedBlock {}
// SAFETY: `&PinnedBlock` only gives `&[u8]`.
unsafe impl Sync for PinnedBlock {}

impl Deref for PinnedBlock {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is inside the live region and owned by this block.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl DerefMut for PinnedBlock {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
