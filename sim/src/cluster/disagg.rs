//! Disaggregated serving: separate prefill and decode pools and the KV handoff.
//!
//! Owns: [`Disagg`] (the pools, the cluster's fabric, the handoffs and frames in flight
//! and their counters) and the handoff. Each worker belongs to one [`Pool`] for life:
//! the scenario's first workers form the prefill pool, the only one the router routes
//! to, and the rest the decode pool; a worker the driver adds joins the pool it names
//! (`Cluster::add_worker_to`), on a node of its own that the fabric grows by. A prefill
//! worker prefills and the first token lands at the end of the pass's prefill part
//! (TTFT is measured there); then the decode worker with the fewest requests (the
//! lowest index on a tie) takes device blocks for the prompt (without free ones the
//! handoff waits in its queue, first come first served), and the prompt blocks cross
//! the fabric ([`crate::fabric::ClusterFabric`]) as MRDN frames, all sent at once,
//! sharing the NICs and the switch with every other handoff. When the last frame lands
//! the prefill worker lets its blocks go (they stay cached there) and the decode worker
//! registers them and decodes. A request of one output token is done on its prefill
//! worker.
//!
//! Handoffs go only to decode workers that are up and not draining: a decode worker
//! draining finishes the handoffs it has, receives no new one, and leaves.
//!
//! A handoff is bound to the incarnations (epochs) of both its ends, so a crash of
//! either aborts it: its frames in flight never land, the end still up lets go of what
//! it held, and the request goes back to the router to be prefilled again, keeping the
//! tokens it had generated. Handoffs go only to decode workers that are up; with none up
//! they wait, and go out first come first served when one comes back.
//! Never: decide what a pass holds (`batching`) or route (`worker`).

use super::report::{DisaggregationReport, LinkReport, Percentiles};
use super::worker::{cacheable_blocks, State};
use super::{Cluster, Epoch, LinkSnapshot, Wakeup};
use crate::fabric::{frame_bytes, frame_sizes, ClusterFabric, FabricLink};
use crate::hardware::HardwareProfile;
use crate::hardware::LinkUsage;
use crate::scenario::{Disaggregation, Routing};
use kvtwin::block::Reset;
use kvtwin::ids::{Timestamp, WorkerId};
use kvtwin::pool::{BlockChain, MutableBlock};
use kvtwin::stats::Latencies;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The pool a worker of a disaggregated cluster serves in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pool {
    /// Prefills the requests the router sends it, then hands their KV off.
    Prefill,
    /// Receives handoffs and decodes.
    Decode,
}

/// Disaggregated serving: the pools, the fabric and the handoffs in flight.
pub(super) struct Disagg {
    /// Each worker's pool (index: worker), for life.
    pub(super) pool_of: Vec<Pool>,
    /// The workers of each pool ever (removed ones too), in worker order: the prefill
    /// pool is the router's round-robin order, and both are the report's order.
    pub(super) prefill: Vec<usize>,
    pub(super) decode: Vec<usize>,
    /// Whether the driver added or removed a worker: the report then names the pools'
    /// workers (added ones are not the first ones or the rest; removed ones stay
    /// listed, which the names make plain).
    pub(super) scaled: bool,
    pub(super) frame_blocks: usize,
    pub(super) bytes_per_block: u64,
    pub(super) fabric: ClusterFabric,
    /// Fabric deadlines in the event queue.
    pub(super) poll_at: BTreeSet<Timestamp>,
    /// Handoffs whose last frame has not landed, by request.
    pub(super) handoffs: BTreeMap<usize, Handoff>,
    /// Handoffs waiting for a decode worker to be up, first come first served.
    pub(super) unassigned: VecDeque<usize>,
    /// Every frame in flight, by fabric transfer id.
    pub(super) frames_in_flight: BTreeMap<u64, FrameInFlight>,
    pub(super) handoffs_done: u64,
    pub(super) handoffs_aborted: u64,
    pub(super) frames_aborted: u64,
    pub(super) frames: u64,
    pub(super) bytes: u64,
    pub(super) header_bytes: u64,
    pub(super) waits: u64,
    pub(super) finished_at_prefill: u64,
    pub(super) latency: Latencies,
    pub(super) wait: Latencies,
    /// Per worker: requests handed off (prefill pool), handoffs received (decode pool).
    pub(super) handed_off: Vec<u64>,
    pub(super) received: Vec<u64>,
}

/// One request's KV handoff from a prefill worker to a decode worker.
pub(super) struct Handoff {
    pub(super) from: usize,
    /// The decode worker; `None` while none is up (the handoff waits in
    /// `Disagg::unassigned`).
    pub(super) to: Option<usize>,
    /// Its frames' fabric ids, to abort those still in flight if an end crashes.
    pub(super) frames: Vec<u64>,
    /// When the prefill ended.
    pub(super) ready_at: Timestamp,
    /// When the frames were sent (the decode worker had blocks for them).
    pub(super) sent_at: Option<Timestamp>,
    pub(super) frames_left: usize,
    /// Whether it has waited for decode blocks (counted once).
    pub(super) waited: bool,
}

/// A handoff frame on the fabric: its request, and the incarnations of the workers at
/// both ends when it was sent (a frame of a crashed worker's former self never counts).
pub(super) struct FrameInFlight {
    pub(super) request: usize,
    pub(super) from: (usize, Epoch),
    pub(super) to: (usize, Epoch),
}

impl Disagg {
    /// The fabric's links now, each node's NIC on its own (utilisation over
    /// `elapsed_ns`), for snapshots.
    pub(super) fn link_snapshots(&self, elapsed_ns: f64) -> Vec<LinkSnapshot> {
        self.fabric
            .usage()
            .into_iter()
            .map(|(link, usage)| {
                let (worker, name) = match link {
                    FabricLink::NicOut(node) => {
                        (Some(WorkerId::new(node as u64)), "fabric_nic_out")
                    }
                    FabricLink::NicIn(node) => (Some(WorkerId::new(node as u64)), "fabric_nic_in"),
                    FabricLink::Switch => (None, "switch"),
                };
                LinkSnapshot {
                    worker,
                    link: name,
                    bytes: usage.bytes,
                    transfers: usage.transfers,
                    utilisation: usage.busy_ns as f64 / elapsed_ns,
                }
            })
            .collect()
    }

    /// Whether worker `w` is in `pool`.
    pub(super) fn is_in(&self, w: usize, pool: Pool) -> bool {
        self.pool_of.get(w) == Some(&pool)
    }

    /// The workers of `pool` ever, in worker order.
    pub(super) fn members(&self, pool: Pool) -> &[usize] {
        match pool {
            Pool::Prefill => &self.prefill,
            Pool::Decode => &self.decode,
        }
    }

    /// Worker `w`, just added, joins `pool`, on a node of its own the fabric grows by.
    pub(super) fn join(&mut self, w: usize, pool: Pool) {
        debug_assert_eq!(w, self.pool_of.len(), "workers join in order");
        self.pool_of.push(pool);
        match pool {
            Pool::Prefill => self.prefill.push(w),
            Pool::Decode => self.decode.push(w),
        }
        self.handed_off.push(0);
        self.received.push(0);
        let node = self.fabric.add_node();
        debug_assert_eq!(node, w, "worker w runs on node w");
        self.scaled = true;
    }

    /// The report: per pool in worker order, every worker the pool ever had (with no
    /// driver command, the first `prefill_workers` and the rest, as the scenario says).
    pub(super) fn report(&self, simulated_ns: u64) -> DisaggregationReport {
        let (prefill_workers, decode_workers) = (self.prefill.len(), self.decode.len());
        // The fabric links that carry handoffs, each summed over the pool that uses it.
        let mut links: Vec<(&'static str, LinkUsage, usize)> = vec![
            ("nic_out", LinkUsage::default(), prefill_workers),
            ("nic_in", LinkUsage::default(), decode_workers),
        ];
        for (link, usage) in self.fabric.usage() {
            let index = match link {
                FabricLink::NicOut(node) if self.is_in(node, Pool::Prefill) => 0,
                FabricLink::NicIn(node) if self.is_in(node, Pool::Decode) => 1,
                FabricLink::Switch => {
                    links.push(("switch", LinkUsage::default(), 1));
                    links.len() - 1
                }
                _ => continue,
            };
            let sum = &mut links[index].1;
            sum.bytes += usage.bytes;
            sum.busy_ns += usage.busy_ns;
            sum.transfers += usage.transfers;
        }
        let per = |counts: &[u64], pool: Pool| -> Vec<u64> {
            self.members(pool).iter().map(|w| counts[*w]).collect()
        };
        let named = |pool: Pool| self.scaled.then(|| self.members(pool).to_vec());
        DisaggregationReport {
            prefill_workers,
            decode_workers,
            frame_blocks: self.frame_blocks,
            handoffs: self.handoffs_done,
            frames: self.frames,
            bytes: self.bytes,
            header_bytes: self.header_bytes,
            handoff_latency: Percentiles::of(self.latency.clone()),
            handoff_wait: Percentiles::of(self.wait.clone()),
            waits_for_decode_blocks: self.waits,
            handed_off_per_prefill_worker: per(&self.handed_off, Pool::Prefill),
            received_per_decode_worker: per(&self.received, Pool::Decode),
            prefill_pool: named(Pool::Prefill),
            decode_pool: named(Pool::Decode),
            finished_at_prefill: self.finished_at_prefill,
            handoffs_aborted: self.handoffs_aborted,
            frames_aborted: self.frames_aborted,
            links: links
                .into_iter()
                .map(|(link, usage, nodes)| LinkReport {
                    link,
                    bytes: usage.bytes,
                    transfers: usage.transfers,
                    utilisation: usage.busy_ns as f64
                        / simulated_ns.max(1) as f64
                        / nodes.max(1) as f64,
                })
                .collect(),
        }
    }

    pub(super) fn new(
        spec: Disaggregation,
        workers: usize,
        hardware: &HardwareProfile,
        bytes_per_block: u64,
    ) -> Self {
        let pool_of: Vec<Pool> = (0..workers)
            .map(|w| {
                if w < spec.prefill_workers {
                    Pool::Prefill
                } else {
                    Pool::Decode
                }
            })
            .collect();
        Self {
            prefill: (0..spec.prefill_workers.min(workers)).collect(),
            decode: (spec.prefill_workers.min(workers)..workers).collect(),
            pool_of,
            scaled: false,
            frame_blocks: spec.frame_blocks.max(1),
            bytes_per_block,
            fabric: ClusterFabric::new(
                workers,
                hardware.nic_bytes_per_s,
                hardware.nic_latency_ns,
                spec.switch_bytes_per_s,
                spec.switch_latency_ns,
            ),
            poll_at: BTreeSet::new(),
            handoffs: BTreeMap::new(),
            unassigned: VecDeque::new(),
            frames_in_flight: BTreeMap::new(),
            handoffs_done: 0,
            handoffs_aborted: 0,
            frames_aborted: 0,
            frames: 0,
            bytes: 0,
            header_bytes: 0,
            waits: 0,
            finished_at_prefill: 0,
            latency: Latencies::new(),
            wait: Latencies::new(),
            handed_off: vec![0; workers],
            received: vec![0; workers],
        }
    }
}

impl Cluster<'_> {
    /// Aborts request `i`'s handoff, if it has one, because one of its ends crashed:
    /// its frames still on the fabric never land (the other transfers take their share
    /// of the links), the prefill worker, if up, lets the request's blocks go (they stay
    /// cached) and the router stops counting its load there, and the decode worker, if
    /// up, gives back the blocks it reserved (or drops the handoff from its queue). The
    /// request itself is the caller's to retry.
    pub(super) fn abort_handoff(&mut self, i: usize) {
        let now = self.now;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.remove(&i) else {
            return;
        };
        disagg.handoffs_aborted += 1;
        disagg.unassigned.retain(|waiting| *waiting != i);
        for id in &handoff.frames {
            if disagg.frames_in_flight.remove(id).is_some() && disagg.fabric.abort(*id, now) {
                disagg.frames_aborted += 1;
            }
        }
        // The others' rates went up: their landings may be earlier than scheduled.
        self.schedule_fabric();
        let p = handoff.from;
        if self.workers[p].up {
            self.set_clock(p);
            let worker = &mut self.workers[p];
            if let Some(State::Sending { held, own }) = worker.states.remove(&i) {
                drop(own);
                worker.manager.device().release(held);
                if self.route.mode == Routing::Kv {
                    let (key, blocks) = (worker.key, self.request(i).blocks.len() as u64);
                    self.route.router.finish(key, blocks);
                }
            }
            self.retry_waiting(p);
            self.also_touched.insert(p);
        }
        if let Some(d) = handoff.to.filter(|d| self.workers[*d].up) {
            self.set_clock(d);
            let worker = &mut self.workers[d];
            match worker.states.remove(&i) {
                Some(State::Receiving { blocks }) => drop(blocks),
                Some(other) => {
                    worker.states.insert(i, other);
                }
                None => worker.waiting.retain(|waiting| *waiting != i),
            }
            self.retry_waiting(d);
            self.also_touched.insert(d);
        }
    }

    /// Request `i`, prefilled on prefill worker `p`, goes to the decode pool: `p` holds
    /// its blocks until the handoff lands, and a decode worker receives it
    /// ([`Cluster::assign_decode_worker`]).
    pub(super) fn hand_off(
        &mut self,
        p: usize,
        i: usize,
        held: BlockChain,
        own: Vec<MutableBlock<Reset>>,
    ) {
        self.workers[p]
            .states
            .insert(i, State::Sending { held, own });
        let now = self.now;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        disagg.handed_off[p] += 1;
        disagg.handoffs.insert(
            i,
            Handoff {
                from: p,
                to: None,
                frames: Vec::new(),
                ready_at: now,
                sent_at: None,
                frames_left: 0,
                waited: false,
            },
        );
        self.assign_decode_worker(i);
    }

    /// Gives request `i`'s handoff to the decode worker that is up, and not draining,
    /// with the fewest requests (the lowest index on a tie), which receives it. With none
    /// it waits, first come first served, for one to come back or be added (its blocks
    /// stay held on the prefill worker): nothing is handed to a crashed or leaving
    /// worker.
    pub(super) fn assign_decode_worker(&mut self, i: usize) {
        let Some(disagg) = self.disagg.as_ref() else {
            return;
        };
        // `min_by_key` keeps the first of equals: the lowest index.
        let d = disagg
            .members(Pool::Decode)
            .iter()
            .copied()
            .filter(|d| self.workers[*d].up && !self.draining.contains(d))
            .min_by_key(|d| self.workers[*d].states.len() + self.workers[*d].waiting.len());
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.get_mut(&i) else {
            return;
        };
        match d {
            Some(d) => {
                handoff.to = Some(d);
                self.receive(d, i);
            }
            None => disagg.unassigned.push_back(i),
        }
    }

    /// Decode worker `w`, back from a crash or just added, takes the handoffs that
    /// waited for one, in their order (each goes to the least loaded decode worker then,
    /// which is `w` while the others are busier).
    pub(super) fn assign_waiting_handoffs(&mut self, w: usize) {
        let unassigned = match self.disagg.as_mut() {
            Some(disagg) if disagg.is_in(w, Pool::Decode) => std::mem::take(&mut disagg.unassigned),
            _ => VecDeque::new(),
        };
        for i in unassigned {
            self.assign_decode_worker(i);
        }
    }

    /// Blocks request `i`'s handoff carries: its prompt's, and for a request prefilled
    /// again after a crash, those of the generated tokens recomputed with it (all but the
    /// newest, whose KV the decode worker computes).
    pub(super) fn handoff_blocks(&self, i: usize) -> usize {
        let live = &self.requests.live[&i];
        let request = &live.request;
        let computed = request.input_tokens + live.generated.saturating_sub(1);
        let beyond_prompt = computed
            .div_ceil(self.shape.block_size)
            .saturating_sub(request.input_tokens.div_ceil(self.shape.block_size));
        request.blocks.len() + beyond_prompt as usize
    }

    /// Decode worker `d` takes device blocks for request `i`'s prompt and the handoff's
    /// frames go out; without free blocks the handoff waits in `d`'s queue, first come
    /// first served, and is tried again when blocks come free there.
    pub(super) fn receive(&mut self, d: usize, i: usize) {
        let blocks = self.handoff_blocks(i);
        self.set_clock(d);
        // Taking blocks may evict cached ones: `d` has events to publish.
        self.also_touched.insert(d);
        match self.workers[d].manager.allocate(blocks, self.now) {
            Ok(blocks) => {
                self.workers[d]
                    .states
                    .insert(i, State::Receiving { blocks });
                self.send_frames(i);
            }
            Err(_) => {
                if let Some(disagg) = self.disagg.as_mut() {
                    if let Some(handoff) = disagg.handoffs.get_mut(&i) {
                        if !handoff.waited {
                            handoff.waited = true;
                            disagg.waits += 1;
                        }
                    }
                }
                self.workers[d].waiting.push_back(i);
            }
        }
    }

    /// Sends request `i`'s blocks over the fabric, `frame_blocks` to an MRDN frame, all
    /// frames at once (a prompt of no full block still sends one frame, its header).
    pub(super) fn send_frames(&mut self, i: usize) {
        let blocks = self.handoff_blocks(i);
        let now = self.now;
        let workers = &self.workers;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.get_mut(&i) else {
            return;
        };
        let Some(to) = handoff.to else {
            return;
        };
        let (from, to) = (
            (handoff.from, workers[handoff.from].epoch),
            (to, workers[to].epoch),
        );
        let mut sizes: Vec<usize> = frame_sizes(blocks, disagg.frame_blocks).collect();
        if sizes.is_empty() {
            sizes.push(0);
        }
        handoff.sent_at = Some(now);
        handoff.frames_left = sizes.len();
        disagg
            .wait
            .push(now.saturating_duration_since(handoff.ready_at).as_nanos() as u64);
        for size in sizes {
            let bytes = frame_bytes(size, disagg.bytes_per_block);
            let id = disagg.fabric.start(from.0, to.0, bytes, now);
            handoff.frames.push(id);
            disagg.frames_in_flight.insert(
                id,
                FrameInFlight {
                    request: i,
                    from,
                    to,
                },
            );
            disagg.frames += 1;
            disagg.bytes += bytes;
            disagg.header_bytes += frame_bytes(0, 0);
        }
        self.schedule_fabric();
    }

    /// Makes sure the fabric's next deadline is in the event queue.
    pub(super) fn schedule_fabric(&mut self) {
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        if let Some(deadline) = disagg.fabric.next_deadline() {
            let at = deadline.max(self.now);
            if disagg.poll_at.insert(at) {
                self.queue.push(at, Wakeup::Fabric);
            }
        }
    }

    /// A fabric deadline: frames that landed count down their handoffs, and every
    /// handoff whose last frame is in completes, in the order its frames landed.
    pub(super) fn fabric_due(&mut self) {
        let now = self.now;
        let workers = &self.workers;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        disagg.poll_at.remove(&now);
        disagg.fabric.advance(now);
        let mut complete = Vec::new();
        while let Some(id) = disagg.fabric.pop_landed(now) {
            let Some(frame) = disagg.frames_in_flight.remove(&id) else {
                continue;
            };
            // Sent by or to a crashed worker's former self: its handoff was aborted (and
            // the frame with it, so this is only a safeguard).
            let current = |(w, epoch): (usize, Epoch)| workers[w].up && workers[w].epoch == epoch;
            if !(current(frame.from) && current(frame.to)) {
                continue;
            }
            let i = frame.request;
            if let Some(handoff) = disagg.handoffs.get_mut(&i) {
                handoff.frames_left = handoff.frames_left.saturating_sub(1);
                if handoff.frames_left == 0 {
                    complete.push(i);
                }
            }
        }
        for i in complete {
            self.handoff_landed(i);
        }
        self.schedule_fabric();
    }

    /// Every frame of request `i`'s handoff has landed: the prefill worker lets its
    /// blocks go (they stay cached there for prefix reuse) and takes waiting work, and
    /// the decode worker registers the prompt blocks (its prefix cache, announced to the
    /// router like any others) and decodes the request.
    pub(super) fn handoff_landed(&mut self, i: usize) {
        let now = self.now;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.remove(&i) else {
            return;
        };
        let (p, d) = (
            handoff.from,
            handoff
                .to
                .expect("a handoff whose frames landed was sent to a decode worker"),
        );
        disagg.handoffs_done += 1;
        disagg.received[d] += 1;
        if let Some(sent) = handoff.sent_at {
            disagg
                .latency
                .push(now.saturating_duration_since(sent).as_nanos() as u64);
        }
        let prompt_blocks = self.request(i).blocks.len() as u64;
        self.set_clock(p);
        let worker = &mut self.workers[p];
        if let Some(State::Sending { held, own }) = worker.states.remove(&i) {
            drop(own);
            worker.manager.device().release(held);
        }
        if self.route.mode == Routing::Kv {
            let key = self.workers[p].key;
            self.route.router.finish(key, prompt_blocks);
        }
        self.retry_waiting(p);
        self.also_touched.insert(p);
        self.set_clock(d);
        self.also_touched.insert(d);
        let Some(State::Receiving { mut blocks }) = self.workers[d].states.remove(&i) else {
            return;
        };
        let request = &self.requests.live[&i].request;
        let cacheable = cacheable_blocks(
            request,
            self.shape.block_size,
            self.shape.cache_partial_blocks,
        )
        .min(blocks.len());
        // A partial last block that is not cached stays the request's own.
        let own = blocks.split_off(cacheable);
        let complete = blocks
            .into_iter()
            .zip(&request.blocks[..cacheable])
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        let held = self.workers[d].manager.register(complete, now);
        if self.decoded(d, i, held, own) {
            self.retry_waiting(d);
        }
    }
}
