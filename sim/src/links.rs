//! Shared links as a fluid model: the transfers in flight on a link share its bandwidth
//! max-min fairly, recomputed whenever a transfer starts or finishes its bytes; a transfer
//! that crosses several links moves at the rate its tightest link grants it.
//!
//! Owns: [`LinkSpec`], [`LinkUsage`] and [`FluidLinks`] (flows, their rates, the queues of
//! links with a queue depth, and the transfers waiting out their latency).
//! Never: knows tiers or requests (the hardware maps a transfer to link indices) or reads
//! a clock: every call says what time it is.
//!
//! The model, per transfer of `b` bytes over links `L`:
//! - it waits (first come, first served) while a link of `L` with a queue depth has that
//!   many transfers in service (a link of infinite bandwidth with a queue depth, crossed by
//!   every transfer, bounds the transfers in service overall: a backend's worker threads);
//! - then it moves its bytes at rate `r`, consuming `r × cost(l)` of each link's
//!   bandwidth, where `cost(l) ≥ 1` is how many bytes' worth of a link's time one byte
//!   takes: 1 unless the link is bound by operations per second (an SSD serving small
//!   I/O), then `ops × bandwidth / (iops × b)`;
//! - the rates are the max-min fair allocation (progressive filling: every unfrozen
//!   transfer's rate rises together; a link that saturates freezes the transfers that
//!   cross it), so two equal transfers on one link each get half of it; a transfer never
//!   moves faster than the per-transfer rate of any link it crosses (one stream, one
//!   worker thread), so it freezes there first when that is lower;
//! - once its bytes are through, it lands after the sum of the latencies of `L`.
//!
//! Time is integer nanoseconds; bytes in flight are `f64`. A transfer whose remaining
//! bytes would take under half a nanosecond is through.

use kvtwin::ids::Timestamp;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

/// What one link can do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkSpec {
    /// Bandwidth, bytes per second (at least 1).
    pub bytes_per_s: f64,
    /// Operations per second the link serves at most (an SSD's IOPS); `None`: unbound.
    pub ops_per_s: Option<f64>,
    /// The largest operation: a transfer is `ceil(bytes / max_op_bytes)` operations.
    pub max_op_bytes: u64,
    /// Transfers in service at once at most (an SSD's queue depth); `None`: unbound.
    pub queue_depth: Option<usize>,
    /// One transfer's rate at most, bytes per second (a single stream: what one thread or
    /// one queue moves); `None`: only the link's bandwidth bounds it.
    pub max_transfer_bytes_per_s: Option<f64>,
}

impl LinkSpec {
    /// A link bound by bandwidth only.
    pub fn bandwidth(bytes_per_s: u64) -> Self {
        Self {
            bytes_per_s: bytes_per_s.max(1) as f64,
            ops_per_s: None,
            max_op_bytes: u64::MAX,
            queue_depth: None,
            max_transfer_bytes_per_s: None,
        }
    }

    /// Seconds `bytes` take on this link with nothing else in flight.
    pub fn seconds_alone(&self, bytes: u64) -> f64 {
        let link = bytes as f64 * self.cost(bytes) / self.bytes_per_s.max(1.0);
        match self.max_transfer_bytes_per_s {
            Some(cap) => link.max(bytes as f64 / cap.max(1.0)),
            None => link,
        }
    }

    /// Bytes' worth of this link's time that one byte of a `bytes`-byte transfer takes.
    fn cost(&self, bytes: u64) -> f64 {
        match self.ops_per_s {
            Some(iops) if bytes > 0 => {
                let ops = bytes.div_ceil(self.max_op_bytes.max(1)).max(1) as f64;
                (ops * self.bytes_per_s / (iops.max(1e-9) * bytes as f64)).max(1.0)
            }
            _ => 1.0,
        }
    }
}

/// What one link did during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkUsage {
    /// Bytes carried.
    pub bytes: u64,
    /// Time with at least one transfer moving bytes on it.
    pub busy_ns: u64,
    /// Transfers carried.
    pub transfers: u64,
}

#[derive(Debug)]
struct Flow {
    /// Link indices and the cost per byte on each.
    links: Vec<(usize, f64)>,
    /// The rate it never exceeds: the lowest per-transfer rate of its links.
    cap: f64,
    remaining: f64,
    rate: f64,
    latency: Duration,
    in_service: bool,
    /// The links whose queue slots it holds (with [`FluidLinks::hold_while_queued`]: the
    /// slots it took before a full link stopped it; otherwise empty until it is in
    /// service, then every queued link of its path).
    held: Vec<usize>,
}

/// Transfers sharing a set of links.
#[derive(Debug)]
pub struct FluidLinks {
    specs: Vec<LinkSpec>,
    /// Each link's bandwidth as built (a slowdown scales `specs` from it).
    nominal_bytes_per_s: Vec<f64>,
    /// Flows by id (ids grow with submission, so iteration is submission order).
    flows: BTreeMap<u64, Flow>,
    /// Per link: flows waiting for a queue slot, and flows in service.
    waiting: Vec<VecDeque<u64>>,
    in_service: Vec<usize>,
    /// Flows whose bytes are through, by landing time.
    landing: BTreeSet<(Timestamp, u64)>,
    usage: Vec<LinkUsage>,
    /// The time the flows' `remaining` refers to.
    last: Timestamp,
    /// Whether a flow takes the queue slots of its path one link at a time, in path
    /// order, keeping those it has while it waits for the next (a worker thread blocked
    /// in a copy or an I/O call waiting for the device's servers); otherwise it takes
    /// them all at once, when all have room.
    hold_while_queued: bool,
}

impl FluidLinks {
    /// Links with these specs, indexed in order.
    pub fn new(specs: Vec<LinkSpec>) -> Self {
        let n = specs.len();
        Self {
            nominal_bytes_per_s: specs.iter().map(|s| s.bytes_per_s).collect(),
            specs,
            flows: BTreeMap::new(),
            waiting: vec![VecDeque::new(); n],
            in_service: vec![0; n],
            landing: BTreeSet::new(),
            usage: vec![LinkUsage::default(); n],
            last: Timestamp::ZERO,
            hold_while_queued: false,
        }
    }

    /// Links whose transfers take their queue slots in path order and keep those they
    /// have while they wait for the next: a queued link first on every path (a backend's
    /// worker threads) then stays taken while a transfer waits for a link's servers
    /// further on, as a thread blocked in its copy does. Paths must list queued links in
    /// one global order (no deadlock: no transfer waits for a slot before one it holds).
    pub fn holding_while_queued(mut self) -> Self {
        self.hold_while_queued = true;
        self
    }

    /// The specs.
    pub fn specs(&self) -> &[LinkSpec] {
        &self.specs
    }

    /// Usage per link, in index order.
    pub fn usage(&self) -> &[LinkUsage] {
        &self.usage
    }

    /// Runs `link` at `factor` of its nominal speed from `now` on (1.0 restores it): the
    /// flows on it share the new capacity, as when a transfer starts or ends.
    pub fn set_speed(&mut self, link: usize, factor: f64, now: Timestamp) {
        if link >= self.specs.len() {
            return;
        }
        self.advance(now);
        self.progress(now);
        self.specs[link].bytes_per_s = self.nominal_bytes_per_s[link] * factor.max(1e-9);
        self.share();
    }

    /// Adds an idle link with `spec` after the others; returns its index. The links
    /// already there keep their indices, and the flows on them their rates: an idle link
    /// weighs nothing in the sharing.
    pub fn add_link(&mut self, spec: LinkSpec) -> usize {
        self.nominal_bytes_per_s.push(spec.bytes_per_s);
        self.specs.push(spec);
        self.waiting.push(VecDeque::new());
        self.in_service.push(0);
        self.usage.push(LinkUsage::default());
        self.specs.len() - 1
    }

    /// Transfers not yet landed.
    pub fn len(&self) -> usize {
        self.flows.len() + self.landing.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Starts transfer `id` (ids must grow) of `bytes` over `links` at `now`; it lands
    /// `latency` after its bytes are through. Links out of range are ignored.
    pub fn start(
        &mut self,
        id: u64,
        links: &[usize],
        bytes: u64,
        latency: Duration,
        now: Timestamp,
    ) {
        self.advance(now);
        // Rates change now: move the bytes in service up to here first.
        self.progress(now);
        let links: Vec<(usize, f64)> = links
            .iter()
            .filter(|l| **l < self.specs.len())
            .map(|l| (*l, self.specs[*l].cost(bytes)))
            .collect();
        for (link, _) in &links {
            self.usage[*link].bytes += bytes;
            self.usage[*link].transfers += 1;
        }
        if links.is_empty() || bytes == 0 {
            self.landing.insert((now.saturating_add(latency), id));
            return;
        }
        let cap = links
            .iter()
            .filter_map(|(l, _)| self.specs[*l].max_transfer_bytes_per_s)
            .fold(f64::INFINITY, |cap, link_cap| cap.min(link_cap.max(1.0)));
        self.flows.insert(
            id,
            Flow {
                links,
                cap,
                remaining: bytes as f64,
                rate: 0.0,
                latency,
                in_service: false,
                held: Vec::new(),
            },
        );
        self.admit(id);
        self.share();
    }

    /// Puts `id` in service if every queue on its path has room; otherwise queues it on
    /// the first link without room (keeping the slots before it, when holding).
    fn admit(&mut self, id: u64) {
        let Some(flow) = self.flows.get(&id) else {
            return;
        };
        let has_room = |links: &Self, l: usize| {
            links.specs[l]
                .queue_depth
                .is_none_or(|depth| links.in_service[l] < depth.max(1))
        };
        let path: Vec<usize> = flow.links.iter().map(|(l, _)| *l).collect();
        if self.hold_while_queued {
            let held = flow.held.clone();
            for link in path {
                if held.contains(&link) || self.specs[link].queue_depth.is_none() {
                    continue;
                }
                if !has_room(self, link) {
                    self.waiting[link].push_back(id);
                    return;
                }
                self.in_service[link] += 1;
                if let Some(flow) = self.flows.get_mut(&id) {
                    flow.held.push(link);
                }
            }
            if let Some(flow) = self.flows.get_mut(&id) {
                flow.in_service = true;
            }
            return;
        }
        match path.iter().copied().find(|l| !has_room(self, *l)) {
            Some(link) => self.waiting[link].push_back(id),
            None => {
                for &link in &path {
                    self.in_service[link] += 1;
                }
                if let Some(flow) = self.flows.get_mut(&id) {
                    flow.in_service = true;
                    flow.held = path;
                }
            }
        }
    }

    /// Max-min fair rates for the flows in service (progressive filling).
    fn share(&mut self) {
        let mut left: Vec<f64> = self.specs.iter().map(|s| s.bytes_per_s.max(1.0)).collect();
        let mut unfrozen: Vec<u64> = Vec::new();
        for (id, flow) in &mut self.flows {
            flow.rate = 0.0;
            if flow.in_service {
                unfrozen.push(*id);
            }
        }
        let mut floor = 0.0f64;
        while !unfrozen.is_empty() {
            let mut weight = vec![0.0f64; self.specs.len()];
            for id in &unfrozen {
                for (link, cost) in &self.flows[id].links {
                    weight[*link] += cost;
                }
            }
            // The link that saturates first as every unfrozen rate rises together
            // (ties: the lowest index, for determinism).
            let mut bottleneck: Option<(f64, usize)> = None;
            for (link, w) in weight.iter().enumerate() {
                if *w > 0.0 {
                    let level = left[link].max(0.0) / w;
                    if bottleneck.is_none_or(|(best, _)| level < best) {
                        bottleneck = Some((level, link));
                    }
                }
            }
            let Some((level, link)) = bottleneck else {
                break;
            };
            // A flow whose own cap is below every link's level stops there, and only it.
            let cap = unfrozen
                .iter()
                .map(|id| self.flows[id].cap)
                .fold(f64::INFINITY, f64::min);
            let capped = cap <= level;
            let level = if capped { cap } else { level };
            // Levels never fall as filling goes on; clamping keeps rounding from giving a
            // later flow less (or nothing) than one frozen before it.
            let level = level.max(floor);
            floor = level;
            let (frozen, rest): (Vec<u64>, Vec<u64>) = unfrozen.into_iter().partition(|id| {
                let flow = &self.flows[id];
                if capped {
                    flow.cap <= cap
                } else {
                    flow.links.iter().any(|(l, _)| *l == link)
                }
            });
            for id in frozen {
                let flow = self.flows.get_mut(&id).expect("unfrozen flows exist");
                flow.rate = level;
                for (l, cost) in &flow.links {
                    left[*l] -= level * cost;
                }
            }
            unfrozen = rest;
        }
    }

    /// Nanoseconds until `flow`'s bytes are through at its current rate.
    fn ns_left(flow: &Flow) -> Option<f64> {
        (flow.in_service && flow.rate > 0.0).then(|| flow.remaining / flow.rate * 1e9)
    }

    /// When the next flow's bytes are through, at the current rates.
    fn next_through(&self) -> Option<Timestamp> {
        self.flows
            .values()
            .filter_map(Self::ns_left)
            // A thousandth of a nanosecond of slack absorbs rounding in `remaining`.
            .map(|ns| {
                let ns = (ns - 1e-3).max(0.0).ceil() as u64;
                self.last.saturating_add(Duration::from_nanos(ns))
            })
            .min()
    }

    /// Moves every flow forward to `now`, exactly: rates change at each flow that gets
    /// through on the way, and queued flows start as slots free.
    ///
    /// Bytes are moved only up to the last rate change, never to `now` itself: moving
    /// them at every call would round differently however often a caller looks, and
    /// landing times would depend on it. Between rate changes a flow's progress is
    /// implied by its rate.
    pub fn advance(&mut self, now: Timestamp) {
        while let Some(through) = self.next_through().filter(|through| *through <= now) {
            self.progress(through);
            if !self.finish_through() {
                // Due but not through: only rounding in `remaining` does that. Land the
                // nearest flow, so that time never stalls.
                self.finish_nearest();
            }
        }
    }

    /// Lands the in-service flow with the least time left (ties: the lowest id), then
    /// shares the links again: the fallback when rounding keeps a due flow just short.
    fn finish_nearest(&mut self) {
        let nearest = self
            .flows
            .iter()
            .filter_map(|(id, flow)| Self::ns_left(flow).map(|ns| (ns, *id)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        if let Some((_, id)) = nearest {
            if let Some(flow) = self.flows.get_mut(&id) {
                flow.remaining = 0.0;
            }
            self.finish_through();
        }
    }

    /// Moves the bytes of every flow in service on to `to` at the current rates.
    fn progress(&mut self, to: Timestamp) {
        let elapsed = to.saturating_duration_since(self.last);
        if elapsed.is_zero() {
            self.last = self.last.max(to);
            return;
        }
        let seconds = elapsed.as_nanos() as f64 / 1e9;
        let mut busy = vec![false; self.specs.len()];
        for flow in self.flows.values_mut().filter(|f| f.in_service) {
            flow.remaining = (flow.remaining - flow.rate * seconds).max(0.0);
            for (link, _) in &flow.links {
                busy[*link] = true;
            }
        }
        for (link, busy) in busy.into_iter().enumerate() {
            if busy {
                self.usage[link].busy_ns += elapsed.as_nanos() as u64;
            }
        }
        self.last = to;
    }

    /// Lands the flows whose bytes are through, starts queued ones in their place and
    /// shares the links again; returns whether any got through.
    fn finish_through(&mut self) -> bool {
        let through: Vec<u64> = self
            .flows
            .iter()
            .filter(|(_, f)| f.in_service && Self::ns_left(f).is_some_and(|ns| ns < 0.5))
            .map(|(id, _)| *id)
            .collect();
        if through.is_empty() {
            return false;
        }
        for id in through {
            let Some(flow) = self.flows.remove(&id) else {
                continue;
            };
            self.landing
                .insert((self.last.saturating_add(flow.latency), id));
            self.leave_service(&flow.held);
        }
        self.share();
        true
    }

    /// A flow left the slots it held on `links`: they go to the flows waiting.
    fn leave_service(&mut self, links: &[usize]) {
        for link in links {
            self.in_service[*link] = self.in_service[*link].saturating_sub(1);
            while let Some(next) = self.waiting[*link].pop_front() {
                self.admit(next);
                let started = self.flows.get(&next).is_some_and(|f| f.in_service);
                let depth = self.specs[*link].queue_depth.unwrap_or(usize::MAX).max(1);
                if !started || self.in_service[*link] >= depth {
                    break;
                }
            }
        }
    }

    /// Stops transfer `id` at `now`, wherever it is (moving bytes, queued, or through and
    /// waiting out its latency): it will never land. The bytes it had not moved come off
    /// its links' usage, and the others share the links again. Returns whether it was
    /// in flight.
    pub fn abort(&mut self, id: u64, now: Timestamp) -> bool {
        self.advance(now);
        if let Some(&entry) = self.landing.iter().find(|(_, landing)| *landing == id) {
            self.landing.remove(&entry);
            return true;
        }
        if !self.flows.contains_key(&id) {
            return false;
        }
        // Rates change now: move the bytes in service up to here first.
        self.progress(now);
        let Some(flow) = self.flows.remove(&id) else {
            return false;
        };
        let unmoved = flow.remaining.round() as u64;
        for (link, _) in &flow.links {
            self.usage[*link].bytes = self.usage[*link].bytes.saturating_sub(unmoved);
        }
        if !flow.in_service {
            for queue in &mut self.waiting {
                queue.retain(|waiting| *waiting != id);
            }
        }
        self.leave_service(&flow.held);
        self.share();
        true
    }

    /// The earliest transfer landed by `now` (call [`FluidLinks::advance`] first).
    pub fn pop_landed(&mut self, now: Timestamp) -> Option<u64> {
        let &(at, id) = self.landing.first()?;
        if at > now {
            return None;
        }
        self.landing.remove(&(at, id));
        Some(id)
    }

    /// When something next happens: a transfer lands, or one's bytes get through (rates
    /// change then, so landings after it can move earlier).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        let landing = self.landing.first().map(|(at, _)| *at);
        match (landing, self.next_through()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GB: u64 = 1_000_000_000;

    fn ms(ms: f64) -> Timestamp {
        Timestamp::from_nanos((ms * 1e6).round() as u64)
    }

    /// Runs `links` until everything lands; returns each id's landing time.
    fn drain(links: &mut FluidLinks) -> BTreeMap<u64, Timestamp> {
        let mut landed = BTreeMap::new();
        while let Some(at) = links.next_deadline() {
            links.advance(at);
            while let Some(id) = links.pop_landed(at) {
                landed.insert(id, at);
            }
        }
        landed
    }

    #[test]
    fn a_slowed_link_shares_its_new_speed_from_then_on() {
        // 1 MB at 1 GB/s; halfway (0.5 ms) the link drops to half speed: the other half
        // takes 1 ms more. Restored, a second transfer moves at full speed again.
        let mut links = FluidLinks::new(vec![LinkSpec::bandwidth(GB)]);
        links.start(0, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.set_speed(0, 0.5, ms(0.5));
        assert_eq!(drain(&mut links)[&0], ms(1.5));
        links.set_speed(0, 1.0, ms(2.0));
        links.start(1, &[0], 1_000_000, Duration::ZERO, ms(2.0));
        assert_eq!(drain(&mut links)[&1], ms(3.0));
    }

    #[test]
    fn an_aborted_transfer_never_lands_and_gives_its_share_back() {
        // Two 1 MB transfers share 1 GB/s; at 1 ms (0.5 MB each moved) one is aborted:
        // the other moves its last 0.5 MB alone, through at 1.5 ms. The link carried
        // 1.5 MB. A queued transfer can be aborted too, and an unknown id is not.
        let mut links = FluidLinks::new(vec![LinkSpec::bandwidth(GB)]);
        links.start(0, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        assert!(links.abort(0, ms(1.0)));
        assert!(!links.abort(0, ms(1.0)));
        let landed = drain(&mut links);
        assert_eq!(landed.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!(landed[&1], ms(1.5));
        assert_eq!(links.usage()[0].bytes, 1_500_000);
        let mut queued = FluidLinks::new(vec![LinkSpec {
            queue_depth: Some(1),
            ..LinkSpec::bandwidth(GB)
        }]);
        queued.start(0, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        queued.start(1, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        assert!(queued.abort(1, ms(0.5)));
        assert_eq!(drain(&mut queued).len(), 1);
        assert!(queued.is_empty());
    }

    #[test]
    fn two_equal_transfers_on_one_link_each_take_twice_as_long() {
        let mut links = FluidLinks::new(vec![LinkSpec::bandwidth(GB)]);
        links.start(0, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        let landed = drain(&mut links);
        assert_eq!(landed[&0], ms(2.0));
        assert_eq!(landed[&1], ms(2.0));
        assert_eq!(links.usage()[0].busy_ns, 2_000_000);
    }

    #[test]
    fn a_small_transfer_behind_a_large_one_shares_and_the_large_one_speeds_up_after() {
        let mut links = FluidLinks::new(vec![LinkSpec::bandwidth(GB)]);
        // 9 MB starts alone; after 1 ms (1 MB moved) a 1 MB transfer joins: both get
        // 0.5 GB/s, the small one is through at 3 ms, the large one has 6 MB left at
        // full speed and is through at 9 ms, as if the link had carried 10 MB in order.
        links.start(0, &[0], 9_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0], 1_000_000, Duration::ZERO, ms(1.0));
        let landed = drain(&mut links);
        assert_eq!(landed[&1], ms(3.0));
        assert_eq!(landed[&0], ms(10.0));
    }

    #[test]
    fn a_transfer_over_two_links_moves_at_its_tightest_share() {
        // Link 0 at 1 GB/s carries A and B; link 1 at 0.2 GB/s carries B alone. B is
        // held to 0.2 GB/s by link 1, so A gets the other 0.8 GB/s of link 0.
        let mut links = FluidLinks::new(vec![LinkSpec::bandwidth(GB), LinkSpec::bandwidth(GB / 5)]);
        links.start(0, &[0], 800_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0, 1], 200_000, Duration::ZERO, Timestamp::ZERO);
        let landed = drain(&mut links);
        assert_eq!(landed[&0], ms(1.0));
        assert_eq!(landed[&1], ms(1.0));
    }

    #[test]
    fn tiny_transfers_take_their_latency() {
        let mut links = FluidLinks::new(vec![LinkSpec::bandwidth(GB)]);
        for id in 0..100 {
            links.start(id, &[0], 64, Duration::from_micros(80), Timestamp::ZERO);
        }
        let landed = drain(&mut links);
        // 6,400 bytes at 1 GB/s is 6.4 µs of wire against 80 µs of latency.
        assert!(landed
            .values()
            .all(|at| *at == Timestamp::from_nanos(86_400)));
    }

    #[test]
    fn small_reads_are_bound_by_iops_and_queue_depth() {
        // 6.5 GB/s, 1 M IOPS, at most 4 in service: a 4 KiB read costs 1 µs of the
        // drive (IOPS) rather than 0.63 µs (bandwidth). 8 reads at once: 4 in service
        // share the drive for 4 µs, then the next 4.
        let ssd = LinkSpec {
            bytes_per_s: 6.5e9,
            ops_per_s: Some(1e6),
            max_op_bytes: 1 << 20,
            queue_depth: Some(4),
            max_transfer_bytes_per_s: None,
        };
        let mut links = FluidLinks::new(vec![ssd]);
        for id in 0..8 {
            links.start(id, &[0], 4096, Duration::ZERO, Timestamp::ZERO);
        }
        let landed = drain(&mut links);
        assert!((0..4).all(|id| landed[&id] == Timestamp::from_nanos(4_000)));
        assert!((4..8).all(|id| landed[&id] == Timestamp::from_nanos(8_000)));
        // A large read is bandwidth-bound: 6.5 MB in 1 ms.
        links.start(8, &[0], 6_500_000, Duration::ZERO, ms(1.0));
        assert_eq!(drain(&mut links)[&8], ms(2.0));
    }

    #[test]
    fn a_transfer_moves_no_faster_than_its_per_transfer_rate() {
        // A 2 GB/s link whose transfers move at 1 GB/s each: one 1 MB transfer alone takes
        // 1 ms (not 0.5), two together still 1 ms each, four share the link at 0.5 GB/s.
        let link = LinkSpec {
            max_transfer_bytes_per_s: Some(1e9),
            ..LinkSpec::bandwidth(2 * GB)
        };
        assert_eq!(link.seconds_alone(1_000_000), 1e-3);
        for (count, through) in [(1u64, 1.0), (2, 1.0), (4, 2.0)] {
            let mut links = FluidLinks::new(vec![link]);
            for id in 0..count {
                links.start(id, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
            }
            let landed = drain(&mut links);
            assert!(
                landed.values().all(|at| *at == ms(through)),
                "{count}: {landed:?}"
            );
        }
        // A capped flow leaves the rest of the link to an uncapped one on another path.
        let mut links = FluidLinks::new(vec![link, LinkSpec::bandwidth(10 * GB)]);
        links.start(0, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0, 1], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        let landed = drain(&mut links);
        assert_eq!(landed[&0], ms(1.0));
        assert_eq!(landed[&1], ms(1.0));
    }

    #[test]
    fn an_unbounded_link_with_a_queue_depth_bounds_the_transfers_in_service() {
        // Two links, and a third of no bandwidth limit with room for 2, crossed by all:
        // of three transfers on different links, the third waits for a slot.
        let workers = LinkSpec {
            queue_depth: Some(2),
            ..LinkSpec::bandwidth(u64::MAX)
        };
        let mut links = FluidLinks::new(vec![
            LinkSpec::bandwidth(GB),
            LinkSpec::bandwidth(GB),
            workers,
        ]);
        links.start(0, &[2, 0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[2, 1], 2_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(2, &[2, 1], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        let landed = drain(&mut links);
        assert_eq!(landed[&0], ms(1.0));
        // The third starts at 1 ms and shares link 1 with the second from then on.
        assert_eq!(landed[&1], ms(3.0));
        assert_eq!(landed[&2], ms(3.0));
    }

    proptest! {
        /// Whatever arrives when: the links never carry more than their bandwidth
        /// (every byte is through no sooner than the link's total bytes allow) and never
        /// idle while work waits (the last byte is through by the time a link working
        /// flat out would finish, counting from the first arrival).
        #[test]
        fn links_are_work_conserving_and_never_over_capacity(
            transfers in prop::collection::vec((0u64..4_000_000, 1u64..2_000_000, 0usize..3), 1..30)
        ) {
            let bandwidth = [GB, GB / 2, 2 * GB];
            let specs: Vec<LinkSpec> = bandwidth.iter().map(|b| LinkSpec::bandwidth(*b)).collect();
            let mut links = FluidLinks::new(specs);
            let mut arrivals: Vec<(u64, u64, usize)> = transfers.clone();
            arrivals.sort_unstable();
            let mut landed = BTreeMap::new();
            for (id, (at, bytes, link)) in arrivals.iter().enumerate() {
                let now = Timestamp::from_nanos(*at);
                while let Some(deadline) = links.next_deadline().filter(|d| *d < now) {
                    links.advance(deadline);
                    while let Some(done) = links.pop_landed(deadline) {
                        landed.insert(done, deadline);
                    }
                }
                links.start(id as u64, &[*link], *bytes, Duration::ZERO, now);
            }
            landed.extend(drain(&mut links));
            prop_assert_eq!(landed.len(), arrivals.len());
            for (link, link_bandwidth) in bandwidth.iter().enumerate() {
                let ours: Vec<(usize, &(u64, u64, usize))> =
                    arrivals.iter().enumerate().filter(|(_, a)| a.2 == link).collect();
                let Some(first) = ours.first() else { continue };
                let bytes: u64 = ours.iter().map(|(_, a)| a.1).sum();
                let last = ours.iter().map(|(id, _)| landed[&(*id as u64)]).max().unwrap();
                let floor_ns = (bytes as f64 / *link_bandwidth as f64 * 1e9) as u64;
                // Capacity: everything through no sooner than the first arrival plus the
                // time the link needs for all of it (2 ns of rounding per transfer).
                prop_assert!(last.as_nanos() + 2 * ours.len() as u64 >= first.1 .0 + floor_ns);
                // Work conservation: no later than the last arrival plus all of it.
                let last_arrival = ours.iter().map(|(_, a)| a.0).max().unwrap();
                prop_assert!(last.as_nanos() <= last_arrival + floor_ns + 2 * ours.len() as u64);
            }
        }
    }

    /// A link of `servers` servers at 1 GB/s each under a 2 GB/s aggregate.
    fn served(servers: usize) -> LinkSpec {
        LinkSpec {
            queue_depth: Some(servers),
            max_transfer_bytes_per_s: Some(GB as f64),
            ..LinkSpec::bandwidth(2 * GB)
        }
    }

    #[test]
    fn servers_finish_equal_transfers_in_waves() {
        // Two servers, five equal 1 MB transfers at once: two at a time at 1 GB/s each,
        // in arrival order: through at 1, 1, 2, 2 and 3 ms.
        let mut links = FluidLinks::new(vec![served(2)]);
        for id in 0..5 {
            links.start(id, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        }
        let landed: Vec<Timestamp> = drain(&mut links).into_values().collect();
        assert_eq!(landed, [ms(1.0), ms(1.0), ms(2.0), ms(2.0), ms(3.0)]);
        // The fluid link moves all five together: through at 2.5 ms, all of them.
        let mut fluid = FluidLinks::new(vec![LinkSpec {
            max_transfer_bytes_per_s: Some(GB as f64),
            ..LinkSpec::bandwidth(2 * GB)
        }]);
        for id in 0..5 {
            fluid.start(id, &[0], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        }
        assert!(drain(&mut fluid).values().all(|at| *at == ms(2.5)));
    }

    #[test]
    fn a_large_transfer_is_never_slowed_by_a_small_one_queued_on_another_server() {
        // 10 MB on one server, 2 MB on the other; a 1 MB transfer arriving at 0.5 ms
        // waits for the 2 MB one's server (free at 2 ms) and runs there until 3 ms: the
        // 10 MB transfer runs at its own 1 GB/s throughout, through at 10 ms, as without
        // the small one.
        let mut links = FluidLinks::new(vec![served(2)]);
        links.start(0, &[0], 10_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0], 2_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(2, &[0], 1_000_000, Duration::ZERO, ms(0.5));
        let landed = drain(&mut links);
        assert_eq!(
            (landed[&0], landed[&1], landed[&2]),
            (ms(10.0), ms(2.0), ms(3.0))
        );
    }

    #[test]
    fn a_transfer_waiting_for_a_server_keeps_its_worker_when_holding() {
        // Link 0: two workers (no bandwidth limit); link 1: a disk of one server at
        // 1 GB/s; link 2: memory at 1 GB/s. Two 1 MB disk writes and then a 1 MB copy, at
        // once. Holding, the second write keeps its worker while it waits for the disk,
        // so the copy waits for a worker: it starts when the first write is through
        // (1 ms) and is through at 2 ms, as the second write is. Not holding, the
        // second write waits for the disk without a worker and the copy runs at once.
        let specs = || {
            vec![
                LinkSpec {
                    queue_depth: Some(2),
                    ..LinkSpec::bandwidth(u64::MAX)
                },
                LinkSpec {
                    queue_depth: Some(1),
                    ..LinkSpec::bandwidth(GB)
                },
                LinkSpec::bandwidth(GB),
            ]
        };
        let run = |mut links: FluidLinks| {
            links.start(0, &[0, 1], 1_000_000, Duration::ZERO, Timestamp::ZERO);
            links.start(1, &[0, 1], 1_000_000, Duration::ZERO, Timestamp::ZERO);
            links.start(2, &[0, 2], 1_000_000, Duration::ZERO, Timestamp::ZERO);
            drain(&mut links)
        };
        let held = run(FluidLinks::new(specs()).holding_while_queued());
        assert_eq!((held[&0], held[&1], held[&2]), (ms(1.0), ms(2.0), ms(2.0)));
        let free = run(FluidLinks::new(specs()));
        assert_eq!((free[&0], free[&1], free[&2]), (ms(1.0), ms(2.0), ms(1.0)));
        // An aborted transfer gives back what it held, waiting or not.
        let mut links = FluidLinks::new(specs()).holding_while_queued();
        links.start(0, &[0, 1], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(1, &[0, 1], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        links.start(2, &[0, 2], 1_000_000, Duration::ZERO, Timestamp::ZERO);
        assert!(links.abort(1, ms(0.5)));
        let landed = drain(&mut links);
        assert_eq!((landed[&0], landed[&2]), (ms(1.0), ms(1.5)));
    }
}
