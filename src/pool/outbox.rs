//! A pool's queue of events, and the buffers its events' block lists are made from.
//!
//! Owns: [`Outbox`] (the queued events, each with its place in the order of events of
//! the pools sharing one manager's counters; a block that continues the previous event
//! extends it) and [`EventBuffers`] (emptied block lists handed back by whoever consumed
//! the events, for the next ones).
//! Never: stamp events (the pool does, see `PoolInner::next_stamp`) or decide when one
//! is due.
//!
//! Why the buffers: every event carries a list of blocks, and a simulation makes and
//! drops hundreds of thousands of them (an allocation and a free each, ~6 % of
//! `kvtwin bench sim`'s instructions with the frees, issue 33). A driver that is done
//! with an event gives it back ([`crate::manager::Manager::recycle_event`]), and its
//! list comes back round to the pool at the next collection.

use crate::block::BlockIdentity;
use crate::events::{KvCacheEventData, StoredBlock};
use crate::ids::SequenceHash;
use crate::tier::Tier;

/// Room a new event's list starts with: events grow a block at a time, and growing from
/// one reallocated three times on the way to a chain's usual length.
const EVENT_START_CAPACITY: usize = 8;

/// Emptied lists a pool keeps of each kind, and a manager's [`EventBuffers`] too.
const SPARE_LISTS: usize = 64;

/// A list longer than this is not kept for reuse: one long event must not pin its
/// memory for the rest of a run.
const LARGEST_KEPT_LIST: usize = 256;

/// Emptied event block lists, of both kinds, bounded.
#[derive(Debug, Default)]
pub struct EventBuffers {
    stored: Vec<Vec<StoredBlock>>,
    removed: Vec<Vec<SequenceHash>>,
}

impl EventBuffers {
    /// Keeps the block list of `data`, emptied, if there is room and it is not long.
    pub fn recycle(&mut self, data: KvCacheEventData) {
        match data {
            KvCacheEventData::Stored { blocks, .. } => keep(&mut self.stored, blocks),
            KvCacheEventData::Removed { block_hashes, .. } => keep(&mut self.removed, block_hashes),
            KvCacheEventData::Cleared => {}
        }
    }

    /// Lists held, of both kinds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.stored.len() + self.removed.len()
    }
}

fn keep<T>(spares: &mut Vec<Vec<T>>, mut list: Vec<T>) {
    if spares.len() < SPARE_LISTS && list.capacity() <= LARGEST_KEPT_LIST {
        list.clear();
        spares.push(list);
    }
}

/// A list from `spares`, or a new one.
fn list<T>(spares: &mut Vec<Vec<T>>) -> Vec<T> {
    spares
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(EVENT_START_CAPACITY))
}

/// A pool's queued events with their stamps, and its spare block lists.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    queue: Vec<(u64, KvCacheEventData)>,
    spares: EventBuffers,
}

impl Outbox {
    /// Queues the removal of `hash` from `tier` at `stamp`, extending the previous
    /// Removed event when no other event came in between.
    pub(super) fn push_removed(&mut self, stamp: u64, hash: SequenceHash, tier: Tier) {
        if let Some((last, KvCacheEventData::Removed { block_hashes, .. })) = self.queue.last_mut()
        {
            if *last + 1 == stamp {
                block_hashes.push(hash);
                *last = stamp;
                return;
            }
        }
        let mut block_hashes = list(&mut self.spares.removed);
        block_hashes.push(hash);
        self.push_in_place(|| (stamp, KvCacheEventData::Removed { block_hashes, tier }));
    }

    /// Queues `identity` stored in `tier` at `stamp`, extending the previous Stored
    /// event when the block continues its chain and no other event came in between:
    /// the router sees one event per chain, as from Dynamo's engines.
    pub(super) fn push_stored(&mut self, stamp: u64, identity: &BlockIdentity, tier: Tier) {
        let block = StoredBlock {
            block_hash: identity.sequence_hash,
            tokens_hash: identity.local_hash,
        };
        if let Some((last, KvCacheEventData::Stored { blocks, .. })) = self.queue.last_mut() {
            if *last + 1 == stamp
                && identity.parent.is_some()
                && blocks.last().map(|b| b.block_hash) == identity.parent
            {
                blocks.push(block);
                *last = stamp;
                return;
            }
        }
        let mut blocks = list(&mut self.spares.stored);
        blocks.push(block);
        let parent_hash = identity.parent;
        self.push_in_place(|| {
            (
                stamp,
                KvCacheEventData::Stored {
                    parent_hash,
                    blocks,
                    tier,
                },
            )
        });
    }

    /// `queue.push(event())`, the room made before the event is built so that it is
    /// written where it goes, not built on the stack and copied.
    #[inline(always)]
    fn push_in_place(&mut self, event: impl FnOnce() -> (u64, KvCacheEventData)) {
        self.queue.reserve(1);
        let len = self.queue.len();
        // SAFETY: `reserve(1)` left room for one more element past `len`, which is written
        // before the length covers it.
        unsafe {
            self.queue.as_mut_ptr().add(len).write(event());
            self.queue.set_len(len + 1);
        }
    }

    /// Moves the queued events onto the end of `out` (the queue keeps its allocation),
    /// and tops the spare lists up from `buffers`.
    pub(super) fn move_into(
        &mut self,
        out: &mut Vec<(u64, KvCacheEventData)>,
        buffers: &mut EventBuffers,
    ) {
        out.append(&mut self.queue);
        top_up(&mut self.spares.stored, &mut buffers.stored);
        top_up(&mut self.spares.removed, &mut buffers.removed);
    }

    /// Takes the queued events, oldest first.
    pub(super) fn take(&mut self) -> Vec<(u64, KvCacheEventData)> {
        std::mem::take(&mut self.queue)
    }

    /// Events queued.
    pub(super) fn len(&self) -> usize {
        self.queue.len()
    }
}

fn top_up<T>(spares: &mut Vec<Vec<T>>, from: &mut Vec<Vec<T>>) {
    while spares.len() < SPARE_LISTS {
        match from.pop() {
            Some(list) => spares.push(list),
            None => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::LocalBlockHash;

    fn chain(n: u64) -> Vec<BlockIdentity> {
        let locals: Vec<LocalBlockHash> = (0..n).map(LocalBlockHash::new).collect();
        BlockIdentity::chain(&locals)
    }

    #[test]
    fn recycled_lists_come_back_empty_and_bounded() {
        let identities = chain(3);
        let mut outbox = Outbox::default();
        outbox.push_stored(1, &identities[0], Tier::Device);
        outbox.push_stored(2, &identities[1], Tier::Device);
        outbox.push_removed(3, identities[2].sequence_hash, Tier::Device);
        let mut events = Vec::new();
        let mut buffers = EventBuffers::default();
        outbox.move_into(&mut events, &mut buffers);
        assert_eq!(events.len(), 2, "the second block extends the first event");
        let list_at = |data: &KvCacheEventData| match data {
            KvCacheEventData::Stored { blocks, .. } => blocks.as_ptr() as usize,
            KvCacheEventData::Removed { block_hashes, .. } => block_hashes.as_ptr() as usize,
            KvCacheEventData::Cleared => 0,
        };
        let stored_list = list_at(&events[0].1);
        for (_, data) in events.drain(..) {
            buffers.recycle(data);
        }
        assert_eq!(buffers.len(), 2);
        // The next collection hands them to the pool; its next event uses one, empty.
        outbox.move_into(&mut events, &mut buffers);
        assert_eq!(buffers.len(), 0);
        outbox.push_stored(4, &identities[0], Tier::Host);
        outbox.move_into(&mut events, &mut buffers);
        let KvCacheEventData::Stored { blocks, tier, .. } = &events[0].1 else {
            panic!("{:?}", events[0]);
        };
        assert_eq!((blocks.len(), *tier), (1, Tier::Host));
        assert_eq!(list_at(&events[0].1), stored_list, "the same list, reused");
        // Bounded: lists past the bound, and long lists, are let go.
        for _ in 0..2 * SPARE_LISTS {
            buffers.recycle(KvCacheEventData::Removed {
                block_hashes: Vec::with_capacity(1),
                tier: Tier::Device,
            });
        }
        buffers.recycle(KvCacheEventData::Stored {
            parent_hash: None,
            blocks: Vec::with_capacity(LARGEST_KEPT_LIST + 1),
            tier: Tier::Device,
        });
        assert_eq!(buffers.len(), SPARE_LISTS);
    }
}
