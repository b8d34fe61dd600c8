//! Transfers that touch the GPU tier (feature `cuda`): the block copies of a transfer
//! between the GPU and a memory tier, or within the GPU, as one batch on the worker's
//! stream.
//!
//! Owns: [`Stores::execute_gpu`] and the lock discipline of a batch. A batch holds every
//! block it copies for the whole batch (the copies run while the worker waits on the
//! batch's event), so it takes the locks in one global order, tier index first, block id
//! second, which two batches can never take in opposite orders; and it refuses a
//! transfer that names a block twice (the manager never does; the lock would wait on
//! itself). Copies between the GPU and the disk or remote tiers stage each block through
//! the worker's buffer (the `Gpu` arms of `Stores::load` / `Stores::store`).
//! Never: enqueue a copy whose host bytes are not locked until the batch's event fires.

use super::device::{BlockCopy, CopyEngine, DeviceMemory};
use super::memory::MemoryArena;
use super::store::{Scratch, Stores, TierStore};
use kvtwin::hardware::{TransferError, TransferRequest};
use kvtwin::ids::BlockId;
use kvtwin::tier::Tier;
use std::sync::atomic::Ordering;

impl Stores {
    /// Runs `request` if it is a batch for the GPU (GPU to or from a memory tier, or GPU
    /// to GPU); `None` leaves it to the block-by-block path.
    pub(crate) fn execute_gpu(
        &self,
        request: &TransferRequest,
        scratch: &mut Scratch,
    ) -> Option<Result<(), TransferError>> {
        let (src, dst) = (request.src_tier, request.dst_tier);
        let result = match (self.get(src)?, self.get(dst)?) {
            (TierStore::Gpu(gpu), TierStore::Memory(memory)) => {
                self.gpu_memory(&**gpu, memory, request, true, scratch)
            }
            (TierStore::Memory(memory), TierStore::Gpu(gpu)) => {
                self.gpu_memory(&**gpu, memory, request, false, scratch)
            }
            (TierStore::Gpu(gpu), TierStore::Gpu(_)) => self.gpu_gpu(&**gpu, request, scratch),
            _ => return None,
        };
        if result.is_ok() {
            let blocks = request.src_blocks.len() as u64;
            self.counters.blocks[src.index()][dst.index()].fetch_add(blocks, Ordering::Relaxed);
            self.counters.bytes[src.index()][dst.index()]
                .fetch_add(blocks * self.block_bytes as u64, Ordering::Relaxed);
        }
        Some(result)
    }

    /// GPU to memory (`download`) or memory to GPU.
    fn gpu_memory(
        &self,
        gpu: &dyn DeviceMemory,
        memory: &MemoryArena,
        request: &TransferRequest,
        download: bool,
        scratch: &mut Scratch,
    ) -> Result<(), TransferError> {
        let (gpu_blocks, memory_blocks) = if download {
            (&request.src_blocks, &request.dst_blocks)
        } else {
            (&request.dst_blocks, &request.src_blocks)
        };
        let failed = TransferError::Failed { tier: Tier::Device };
        if !distinct(gpu_blocks) || !distinct(memory_blocks) {
            return Err(failed);
        }
        let stream = stream(scratch, gpu)?;
        // The device tier's index is below every memory tier's: lock it first.
        let locked = lock_in_order(gpu_blocks, |_, block| {
            if download {
                gpu.read(block)
            } else {
                gpu.write(block)
            }
        })?;
        if download {
            let mut targets = lock_in_order(memory_blocks, |_, block| memory.write(block))?;
            let copies = locked
                .iter()
                .zip(targets.iter_mut())
                .map(|(source, target)| BlockCopy::DeviceToHost {
                    dst: &mut target[..],
                    src: source.address,
                })
                .collect();
            // SAFETY: the device blocks are read-locked and the host blocks write-locked
            // until `run` has waited for these copies.
            unsafe { stream.run(copies) }
        } else {
            let sources = lock_in_order(memory_blocks, |_, block| memory.read(block))?;
            let copies = locked
                .iter()
                .zip(sources.iter())
                .map(|(target, source)| BlockCopy::HostToDevice {
                    dst: target.address,
                    src: &source[..],
                })
                .collect();
            // SAFETY: the device blocks are write-locked and the host blocks read-locked
            // until `run` has waited for these copies.
            unsafe { stream.run(copies) }
        }
    }

    /// GPU block to GPU block.
    fn gpu_gpu(
        &self,
        gpu: &dyn DeviceMemory,
        request: &TransferRequest,
        scratch: &mut Scratch,
    ) -> Result<(), TransferError> {
        let failed = TransferError::Failed { tier: Tier::Device };
        let all: Vec<BlockId> = request
            .src_blocks
            .iter()
            .chain(&request.dst_blocks)
            .copied()
            .collect();
        if !distinct(&all) {
            return Err(failed);
        }
        let sources = request.src_blocks.len();
        // One tier: one order over sources and targets together.
        let locked = lock_in_order(&all, |position, block| {
            if position < sources {
                gpu.read(block)
            } else {
                gpu.write(block)
            }
        })?;
        let (from, to) = locked.split_at(sources);
        let len = gpu.block_bytes();
        let stream = stream(scratch, gpu)?;
        let copies = from
            .iter()
            .zip(to)
            .map(|(src, dst)| BlockCopy::DeviceToDevice {
                dst: dst.address,
                src: src.address,
                len,
            })
            .collect();
        // SAFETY: sources read-locked, targets write-locked, distinct, until `run` has
        // waited for the copies.
        unsafe { stream.run(copies) }
    }
}

/// The worker's copy engine on `gpu`, made on first use (on the worker's own thread,
/// where the context must be current).
fn stream<'s>(
    scratch: &'s mut Scratch,
    gpu: &dyn DeviceMemory,
) -> Result<&'s mut Box<dyn CopyEngine>, TransferError> {
    if scratch.stream.is_none() {
        scratch.stream = Some(gpu.copy_engine()?);
    }
    scratch
        .stream
        .as_mut()
        .ok_or(TransferError::Failed { tier: Tier::Device })
}

/// Whether no block appears twice.
fn distinct(blocks: &[BlockId]) -> bool {
    let mut sorted = blocks.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).all(|pair| pair[0] != pair[1])
}

/// Locks `blocks` in ascending id order with `lock` (given each block's position in
/// `blocks`), returning the guards in the order of `blocks`.
fn lock_in_order<T>(
    blocks: &[BlockId],
    mut lock: impl FnMut(usize, BlockId) -> Result<T, TransferError>,
) -> Result<Vec<T>, TransferError> {
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_unstable_by_key(|&i| blocks[i]);
    let mut slots: Vec<Option<T>> = (0..blocks.len()).map(|_| None).collect();
    for i in order {
        slots[i] = Some(lock(i, blocks[i])?);
    }
    // Every slot was filled above.
    Ok(slots.into_iter().flatten().collect())
}
