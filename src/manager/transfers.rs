//! Transfers in flight and their completions: what each submitted transfer is for
//! ([`InFlight`]), and [`Manager::handle_completions`] / [`Manager::handle_completion`],
//! which register the landed copies, release the sources and queue outputs.
//!
//! Invariants: every transfer the manager submitted is in `in_flight` until its
//! completion is handled, and holds its source blocks (referenced) and target blocks
//! (Reset) until then; a completion for an unknown id is ignored. A source read back
//! corrupt is forgotten, never offered again ([`Manager::forget_corrupt_blocks`], which
//! a driver reading a tier itself calls too).
//!
//! Never: submit a transfer of its own accord except the write-through copy of a block
//! that has just landed, or read a clock.

use super::onboard::Segment;
use super::{Manager, ManagerOutput, OffloadPolicy};
use crate::block::{Complete, Reset};
use crate::hardware::{Completion, Hardware, TransferError};
use crate::ids::{RequestId, SequenceHash, Timestamp};
use crate::pool::{ImmutableBlock, MutableBlock};
use crate::tier::Tier;

/// What a transfer in flight is for, with the blocks it holds until it completes.
#[derive(Debug)]
pub(super) enum InFlight {
    Onboard {
        request: RequestId,
        segment: usize,
        sources: Vec<ImmutableBlock>,
        targets: Vec<MutableBlock<Reset>>,
    },
    Offload {
        sources: Vec<ImmutableBlock>,
        targets: Vec<MutableBlock<Reset>>,
        policy: OffloadPolicy,
    },
}

impl InFlight {
    /// The tiers the transfer reads from and writes to.
    pub(super) fn tiers(&self) -> (Tier, Tier) {
        match self {
            InFlight::Onboard { sources, .. } => (
                sources.first().map_or(Tier::Device, ImmutableBlock::tier),
                Tier::Device,
            ),
            InFlight::Offload {
                sources, targets, ..
            } => (
                sources.first().map_or(Tier::Device, ImmutableBlock::tier),
                targets.first().map_or(Tier::Device, MutableBlock::tier),
            ),
        }
    }
}

impl<H: Hardware> Manager<H> {
    pub(super) fn count_submit(&mut self, bytes: u64) {
        self.stats.transfers_submitted += 1;
        self.stats.bytes_submitted += bytes;
    }

    /// Takes every transfer the hardware finished by `now` and acts on it: registers
    /// onboarded and offloaded copies, releases sources, queues outputs.
    pub fn handle_completions(&mut self, now: Timestamp) {
        self.tick(now);
        while let Some(completion) = self.hardware.poll_completion(now) {
            self.handle_completion(completion, now);
        }
        self.pump_writeback(now);
    }

    /// Acts on one finished transfer (for drivers whose backend reports completions
    /// directly). An unknown id is ignored: it was not this manager's.
    pub fn handle_completion(&mut self, completion: Completion, now: Timestamp) {
        self.tick(now);
        let Some(flight) = self.in_flight.remove(&completion.id) else {
            return;
        };
        match flight {
            InFlight::Onboard {
                request,
                segment,
                sources,
                targets,
            } => {
                let source_tier = sources.first().map_or(Tier::Device, ImmutableBlock::tier);
                let outcome = match completion.result {
                    Ok(()) => {
                        let complete = copies_of(&sources, targets);
                        self.stats.onboarded_blocks[source_tier.index()] += sources.len() as u64;
                        Segment::Done(self.device().register_chain(complete))
                    }
                    Err(error) => {
                        self.stats.onboard_failed_blocks += sources.len() as u64;
                        self.forget_corrupt(&error, &sources);
                        Segment::Failed(sources.len())
                    }
                };
                self.pool_of(source_tier).release(sources);
                self.finish_segment(request, segment, outcome);
            }
            InFlight::Offload {
                sources,
                targets,
                policy,
            } => {
                let from = sources.first().map_or(Tier::Device, ImmutableBlock::tier);
                let to = targets.first().map_or(Tier::Device, MutableBlock::tier);
                for source in &sources {
                    self.offloading.remove(&(to, source.sequence_hash()));
                }
                if matches!(policy, OffloadPolicy::WriteBack { .. }) {
                    self.writeback_pinned[from.index()] -= sources.len();
                }
                let blocks = sources.len();
                match completion.result {
                    Ok(()) => {
                        // The parent of a block may have left every tier while the copy
                        // was in flight: such a copy is an orphan (see `offload`) and
                        // its target goes back unregistered.
                        let mut complete = Vec::with_capacity(sources.len());
                        let mut orphans = Vec::new();
                        for copy in copies_of(&sources, targets) {
                            let parent = copy.identity().parent;
                            if parent.is_none_or(|parent| self.holds_anywhere(parent)) {
                                complete.push(copy);
                            } else {
                                orphans.push(copy);
                            }
                        }
                        self.stats.orphans_not_offloaded += orphans.len() as u64;
                        let orphaned: Vec<SequenceHash> = orphans
                            .iter()
                            .map(|copy| copy.identity().sequence_hash)
                            .collect();
                        drop(orphans);
                        let copies = self.pool_of(to).register_chain(complete);
                        self.stats.offloaded_blocks[to.index()] += blocks as u64;
                        self.outputs
                            .push_back(ManagerOutput::Offloaded { from, to, blocks });
                        if self.offload_policy(to) == OffloadPolicy::WriteThrough {
                            self.offload(to, copies.clone().into_vec(), now);
                        }
                        self.pool_of(to).release(copies);
                        // A written-back block is clean now: it may go first, and the
                        // write-back scan need not look for its copy below.
                        match policy {
                            OffloadPolicy::WriteBack { .. } => self
                                .pool_of(from)
                                .release_cold_checked(sources, |identity| {
                                    !orphaned.contains(&identity.sequence_hash)
                                }),
                            _ => self.pool_of(from).release(sources),
                        }
                    }
                    Err(error) => {
                        self.forget_corrupt(&error, &sources);
                        self.pool_of(from).release(sources);
                        self.stats.offload_failed_blocks += blocks as u64;
                        self.outputs
                            .push_back(ManagerOutput::OffloadFailed { from, to, blocks });
                    }
                }
            }
        }
    }

    /// A transfer whose sources failed their checksum when read: those copies are no
    /// copies. They leave their tier (with `Removed`) so that lookups stop offering them
    /// and the next offload can write a good copy in their place; the hardware names
    /// the tier, not the block, so every source of the transfer goes. Other failures
    /// (an I/O error, a tier going down) leave the sources where they are.
    fn forget_corrupt(&mut self, error: &TransferError, sources: &[ImmutableBlock]) {
        let Some(tier) = sources.first().map(ImmutableBlock::tier) else {
            return;
        };
        if *error != (TransferError::Corrupt { tier }) {
            return;
        }
        let hashes: Vec<SequenceHash> = sources.iter().map(ImmutableBlock::sequence_hash).collect();
        self.forget_corrupt_blocks(tier, &hashes);
    }

    /// Forgets the blocks of `tier` among `hashes` whose bytes failed a check, however
    /// they were read (a transfer, or a driver reading a tier itself, as kvtwin's
    /// connector does): each leaves the tier with a `Removed`, so lookups stop offering
    /// it and the next copy can be written in its place. How many were forgotten.
    pub fn forget_corrupt_blocks(&mut self, tier: Tier, hashes: &[SequenceHash]) -> usize {
        let Some(Some(pool)) = self.pools.get(tier.index()) else {
            return 0;
        };
        let forgotten = pool.invalidate(hashes);
        self.stats.corrupt_blocks_forgotten += forgotten as u64;
        forgotten
    }
}

/// The landed copies of `sources`: each target takes its source's identity
/// (Reset → Complete), ready to register in the target's tier.
fn copies_of(
    sources: &[ImmutableBlock],
    targets: Vec<MutableBlock<Reset>>,
) -> Vec<MutableBlock<Complete>> {
    targets
        .into_iter()
        .zip(sources)
        .map(|(target, source)| target.apply_identity(*source.identity()))
        .collect()
}
