//! A deterministic [`Hardware`] for tests and examples: transfers complete instantly or
//! after a fixed delay, and can be made to fail.
//!
//! Owns: [`TestHardware`], [`TransferTiming`], [`ManualClock`]. It moves no bytes; it only
//! keeps the promises of the `Hardware` contract (ids unique, completions at their
//! deadline, in deadline order, ties in submission order), so the manager's logic can be
//! tested without a simulator.
//! Never: read a real clock or model contention (the simulator in `kvtwin-sim` does).

use crate::fabric::InProcessFabric;
use crate::hardware::{
    Clock, Completion, DeadlineQueue, Hardware, MemoryStorage, SubmitError, TransferError,
    TransferRequest,
};
use crate::ids::{Timestamp, TransferId};
use crate::tier::Tier;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::time::Duration;

/// A clock that shows what it was last set to.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: Cell<Timestamp>,
}

impl ManualClock {
    /// Sets the time.
    pub fn set(&self, now: Timestamp) {
        self.now.set(now);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.now.get()
    }
}

/// How long a [`TestHardware`] transfer takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferTiming {
    /// Done at the time it was submitted.
    Instant,
    /// Done a fixed span after submission.
    Fixed(Duration),
}

/// A `Hardware` whose transfers finish on a fixed schedule.
#[derive(Debug)]
pub struct TestHardware {
    timing: TransferTiming,
    clock: ManualClock,
    fabric: InProcessFabric,
    storage: MemoryStorage,
    queue: DeadlineQueue,
    outcomes: BTreeMap<TransferId, Result<(), TransferError>>,
    fail_next: usize,
    corrupt_next: usize,
    submitted: Vec<TransferRequest>,
    transfer_cost_per_block: [Duration; 4],
    recompute_cost_per_block: Duration,
    bytes_per_block: u64,
}

impl TestHardware {
    /// Hardware with the given timing, room for 1024 transfers in flight, and cost
    /// estimates of 1 µs per block transferred and 10 µs per block recomputed.
    pub fn new(timing: TransferTiming) -> Self {
        Self {
            timing,
            clock: ManualClock::default(),
            fabric: InProcessFabric::new(64 << 20),
            storage: MemoryStorage::new(),
            queue: DeadlineQueue::new(1024),
            outcomes: BTreeMap::new(),
            fail_next: 0,
            corrupt_next: 0,
            submitted: Vec::new(),
            transfer_cost_per_block: [Duration::from_micros(1); 4],
            recompute_cost_per_block: Duration::from_micros(10),
            bytes_per_block: 1,
        }
    }

    /// Sets the estimate the cost-aware onboarding sees for moving one block of
    /// `bytes_per_block` bytes out of `tier`.
    pub fn with_transfer_cost(
        mut self,
        tier: Tier,
        per_block: Duration,
        bytes_per_block: u64,
    ) -> Self {
        self.transfer_cost_per_block[tier.index()] = per_block;
        self.bytes_per_block = bytes_per_block.max(1);
        self
    }

    /// Sets the estimated time to recompute one block.
    pub fn with_recompute_cost(mut self, per_block: Duration) -> Self {
        self.recompute_cost_per_block = per_block;
        self
    }

    /// Bounds the transfers in flight (beyond it `submit` answers `QueueFull`).
    pub fn with_max_in_flight(mut self, max: usize) -> Self {
        self.queue = DeadlineQueue::new(max);
        self
    }

    /// The next `count` transfers submitted will fail.
    pub fn fail_next(&mut self, count: usize) {
        self.fail_next = count;
    }

    /// The next `count` transfers submitted will fail as if their source bytes failed
    /// their checksum (`TransferError::Corrupt` of the source tier).
    pub fn corrupt_next(&mut self, count: usize) {
        self.corrupt_next = count;
    }

    /// Every transfer submitted so far, in order.
    pub fn submitted(&self) -> &[TransferRequest] {
        &self.submitted
    }

    /// Transfers not yet completed.
    pub fn in_flight(&self) -> usize {
        self.queue.len()
    }
}

impl Hardware for TestHardware {
    type Clock = ManualClock;
    type Fabric = InProcessFabric;
    type Storage = MemoryStorage;

    fn clock(&self) -> &ManualClock {
        &self.clock
    }

    fn fabric(&self) -> &InProcessFabric {
        &self.fabric
    }

    fn storage(&mut self) -> &mut MemoryStorage {
        &mut self.storage
    }

    fn submit(
        &mut self,
        request: TransferRequest,
        now: Timestamp,
    ) -> Result<TransferId, SubmitError> {
        self.queue.admit(&request)?;
        let deadline = match self.timing {
            TransferTiming::Instant => now,
            TransferTiming::Fixed(span) => now.saturating_add(span),
        };
        let outcome = if self.fail_next > 0 {
            self.fail_next -= 1;
            Err(TransferError::Failed {
                tier: request.src_tier,
            })
        } else if self.corrupt_next > 0 {
            self.corrupt_next -= 1;
            Err(TransferError::Corrupt {
                tier: request.src_tier,
            })
        } else {
            Ok(())
        };
        let id = self.queue.push(deadline);
        self.outcomes.insert(id, outcome);
        self.submitted.push(request);
        Ok(id)
    }

    fn poll_completion(&mut self, now: Timestamp) -> Option<Completion> {
        let id = self.queue.pop_due(now)?;
        let result = self.outcomes.remove(&id).unwrap_or(Ok(()));
        Some(Completion { id, result })
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        self.queue.next_deadline()
    }

    fn estimate_transfer(&self, src: Tier, _dst: Tier, bytes: u64) -> Duration {
        let blocks = bytes.div_ceil(self.bytes_per_block);
        self.transfer_cost_per_block[src.index()]
            .saturating_mul(u32::try_from(blocks).unwrap_or(u32::MAX))
    }

    fn estimate_recompute(&self, blocks: usize) -> Duration {
        self.recompute_cost_per_block
            .saturating_mul(u32::try_from(blocks).unwrap_or(u32::MAX))
    }
}
