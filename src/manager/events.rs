//! The manager's outputs: finished work ([`Manager::poll_output`]), the per-worker event
//! stream ([`Manager::take_events`]) with its snapshot for a consumer that lost track
//! ([`Manager::publish_snapshot`]), and the next deadline ([`Manager::poll_timeout`]).
//!
//! Invariants: event ids are consecutive from 0 per manager; events of all tiers are
//! numbered in the order they happened (a block stored below before its parent left the
//! device comes before that removal), and a snapshot never reorders events queued
//! before it.
//!
//! Never: publish. The manager holds no sink; the driver drains and forwards.

use super::{Manager, ManagerOutput};
use crate::block::BlockIdentity;
use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use crate::hardware::Hardware;
use crate::ids::{SequenceHash, Timestamp};
use crate::tier::Tier;
use rustc_hash::FxHashSet;

impl<H: Hardware> Manager<H> {
    /// The next finished piece of work, oldest first.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<ManagerOutput> {
        self.outputs.pop_front()
    }

    /// The events of every tier since the last call, numbered for this worker, in the
    /// order they happened.
    #[must_use]
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        self.collect_pool_events();
        std::mem::take(&mut self.events)
    }

    /// Gives back the buffer [`Manager::take_events`] returned, emptied, so that the next
    /// events fill it instead of growing a new one (a simulation settles a worker tens of
    /// thousands of times). Kept only while no newer event is waiting.
    pub fn recycle_events(&mut self, mut buffer: Vec<KvCacheEvent>) {
        if self.events.is_empty() && buffer.capacity() > self.events.capacity() {
            buffer.clear();
            self.events = buffer;
        }
    }

    /// Gives back an event the driver is done with (delivered, not kept), so that its
    /// block list serves a later event instead of a new allocation. Optional: an event
    /// dropped instead costs only that allocation.
    pub fn recycle_event(&mut self, event: KvCacheEvent) {
        self.event_buffers.recycle(event.data);
    }

    /// Moves the pools' events into the manager's stream in the order they happened
    /// across tiers (a block offloaded to host before its parent left the device must be
    /// stored before the parent is removed, or a router would refuse it).
    pub(super) fn collect_pool_events(&mut self) {
        let events = self.counters.latest_stamp();
        if events == self.events_collected {
            return;
        }
        self.events_collected = events;
        // One buffer kept between collections.
        let mut ordered = std::mem::take(&mut self.ordered_events);
        for pool in self.pools.iter().flatten() {
            pool.move_ordered_events_into(&mut ordered, &mut self.event_buffers);
        }
        ordered.sort_by_key(|(stamp, _)| *stamp);
        for (_, data) in ordered.drain(..) {
            self.push_event(data);
        }
        self.ordered_events = ordered;
    }

    pub(super) fn push_event(&mut self, data: KvCacheEventData) {
        let event = KvCacheEvent {
            event_id: self.next_event_id,
            dp_rank: self.config.dp_rank,
            data,
        };
        self.next_event_id += 1;
        self.events.push(event);
    }

    /// When the hardware will next finish something, if it knows.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.hardware.next_deadline()
    }

    /// The id the next event will carry (events so far, counting from 0).
    pub fn next_event_id(&self) -> u64 {
        self.next_event_id
    }

    /// Publishes the registered state of every tier as events, for a consumer that lost
    /// track (a restarted router, or one that saw a gap in the event ids): a `Cleared`,
    /// then a `Stored` per block, parents before children. Blocks that no prefix lookup
    /// can reach (a block of their prefix is in no tier) are left out: a router would
    /// refuse them, and no query could use them. Returns the blocks published.
    pub fn publish_snapshot(&mut self) -> usize {
        // Events already queued keep their place before the snapshot.
        self.collect_pool_events();
        self.push_event(KvCacheEventData::Cleared);
        let blocks = self.reachable_blocks();
        for (identity, tier) in &blocks {
            self.push_event(KvCacheEventData::Stored {
                parent_hash: identity.parent,
                blocks: vec![StoredBlock {
                    block_hash: identity.sequence_hash,
                    tokens_hash: identity.local_hash,
                }],
                tier: *tier,
            });
        }
        blocks.len()
    }

    /// Every registered block a prefix lookup can reach (its whole prefix is registered
    /// in some tier), with its tier, parents before children (by position, then tier,
    /// then hash). A block held in two tiers is listed once per tier.
    pub fn reachable_blocks(&self) -> Vec<(BlockIdentity, Tier)> {
        let mut blocks: Vec<(BlockIdentity, Tier)> = Vec::new();
        for pool in self.pools.iter().flatten() {
            blocks.extend(
                pool.registered_identities()
                    .into_iter()
                    .map(|identity| (identity, pool.tier())),
            );
        }
        blocks.sort_by_key(|(identity, tier)| (identity.position, *tier, identity.sequence_hash));
        let mut reachable: FxHashSet<SequenceHash> = FxHashSet::default();
        blocks.retain(|(identity, _)| {
            let keep = identity
                .parent
                .is_none_or(|parent| reachable.contains(&parent));
            if keep {
                reachable.insert(identity.sequence_hash);
            }
            keep
        });
        blocks
    }
}
