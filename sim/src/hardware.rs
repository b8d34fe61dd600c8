//! `SimHardware`: a `Hardware` whose transfers take the time the hardware model says.
//!
//! Owns: [`HardwareProfile`] (link bandwidths and latencies, a per-token compute cost),
//! [`Link`] and [`SimHardware`]. Each transfer crosses the links of its path (PCIe per
//! direction, NVMe read or write, NIC in or out); it takes the sum of their latencies plus
//! its bytes over the tightest link's bandwidth, and each link serves its transfers one
//! after another (first come, first served).
//! This is the first, simple contention model: fair sharing of a link among concurrent
//! transfers comes with the simulator issue.
//! Never: read a wall clock; every deadline derives from `now` arguments.

use kvtwin::fabric::InProcessFabric;
use kvtwin::hardware::{
    Clock, Completion, DeadlineQueue, Hardware, MemoryStorage, SubmitError, TransferRequest,
};
use kvtwin::ids::{Timestamp, TransferId};
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::time::Duration;

/// Bandwidths (bytes per second), latencies (nanoseconds) and compute costs of one
/// worker's node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HardwareProfile {
    /// A name for reports.
    pub name: String,
    /// PCIe bandwidth per direction between GPU and host.
    pub pcie_bytes_per_s: u64,
    /// PCIe latency per transfer.
    pub pcie_latency_ns: u64,
    /// NVMe sequential read bandwidth.
    pub nvme_read_bytes_per_s: u64,
    /// NVMe sequential write bandwidth.
    pub nvme_write_bytes_per_s: u64,
    /// NVMe latency per transfer.
    pub nvme_latency_ns: u64,
    /// NIC bandwidth per direction.
    pub nic_bytes_per_s: u64,
    /// Network latency per transfer.
    pub nic_latency_ns: u64,
    /// Prefill cost per prompt token (a linear placeholder for the compute model).
    pub prefill_ns_per_token: u64,
    /// Decode cost per generated token.
    pub decode_ns_per_token: u64,
    /// Transfers in flight at most.
    pub max_inflight_transfers: usize,
}

/// One direction of one physical link.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Link {
    /// Host to GPU.
    PcieHostToDevice,
    /// GPU to host.
    PcieDeviceToHost,
    /// SSD reads.
    NvmeRead,
    /// SSD writes.
    NvmeWrite,
    /// Network, inbound.
    NicIn,
    /// Network, outbound.
    NicOut,
}

impl Link {
    /// Every link, in report order.
    pub const ALL: [Link; 6] = [
        Link::PcieHostToDevice,
        Link::PcieDeviceToHost,
        Link::NvmeRead,
        Link::NvmeWrite,
        Link::NicIn,
        Link::NicOut,
    ];

    fn index(self) -> usize {
        Link::ALL.iter().position(|l| *l == self).unwrap_or(0)
    }

    /// The link's name in reports.
    pub const fn name(self) -> &'static str {
        match self {
            Link::PcieHostToDevice => "pcie_h2d",
            Link::PcieDeviceToHost => "pcie_d2h",
            Link::NvmeRead => "nvme_read",
            Link::NvmeWrite => "nvme_write",
            Link::NicIn => "nic_in",
            Link::NicOut => "nic_out",
        }
    }
}

/// The links a transfer from `src` to `dst` crosses, in order.
pub fn path(src: Tier, dst: Tier) -> Vec<Link> {
    // Everything is staged through host memory: out of the source tier into the host,
    // then from the host into the destination tier.
    let mut links = Vec::new();
    match src {
        Tier::Device => links.push(Link::PcieDeviceToHost),
        Tier::Host => {}
        Tier::Disk => links.push(Link::NvmeRead),
        Tier::Remote => links.push(Link::NicIn),
    }
    match dst {
        Tier::Device => links.push(Link::PcieHostToDevice),
        Tier::Host => {}
        Tier::Disk => links.push(Link::NvmeWrite),
        Tier::Remote => links.push(Link::NicOut),
    }
    links
}

/// What one link did during a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LinkUsage {
    /// Bytes carried.
    pub bytes: u64,
    /// Time spent carrying them.
    pub busy_ns: u64,
    /// Transfers carried.
    pub transfers: u64,
}

/// A clock the simulator sets.
#[derive(Debug, Default)]
pub struct SimClock {
    now: Cell<Timestamp>,
}

impl SimClock {
    /// Sets the simulated time.
    pub fn set(&self, now: Timestamp) {
        self.now.set(now);
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        self.now.get()
    }
}

/// The simulated node.
#[derive(Debug)]
pub struct SimHardware {
    profile: HardwareProfile,
    block_size_tokens: u64,
    clock: SimClock,
    fabric: InProcessFabric,
    storage: MemoryStorage,
    busy_until: [Timestamp; 6],
    usage: [LinkUsage; 6],
    queue: DeadlineQueue,
}

impl SimHardware {
    /// A node with `profile`, for blocks of `block_size_tokens` tokens.
    pub fn new(profile: HardwareProfile, block_size_tokens: usize) -> Self {
        let queue = DeadlineQueue::new(profile.max_inflight_transfers);
        Self {
            profile,
            block_size_tokens: block_size_tokens as u64,
            clock: SimClock::default(),
            fabric: InProcessFabric::new(1 << 30),
            storage: MemoryStorage::new(),
            busy_until: [Timestamp::ZERO; 6],
            usage: [LinkUsage::default(); 6],
            queue,
        }
    }

    /// The profile.
    pub fn profile(&self) -> &HardwareProfile {
        &self.profile
    }

    /// Per-link usage so far, in [`Link::ALL`] order.
    pub fn link_usage(&self) -> Vec<(Link, LinkUsage)> {
        Link::ALL
            .iter()
            .map(|l| (*l, self.usage[l.index()]))
            .collect()
    }

    fn bandwidth(&self, link: Link) -> u64 {
        let p = &self.profile;
        match link {
            Link::PcieHostToDevice | Link::PcieDeviceToHost => p.pcie_bytes_per_s,
            Link::NvmeRead => p.nvme_read_bytes_per_s,
            Link::NvmeWrite => p.nvme_write_bytes_per_s,
            Link::NicIn | Link::NicOut => p.nic_bytes_per_s,
        }
        .max(1)
    }

    fn latency(&self, link: Link) -> Duration {
        let p = &self.profile;
        Duration::from_nanos(match link {
            Link::PcieHostToDevice | Link::PcieDeviceToHost => p.pcie_latency_ns,
            Link::NvmeRead | Link::NvmeWrite => p.nvme_latency_ns,
            Link::NicIn | Link::NicOut => p.nic_latency_ns,
        })
    }

    /// Latency and serialisation time of `bytes` over `links`.
    fn spans(&self, links: &[Link], bytes: u64) -> (Duration, Duration) {
        let latency = links.iter().map(|l| self.latency(*l)).sum();
        let bandwidth = links.iter().map(|l| self.bandwidth(*l)).min();
        let wire = bandwidth.map_or(Duration::ZERO, |bw| {
            Duration::from_nanos(((u128::from(bytes) * 1_000_000_000) / u128::from(bw)) as u64)
        });
        (latency, wire)
    }
}

impl Hardware for SimHardware {
    type Clock = SimClock;
    type Fabric = InProcessFabric;
    type Storage = MemoryStorage;

    fn clock(&self) -> &SimClock {
        &self.clock
    }

    fn fabric(&self) -> &InProcessFabric {
        &self.fabric
    }

    fn storage(&mut self) -> &mut MemoryStorage {
        &mut self.storage
    }

    fn submit(
        &mut self,
        request: TransferRequest,
        now: Timestamp,
    ) -> Result<TransferId, SubmitError> {
        self.queue.admit(&request)?;
        let links = path(request.src_tier, request.dst_tier);
        let (latency, wire) = self.spans(&links, request.bytes);
        // First come, first served: start when every link on the path is free.
        let start = links
            .iter()
            .map(|l| self.busy_until[l.index()])
            .fold(now, Timestamp::max);
        let wire_done = start.saturating_add(wire);
        for link in &links {
            self.busy_until[link.index()] = wire_done;
            let usage = &mut self.usage[link.index()];
            usage.bytes += request.bytes;
            usage.busy_ns += wire.as_nanos() as u64;
            usage.transfers += 1;
        }
        Ok(self.queue.push(wire_done.saturating_add(latency)))
    }

    fn poll_completion(&mut self, now: Timestamp) -> Option<Completion> {
        self.queue
            .pop_due(now)
            .map(|id| Completion { id, result: Ok(()) })
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        self.queue.next_deadline()
    }

    fn estimate_transfer(&self, src: Tier, dst: Tier, bytes: u64) -> Duration {
        let (latency, wire) = self.spans(&path(src, dst), bytes);
        latency + wire
    }

    fn estimate_recompute(&self, blocks: usize) -> Duration {
        let tokens = (blocks as u64).saturating_mul(self.block_size_tokens);
        Duration::from_nanos(tokens.saturating_mul(self.profile.prefill_ns_per_token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::ids::BlockId;

    fn profile() -> HardwareProfile {
        HardwareProfile {
            name: "test".into(),
            pcie_bytes_per_s: 1_000_000_000,
            pcie_latency_ns: 1_000,
            nvme_read_bytes_per_s: 500_000_000,
            nvme_write_bytes_per_s: 250_000_000,
            nvme_latency_ns: 10_000,
            nic_bytes_per_s: 1_000_000_000,
            nic_latency_ns: 5_000,
            prefill_ns_per_token: 100,
            decode_ns_per_token: 10_000,
            max_inflight_transfers: 8,
        }
    }

    fn transfer(src: Tier, dst: Tier, bytes: u64) -> TransferRequest {
        TransferRequest {
            src_tier: src,
            src_blocks: vec![BlockId::new(0)],
            dst_tier: dst,
            dst_blocks: vec![BlockId::new(0)],
            bytes,
        }
    }

    #[test]
    fn a_transfer_takes_latency_plus_bytes_over_the_tightest_link() {
        let hw = SimHardware::new(profile(), 16);
        // Disk → device: NVMe read (500 MB/s) then PCIe: 1 MB takes 2 ms + 11 µs.
        assert_eq!(
            hw.estimate_transfer(Tier::Disk, Tier::Device, 1_000_000),
            Duration::from_nanos(2_011_000)
        );
        assert_eq!(hw.estimate_recompute(2), Duration::from_nanos(3_200));
    }

    #[test]
    fn transfers_on_one_link_queue_behind_each_other() {
        let mut hw = SimHardware::new(profile(), 16);
        let t0 = Timestamp::ZERO;
        hw.submit(transfer(Tier::Host, Tier::Device, 1_000_000), t0)
            .unwrap();
        hw.submit(transfer(Tier::Host, Tier::Device, 1_000_000), t0)
            .unwrap();
        // A transfer on the other direction does not wait.
        hw.submit(transfer(Tier::Device, Tier::Host, 1_000_000), t0)
            .unwrap();
        assert_eq!(hw.next_deadline(), Some(Timestamp::from_nanos(1_001_000)));
        assert!(hw
            .poll_completion(Timestamp::from_nanos(1_000_999))
            .is_none());
        assert!(hw
            .poll_completion(Timestamp::from_nanos(1_001_000))
            .is_some());
        let usage = hw.link_usage();
        assert_eq!(usage[0].1.bytes, 2_000_000);
    }

    #[test]
    fn the_transfer_queue_is_bounded() {
        let mut hw = SimHardware::new(
            HardwareProfile {
                max_inflight_transfers: 1,
                ..profile()
            },
            16,
        );
        hw.submit(transfer(Tier::Host, Tier::Device, 1), Timestamp::ZERO)
            .unwrap();
        assert_eq!(
            hw.submit(transfer(Tier::Host, Tier::Device, 1), Timestamp::ZERO),
            Err(SubmitError::QueueFull { depth: 1 })
        );
    }
}
