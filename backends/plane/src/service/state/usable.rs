//! Which workers the router can use, as far as the block size goes: a worker whose
//! events announce another block size than the router's is refused batch by batch and
//! never mixed in, and `/readyz` and `/v1/workers` say so.
//!
//! Owns: [`RouterState::refuse_block_size`] and [`RouterState::usable`] (the part of
//! `/readyz` after the sources' catch-up).
//! Never: decide a batch's fate (the source's decoder checks it against the shared
//! `RouterBlockSize` before the lock is taken), or learn a block size (the decoder does).

use super::RouterState;
use crate::service::block_size::{BlockSizeMismatch, BlockSizeOrigin};
use crate::service::source::BLOCK_SIZE_MISMATCH;
use kvtwin::ids::WorkerId;

impl RouterState {
    /// Counts a batch of `worker` refused because its blocks have another size than the
    /// router's (globally, and on the worker's lowest known rank as a drop and a
    /// block-size mismatch), and remembers the size it announced: the rank is unusable
    /// until one of its events is applied.
    pub fn refuse_block_size(&mut self, worker: WorkerId, mismatch: BlockSizeMismatch) {
        self.warn(BLOCK_SIZE_MISMATCH, || {
            format!(
                "worker {worker}: its events announce {}-token blocks, the router's are {} \
                 tokens; refused (start the router with --block-size {} for this engine)",
                mismatch.events, mismatch.router, mismatch.events
            )
        });
        self.metrics.drop_one(BLOCK_SIZE_MISMATCH);
        let key = self.primary(worker);
        let entry = self.touch(key);
        entry.integrity.dropped += 1;
        entry.integrity.block_size_mismatches += 1;
        entry.refused_block_size = Some(mismatch.events);
    }

    /// `Ok` when the block size is known and, if workers are known, at least one is not
    /// refused for its block size; otherwise why not, naming the workers and sizes.
    pub(super) fn usable(&self) -> Result<(), String> {
        let Some(router) = self.block_size.get() else {
            return Err(match self.block_size.origin() {
                BlockSizeOrigin::Learned => "waiting to learn the block size from the first \
                    BlockStored (no --block-size given)"
                    .to_string(),
                // A fixed size is never 0 (`RouterBlockSize::fixed` learns then).
                BlockSizeOrigin::Fixed => "no block size".to_string(),
            });
        };
        if self.workers.is_empty()
            || self
                .workers
                .values()
                .any(|entry| entry.refused_block_size.is_none())
        {
            return Ok(());
        }
        let refused: Vec<String> = self
            .workers
            .iter()
            .filter_map(|(key, entry)| {
                let size = entry.refused_block_size?;
                Some(format!(
                    "worker {}{} sends {size}-token blocks",
                    key.worker.get(),
                    if key.dp_rank == 0 {
                        String::new()
                    } else {
                        format!(" rank {}", key.dp_rank)
                    }
                ))
            })
            .collect();
        Err(format!(
            "no usable worker: block size mismatch, the router's blocks are {router} tokens; {}",
            refused.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::block_size::RouterBlockSize;
    use crate::service::state::RouterLimits;
    use crate::wire::{WorkerEvent, WorkerEventData};
    use kvtwin::ids::LocalBlockHash;
    use kvtwin::tier::Tier;

    fn stored(worker: u64) -> WorkerEvent {
        WorkerEvent {
            worker: WorkerId::new(worker),
            dp_rank: 0,
            event_id: 0,
            data: WorkerEventData::Stored {
                parent: None,
                blocks: vec![(worker, LocalBlockHash::new(worker))],
                tier: Tier::Device,
            },
        }
    }

    #[test]
    fn readiness_waits_for_the_block_size_and_names_refused_workers() {
        let shared = RouterBlockSize::learned();
        let mut state = RouterState::with_block_size(shared.clone(), RouterLimits::default());
        let waiting = state.readiness().unwrap_err();
        assert!(
            waiting.contains("waiting to learn the block size"),
            "{waiting}"
        );
        assert_eq!(state.block_size(), None);
        assert!(state.hash_tokens(&[1, 2, 3]).is_empty());

        shared.admit(16).unwrap();
        assert_eq!(state.block_size(), Some(16));
        assert_eq!(state.readiness(), Ok(()));

        let mismatch = BlockSizeMismatch {
            events: 32,
            router: 16,
        };
        state.refuse_block_size(WorkerId::new(1), mismatch);
        let refused = state.readiness().unwrap_err();
        assert!(
            refused.contains("worker 1 sends 32-token blocks") && refused.contains("16 tokens"),
            "{refused}"
        );
        let row = &state.workers()[0];
        assert_eq!(row.refused_block_size, Some(32));
        assert_eq!(row.integrity.block_size_mismatches, 1);
        assert_eq!(row.integrity.dropped, 1);
        assert_eq!(state.metrics().dropped()[BLOCK_SIZE_MISMATCH], 1);

        // Another worker that is usable makes the router ready again.
        state.apply_batch(&[stored(2)]);
        assert_eq!(state.readiness(), Ok(()));
        // And the refused one, once an event of it is applied, is usable again.
        state.apply_batch(&[stored(1)]);
        assert_eq!(state.workers()[0].refused_block_size, None);
    }
}
