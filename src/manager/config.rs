//! Configuration of a [`super::Manager`]: which tiers exist, how big they are, how blocks
//! move between them.
//!
//! Owns: [`ManagerConfig`], [`TierConfig`], [`OffloadPolicy`], [`OnboardPolicy`] and
//! their validation. Modes are enums, never booleans.
//! Never: build pools (the manager does) or hold runtime state.

use crate::ids::WorkerId;
use crate::pool::{EvictionPolicyKind, PoolConfigError};
use crate::tier::Tier;
use serde::{Deserialize, Serialize};

/// How a tier's registered blocks reach the next lower tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OffloadPolicy {
    /// Never: blocks evicted here are gone.
    #[default]
    None,
    /// Copy every block down as soon as it is registered here.
    WriteThrough,
    /// Copy the coldest cached blocks down when fewer than `low_watermark_blocks` blocks
    /// of this tier are free, so that eviction finds copies already made.
    WriteBack {
        /// Free blocks to keep in reserve.
        low_watermark_blocks: usize,
    },
}

/// Whether a lower-tier prefix hit is always brought back, or only when it is cheaper
/// than recomputing it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnboardPolicy {
    /// Always onboard lower-tier hits.
    Always,
    /// Onboard the prefix of lower-tier hits that minimises transfer plus recompute time
    /// (the hardware's estimates); recompute the rest.
    #[default]
    CostAware,
}

/// One tier of a manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    /// Which tier.
    pub tier: Tier,
    /// Its number of blocks.
    pub capacity_blocks: usize,
    /// Its eviction order.
    #[serde(default)]
    pub eviction: EvictionPolicyKind,
    /// How its blocks reach the next lower present tier.
    #[serde(default)]
    pub offload: OffloadPolicy,
}

/// A manager's configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerConfig {
    /// The worker whose cache this is (stamped on nothing in the core; drivers use it).
    pub worker_id: WorkerId,
    /// Data-parallel rank stamped on every event.
    #[serde(default)]
    pub dp_rank: u32,
    /// Tokens per block, the same in every tier.
    pub block_size_tokens: usize,
    /// Bytes of one block (all layers), from the layout.
    pub bytes_per_block: u64,
    /// The tiers, fastest first; `Device` must be among them.
    pub tiers: Vec<TierConfig>,
    /// When lower-tier hits are onboarded.
    #[serde(default)]
    pub onboard: OnboardPolicy,
    /// Transfers in flight at most (onboards and offloads together); offloads beyond it
    /// are skipped and counted, onboards fail with an error.
    pub max_inflight_transfers: usize,
}

/// A configuration the manager cannot run.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerConfigError {
    /// No `Device` tier.
    #[error("a manager needs a device tier")]
    NoDeviceTier,
    /// Tiers out of order or repeated.
    #[error("tiers must be listed fastest first, each once; {0} is out of place")]
    TierOrder(Tier),
    /// A write-back watermark as large as the tier.
    #[error("{tier}: write-back watermark {watermark} must be below the capacity {capacity}")]
    WatermarkTooHigh {
        /// The tier.
        tier: Tier,
        /// The watermark.
        watermark: usize,
        /// The tier's capacity.
        capacity: usize,
    },
    /// The lowest tier cannot offload.
    #[error("{0} is the lowest tier: it has nowhere to offload to")]
    NoLowerTier(Tier),
    /// A pool could not be built.
    #[error("{tier} pool: {source}")]
    Pool {
        /// The tier.
        tier: Tier,
        /// Why.
        source: PoolConfigError,
    },
    /// Zero transfers allowed in flight.
    #[error("max_inflight_transfers must be at least 1")]
    NoTransfers,
}

impl ManagerConfig {
    /// Checks everything that does not need the pools built.
    pub fn validate(&self) -> Result<(), ManagerConfigError> {
        if self.tiers.first().map(|t| t.tier) != Some(Tier::Device) {
            return Err(ManagerConfigError::NoDeviceTier);
        }
        for pair in self.tiers.windows(2) {
            if pair[1].tier <= pair[0].tier {
                return Err(ManagerConfigError::TierOrder(pair[1].tier));
            }
        }
        if self.max_inflight_transfers == 0 {
            return Err(ManagerConfigError::NoTransfers);
        }
        let last = self.tiers.len() - 1;
        for (index, tier) in self.tiers.iter().enumerate() {
            if index == last && tier.offload != OffloadPolicy::None {
                return Err(ManagerConfigError::NoLowerTier(tier.tier));
            }
            if let OffloadPolicy::WriteBack {
                low_watermark_blocks,
            } = tier.offload
            {
                if low_watermark_blocks >= tier.capacity_blocks {
                    return Err(ManagerConfigError::WatermarkTooHigh {
                        tier: tier.tier,
                        watermark: low_watermark_blocks,
                        capacity: tier.capacity_blocks,
                    });
                }
            }
        }
        Ok(())
    }
}
