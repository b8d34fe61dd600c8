//! The tiers' bytes and the block copies between them, as the worker threads run them.
//!
//! Owns: [`Stores`] (one store per present tier: memory arena, disk extent or remote
//! store), the copy of one transfer block by block, and the [`Counters`] the copies bump.
//! A copy between two memory tiers goes straight from source to destination, locking
//! them in tier order (so two opposite copies can never wait on each other); every other
//! copy stages the block in the worker's aligned buffer: loaded (and, from disk or
//! remote, verified) first, stored second, so a block that fails its check never reaches
//! its destination.
//! With feature `cuda`, a transfer between the GPU tier and a memory tier (or within the
//! GPU) runs as one batch on the worker's stream (module `gpu`); the GPU tier's
//! [`Stores::load`] / [`Stores::store`] arms copy one block synchronously, for the staged
//! copies to and from disk and remote and for direct block access.
//! Never: decide what to copy (the manager does), or report a completion (the workers do).

use super::disk::{AlignedBuf, DiskExtent, ReadError};
use super::memory::MemoryArena;
use super::remote::RemoteStore;
use kvtwin::hardware::{TransferError, TransferRequest};
use kvtwin::ids::BlockId;
use kvtwin::tier::Tier;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where one tier's blocks live.
#[derive(Debug)]
pub(crate) enum TierStore {
    /// Host memory (the device tier emulated, or the host tier).
    Memory(MemoryArena),
    /// The extent file.
    Disk(DiskExtent),
    /// Frames on a fabric.
    Remote(RemoteStore),
    /// GPU memory (the device tier, feature `cuda`).
    #[cfg(feature = "cuda")]
    Gpu(Box<dyn super::device::DeviceMemory>),
}

/// What each worker thread keeps between transfers.
pub(crate) struct Scratch {
    /// The buffer staged copies pass through.
    pub(crate) staging: AlignedBuf,
    /// The worker's CUDA stream, made on its first GPU transfer.
    #[cfg(feature = "cuda")]
    pub(crate) stream: Option<Box<dyn super::device::CopyEngine>>,
}

impl Scratch {
    /// A worker's scratch around `staging`.
    pub(crate) fn new(staging: AlignedBuf) -> Self {
        Self {
            staging,
            #[cfg(feature = "cuda")]
            stream: None,
        }
    }
}

impl TierStore {
    pub(crate) fn capacity(&self) -> usize {
        match self {
            TierStore::Memory(arena) => arena.capacity(),
            TierStore::Disk(extent) => extent.capacity(),
            TierStore::Remote(remote) => remote.capacity(),
            #[cfg(feature = "cuda")]
            TierStore::Gpu(arena) => arena.capacity(),
        }
    }
}

/// Cumulative counts, bumped by the workers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) transfers_completed: AtomicU64,
    pub(crate) transfers_failed: AtomicU64,
    /// Bytes copied, by `[src][dst]` tier index.
    pub(crate) bytes: [[AtomicU64; 4]; 4],
    /// Blocks copied, by `[src][dst]` tier index.
    pub(crate) blocks: [[AtomicU64; 4]; 4],
    /// Reads whose checksum failed, by tier index.
    pub(crate) checksum_failures: [AtomicU64; 4],
}

/// Every present tier's store.
#[derive(Debug)]
pub(crate) struct Stores {
    pub(crate) block_bytes: usize,
    pub(crate) tiers: [Option<TierStore>; 4],
    pub(crate) counters: Counters,
}

impl Stores {
    /// The store of `tier`, if present.
    pub(crate) fn get(&self, tier: Tier) -> Option<&TierStore> {
        self.tiers[tier.index()].as_ref()
    }

    /// The disk extent, if there is a disk tier.
    pub(crate) fn disk(&self) -> Option<&DiskExtent> {
        match self.get(Tier::Disk) {
            Some(TierStore::Disk(extent)) => Some(extent),
            _ => None,
        }
    }

    /// Bytes a worker's staging buffer needs: one disk slot, or one block.
    pub(crate) fn staging_bytes(&self) -> usize {
        self.disk().map_or(self.block_bytes, DiskExtent::stride)
    }

    /// Runs one transfer, block by block; stops at the first block that fails.
    pub(crate) fn execute(
        &self,
        request: &TransferRequest,
        scratch: &mut Scratch,
    ) -> Result<(), TransferError> {
        #[cfg(feature = "cuda")]
        if let Some(result) = self.execute_gpu(request, scratch) {
            return result;
        }
        let (src, dst) = (request.src_tier, request.dst_tier);
        for (from, to) in request.src_blocks.iter().zip(&request.dst_blocks) {
            self.copy(src, *from, dst, *to, &mut scratch.staging)?;
            self.counters.blocks[src.index()][dst.index()].fetch_add(1, Ordering::Relaxed);
            self.counters.bytes[src.index()][dst.index()]
                .fetch_add(self.block_bytes as u64, Ordering::Relaxed);
        }
        Ok(())
    }

    fn copy(
        &self,
        src: Tier,
        from: BlockId,
        dst: Tier,
        to: BlockId,
        staging: &mut AlignedBuf,
    ) -> Result<(), TransferError> {
        let absent = |tier| TransferError::Failed { tier };
        let source = self.get(src).ok_or(absent(src))?;
        let target = self.get(dst).ok_or(absent(dst))?;
        if let (TierStore::Memory(a), TierStore::Memory(b)) = (source, target) {
            if src < dst {
                let from = a.read(from)?;
                b.write(to)?.copy_from_slice(&from);
                return Ok(());
            }
            if dst < src {
                let mut to = b.write(to)?;
                to.copy_from_slice(&a.read(from)?);
                return Ok(());
            }
        }
        self.load(src, from, staging)?;
        self.store(dst, to, staging)
    }

    /// Brings block `block` of `tier` into the first `block_bytes` of `staging`,
    /// verified; a checksum failure is counted.
    pub(crate) fn load(
        &self,
        tier: Tier,
        block: BlockId,
        staging: &mut AlignedBuf,
    ) -> Result<(), TransferError> {
        let result = match self.get(tier) {
            None => Err(TransferError::Failed { tier }),
            Some(TierStore::Memory(arena)) => {
                let bytes = arena.read(block)?;
                staging.as_mut_slice()[..self.block_bytes].copy_from_slice(&bytes);
                Ok(())
            }
            Some(TierStore::Disk(extent)) => {
                extent
                    .read_block(block, staging)
                    .map_err(|error| match error {
                        ReadError::Io => TransferError::Failed { tier },
                        ReadError::Corrupt => TransferError::Corrupt { tier },
                    })
            }
            Some(TierStore::Remote(remote)) => {
                remote.read(block, &mut staging.as_mut_slice()[..self.block_bytes])
            }
            #[cfg(feature = "cuda")]
            Some(TierStore::Gpu(arena)) => {
                arena.load(block, &mut staging.as_mut_slice()[..self.block_bytes])
            }
        };
        if let Err(TransferError::Corrupt { tier }) = result {
            self.counters.checksum_failures[tier.index()].fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Writes the first `block_bytes` of `staging` as block `block` of `tier` (the disk
    /// adds its trailer in the rest of `staging`).
    pub(crate) fn store(
        &self,
        tier: Tier,
        block: BlockId,
        staging: &mut AlignedBuf,
    ) -> Result<(), TransferError> {
        let failed = TransferError::Failed { tier };
        match self.get(tier) {
            None => Err(failed),
            Some(TierStore::Memory(arena)) => {
                arena
                    .write(block)?
                    .copy_from_slice(&staging.as_slice()[..self.block_bytes]);
                Ok(())
            }
            Some(TierStore::Disk(extent)) => extent.write_block(block, staging).map_err(|_| failed),
            Some(TierStore::Remote(remote)) => {
                remote.write(block, &staging.as_slice()[..self.block_bytes])
            }
            #[cfg(feature = "cuda")]
            Some(TierStore::Gpu(arena)) => {
                arena.store(block, &staging.as_slice()[..self.block_bytes])
            }
        }
    }
}
