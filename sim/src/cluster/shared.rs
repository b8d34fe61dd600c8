//! The cluster's side of the shared tier ([`crate::shared`]): which request reads what,
//! and when a read lands.
//!
//! Owns: the reads of requests (a request whose prefix continues in the store past what
//! its worker holds waits in `State::Fetching` for those blocks, keeping its place in
//! the prefill queue, then prefills the rest), the writes of what workers register on their devices, the store's wakeups,
//! and what the router is told of the store (the prefix it holds of each request, at
//! routing time: the store's own events reach the router at once and are never lost,
//! unlike the workers').
//! Never: decide what the store holds or evicts (`SharedStore` does), or route.

use super::worker::{prefilling, State};
use super::{Cluster, Epoch, Wakeup};
use crate::shared::Landed;
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::ids::SequenceHash;
use kvtwin::router::scheduler::SharedPrefix;
use kvtwin::tier::Tier;

/// A read of the store for request `request` on worker `worker` (that incarnation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SharedRead {
    worker: usize,
    epoch: Epoch,
    request: usize,
}

impl Cluster<'_> {
    /// How many blocks of request `i`, from its block `from` on, the store holds (as a
    /// prefix, and no further than a lookup may hit).
    pub(super) fn shared_hits(&self, i: usize, from: usize) -> usize {
        if !self.shared.is_on() {
            return 0;
        }
        let hittable = self.hittable(i);
        if from >= hittable {
            return 0;
        }
        let hashes: Vec<SequenceHash> = self.request(i).blocks[from..hittable]
            .iter()
            .map(|b| b.sequence_hash)
            .collect();
        self.shared.prefix(&hashes)
    }

    /// What the router is told of the store for request `i`: the leading blocks it
    /// holds, at the configured credit.
    pub(super) fn shared_prefix(&self, i: usize) -> SharedPrefix {
        if !self.shared.is_on() {
            return SharedPrefix::default();
        }
        SharedPrefix {
            blocks: u32::try_from(self.shared_hits(i, 0)).unwrap_or(u32::MAX),
            credit: self.shared.spec().router_credit,
        }
    }

    /// Worker `w` reads `blocks` blocks of request `i` from its block `from` on; the
    /// request waits in `State::Fetching` meanwhile.
    pub(super) fn start_shared_read(&mut self, w: usize, i: usize, from: usize, blocks: usize) {
        let hashes: Vec<SequenceHash> = self.request(i).blocks[from..from + blocks]
            .iter()
            .map(|b| b.sequence_hash)
            .collect();
        let read = SharedRead {
            worker: w,
            epoch: self.workers[w].epoch,
            request: i,
        };
        self.shared.read(w, &hashes, read, self.now);
        self.schedule_shared();
    }

    /// Worker `w` published `event`: blocks it registered on its device go to the store.
    pub(super) fn write_to_shared(&mut self, w: usize, event: &KvCacheEvent) {
        if !self.shared.is_on() {
            return;
        }
        if let KvCacheEventData::Stored {
            blocks,
            tier: Tier::Device,
            ..
        } = &event.data
        {
            let hashes: Vec<SequenceHash> = blocks.iter().map(|b| b.block_hash).collect();
            self.shared.write(w, &hashes, self.now);
            self.schedule_shared();
        }
    }

    /// Wakes the cluster at the store's next deadline (once per instant).
    fn schedule_shared(&mut self) {
        if let Some(deadline) = self.shared.next_deadline() {
            let at = deadline.max(self.now);
            if self.shared_poll_at.insert(at) {
                self.queue.push(at, Wakeup::Shared);
            }
        }
    }

    /// A deadline of the store: writes that landed make their blocks findable; reads
    /// that landed register their blocks on the reader, whose request goes on to
    /// prefill what is left.
    pub(super) fn shared_due(&mut self) {
        let now = self.now;
        self.shared_poll_at.remove(&now);
        while let Some(landed) = self.shared.pop_landed(now) {
            if let Landed::Read(read) = landed {
                self.shared_read_landed(read);
            }
        }
        self.schedule_shared();
    }

    fn shared_read_landed(&mut self, read: SharedRead) {
        let SharedRead {
            worker: w,
            epoch,
            request: i,
        } = read;
        // Read by a crashed worker's former self: its requests started again elsewhere.
        if !self.current(w, epoch) {
            return;
        }
        let Some(State::Fetching {
            mut held,
            mut computing,
            blocks,
        }) = self.workers[w].states.remove(&i)
        else {
            return;
        };
        self.set_clock(w);
        let live = &self.requests.live[&i];
        let request = &live.request;
        let from = held.len();
        let complete = computing
            .drain(..blocks)
            .zip(&request.blocks[from..from + blocks])
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        let worker = &mut self.workers[w];
        held.extend(worker.manager.register(complete, self.now));
        let state = prefilling(live, held, computing, self.shape.block_size);
        worker.states.insert(i, state);
        // Already in the prefill queue, where it kept its place.
        self.also_touched.insert(w);
    }
}
