//! The network between the nodes of a cluster: what carries a disaggregated KV handoff
//! from a prefill worker's node to a decode worker's.
//!
//! Owns: [`ClusterFabric`] (one NIC-out and one NIC-in link per node and, optionally,
//! one switch link that every transfer crosses, all in one [`FluidLinks`], so concurrent
//! frames share each link max-min fairly and the tightest link limits each), and the
//! size of an MRDN frame on the wire ([`frame_bytes`], [`frame_sizes`]). A transfer from
//! node `a` to node `b` crosses `[nic_out(a), switch, nic_in(b)]` and lands the NIC
//! latency plus the switch latency after its bytes are through (one network hop: the
//! profile's `nic_latency_ns` is per transfer, not per end).
//!
//! Nodes added while a run goes ([`ClusterFabric::add_node`]) get their two NIC links
//! after every link built at the start, so a run that never adds one indexes, shares and
//! sums its links exactly as before (the sharing breaks ties on the lowest index).
//!
//! These links are the cluster's, apart from the NIC links of each worker's
//! `SimHardware`, which carry that node's own remote-tier traffic.
//! Never: know requests, blocks or pools (the run maps handoffs to transfers), read a
//! clock, or iterate anything unordered.

use crate::hardware::Link;
use crate::links::{FluidLinks, LinkSpec, LinkUsage};
use kvtwin::ids::Timestamp;
use kvtwin::wire::HEADER_LEN;
use std::time::Duration;

/// Bytes on the wire of one MRDN frame carrying `blocks` blocks: their bytes and the
/// 32-byte header ([`kvtwin::wire::HEADER_LEN`]).
pub fn frame_bytes(blocks: usize, bytes_per_block: u64) -> u64 {
    (blocks as u64)
        .saturating_mul(bytes_per_block)
        .saturating_add(HEADER_LEN as u64)
}

/// Blocks in each frame of a handoff of `blocks` blocks, `frame_blocks` at most per frame
/// (the last one holds the rest): `ceil(blocks / frame_blocks)` frames, and none for no
/// blocks.
pub fn frame_sizes(blocks: usize, frame_blocks: usize) -> impl Iterator<Item = usize> {
    let per = frame_blocks.max(1);
    (0..blocks.div_ceil(per)).map(move |f| per.min(blocks - f * per))
}

/// One link of the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FabricLink {
    /// A node's NIC, outbound.
    NicOut(usize),
    /// A node's NIC, inbound.
    NicIn(usize),
    /// The switch every transfer crosses.
    Switch,
}

/// The links between the nodes, and the transfers on them.
#[derive(Debug)]
pub struct ClusterFabric {
    links: FluidLinks,
    /// Nodes built at the start: their links come first (see the module docs).
    nodes: usize,
    /// Nodes added since, numbered on from `nodes`.
    added: usize,
    /// Each NIC's bandwidth per direction, for nodes added later.
    nic_bytes_per_s: u64,
    switch: bool,
    /// Latency of one transfer: the NIC's plus the switch's.
    latency: Duration,
    next_id: u64,
}

impl ClusterFabric {
    /// `nodes` nodes, each NIC `nic_bytes_per_s` per direction; a switch of
    /// `switch_bytes_per_s` between them (0: non-blocking, no link of its own).
    pub fn new(
        nodes: usize,
        nic_bytes_per_s: u64,
        nic_latency_ns: u64,
        switch_bytes_per_s: u64,
        switch_latency_ns: u64,
    ) -> Self {
        let switch = switch_bytes_per_s > 0;
        let mut specs = vec![LinkSpec::bandwidth(nic_bytes_per_s); 2 * nodes];
        if switch {
            specs.push(LinkSpec::bandwidth(switch_bytes_per_s));
        }
        Self {
            links: FluidLinks::new(specs),
            nodes,
            added: 0,
            nic_bytes_per_s,
            switch,
            latency: Duration::from_nanos(nic_latency_ns.saturating_add(switch_latency_ns)),
            next_id: 0,
        }
    }

    /// Adds a node, its NICs idle; returns its number (nodes are numbered in order).
    pub fn add_node(&mut self) -> usize {
        let node = self.node_count();
        let out = self
            .links
            .add_link(LinkSpec::bandwidth(self.nic_bytes_per_s));
        self.links
            .add_link(LinkSpec::bandwidth(self.nic_bytes_per_s));
        self.added += 1;
        debug_assert_eq!(out, self.index(FabricLink::NicOut(node)));
        node
    }

    /// Nodes on the fabric: those built with it and those added since.
    pub fn node_count(&self) -> usize {
        self.nodes + self.added
    }

    /// A link's index in `links`: the nodes built at the start lay theirs out as NICs
    /// out, NICs in, the switch; each node added later has its NIC out and in after
    /// those, in the order the nodes came.
    fn index(&self, link: FabricLink) -> usize {
        let first_added = 2 * self.nodes + usize::from(self.switch);
        match link {
            FabricLink::NicOut(node) if node < self.nodes => node,
            FabricLink::NicIn(node) if node < self.nodes => self.nodes + node,
            FabricLink::NicOut(node) => first_added + 2 * (node - self.nodes),
            FabricLink::NicIn(node) => first_added + 2 * (node - self.nodes) + 1,
            FabricLink::Switch => 2 * self.nodes,
        }
    }

    /// Starts a transfer of `bytes` from node `from` to node `to` at `now`; returns its
    /// id (ids grow).
    pub fn start(&mut self, from: usize, to: usize, bytes: u64, now: Timestamp) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut path = vec![self.index(FabricLink::NicOut(from))];
        if self.switch {
            path.push(self.index(FabricLink::Switch));
        }
        path.push(self.index(FabricLink::NicIn(to)));
        self.links.start(id, &path, bytes, self.latency, now);
        id
    }

    /// Moves every transfer forward to `now`.
    pub fn advance(&mut self, now: Timestamp) {
        self.links.advance(now);
    }

    /// Stops transfer `id` at `now` (an end of it crashed): it never lands, the bytes it
    /// had not moved come off its links' usage, and the transfers left share the links
    /// again. Returns whether it was in flight.
    pub fn abort(&mut self, id: u64, now: Timestamp) -> bool {
        self.links.abort(id, now)
    }

    /// The earliest transfer landed by `now` (call [`ClusterFabric::advance`] first).
    pub fn pop_landed(&mut self, now: Timestamp) -> Option<u64> {
        self.links.pop_landed(now)
    }

    /// When something next happens on the fabric (a transfer lands, or one's bytes are
    /// through and the rates change).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.links.next_deadline()
    }

    /// Runs `node`'s NIC in direction `link` (`NicIn` or `NicOut`; others are not on the
    /// fabric) at `factor` of its speed from `now` on.
    pub fn set_nic_speed(&mut self, node: usize, link: Link, factor: f64, now: Timestamp) {
        let link = match link {
            Link::NicIn => FabricLink::NicIn(node),
            Link::NicOut => FabricLink::NicOut(node),
            _ => return,
        };
        if node < self.node_count() {
            let index = self.index(link);
            self.links.set_speed(index, factor, now);
        }
    }

    /// Usage of every link: each node's NIC out, then each node's NIC in (added nodes
    /// included, in node order), then the switch if there is one.
    pub fn usage(&self) -> Vec<(FabricLink, LinkUsage)> {
        let nodes = self.node_count();
        let mut links: Vec<FabricLink> = (0..nodes).map(FabricLink::NicOut).collect();
        links.extend((0..nodes).map(FabricLink::NicIn));
        if self.switch {
            links.push(FabricLink::Switch);
        }
        links
            .into_iter()
            .map(|link| (link, self.links.usage()[self.index(link)]))
            .collect()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const GB: u64 = 1_000_000_000;

    /// Runs the fabric until everything lands; returns each id's landing time.
    fn drain(fabric: &mut ClusterFabric) -> BTreeMap<u64, Timestamp> {
        let mut landed = BTreeMap::new();
        while let Some(at) = fabric.next_deadline() {
            fabric.advance(at);
            while let Some(id) = fabric.pop_landed(at) {
                landed.insert(id, at);
            }
        }
        landed
    }

    #[test]
    fn frames_carry_their_blocks_and_a_header_and_the_last_holds_the_rest() {
        assert_eq!(frame_bytes(16, 1024), 16 * 1024 + 32);
        assert_eq!(frame_sizes(40, 16).collect::<Vec<_>>(), vec![16, 16, 8]);
        assert_eq!(frame_sizes(32, 16).collect::<Vec<_>>(), vec![16, 16]);
        assert_eq!(frame_sizes(0, 16).count(), 0);
    }

    #[test]
    fn a_transfer_takes_its_bytes_over_the_nic_plus_one_hop_of_latency() {
        // 1 MB at 1 GB/s: 1 ms, then 10 µs of NIC and 2 µs of switch latency.
        let mut fabric = ClusterFabric::new(2, GB, 10_000, 0, 2_000);
        let id = fabric.start(0, 1, 1_000_000, Timestamp::ZERO);
        assert_eq!(drain(&mut fabric)[&id], Timestamp::from_nanos(1_012_000));
        assert!(fabric.is_empty());
    }

    #[test]
    fn transfers_into_one_node_share_its_nic_in_and_a_slow_switch_limits_all() {
        // From nodes 0 and 1 into node 2: its NIC in is shared, each takes 2 ms.
        let mut fabric = ClusterFabric::new(3, GB, 0, 0, 0);
        let a = fabric.start(0, 2, 1_000_000, Timestamp::ZERO);
        let b = fabric.start(1, 2, 1_000_000, Timestamp::ZERO);
        let landed = drain(&mut fabric);
        assert_eq!(landed[&a], Timestamp::from_nanos(2_000_000));
        assert_eq!(landed[&b], Timestamp::from_nanos(2_000_000));
        // To different nodes they do not share, unless the switch is the bottleneck.
        let mut fabric = ClusterFabric::new(4, GB, 0, GB, 0);
        let a = fabric.start(0, 2, 1_000_000, Timestamp::ZERO);
        let b = fabric.start(1, 3, 1_000_000, Timestamp::ZERO);
        let landed = drain(&mut fabric);
        assert_eq!(landed[&a], Timestamp::from_nanos(2_000_000));
        assert_eq!(landed[&b], Timestamp::from_nanos(2_000_000));
        let usage = fabric.usage();
        assert_eq!(usage.len(), 9);
        assert_eq!(usage[8].0, FabricLink::Switch);
        assert_eq!(usage[8].1.bytes, 2_000_000);
    }

    #[test]
    fn an_aborted_transfer_never_lands_and_gives_its_share_back() {
        // Two 1 MB transfers into node 2 share its NIC in: 0.5 MB each by 1 ms, when one
        // is aborted; the other's last 0.5 MB then goes at full speed, through at 1.5 ms.
        let mut fabric = ClusterFabric::new(3, GB, 0, 0, 0);
        let a = fabric.start(0, 2, 1_000_000, Timestamp::ZERO);
        let b = fabric.start(1, 2, 1_000_000, Timestamp::ZERO);
        assert!(fabric.abort(a, Timestamp::from_nanos(1_000_000)));
        assert!(!fabric.abort(a, Timestamp::from_nanos(1_000_000)));
        let landed = drain(&mut fabric);
        assert_eq!(landed.len(), 1);
        assert_eq!(landed[&b], Timestamp::from_nanos(1_500_000));
        // Only the bytes it moved count on its links.
        assert_eq!(fabric.usage()[3 + 2].1.bytes, 1_500_000);
    }

    #[test]
    fn an_added_node_gets_its_own_nics_and_the_others_keep_theirs() {
        // Two nodes behind a 1 GB/s switch; a third added: transfers 0 → 1 and 0 → 2
        // share node 0's NIC out (and the switch), 2 ms each, as with three from the
        // start.
        let run = |mut fabric: ClusterFabric| {
            let a = fabric.start(0, 1, 1_000_000, Timestamp::ZERO);
            let b = fabric.start(0, 2, 1_000_000, Timestamp::ZERO);
            let landed = drain(&mut fabric);
            (landed[&a], landed[&b], fabric.usage())
        };
        let mut grown = ClusterFabric::new(2, GB, 0, GB, 0);
        assert_eq!(grown.add_node(), 2);
        assert_eq!(grown.node_count(), 3);
        let (a, b, usage) = run(grown);
        let (a3, b3, usage3) = run(ClusterFabric::new(3, GB, 0, GB, 0));
        assert_eq!((a, b), (a3, b3));
        assert_eq!(
            (a, b),
            (
                Timestamp::from_nanos(2_000_000),
                Timestamp::from_nanos(2_000_000)
            )
        );
        // The same links in the same order: outs, ins, the switch.
        assert_eq!(usage, usage3);
        assert_eq!(usage[5], (FabricLink::NicIn(2), usage3[5].1));
        assert_eq!(usage[5].1.bytes, 1_000_000);
    }
}
