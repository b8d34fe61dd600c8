//! A memory tier: the blocks of one tier in host memory (the device tier emulated when
//! there is no GPU, or the host tier).
//!
//! Owns: [`MemoryArena`], one buffer of `block_bytes` per block, each behind its own
//! read-write lock so that worker threads copy different blocks at once without `unsafe`
//! (one big arena split among threads would need raw pointers). The manager never has a
//! block read and written at once (a transfer's sources are pinned, its targets are
//! exclusively held), so the locks are uncontended in practice; they make a misuse a wait,
//! never a data race. With feature `cuda` and a GPU, the host tier's blocks are the
//! page-locked blocks of a `device::Gpu` ([`BlockBytes::Pinned`]) so that copies to and
//! from the GPU run by DMA at the link's speed; everything else treats them as plain
//! bytes.
//! Never: allocate after construction, or abort on a failed allocation (it is an error).

use super::{read, write, HostError};
use kvtwin::hardware::TransferError;
use kvtwin::ids::BlockId;
use kvtwin::tier::Tier;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One block's bytes.
#[derive(Debug)]
pub(crate) enum BlockBytes {
    /// On the heap.
    Heap(Box<[u8]>),
    /// A slice of a page-locked region.
    #[cfg(feature = "cuda")]
    Pinned(Box<dyn super::device::HostBlock>),
}

impl Deref for BlockBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            BlockBytes::Heap(bytes) => bytes,
            #[cfg(feature = "cuda")]
            BlockBytes::Pinned(block) => block,
        }
    }
}

impl DerefMut for BlockBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            BlockBytes::Heap(bytes) => bytes,
            #[cfg(feature = "cuda")]
            BlockBytes::Pinned(block) => block,
        }
    }
}

/// The blocks of one memory tier.
pub(crate) struct MemoryArena {
    tier: Tier,
    blocks: Box<[RwLock<BlockBytes>]>,
}

impl fmt::Debug for MemoryArena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryArena")
            .field("tier", &self.tier)
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl MemoryArena {
    /// `capacity` zeroed blocks of `block_bytes`; an allocation the system refuses is an
    /// error, not an abort.
    pub(crate) fn new(tier: Tier, capacity: usize, block_bytes: usize) -> Result<Self, HostError> {
        let out_of_memory = || HostError::OutOfMemory {
            tier,
            bytes: (capacity as u64).saturating_mul(block_bytes as u64),
        };
        let mut blocks = Vec::new();
        blocks
            .try_reserve_exact(capacity)
            .map_err(|_| out_of_memory())?;
        for _ in 0..capacity {
            let mut block = Vec::new();
            block
                .try_reserve_exact(block_bytes)
                .map_err(|_| out_of_memory())?;
            block.resize(block_bytes, 0);
            blocks.push(RwLock::new(BlockBytes::Heap(block.into_boxed_slice())));
        }
        Ok(Self {
            tier,
            blocks: blocks.into_boxed_slice(),
        })
    }

    /// `capacity` zeroed, page-locked blocks of `block_bytes` from `gpu`.
    #[cfg(feature = "cuda")]
    pub(crate) fn pinned(
        tier: Tier,
        capacity: usize,
        block_bytes: usize,
        gpu: &dyn super::device::Gpu,
    ) -> Result<Self, HostError> {
        let blocks = gpu
            .pinned_blocks(capacity, block_bytes)?
            .into_iter()
            .map(|block| RwLock::new(BlockBytes::Pinned(block)))
            .collect();
        Ok(Self { tier, blocks })
    }

    /// Blocks in the arena.
    pub(crate) fn capacity(&self) -> usize {
        self.blocks.len()
    }

    fn slot(&self, block: BlockId) -> Result<&RwLock<BlockBytes>, TransferError> {
        self.blocks
            .get(block.index())
            .ok_or(TransferError::Failed { tier: self.tier })
    }

    /// Shared access to a block's bytes.
    pub(crate) fn read(
        &self,
        block: BlockId,
    ) -> Result<RwLockReadGuard<'_, BlockBytes>, TransferError> {
        Ok(read(self.slot(block)?))
    }

    /// Exclusive access to a block's bytes.
    pub(crate) fn write(
        &self,
        block: BlockId,
    ) -> Result<RwLockWriteGuard<'_, BlockBytes>, TransferError> {
        Ok(write(self.slot(block)?))
    }
}
