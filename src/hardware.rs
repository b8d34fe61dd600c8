//! The boundary between the sans-IO core and whatever moves bytes.
//!
//! Owns: the [`Hardware`] bundle trait that `Manager` is generic over, its associated
//! [`Clock`] and [`Storage`] traits (the [`crate::fabric::Fabric`] trait lives with the
//! wire frame), the transfer request / completion types and their errors, and
//! [`MemoryStorage`], an in-memory `Storage` with separate live and durable images.
//!
//! Shape (quinn-proto style): the manager calls `submit(.., now)`; the hardware finishes
//! the transfer on its own time; the driver hands time back through
//! `poll_completion(now)`. The simulator knows every deadline (`next_deadline`); a real
//! backend returns `None` and wakes its driver through a notifier of its own.
//! Never: `async fn`, a hidden runtime, or a clock read by the core.

use crate::fabric::Fabric;
use crate::ids::{BlockId, Timestamp, TransferId};
use crate::tier::Tier;
use std::collections::BTreeSet;
use std::time::Duration;

/// A source of time. Only drivers and backends hold one; the core is handed `now`.
pub trait Clock {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// One copy of whole blocks from one tier to another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferRequest {
    /// Source tier.
    pub src_tier: Tier,
    /// Source blocks, in order.
    pub src_blocks: Vec<BlockId>,
    /// Destination tier.
    pub dst_tier: Tier,
    /// Destination blocks, pairwise with `src_blocks`.
    pub dst_blocks: Vec<BlockId>,
    /// Bytes moved in all (blocks × bytes per block, from the layout).
    pub bytes: u64,
}

impl TransferRequest {
    /// The contract every `Hardware::submit` checks first: source and destination block
    /// lists pair up and are not empty.
    pub fn check_shape(&self) -> Result<(), SubmitError> {
        if self.src_blocks.len() != self.dst_blocks.len() || self.src_blocks.is_empty() {
            return Err(SubmitError::Malformed {
                src: self.src_blocks.len(),
                dst: self.dst_blocks.len(),
            });
        }
        Ok(())
    }
}

/// A transfer finished, well or not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// Which transfer.
    pub id: TransferId,
    /// Its outcome.
    pub result: Result<(), TransferError>,
}

/// The hardware refused a transfer; nothing was started.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The bounded transfer queue is full: backpressure, retry after completions.
    #[error("transfer queue full ({depth} in flight)")]
    QueueFull {
        /// Transfers in flight.
        depth: usize,
    },
    /// The hardware has no such tier.
    #[error("tier {0} is not present")]
    TierUnavailable(Tier),
    /// Source and destination lists differ in length, or are empty.
    #[error("malformed transfer: {src} source and {dst} destination blocks")]
    Malformed {
        /// Source blocks.
        src: usize,
        /// Destination blocks.
        dst: usize,
    },
}

/// A started transfer failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransferError {
    /// The device, link or file reported an error.
    #[error("transfer failed on {tier}")]
    Failed {
        /// The tier whose side failed.
        tier: Tier,
    },
    /// The bytes arrived but their checksum did not match: never served.
    #[error("checksum mismatch on data read from {tier}")]
    Corrupt {
        /// The tier the bad bytes came from.
        tier: Tier,
    },
}

/// Transfers in flight ordered by their deadline: the bookkeeping every `Hardware` that
/// knows its deadlines (the simulator, `TestHardware`) needs. Ids are unique; completions
/// pop in deadline order, ties in submission order.
#[derive(Clone, Debug, Default)]
pub struct DeadlineQueue {
    pending: BTreeSet<(Timestamp, TransferId)>,
    next_id: u64,
    max_in_flight: usize,
}

impl DeadlineQueue {
    /// An empty queue admitting at most `max_in_flight` transfers.
    pub fn new(max_in_flight: usize) -> Self {
        Self {
            pending: BTreeSet::new(),
            next_id: 0,
            max_in_flight,
        }
    }

    /// Checks `request` against the contract (pairwise non-empty block lists) and the
    /// bound, before the hardware models it.
    pub fn admit(&self, request: &TransferRequest) -> Result<(), SubmitError> {
        request.check_shape()?;
        if self.pending.len() >= self.max_in_flight {
            return Err(SubmitError::QueueFull {
                depth: self.pending.len(),
            });
        }
        Ok(())
    }

    /// Records an admitted transfer that finishes at `deadline`.
    pub fn push(&mut self, deadline: Timestamp) -> TransferId {
        let id = TransferId::new(self.next_id);
        self.next_id += 1;
        self.pending.insert((deadline, id));
        id
    }

    /// The earliest transfer due by `now`, removed.
    pub fn pop_due(&mut self, now: Timestamp) -> Option<TransferId> {
        let &(deadline, id) = self.pending.first()?;
        if deadline > now {
            return None;
        }
        self.pending.remove(&(deadline, id));
        Some(id)
    }

    /// When the earliest transfer is due.
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.pending.first().map(|(deadline, _)| *deadline)
    }

    /// Transfers in flight.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// Disk-tier storage: extents of bytes with explicit durability (redb's
/// `StorageBackend` shape). `write` changes the live image; only `sync_data` makes it
/// durable.
pub trait Storage {
    /// Current length in bytes.
    fn len(&self) -> Result<u64, StorageError>;
    /// Whether the storage holds no bytes.
    fn is_empty(&self) -> Result<bool, StorageError> {
        Ok(self.len()? == 0)
    }
    /// Fills `buf` from `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StorageError>;
    /// Writes `data` at `offset` (within the current length).
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StorageError>;
    /// Grows or shrinks to `len` bytes (new bytes are zero).
    fn set_len(&mut self, len: u64) -> Result<(), StorageError>;
    /// Makes every completed write durable.
    fn sync_data(&mut self) -> Result<(), StorageError>;
}

/// A storage operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The range is outside the storage.
    #[error("range {offset}+{len} outside storage of {size} bytes")]
    OutOfRange {
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Storage size.
        size: u64,
    },
    /// The operating system reported an error.
    #[error("storage I/O error")]
    Io(#[from] std::io::Error),
    /// A fault injected by a simulator or a test.
    #[error("injected storage fault")]
    InjectedFault,
}

/// The set of devices a `Manager` moves blocks with.
pub trait Hardware {
    /// The time source drivers of this hardware use.
    type Clock: Clock;
    /// How remote-tier bytes travel.
    type Fabric: Fabric;
    /// The disk tier's storage.
    type Storage: Storage;

    /// The clock.
    fn clock(&self) -> &Self::Clock;
    /// The fabric.
    fn fabric(&self) -> &Self::Fabric;
    /// The disk-tier storage.
    fn storage(&mut self) -> &mut Self::Storage;

    /// Starts a transfer.
    fn submit(
        &mut self,
        request: TransferRequest,
        now: Timestamp,
    ) -> Result<TransferId, SubmitError>;
    /// A finished transfer, if one finished by `now`.
    fn poll_completion(&mut self, now: Timestamp) -> Option<Completion>;
    /// When the next transfer will finish, if the hardware knows.
    fn next_deadline(&self) -> Option<Timestamp>;
    /// Expected duration of moving `bytes` from `src` to `dst` on an idle system.
    fn estimate_transfer(&self, src: Tier, dst: Tier, bytes: u64) -> Duration;
    /// Expected duration of recomputing (prefilling) `blocks` blocks of KV.
    fn estimate_recompute(&self, blocks: usize) -> Duration;

    /// Whether a manager of this hardware and every handle of its blocks stay on the
    /// thread that builds the manager (a simulator's world). Its pools then lock without
    /// atomic operations, and touching them from another thread panics
    /// ([`crate::sync::PoolLock`]). Real hardware, whose transfers finish on other
    /// threads, keeps the default.
    fn single_threaded(&self) -> bool {
        false
    }
}

/// In-memory [`Storage`] keeping the live image and the durable image apart, so a crash
/// (losing everything not synced) can be modelled with [`MemoryStorage::crash`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStorage {
    live: Vec<u8>,
    durable: Vec<u8>,
}

impl MemoryStorage {
    /// Empty storage.
    pub fn new() -> Self {
        Self::default()
    }

    /// Loses every write not yet synced: the live image becomes the durable one.
    pub fn crash(&mut self) {
        self.live.clone_from(&self.durable);
    }

    fn range(&self, offset: u64, len: usize) -> Result<std::ops::Range<usize>, StorageError> {
        let size = self.live.len() as u64;
        let end = offset.checked_add(len as u64).filter(|&end| end <= size);
        match end {
            Some(end) => Ok(offset as usize..end as usize),
            None => Err(StorageError::OutOfRange {
                offset,
                len: len as u64,
                size,
            }),
        }
    }
}

impl Storage for MemoryStorage {
    fn len(&self) -> Result<u64, StorageError> {
        Ok(self.live.len() as u64)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), StorageError> {
        let range = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.live[range]);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), StorageError> {
        let range = self.range(offset, data.len())?;
        self.live[range].copy_from_slice(data);
        Ok(())
    }

    fn set_len(&mut self, len: u64) -> Result<(), StorageError> {
        let len = usize::try_from(len).map_err(|_| StorageError::OutOfRange {
            offset: 0,
            len,
            size: self.live.len() as u64,
        })?;
        self.live.resize(len, 0);
        Ok(())
    }

    fn sync_data(&mut self) -> Result<(), StorageError> {
        self.durable.clone_from(&self.live);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_storage_loses_unsynced_writes_on_crash() {
        let mut storage = MemoryStorage::new();
        storage.set_len(8).unwrap();
        storage.write(0, &[1, 2, 3, 4]).unwrap();
        storage.sync_data().unwrap();
        storage.write(4, &[5, 6, 7, 8]).unwrap();
        storage.crash();
        let mut buf = [0u8; 8];
        storage.read(0, &mut buf).unwrap();
        assert_eq!(buf, [1, 2, 3, 4, 0, 0, 0, 0]);
    }

    #[test]
    fn memory_storage_rejects_out_of_range_access() {
        let mut storage = MemoryStorage::new();
        storage.set_len(4).unwrap();
        assert!(matches!(
            storage.write(2, &[0; 4]),
            Err(StorageError::OutOfRange { .. })
        ));
        let mut buf = [0u8; 2];
        assert!(matches!(
            storage.read(u64::MAX, &mut buf),
            Err(StorageError::OutOfRange { .. })
        ));
    }
}
