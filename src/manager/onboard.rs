//! Prefix lookups and onboarding: [`Manager::lookup`] answers with a [`LookupPlan`] (device
//! prefix, lower-tier hits worth onboarding, blocks to compute), and
//! [`Manager::start_onboard`] copies the planned lower-tier blocks up to device, one
//! transfer per source tier, reporting in one [`ManagerOutput::OnboardComplete`] per
//! request once every segment has landed or failed.
//!
//! Invariants: a request has at most one onboarding in flight; an onboarding's segments
//! are in prefix order, and only the prefix before the first failed segment is handed to
//! the request (later copies stay cached on device, unreferenced by it).
//!
//! Never: touch a tier that is down (lookups skip it, and a stale plan naming it is
//! refused as the hardware would refuse it), or read a clock.

use super::transfers::InFlight;
use super::{LookupPlan, Manager, ManagerOutput, OnboardPolicy};
use crate::block::Reset;
use crate::hardware::{Hardware, SubmitError, TransferRequest};
use crate::ids::{RequestId, SequenceHash, Timestamp};
use crate::pool::{AllocError, BlockChain, BlockPool, ImmutableBlock, MutableBlock};
use crate::tier::Tier;
use std::time::Duration;

/// `start_onboard` could not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OnboardError {
    /// Not enough device blocks for the onboarded copies.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The hardware refused the first transfer.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Too many transfers in flight.
    #[error("{in_flight} transfers in flight, at most {max}")]
    TooManyTransfers {
        /// In flight now.
        in_flight: usize,
        /// The configured bound.
        max: usize,
    },
    /// The request already has an onboarding in flight.
    #[error("request {0:?} is already onboarding")]
    AlreadyOnboarding(RequestId),
}

/// Where one source-tier run of an onboarding stands.
#[derive(Debug)]
pub(super) enum Segment {
    Pending,
    Done(BlockChain),
    Failed(usize),
}

/// The segments of one request's onboarding, in prefix order.
#[derive(Debug)]
pub(super) struct OnboardJob {
    segments: Vec<Segment>,
    pending: usize,
}

impl<H: Hardware> Manager<H> {
    /// Looks `hashes` (one per full block, in order) up: the device prefix, then the
    /// longest continuation found in lower tiers (each block from the fastest tier that
    /// holds it), cut where onboarding stops paying off (`OnboardPolicy::CostAware`).
    /// The plan references every block it names.
    pub fn lookup(&mut self, hashes: &[SequenceHash], now: Timestamp) -> LookupPlan {
        self.tick(now);
        let device = self.device().match_prefix(hashes);
        let on_device = device.len();
        // A tier that is down holds nothing, and is not asked.
        let lower: Vec<BlockPool> = self
            .present_tiers()
            .skip(1)
            .filter(|t| !self.down[t.index()])
            .map(|t| self.pool_of(t))
            .collect();
        let mut found_tiers: Vec<Tier> = Vec::new();
        for hash in &hashes[on_device..] {
            match lower.iter().find(|pool| pool.contains(*hash)) {
                Some(pool) => found_tiers.push(pool.tier()),
                None => break,
            }
        }
        let onboard_len = match self.config.onboard {
            OnboardPolicy::Always => found_tiers.len(),
            OnboardPolicy::CostAware => self.cheapest_cut(&found_tiers),
        };
        let mut onboard = Vec::with_capacity(onboard_len);
        for (hash, tier) in hashes[on_device..].iter().zip(&found_tiers[..onboard_len]) {
            match self.pool_of(*tier).get(*hash) {
                Some(block) => onboard.push(block),
                None => break,
            }
        }
        let stats = &mut self.stats;
        stats.lookups += 1;
        stats.lookup_blocks += hashes.len() as u64;
        stats.device_hit_blocks += on_device as u64;
        for block in &onboard {
            stats.onboard_planned_blocks[block.tier().index()] += 1;
        }
        let recomputed_hits = found_tiers.len() - onboard.len();
        stats.recomputed_hit_blocks += recomputed_hits as u64;
        LookupPlan {
            device,
            onboard,
            recomputed_hits,
            query_blocks: hashes.len(),
        }
    }

    /// How many of the lower-tier hits (tiers in prefix order) to onboard: the cut that
    /// minimises estimated transfer time of the onboarded blocks plus recompute time of
    /// the rest. Cuts are tried at tier-run boundaries (the cost is linear within a run);
    /// ties go to onboarding more, which saves compute for other requests.
    fn cheapest_cut(&self, found_tiers: &[Tier]) -> usize {
        let total = found_tiers.len();
        let recompute = |blocks: usize| self.hardware.estimate_recompute(blocks);
        let mut best = (recompute(total), 0);
        let mut transfer = Duration::ZERO;
        let mut start = 0;
        while start < total {
            let tier = found_tiers[start];
            let run = found_tiers[start..]
                .iter()
                .take_while(|t| **t == tier)
                .count();
            let bytes = self.config.bytes_per_block.saturating_mul(run as u64);
            transfer += self.hardware.estimate_transfer(tier, Tier::Device, bytes);
            start += run;
            let cost = transfer + recompute(total - start);
            if cost <= best.0 {
                best = (cost, start);
            }
        }
        best.1
    }

    /// Starts bringing the plan's lower-tier blocks to device: allocates device blocks
    /// and submits one transfer per source tier. The plan keeps its device blocks; the
    /// onboarded ones arrive in [`ManagerOutput::OnboardComplete`] for `request`.
    /// Returns the number of transfers started (0 when there is nothing to onboard, and
    /// then no output follows). On error nothing was started and the plan is unchanged.
    pub fn start_onboard(
        &mut self,
        request: RequestId,
        plan: &mut LookupPlan,
        now: Timestamp,
    ) -> Result<usize, OnboardError> {
        self.tick(now);
        if plan.onboard.is_empty() {
            return Ok(0);
        }
        if self.onboarding.contains_key(&request) {
            return Err(OnboardError::AlreadyOnboarding(request));
        }
        let mut runs: Vec<(Tier, usize)> = Vec::new();
        for block in &plan.onboard {
            match runs.last_mut() {
                Some((tier, len)) if *tier == block.tier() => *len += 1,
                _ => runs.push((block.tier(), 1)),
            }
        }
        let max = self.config.max_inflight_transfers;
        if self.in_flight.len() + runs.len() > max {
            return Err(OnboardError::TooManyTransfers {
                in_flight: self.in_flight.len(),
                max,
            });
        }
        let mut targets = self.device().allocate(plan.onboard.len())?;
        let mut sources = std::mem::take(&mut plan.onboard);
        let mut job = OnboardJob {
            segments: Vec::with_capacity(runs.len()),
            pending: 0,
        };
        let mut first_error = None;
        for (segment, (tier, len)) in runs.into_iter().enumerate() {
            let run_sources: Vec<ImmutableBlock> = sources.drain(..len).collect();
            let run_targets: Vec<MutableBlock<Reset>> = targets.drain(..len).collect();
            let request_bytes = self.config.bytes_per_block.saturating_mul(len as u64);
            let transfer = TransferRequest {
                src_tier: tier,
                src_blocks: run_sources.iter().map(ImmutableBlock::block_id).collect(),
                dst_tier: Tier::Device,
                dst_blocks: run_targets.iter().map(MutableBlock::block_id).collect(),
                bytes: request_bytes,
            };
            // A plan made before its tier failed names blocks that are gone: refused
            // as the hardware would refuse them.
            let submitted = if self.down[tier.index()] {
                Err(SubmitError::TierUnavailable(tier))
            } else {
                self.hardware.submit(transfer, now)
            };
            match submitted {
                Ok(id) => {
                    self.count_submit(request_bytes);
                    job.segments.push(Segment::Pending);
                    job.pending += 1;
                    let flight = InFlight::Onboard {
                        request,
                        segment,
                        sources: run_sources,
                        targets: run_targets,
                    };
                    self.in_flight.insert(id, flight);
                }
                Err(error) => {
                    if segment == 0 {
                        // Nothing started: give the plan back as it was.
                        plan.onboard = run_sources;
                        plan.onboard.append(&mut sources);
                        return Err(error.into());
                    }
                    first_error.get_or_insert(error);
                    self.stats.onboard_failed_blocks += len as u64;
                    job.segments.push(Segment::Failed(len));
                }
            }
        }
        self.onboarding.insert(request, job);
        self.pump_writeback(now);
        Ok(self.onboarding.get(&request).map_or(0, |job| job.pending))
    }

    pub(super) fn finish_segment(&mut self, request: RequestId, segment: usize, outcome: Segment) {
        let Some(job) = self.onboarding.get_mut(&request) else {
            return;
        };
        job.segments[segment] = outcome;
        job.pending -= 1;
        if job.pending > 0 {
            return;
        }
        let Some(job) = self.onboarding.remove(&request) else {
            return;
        };
        let mut blocks = BlockChain::new();
        let mut failed_blocks = 0;
        for segment in job.segments {
            match segment {
                Segment::Done(done) if failed_blocks == 0 => blocks.append(done),
                // After a hole the prefix is broken: later copies stay cached on device
                // (they are valid) but are not part of this request's prefix.
                Segment::Done(done) => failed_blocks += done.len(),
                Segment::Failed(len) => failed_blocks += len,
                Segment::Pending => unreachable!("job finished with a pending segment"),
            }
        }
        self.outputs.push_back(ManagerOutput::OnboardComplete {
            request,
            blocks,
            failed_blocks,
        });
    }
}
