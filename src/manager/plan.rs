//! What a prefix lookup found, and what the manager reports back.
//!
//! Owns: [`LookupPlan`] (device hits, lower-tier blocks to onboard, blocks to compute) and
//! [`ManagerOutput`]. A plan holds references to every block it names, so none of them can
//! be evicted between the lookup and the onboarding.
//! Never: start transfers (the manager does).

use crate::ids::RequestId;
use crate::pool::{BlockChain, ImmutableBlock};
use crate::tier::Tier;

/// The answer to a prefix lookup: the query's blocks split, in prefix order, into blocks
/// already on device, blocks to onboard from lower tiers, and blocks to compute.
#[derive(Debug, Default)]
pub struct LookupPlan {
    pub(super) device: BlockChain,
    pub(super) onboard: Vec<ImmutableBlock>,
    pub(super) recomputed_hits: usize,
    pub(super) query_blocks: usize,
}

impl LookupPlan {
    /// Blocks already on device, leading the query.
    pub fn device_blocks(&self) -> &BlockChain {
        &self.device
    }

    /// Lower-tier blocks to onboard, following the device blocks (each knows its tier).
    pub fn onboard_blocks(&self) -> &[ImmutableBlock] {
        &self.onboard
    }

    /// Blocks to onboard from `tier`.
    pub fn onboard_count(&self, tier: Tier) -> usize {
        self.onboard.iter().filter(|b| b.tier() == tier).count()
    }

    /// Lower-tier hits the cost model chose to recompute instead of onboarding.
    pub fn recomputed_hits(&self) -> usize {
        self.recomputed_hits
    }

    /// Full blocks of the query that must be computed (after device and onboarded ones).
    pub fn blocks_to_compute(&self) -> usize {
        self.query_blocks - self.device.len() - self.onboard.len()
    }

    /// Full blocks in the query.
    pub fn query_blocks(&self) -> usize {
        self.query_blocks
    }

    /// Gives up on onboarding: those blocks will be computed. Returns the device blocks.
    pub fn into_device_blocks(mut self) -> BlockChain {
        std::mem::take(&mut self.device)
    }
}

impl Drop for LookupPlan {
    /// Lets go of the blocks leaf first (onboard blocks, then device blocks, each from the
    /// end), so that among them the leaves are evicted first.
    fn drop(&mut self) {
        // The onboard blocks may come from several tiers: one by one, deepest first.
        while let Some(block) = self.onboard.pop() {
            drop(block);
        }
        drop(std::mem::take(&mut self.device));
    }
}

/// Something the manager finished, drained with `Manager::poll_output`.
#[derive(Debug)]
#[must_use]
pub enum ManagerOutput {
    /// Every onboarding transfer of `request` ended.
    OnboardComplete {
        /// The request.
        request: RequestId,
        /// The onboarded device blocks, in prefix order: the longest run that succeeded.
        blocks: BlockChain,
        /// Blocks of the plan that did not arrive (and must be computed).
        failed_blocks: usize,
    },
    /// Blocks were copied down a tier.
    Offloaded {
        /// Source tier.
        from: Tier,
        /// Destination tier.
        to: Tier,
        /// Blocks copied and registered there.
        blocks: usize,
    },
    /// An offload transfer failed; its blocks were not copied.
    OffloadFailed {
        /// Source tier.
        from: Tier,
        /// Destination tier.
        to: Tier,
        /// Blocks lost to the failure.
        blocks: usize,
    },
}
