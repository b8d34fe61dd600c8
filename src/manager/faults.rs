//! Failure and reset of tiers: [`Manager::fail_tier`] and [`Manager::restore_tier`] (a
//! lower tier's storage gone and back, empty), and [`Manager::reset_cache`] (forget every
//! cached block).
//!
//! Invariants: while a tier is down nothing is copied to it or onboarded from it, and
//! lookups do not look there; failing a tier forgets every block it held with a
//! `Removed` event, so a router's view stays exact. The device tier never fails alone.
//!
//! Never: invent completions for transfers that do not touch the failed tier, or reset a
//! cache whose blocks are referenced or in flight.

use super::Manager;
use crate::events::KvCacheEventData;
use crate::hardware::{Completion, Hardware, TransferError};
use crate::ids::{Timestamp, TransferId};
use crate::pool::ResetError;
use crate::tier::Tier;
use serde::{Deserialize, Serialize};

/// `reset_cache` refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClearError {
    /// A pool still has referenced registered blocks.
    #[error("{tier}: {source}")]
    InUse {
        /// The tier.
        tier: Tier,
        /// The pool's refusal.
        source: ResetError,
    },
    /// Transfers are still in flight.
    #[error("{0} transfers in flight")]
    TransfersInFlight(usize),
}

/// `fail_tier` or `restore_tier` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TierFaultError {
    /// The manager has no such tier.
    #[error("tier {0} is not configured")]
    NotPresent(Tier),
    /// The device tier does not fail on its own: a worker whose GPU fails has crashed.
    #[error("the device tier cannot fail alone")]
    Device,
}

/// What [`Manager::fail_tier`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierFailure {
    /// Registered blocks the tier lost, each announced in a `Removed` event.
    pub blocks_lost: usize,
    /// Transfers to or from the tier that were still in flight here, failed through the
    /// ordinary failure path (none when the hardware already reported them failed).
    pub transfers_failed: usize,
}

impl<H: Hardware> Manager<H> {
    /// Whether `tier` failed and has not come back.
    pub fn tier_is_down(&self, tier: Tier) -> bool {
        self.down[tier.index()]
    }

    fn check_faultable(&self, tier: Tier) -> Result<(), TierFaultError> {
        if tier == Tier::Device {
            return Err(TierFaultError::Device);
        }
        if self.pools[tier.index()].is_none() {
            return Err(TierFaultError::NotPresent(tier));
        }
        Ok(())
    }

    /// The storage of `tier` (host, disk or remote) is gone, as when an SSD fails: up →
    /// down. Transfers to or from it still in flight fail through the same path as a
    /// transfer the hardware reports failed (an onboard's blocks are then to be
    /// computed; an offload's sources stay where they were); every block registered in
    /// it is forgotten with a `Removed` event, so a router's view stays exact. Until
    /// [`Manager::restore_tier`], lookups do not look there, nothing is copied there,
    /// and a plan made before naming its blocks is refused by `start_onboard`. Failing
    /// a tier that is already down loses nothing more.
    ///
    /// A driver should first let the hardware report its own failed transfers (and
    /// call [`Manager::handle_completions`]); those still in flight are failed here, and
    /// a later completion of theirs is ignored.
    pub fn fail_tier(&mut self, tier: Tier, now: Timestamp) -> Result<TierFailure, TierFaultError> {
        self.tick(now);
        self.check_faultable(tier)?;
        self.down[tier.index()] = true;
        let touching: Vec<TransferId> = self
            .in_flight
            .iter()
            .filter(|(_, flight)| {
                let (src, dst) = flight.tiers();
                src == tier || dst == tier
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &touching {
            let result = Err(TransferError::Failed { tier });
            self.handle_completion(Completion { id: *id, result }, now);
        }
        let blocks_lost = self.pool_of(tier).invalidate_all();
        Ok(TierFailure {
            blocks_lost,
            transfers_failed: touching.len(),
        })
    }

    /// A failed tier is back, empty: down → up. Offloads go to it again (write-back
    /// catches up on what the tier above holds) and lookups find what lands there.
    pub fn restore_tier(&mut self, tier: Tier, now: Timestamp) -> Result<(), TierFaultError> {
        self.tick(now);
        self.check_faultable(tier)?;
        if !std::mem::replace(&mut self.down[tier.index()], false) {
            return Ok(());
        }
        // What the pumps last saw was with the tier down.
        self.writeback_seen = [None; 4];
        self.writeback_checked_against = [None; 4];
        self.pump_writeback(now);
        Ok(())
    }

    /// Forgets every cached block of every tier and emits one `Cleared`. Refuses while
    /// transfers are in flight or registered blocks are referenced.
    pub fn reset_cache(&mut self, now: Timestamp) -> Result<(), ClearError> {
        self.tick(now);
        if !self.in_flight.is_empty() {
            return Err(ClearError::TransfersInFlight(self.in_flight.len()));
        }
        for pool in self.pools.iter().flatten() {
            let referenced = pool.referenced_registered();
            if referenced > 0 {
                return Err(ClearError::InUse {
                    tier: pool.tier(),
                    source: ResetError::InUse { referenced },
                });
            }
        }
        // Earlier events keep their place before the Cleared.
        self.collect_pool_events();
        for pool in self.pools.iter().flatten() {
            pool.reset_cache().map_err(|source| ClearError::InUse {
                tier: pool.tier(),
                source,
            })?;
            // The per-block removals are implied by Cleared.
            let _ = pool.take_events();
        }
        self.push_event(KvCacheEventData::Cleared);
        Ok(())
    }
}
