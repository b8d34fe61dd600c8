//! The fault timeline, the driver's commands that stop workers, and the recovery.
//!
//! Owns: [`Faults`] (the timeline, the times at which something disrupts the cluster,
//! and what the faults cost) and the fault verbs: a worker crashes (its incarnation, the
//! epoch, changes, so what its former self scheduled is dropped; its requests start again
//! elsewhere, and it comes back empty), a link slows down, the event plane loses or
//! delays events, the router restarts (every worker sends it a snapshot), or a worker's
//! SSD fails (its `SimHardware` fails the disk's transfers in flight and its `Manager`
//! forgets the disk tier until it comes back empty). Also the cut of decode plans at a
//! disruption the driver announces mid-run (see `PassInFlight`).
//! Never: decide routing or batching; a fault only changes what they see.

use super::observe;
use super::router_of;
use super::{Cluster, Wakeup};
use crate::hardware::Link;
use crate::hardware::SimHardware;
use crate::ledger::EventLedger;
use crate::scenario::{Fault, FaultKind};
use kvtwin::hardware::Hardware;
use kvtwin::ids::Timestamp;
use kvtwin::manager::Manager;
use kvtwin::router::WorkerMode;
use kvtwin::tier::Tier;
use std::collections::BTreeSet;
use std::time::Duration;

/// The fault timeline and what it cost.
pub(super) struct Faults {
    /// The scenario's faults, then those the driver injected (indexed by `Wakeup`s).
    pub(super) timeline: Vec<Fault>,
    /// Times at which a fault begins, ends or a worker comes back: decode plans stop
    /// there (see `PassInFlight`).
    pub(super) disruptions: BTreeSet<Timestamp>,
    /// Faults that began.
    pub(super) applied: u64,
    pub(super) requests_retried: u64,
    pub(super) disk_blocks_lost: u64,
    pub(super) disk_transfers_failed: u64,
}

impl Faults {
    pub(super) fn new(timeline: Vec<Fault>) -> Self {
        Self {
            timeline,
            disruptions: BTreeSet::new(),
            applied: 0,
            requests_retried: 0,
            disk_blocks_lost: 0,
            disk_transfers_failed: 0,
        }
    }
}

impl Cluster<'_> {
    pub(super) fn fault_starts(&mut self, index: usize) {
        let Some(fault) = self.faults.timeline.get(index).cloned() else {
            return;
        };
        self.faults.applied += 1;
        self.note(|| observe::fault_began(&fault.kind));
        let until = |for_ms: u64, sim: &mut Cluster<'_>| {
            let at = sim.now.saturating_add(Duration::from_millis(for_ms));
            sim.faults.disruptions.insert(at);
            sim.queue.push(at, Wakeup::FaultEnds(index));
        };
        match fault.kind {
            FaultKind::WorkerCrash { worker, down_ms } => self.crash(worker, down_ms),
            FaultKind::LinkSlowdown {
                worker,
                link,
                factor,
                for_ms,
            } => {
                self.slow_link(worker, link, factor);
                until(for_ms, self);
            }
            FaultKind::EventLoss {
                probability,
                for_ms,
            } => {
                self.plane.extra_loss.insert(index, probability);
                until(for_ms, self);
            }
            FaultKind::EventLag { delay_us, for_ms } => {
                self.plane.extra_delay += Duration::from_micros(delay_us);
                until(for_ms, self);
            }
            FaultKind::SsdFailure { worker, down_ms } => {
                self.fail_disk(worker);
                until(down_ms, self);
            }
            FaultKind::RouterRestart => {
                // Its state and the load it knew are gone; the workers it knows of send
                // snapshots (decode workers too: their blocks are in its index).
                self.route.router = router_of(self.route.scheduler, 0);
                for w in 0..self.workers.len() {
                    // A draining worker is in the index (its blocks are), but is routed
                    // nothing, by the new router either.
                    let routable = self.is_routable(w) && !self.draining.contains(&w);
                    let worker = &mut self.workers[w];
                    worker.last_applied = None;
                    if worker.up {
                        let key = worker.key;
                        if routable {
                            self.route.router.add_worker(key, WorkerMode::Events);
                        }
                        self.resync(w);
                    }
                }
            }
        }
    }

    pub(super) fn fault_ends(&mut self, index: usize) {
        let Some(fault) = self.faults.timeline.get(index).cloned() else {
            return;
        };
        if let Some(text) = self
            .observer
            .as_ref()
            .and_then(|_| observe::fault_ended(&fault.kind))
        {
            self.note(|| text);
        }
        match fault.kind {
            FaultKind::LinkSlowdown {
                worker,
                link,
                factor,
                ..
            } => self.slow_link(worker, link, 1.0 / factor),
            FaultKind::EventLoss { .. } => {
                self.plane.extra_loss.remove(&index);
            }
            FaultKind::EventLag { delay_us, .. } => {
                self.plane.extra_delay = self
                    .plane
                    .extra_delay
                    .saturating_sub(Duration::from_micros(delay_us));
            }
            FaultKind::SsdFailure { worker, .. } => self.restore_disk(worker),
            FaultKind::WorkerCrash { .. } | FaultKind::RouterRestart => {}
        }
    }

    /// Worker `w`'s SSD fails: the hardware fails the transfers touching it, which go
    /// through the manager's failure path (an onboarding from disk ends with its blocks
    /// to compute, and the request goes on to prefill), then the manager forgets the
    /// disk tier, and its `Removed` events go out like any others.
    pub(super) fn fail_disk(&mut self, w: usize) {
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        worker.disk_failures += 1;
        if worker.disk_failures > 1 {
            // Already down: nothing more to lose.
            return;
        }
        self.set_clock(w);
        let now = self.now;
        let manager = &mut self.workers[w].manager;
        let stopped = manager.hardware_mut().fail_tier(Tier::Disk, now);
        manager.handle_completions(now);
        // Validated: the worker has a disk tier.
        let failure = manager.fail_tier(Tier::Disk, now).unwrap_or_default();
        self.faults.disk_transfers_failed += (stopped + failure.transfers_failed) as u64;
        self.faults.disk_blocks_lost += failure.blocks_lost as u64;
        if self.workers[w].up {
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// Worker `w`'s SSD is back, empty, once no failure of it is under way.
    pub(super) fn restore_disk(&mut self, w: usize) {
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        worker.disk_failures = worker.disk_failures.saturating_sub(1);
        if worker.disk_failures > 0 {
            return;
        }
        self.set_clock(w);
        let now = self.now;
        let manager = &mut self.workers[w].manager;
        manager.hardware_mut().restore_tier(Tier::Disk);
        let _ = manager.restore_tier(Tier::Disk, now);
        if self.workers[w].up {
            // Write-back may copy down again at once.
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// Multiplies the speed of `link` on worker `worker`'s node (every node if `None`).
    pub(super) fn slow_link(&mut self, worker: Option<usize>, link: Link, factor: f64) {
        let index = Link::ALL.iter().position(|l| *l == link).unwrap_or(0);
        for w in 0..self.workers.len() {
            if worker.is_some_and(|only| only != w) || !self.workers[w].up {
                continue;
            }
            let speed = {
                let speed = &mut self.workers[w].link_speed[index];
                *speed *= factor;
                *speed
            };
            let now = self.now;
            self.set_clock(w);
            self.workers[w]
                .manager
                .hardware_mut()
                .set_link_speed(link, speed, now);
            // The node's NIC carries its handoffs too.
            if let Some(disagg) = self.disagg.as_mut() {
                disagg.fabric.set_nic_speed(w, link, speed, now);
                self.schedule_fabric();
            }
            // Transfer deadlines moved.
            self.settle(w);
        }
    }

    /// Worker `w` crashes and comes back empty after `down_ms` ([`Self::stop_worker`]).
    pub(super) fn crash(&mut self, w: usize, down_ms: u64) {
        self.stop_worker(w, Some(down_ms));
    }

    /// Worker `w` stops: the router forgets it, its requests start again on other
    /// workers (as a frontend retries them), and it comes back empty after `down_ms`
    /// (never, without). Disaggregated, the handoffs from or to it are aborted first
    /// ([`Cluster::abort_handoff`]), and its requests are prefilled again wherever the
    /// router sends them.
    pub(super) fn stop_worker(&mut self, w: usize, down_ms: Option<u64>) {
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        if !worker.up {
            return;
        }
        let mut requests: Vec<usize> = worker
            .states
            .keys()
            .copied()
            .chain(worker.waiting.iter().copied())
            .collect();
        requests.sort_unstable();
        requests.dedup();
        // A plan ends at the first step that ends at or after a fault (see
        // `PassInFlight`): every step of it but the last is done by now, and an engine
        // going one pass at a time would have its tokens. They are kept; the last step
        // is lost with the worker.
        if let Some(pass) = worker.pass.take() {
            let silent = (pass.steps - 1) as u64;
            self.tally.passes += silent;
            for (i, _) in &pass.members {
                if let Some(live) = self.requests.live.get_mut(i) {
                    live.generated += silent;
                }
            }
        }
        worker.up = false;
        worker.epoch += 1;
        worker.states.clear();
        worker.waiting.clear();
        worker.prefill_queue.clear();
        worker.poll_at.clear();
        worker.last_applied = None;
        worker.gap_seen = false;
        worker.failed_snapshots = 0;
        worker.ledger = EventLedger::new();
        let mut hardware = SimHardware::new(
            self.shape.hardware_profile.clone(),
            self.shape.worker_config.block_size_tokens,
        );
        for (link, speed) in Link::ALL.iter().zip(worker.link_speed) {
            if speed != 1.0 {
                hardware.set_link_speed(*link, speed, self.now);
            }
        }
        hardware.clock().set(self.now);
        // A disk that failed stays down across the restart.
        let disk_down = worker.disk_failures > 0;
        if disk_down {
            hardware.fail_tier(Tier::Disk, self.now);
        }
        let mut config = self.shape.worker_config.clone();
        config.worker_id = worker.key.worker;
        worker.manager = Manager::new(hardware, config).expect("validated when the run began");
        if disk_down {
            // A fresh manager has nothing to lose.
            let _ = worker.manager.fail_tier(Tier::Disk, self.now);
        }
        let id = worker.key.worker;
        self.route.router.remove_worker(id);
        if let Some(down_ms) = down_ms {
            let back = self.now.saturating_add(Duration::from_millis(down_ms));
            self.faults.disruptions.insert(back);
            self.queue.push(back, Wakeup::Restart(w));
        }
        // All aborts before any retry: the blocks they free on the other ends may serve
        // the retried requests (a prefill worker's stay cached there).
        for i in &requests {
            self.abort_handoff(*i);
        }
        for i in requests {
            self.faults.requests_retried += 1;
            self.reroute(i);
        }
    }

    /// A crashed worker comes back empty; requests that found no worker go first.
    pub(super) fn restart(&mut self, w: usize) {
        let worker = &mut self.workers[w];
        if worker.up || worker.removed {
            return;
        }
        worker.up = true;
        let key = worker.key;
        self.note(|| format!("worker {w} restarted (empty)"));
        if self.is_routable(w) {
            self.route.router.add_worker(key, WorkerMode::Events);
        }
        self.assign_waiting_handoffs(w);
        for i in std::mem::take(&mut self.requests.parked) {
            self.reroute(i);
        }
    }

    /// Cuts every decode plan in flight that runs past `at` at the first of its steps
    /// that ends at or after `at`, as if `at` had been a disruption when it was planned
    /// (see `PassInFlight`): a command of the driver, or a fault it injects, then finds
    /// every worker as an engine going one pass at a time would be. The cut pass is
    /// scheduled anew; its former end wakes nothing.
    pub(super) fn cut_plans_at(&mut self, at: Timestamp) {
        for w in 0..self.workers.len() {
            let compute = &self.shape.compute;
            let capacity = self.shape.device_capacity_tokens;
            let worker = &mut self.workers[w];
            let Some(pass) = worker.pass.as_mut() else {
                continue;
            };
            if pass.steps == 1 || pass.ends_at <= at {
                continue;
            }
            let (end, steps) = pass.first_step_ending_at_or_after(at, compute, capacity);
            if steps == pass.steps {
                continue;
            }
            pass.ends_at = end;
            pass.steps = steps;
            let epoch = worker.epoch;
            self.queue.push(end, Wakeup::PassDone(w, epoch));
        }
    }
}
