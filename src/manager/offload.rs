//! Computed blocks and their way down: the inputs that change what the device holds
//! ([`Manager::allocate`], [`Manager::register`], [`Manager::set_phase`]) and the copies
//! down they cause, write-through on register or write-back ahead of eviction (the
//! write-back pump).
//!
//! Invariants: a block is never copied into a tier twice at once (`offloading`); a block
//! whose parent is in no tier is never copied (no lookup could reach it, and a router
//! would refuse its `Stored`); a write-back tier's blocks being copied are counted in
//! `writeback_pinned` until their transfer completes.
//!
//! Never: wait for room. A copy that finds its destination full, down, or the transfer
//! bound reached is skipped and counted, never queued.

use super::transfers::InFlight;
use super::{Manager, OffloadPolicy, TierConfig};
use crate::block::{Complete, Reset};
use crate::hardware::{Hardware, TransferRequest};
use crate::ids::{SequenceHash, Timestamp};
use crate::phase::Phase;
use crate::pool::{AllocError, BlockChain, ImmutableBlock, MutableBlock};
use crate::tier::Tier;

/// What [`Manager::copy_down`] may assume of its sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sources {
    /// Nothing: each is looked up below, among the copies on their way, and its parent
    /// in every tier.
    Unchecked,
    /// The write-back scan found each missing below, not on its way, and its parent held
    /// somewhere, and nothing changed the pools since but pins: only the parent check
    /// can go stale, and only once a target's allocation evicts a block below.
    CheckedBeforeAllocating,
}

impl<H: Hardware> Manager<H> {
    /// Takes `count` device blocks in state Reset for blocks to compute (evicting cached
    /// blocks as needed), then tops up write-back.
    pub fn allocate(
        &mut self,
        count: usize,
        now: Timestamp,
    ) -> Result<Vec<MutableBlock<Reset>>, AllocError> {
        self.tick(now);
        let blocks = self.device().allocate(count)?;
        self.pump_writeback(now);
        Ok(blocks)
    }

    /// Registers computed device blocks (a chain, parent first) and, if the device tier
    /// writes through, starts copying them down.
    pub fn register(&mut self, blocks: Vec<MutableBlock<Complete>>, now: Timestamp) -> BlockChain {
        self.tick(now);
        assert!(
            blocks.iter().all(|b| b.tier() == Tier::Device),
            "register takes device blocks"
        );
        let registered = self.device().register_chain(blocks);
        if self.offload_policy(Tier::Device) == OffloadPolicy::WriteThrough {
            self.offload(Tier::Device, registered.clone().into_vec(), now);
        }
        registered
    }

    /// Tags device blocks with `phase` (for example `ThinkComplete` when a request leaves
    /// its reasoning phase); the priority policy evicts and writes back such blocks first.
    /// Returns how many were found.
    pub fn set_phase(&mut self, hashes: &[SequenceHash], phase: Phase, now: Timestamp) -> usize {
        self.tick(now);
        let found = self.device().set_phase(hashes, phase);
        self.pump_writeback(now);
        found
    }

    /// Copies `sources` (blocks of `from`) to the next lower tier, skipping blocks already
    /// there or already on their way. Blocks that find no room are skipped and counted.
    pub(super) fn offload(&mut self, from: Tier, sources: Vec<ImmutableBlock>, now: Timestamp) {
        self.copy_down(from, sources, Sources::Unchecked, now);
    }

    /// [`Manager::offload`], told whether the sources were checked already.
    fn copy_down(
        &mut self,
        from: Tier,
        sources: Vec<ImmutableBlock>,
        checked: Sources,
        now: Timestamp,
    ) {
        let Some(to) = self.lower_tier(from) else {
            return;
        };
        if self.down[to.index()] || self.down[from.index()] {
            self.stats.offload_skipped_blocks += sources.len() as u64;
            return;
        }
        let policy = self.offload_policy(from);
        let dst = self.pool_of(to);
        let mut kept_sources = Vec::with_capacity(sources.len());
        let mut targets = Vec::with_capacity(sources.len());
        let mut skipped = 0u64;
        // Only an eviction (a Removed event) can take a parent out of every tier while
        // the targets are allocated below; until one, checked sources stay as checked.
        let events_at_start = self.counters.latest_stamp();
        let unchecked = checked == Sources::Unchecked;
        for source in sources {
            let hash = source.sequence_hash();
            if unchecked && (dst.contains(hash) || self.offloading.contains(&(to, hash))) {
                continue;
            }
            let parents_may_have_left =
                unchecked || self.counters.latest_stamp() != events_at_start;
            // A block whose parent left every tier (the parent was copied down, evicted
            // from the device first as the colder copy, then evicted below) is
            // unreachable: copying it would waste the lower tier.
            if parents_may_have_left
                && source
                    .identity()
                    .parent
                    .is_some_and(|parent| !self.holds_anywhere(parent))
            {
                self.stats.orphans_not_offloaded += 1;
                continue;
            }
            if self.in_flight.len() >= self.config.max_inflight_transfers {
                skipped += 1;
                continue;
            }
            match dst.allocate_one() {
                Ok(target) => {
                    targets.push(target);
                    kept_sources.push(source);
                }
                Err(_) => skipped += 1,
            }
        }
        self.stats.offload_skipped_blocks += skipped;
        if kept_sources.is_empty() {
            return;
        }
        let bytes = self
            .config
            .bytes_per_block
            .saturating_mul(kept_sources.len() as u64);
        let transfer = TransferRequest {
            src_tier: from,
            src_blocks: kept_sources.iter().map(ImmutableBlock::block_id).collect(),
            dst_tier: to,
            dst_blocks: targets.iter().map(MutableBlock::block_id).collect(),
            bytes,
        };
        match self.hardware.submit(transfer, now) {
            Ok(id) => {
                self.count_submit(bytes);
                for source in &kept_sources {
                    self.offloading.insert((to, source.sequence_hash()));
                }
                if matches!(policy, OffloadPolicy::WriteBack { .. }) {
                    self.writeback_pinned[from.index()] += kept_sources.len();
                }
                self.in_flight.insert(
                    id,
                    InFlight::Offload {
                        sources: kept_sources,
                        targets,
                        policy,
                    },
                );
            }
            Err(_) => self.stats.offload_skipped_blocks += kept_sources.len() as u64,
        }
    }

    /// For every write-back tier: make sure the blocks the next allocations would evict
    /// are already copied down. Allocations take free blocks first, then the coldest
    /// cached ones, so with `free` free blocks and a watermark `w`, the coldest
    /// `w - free` cached blocks (less those already being copied) must be copied.
    pub(super) fn pump_writeback(&mut self, now: Timestamp) {
        // By index: the loop changes the manager, and a list of the tiers made first
        // was an allocation at every call.
        for index in 0..self.config.tiers.len() {
            let (tier, watermark) = match self.config.tiers[index] {
                TierConfig {
                    tier,
                    offload:
                        OffloadPolicy::WriteBack {
                            low_watermark_blocks,
                        },
                    ..
                } => (tier, low_watermark_blocks),
                _ => continue,
            };
            let Some(to) = self.lower_tier(tier) else {
                continue;
            };
            if self.down[to.index()] || self.down[tier.index()] {
                // Nothing to copy to: the tier evicts without copying until it is back.
                continue;
            }
            // The coldest blocks and which of them the lower tier has change only when
            // the pools do; unchanged since a look that found nothing to do, skip it (a
            // full device with everything already copied would rescan every call).
            let changes = self.counters.version();
            if self.writeback_seen[tier.index()] == Some(changes) {
                continue;
            }
            let pool = self.pool_of(tier);
            let dst = self.pool_of(to);
            let counts = pool.counts();
            let need = watermark.saturating_sub(counts.free + self.writeback_pinned[tier.index()]);
            if need == 0 {
                self.writeback_seen[tier.index()] = Some(changes);
                continue;
            }
            if self.in_flight.len() >= self.config.max_inflight_transfers {
                // No room for a transfer: a completion (which changes the pools) makes
                // some, and the next call looks again.
                continue;
            }
            // Only blocks that `offload` will copy are pinned: a pinned block that went
            // back would move to the hot end of its eviction order, and a scan must not
            // reorder the cache it is looking at.
            // The coldest blocks seen with a copy below (or just copied there) are not
            // looked up again until the lower tier loses one of them.
            let removals = dst.removals();
            match self.writeback_checked_against[tier.index()] {
                Some((below, seen)) if below == to && seen == removals => {}
                Some((below, seen)) if below == to => match dst.removed_since(seen) {
                    Some(removed) => pool.forget_checked_if_any(&removed),
                    None => pool.forget_checked(),
                },
                _ => pool.forget_checked(),
            }
            self.writeback_checked_against[tier.index()] = Some((to, removals));
            let mut coldest =
                pool.coldest_unchecked(need, |identity| dst.contains(identity.sequence_hash));
            coldest.retain(|identity| {
                !self.offloading.contains(&(to, identity.sequence_hash))
                    && identity
                        .parent
                        .is_none_or(|parent| self.holds_anywhere(parent))
            });
            let candidates = pool.pin_all(coldest.iter().map(|identity| identity.sequence_hash));
            if candidates.is_empty() {
                self.writeback_seen[tier.index()] = Some(changes);
            } else {
                self.writeback_seen[tier.index()] = None;
                self.copy_down(tier, candidates, Sources::CheckedBeforeAllocating, now);
            }
        }
    }
}
