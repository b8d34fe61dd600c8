//! The remote tier through a [`Fabric`]: each remote block is one MRDN v1 frame held by
//! the fabric, named by the handle its push returned.
//!
//! Owns: [`RemoteStore`], the handle of every remote block. A write pushes a new frame
//! (pulling the block's old one, so the fabric does not fill with stale frames); a read
//! pulls the frame, checks it (the frame's BLAKE3 catches corruption in flight), copies
//! the body out and pushes the same frame back, since a fabric hands a payload out once.
//! Never: serve a body whose frame did not decode, or keep a handle the fabric refused.
//! A block whose frame could not be pushed back after a read is lost (later reads fail);
//! the read itself was served.

use super::lock;
use kvtwin::fabric::{Fabric, FabricHandle, InProcessFabric};
use kvtwin::hardware::TransferError;
use kvtwin::ids::BlockId;
use kvtwin::phase::Phase;
use kvtwin::tier::Tier;
use kvtwin::wire;
use std::sync::{Arc, Mutex};

const FAILED: TransferError = TransferError::Failed { tier: Tier::Remote };

/// The remote blocks and the fabric that holds them.
#[derive(Debug)]
pub(crate) struct RemoteStore {
    fabric: Arc<InProcessFabric>,
    slots: Box<[Mutex<Option<FabricHandle>>]>,
}

impl RemoteStore {
    /// `capacity` empty remote blocks on `fabric`.
    pub(crate) fn new(fabric: Arc<InProcessFabric>, capacity: usize) -> Self {
        Self {
            fabric,
            slots: (0..capacity).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// Blocks the tier holds.
    pub(crate) fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, block: BlockId) -> Result<&Mutex<Option<FabricHandle>>, TransferError> {
        self.slots.get(block.index()).ok_or(FAILED)
    }

    /// Copies remote block `block` into `out` (exactly one block long).
    pub(crate) fn read(&self, block: BlockId, out: &mut [u8]) -> Result<(), TransferError> {
        // Held across pull and push: a concurrent read of the same block waits for the
        // frame to be back.
        let mut slot = lock(self.slot(block)?);
        let handle = slot.take().ok_or(FAILED)?;
        let payload = self.fabric.pull(handle).map_err(|_| FAILED)?;
        match wire::decode(&payload) {
            Ok(frame) if frame.body.len() == out.len() => out.copy_from_slice(frame.body),
            _ => return Err(TransferError::Corrupt { tier: Tier::Remote }),
        }
        *slot = self.fabric.push(payload).ok();
        Ok(())
    }

    /// Stores `data` as remote block `block`.
    pub(crate) fn write(&self, block: BlockId, data: &[u8]) -> Result<(), TransferError> {
        // The phase tag is the producer's class of the blocks; a transfer request does
        // not carry it, so remote blocks travel as the default class.
        let frame = wire::encode(Phase::default(), data).map_err(|_| FAILED)?;
        let mut slot = lock(self.slot(block)?);
        if let Some(old) = slot.take() {
            let _ = self.fabric.pull(old);
        }
        *slot = Some(self.fabric.push(frame).map_err(|_| FAILED)?);
        Ok(())
    }
}
