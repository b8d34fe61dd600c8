//! The simulated event plane between the workers and the router.
//!
//! Owns: [`Plane`] (its configuration, its seeded losses, the faults under way on it,
//! heartbeats, and its counters) and the path of a KV event from a worker's drain loop
//! to the router: lost with the plane's probability, applied at once without delay,
//! delivered later otherwise (in order). The router notes ids that went missing;
//! heartbeats tell it a worker's latest id; a worker it knows to be behind sends a
//! snapshot of its caches, with a back-off while snapshots fail to bring it in line.
//! Never: touch a worker's requests or pools beyond asking its manager for a snapshot.

use super::{Cluster, Wakeup};
use crate::scenario::EventPlaneSpec;
use kvtwin::events::KvCacheEvent;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::time::Duration;

/// The event plane's configuration, state and counters.
pub(super) struct Plane {
    pub(super) spec: EventPlaneSpec,
    /// The plane's losses (its own stream of the run's seed).
    pub(super) rng: ChaCha8Rng,
    /// Events that reached the router, those it refused, and those lost on the way.
    pub(super) delivered: u64,
    pub(super) rejected: u64,
    pub(super) dropped: u64,
    /// Loss probabilities of the `EventLoss` faults under way, by fault.
    pub(super) extra_loss: BTreeMap<usize, f64>,
    /// Delay added by the `EventLag` faults under way.
    pub(super) extra_delay: Duration,
    /// Time between rounds of heartbeats (zero: none).
    pub(super) heartbeat_every: Duration,
    /// Whether a round of heartbeats is scheduled, and how many heartbeats are on their
    /// way (they do not count as work that keeps heartbeats going).
    pub(super) heartbeat_due: bool,
    pub(super) heartbeats_in_flight: usize,
    /// Snapshots workers sent the router.
    pub(super) snapshots: u64,
}

impl Plane {
    pub(super) fn new(spec: EventPlaneSpec, rng: ChaCha8Rng) -> Self {
        Self {
            spec,
            rng,
            delivered: 0,
            rejected: 0,
            dropped: 0,
            extra_loss: BTreeMap::new(),
            extra_delay: Duration::ZERO,
            heartbeat_every: Duration::from_millis(spec.heartbeat_ms),
            heartbeat_due: false,
            heartbeats_in_flight: 0,
            snapshots: 0,
        }
    }
}

impl Cluster<'_> {
    /// Sends worker `w`'s event towards the router: lost with the plane's probability,
    /// applied now without delay, delivered later otherwise (in order: equal delays
    /// keep the queue's insertion order).
    pub(super) fn publish(&mut self, w: usize, event: KvCacheEvent) {
        if self.lost() {
            self.plane.dropped += 1;
            self.workers[w].manager.recycle_event(event);
            return;
        }
        let delay = self.plane_delay();
        if delay.is_zero() {
            self.deliver(w, &event);
            self.workers[w].manager.recycle_event(event);
        } else {
            let at = self.now.saturating_add(delay);
            let epoch = self.workers[w].epoch;
            self.queue
                .push(at, Wakeup::Deliver(w, epoch, Box::new(event)));
        }
    }

    /// Whether the next message on the event plane is lost (the plane's own loss, or a
    /// fault's, whichever is higher).
    pub(super) fn lost(&mut self) -> bool {
        let p = self
            .plane
            .extra_loss
            .values()
            .fold(self.plane.spec.drop_probability, |a, b| a.max(*b));
        p > 0.0 && self.plane.rng.gen::<f64>() < p
    }

    pub(super) fn plane_delay(&self) -> Duration {
        Duration::from_micros(self.plane.spec.delay_us) + self.plane.extra_delay
    }

    /// The router applies worker `w`'s event, noting ids that went missing before it.
    pub(super) fn deliver(&mut self, w: usize, event: &KvCacheEvent) {
        self.plane.delivered += 1;
        let worker = &mut self.workers[w];
        if worker
            .last_applied
            .is_some_and(|last| event.event_id != last.wrapping_add(1))
        {
            worker.gap_seen = true;
        }
        worker.last_applied = Some(event.event_id);
        let (id, gap, epoch) = (worker.key.worker, worker.gap_seen, worker.epoch);
        if self.route.router.apply(id, event).is_err() {
            self.plane.rejected += 1;
        }
        if gap {
            // Not now: this may run inside the worker's own publishing, and a snapshot
            // must follow the events already on their way, not overtake them.
            self.queue.push(self.now, Wakeup::ResyncCheck(w, epoch));
        }
    }

    /// Every worker that is up sends the id of its latest event over the plane; the
    /// next round is due while anything else is.
    pub(super) fn heartbeat(&mut self) {
        self.plane.heartbeat_due = false;
        // Heartbeats go on while anything else will happen, or the router is behind.
        let more = self.requests.next_arrival.is_some()
            || self.queue.len() > self.plane.heartbeats_in_flight
            || self.workers.iter().any(|w| w.up && w.gap_seen);
        for w in 0..self.workers.len() {
            if !self.workers[w].up || self.lost() {
                continue;
            }
            let worker = &self.workers[w];
            let latest = worker.manager.next_event_id().checked_sub(1);
            let at = self.now.saturating_add(self.plane_delay());
            self.queue
                .push(at, Wakeup::HeartbeatArrives(w, worker.epoch, latest));
            self.plane.heartbeats_in_flight += 1;
        }
        if more {
            self.schedule_heartbeat();
        }
    }

    /// Makes sure a round of heartbeats is due (when they are on at all).
    pub(super) fn schedule_heartbeat(&mut self) {
        if !self.plane.heartbeat_every.is_zero() && !self.plane.heartbeat_due {
            self.plane.heartbeat_due = true;
            self.queue.push(
                self.now.saturating_add(self.plane.heartbeat_every),
                Wakeup::Heartbeat,
            );
        }
    }

    pub(super) fn heartbeat_arrives(&mut self, w: usize, latest: Option<u64>) {
        let worker = &mut self.workers[w];
        if latest.is_some_and(|latest| worker.last_applied.is_none_or(|last| last < latest)) {
            worker.gap_seen = true;
        } else if !worker.gap_seen {
            // In line: the next snapshot, if one is ever needed, is asked for promptly.
            worker.failed_snapshots = 0;
        }
        self.resync_if_behind(w);
    }

    /// Asks worker `w` for a snapshot of its caches if the router has missed some of its
    /// events and is not already waiting for one.
    pub(super) fn resync_if_behind(&mut self, w: usize) {
        let worker = &self.workers[w];
        if !(worker.up && worker.gap_seen) {
            return;
        }
        if self.now >= worker.quiet_until {
            self.resync(w);
        } else {
            // Waiting out the back-off: a later heartbeat asks again.
            self.schedule_heartbeat();
        }
    }

    /// Worker `w` publishes a snapshot of its caches to the router, which then waits
    /// before asking again: two plane delays plus a millisecond, doubled for every
    /// snapshot that did not bring it in line (a lossy plane loses parts of snapshots
    /// too), up to a minute.
    pub(super) fn resync(&mut self, w: usize) {
        let base = self.plane_delay() * 2 + Duration::from_millis(1);
        let worker = &mut self.workers[w];
        let quiet = base
            .saturating_mul(1 << worker.failed_snapshots.min(16))
            .min(Duration::from_secs(60))
            .max(base);
        worker.failed_snapshots += 1;
        worker.gap_seen = false;
        worker.quiet_until = self.now.saturating_add(quiet);
        self.plane.snapshots += 1;
        self.set_clock(w);
        self.workers[w].manager.publish_snapshot();
        self.settle(w);
    }
}
