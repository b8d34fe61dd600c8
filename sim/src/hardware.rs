//! `SimHardware`: a `Hardware` whose transfers take the time the hardware model says.
//!
//! Owns: [`HardwareProfile`] (link bandwidths, latencies, SSD IOPS and queue depth, a
//! per-token compute cost), [`Link`] and [`SimHardware`]. Each transfer crosses the links
//! of its path (PCIe per direction, NVMe read or write, NIC in or out); transfers in
//! flight share each link max-min fairly and small SSD I/O is bound by IOPS
//! ([`crate::links`] has the model); a transfer lands the sum of its links' latencies
//! after its bytes are through.
//!
//! Fault points: a link can be slowed ([`SimHardware::set_link_speed`]) and a tier's
//! storage can fail ([`SimHardware::fail_tier`]): its transfers in flight fail at once
//! and new ones are refused until [`SimHardware::restore_tier`].
//! Never: read a wall clock; every deadline derives from `now` arguments.

use crate::compute::{ComputeModel, UnknownProfile};
use crate::links::{FluidLinks, LinkSpec};
use kvtwin::fabric::InProcessFabric;
use kvtwin::hardware::{
    Clock, Completion, Hardware, MemoryStorage, SubmitError, TransferError, TransferRequest,
};
use kvtwin::ids::{Timestamp, TransferId};
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// Bandwidths (bytes per second), latencies (nanoseconds) and compute costs of one
/// worker's node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
    /// NVMe random-read operations per second (0: bound by bandwidth only).
    #[serde(default)]
    pub nvme_read_iops: u64,
    /// NVMe write operations per second (0: bound by bandwidth only).
    #[serde(default)]
    pub nvme_write_iops: u64,
    /// The largest NVMe operation: a transfer is split into operations this big.
    #[serde(default = "default_nvme_max_io_bytes")]
    pub nvme_max_io_bytes: u64,
    /// NVMe transfers in service at once per direction (0: unbound); more wait in order.
    /// Those in service share the direction's bandwidth, each at most at its
    /// per-transfer rate: the NVMe as a few servers rather than one fluid pipe. With
    /// `transfer_workers`, a transfer waiting for one keeps its worker.
    #[serde(default)]
    pub nvme_queue_depth: usize,
    /// NIC bandwidth per direction.
    pub nic_bytes_per_s: u64,
    /// Network latency per transfer.
    pub nic_latency_ns: u64,
    /// Prefill cost per prompt token, when `compute` is not given.
    pub prefill_ns_per_token: u64,
    /// Decode cost per generated token, when `compute` is not given.
    pub decode_ns_per_token: u64,
    /// Forward-pass times: a built-in profile by name (`Builtin("h100-llama3-8b")`, see
    /// [`ComputeModel::BUILTIN`]) or a model of its own; without it, the two per-token
    /// costs above.
    #[serde(default)]
    pub compute: Option<ComputeChoice>,
    /// Transfers in flight at most.
    pub max_inflight_transfers: usize,
    /// One transfer's rate at most on PCIe, bytes per second (0: only the link bounds
    /// it): a single copy stream, such as one worker thread of a host backend.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pcie_transfer_bytes_per_s: u64,
    /// One transfer's rate at most reading the NVMe (0: only the link bounds it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nvme_read_transfer_bytes_per_s: u64,
    /// One transfer's rate at most writing the NVMe (0: only the link bounds it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nvme_write_transfer_bytes_per_s: u64,
    /// Transfers in service at once over all links (0: unbound): a backend's pool of copy
    /// threads (`HostHardware`'s workers); more wait in submission order.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub transfer_workers: usize,
    /// PCIe transfers in service at once per direction (0: unbound, every transfer in
    /// flight shares the link): copy engines, or the copies memory bandwidth serves at
    /// one transfer's rate each; more wait in arrival order. With `transfer_workers`, a
    /// transfer waiting for one keeps its worker.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pcie_servers: usize,
}

fn is_zero<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

fn default_nvme_max_io_bytes() -> u64 {
    1 << 20
}

/// Where a profile's forward-pass times come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ComputeChoice {
    /// A built-in profile, by name.
    Builtin(String),
    /// A model given in full.
    Custom(Box<ComputeModel>),
}

impl HardwareProfile {
    /// The forward-pass time model this profile describes.
    pub fn compute_model(&self) -> Result<ComputeModel, UnknownProfile> {
        match &self.compute {
            Some(ComputeChoice::Builtin(name)) => ComputeModel::builtin(name),
            Some(ComputeChoice::Custom(model)) => Ok((**model).clone()),
            None => Ok(ComputeModel::Linear {
                prefill_ns_per_token: self.prefill_ns_per_token,
                decode_ns_per_token: self.decode_ns_per_token,
            }),
        }
    }
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

pub use crate::links::LinkUsage;

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
    links: FluidLinks,
    next_id: u64,
    /// Source and destination tier of every transfer not yet reported, by id.
    routes: BTreeMap<u64, (Tier, Tier)>,
    /// Tiers whose storage failed (index: `Tier::index`): transfers to or from them are
    /// refused.
    down: [bool; 4],
    /// Transfers a tier failure stopped, with when and where, to report as failed.
    failed: VecDeque<(Timestamp, u64, Tier)>,
}

impl SimHardware {
    /// A node with `profile`, for blocks of `block_size_tokens` tokens.
    pub fn new(profile: HardwareProfile, block_size_tokens: usize) -> Self {
        let mut specs: Vec<LinkSpec> = Link::ALL.iter().map(|l| link_spec(&profile, *l)).collect();
        if profile.transfer_workers > 0 {
            // The worker pool as one more link, of no bandwidth limit, with a queue depth;
            // every transfer crosses it first (see `worker_link`).
            specs.push(LinkSpec {
                queue_depth: Some(profile.transfer_workers),
                ..LinkSpec::bandwidth(u64::MAX)
            });
        }
        let links = if profile.transfer_workers > 0 {
            // A worker thread blocked in its copy or I/O call waits with the transfer.
            FluidLinks::new(specs).holding_while_queued()
        } else {
            FluidLinks::new(specs)
        };
        Self {
            profile,
            block_size_tokens: block_size_tokens as u64,
            clock: SimClock::default(),
            fabric: InProcessFabric::new(1 << 30),
            storage: MemoryStorage::new(),
            links,
            next_id: 0,
            routes: BTreeMap::new(),
            down: [false; 4],
            failed: VecDeque::new(),
        }
    }

    /// The storage of `tier` fails at `now`: every transfer to or from it that has not
    /// been reported stops (its link share goes to the others) and is reported failed
    /// at `now`; new transfers touching it are refused with `TierUnavailable` until
    /// [`SimHardware::restore_tier`]. Returns the number of transfers failed.
    pub fn fail_tier(&mut self, tier: Tier, now: Timestamp) -> usize {
        self.down[tier.index()] = true;
        let touching: Vec<u64> = self
            .routes
            .iter()
            .filter(|(_, (src, dst))| *src == tier || *dst == tier)
            .map(|(id, _)| *id)
            .collect();
        for id in &touching {
            self.links.abort(*id, now);
            self.routes.remove(id);
            self.failed.push_back((now, *id, tier));
        }
        touching.len()
    }

    /// The storage of `tier` is back (empty, as far as the manager knows): transfers to
    /// and from it are accepted again.
    pub fn restore_tier(&mut self, tier: Tier) {
        self.down[tier.index()] = false;
    }

    /// The profile.
    pub fn profile(&self) -> &HardwareProfile {
        &self.profile
    }

    /// Per-link usage so far, in [`Link::ALL`] order.
    pub fn link_usage(&self) -> Vec<(Link, LinkUsage)> {
        Link::ALL
            .iter()
            .map(|l| (*l, self.links.usage()[l.index()]))
            .collect()
    }

    fn latency(&self, link: Link) -> Duration {
        let p = &self.profile;
        Duration::from_nanos(match link {
            Link::PcieHostToDevice | Link::PcieDeviceToHost => p.pcie_latency_ns,
            Link::NvmeRead | Link::NvmeWrite => p.nvme_latency_ns,
            Link::NicIn | Link::NicOut => p.nic_latency_ns,
        })
    }

    /// Runs `link` at `factor` of its profile's speed from `now` on (1.0 restores it).
    pub fn set_link_speed(&mut self, link: Link, factor: f64, now: Timestamp) {
        self.links.set_speed(link.index(), factor, now);
    }

    /// The index of the worker pool's link, when the profile bounds the transfers in
    /// service: it comes after [`Link::ALL`] and never shows in [`Self::link_usage`].
    fn worker_link(&self) -> Option<usize> {
        (self.profile.transfer_workers > 0).then_some(Link::ALL.len())
    }

    /// Latency and time on the wire of `bytes` over `links` with nothing else in flight.
    fn spans(&self, links: &[Link], bytes: u64) -> (Duration, Duration) {
        let latency = links.iter().map(|l| self.latency(*l)).sum();
        let wire_s = links
            .iter()
            .map(|l| self.links.specs()[l.index()].seconds_alone(bytes))
            .fold(0.0f64, f64::max);
        (latency, Duration::from_nanos((wire_s * 1e9).round() as u64))
    }
}

/// The fluid model's view of `link` under `profile`.
fn link_spec(profile: &HardwareProfile, link: Link) -> LinkSpec {
    let per_transfer = |bytes_per_s: u64| (bytes_per_s > 0).then_some(bytes_per_s as f64);
    let nvme = |bytes_per_s: u64, iops: u64, transfer: u64| LinkSpec {
        ops_per_s: (iops > 0).then_some(iops as f64),
        max_op_bytes: profile.nvme_max_io_bytes.max(1),
        queue_depth: (profile.nvme_queue_depth > 0).then_some(profile.nvme_queue_depth),
        max_transfer_bytes_per_s: per_transfer(transfer),
        ..LinkSpec::bandwidth(bytes_per_s)
    };
    match link {
        Link::PcieHostToDevice | Link::PcieDeviceToHost => LinkSpec {
            max_transfer_bytes_per_s: per_transfer(profile.pcie_transfer_bytes_per_s),
            queue_depth: (profile.pcie_servers > 0).then_some(profile.pcie_servers),
            ..LinkSpec::bandwidth(profile.pcie_bytes_per_s)
        },
        Link::NvmeRead => nvme(
            profile.nvme_read_bytes_per_s,
            profile.nvme_read_iops,
            profile.nvme_read_transfer_bytes_per_s,
        ),
        Link::NvmeWrite => nvme(
            profile.nvme_write_bytes_per_s,
            profile.nvme_write_iops,
            profile.nvme_write_transfer_bytes_per_s,
        ),
        Link::NicIn | Link::NicOut => LinkSpec::bandwidth(profile.nic_bytes_per_s),
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
        request.check_shape()?;
        if let Some(tier) = [request.src_tier, request.dst_tier]
            .into_iter()
            .find(|tier| self.down[tier.index()])
        {
            return Err(SubmitError::TierUnavailable(tier));
        }
        if self.links.len() >= self.profile.max_inflight_transfers {
            return Err(SubmitError::QueueFull {
                depth: self.links.len(),
            });
        }
        let links = path(request.src_tier, request.dst_tier);
        let latency = links.iter().map(|l| self.latency(*l)).sum();
        // The worker pool first: a transfer waiting for a worker waits there.
        let indices: Vec<usize> = self
            .worker_link()
            .into_iter()
            .chain(links.iter().map(|l| l.index()))
            .collect();
        let id = self.next_id;
        self.next_id += 1;
        self.links.start(id, &indices, request.bytes, latency, now);
        self.routes.insert(id, (request.src_tier, request.dst_tier));
        Ok(TransferId::new(id))
    }

    fn poll_completion(&mut self, now: Timestamp) -> Option<Completion> {
        if let Some(&(at, id, tier)) = self.failed.front() {
            if at <= now {
                self.failed.pop_front();
                return Some(Completion {
                    id: TransferId::new(id),
                    result: Err(TransferError::Failed { tier }),
                });
            }
        }
        self.links.advance(now);
        let id = self.links.pop_landed(now)?;
        self.routes.remove(&id);
        Some(Completion {
            id: TransferId::new(id),
            result: Ok(()),
        })
    }

    fn next_deadline(&self) -> Option<Timestamp> {
        let failed = self.failed.front().map(|(at, ..)| *at);
        match (failed, self.links.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn estimate_transfer(&self, src: Tier, dst: Tier, bytes: u64) -> Duration {
        let (latency, wire) = self.spans(&path(src, dst), bytes);
        latency + wire
    }

    fn estimate_recompute(&self, blocks: usize) -> Duration {
        let tokens = (blocks as u64).saturating_mul(self.block_size_tokens);
        Duration::from_nanos(tokens.saturating_mul(self.profile.prefill_ns_per_token))
    }

    /// The simulator builds, runs and drops its managers on one thread, and no transfer
    /// finishes anywhere else: its pools lock without atomic operations.
    fn single_threaded(&self) -> bool {
        true
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
            nvme_read_iops: 0,
            nvme_write_iops: 0,
            nvme_max_io_bytes: 1 << 20,
            nvme_queue_depth: 0,
            nic_bytes_per_s: 1_000_000_000,
            nic_latency_ns: 5_000,
            prefill_ns_per_token: 100,
            decode_ns_per_token: 10_000,
            compute: None,
            max_inflight_transfers: 8,
            pcie_transfer_bytes_per_s: 0,
            nvme_read_transfer_bytes_per_s: 0,
            nvme_write_transfer_bytes_per_s: 0,
            transfer_workers: 0,
            pcie_servers: 0,
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

    /// Polls `hw` at each deadline until everything lands; returns landing times by id.
    fn drain(hw: &mut SimHardware) -> Vec<(u64, u64)> {
        let mut landed = Vec::new();
        while let Some(at) = hw.next_deadline() {
            while let Some(done) = hw.poll_completion(at) {
                assert_eq!(done.result, Ok(()));
                landed.push((done.id.get(), at.as_nanos()));
            }
        }
        landed
    }

    #[test]
    fn transfers_on_one_link_share_it_and_directions_are_separate_links() {
        let mut hw = SimHardware::new(profile(), 16);
        let t0 = Timestamp::ZERO;
        for (src, dst) in [
            (Tier::Host, Tier::Device),
            (Tier::Host, Tier::Device),
            (Tier::Device, Tier::Host),
        ] {
            hw.submit(transfer(src, dst, 1_000_000), t0).unwrap();
        }
        // The two host-to-device transfers share PCIe at 0.5 GB/s each (2 ms); the other
        // direction is a link of its own (1 ms); each lands 1 µs of latency later.
        assert_eq!(
            drain(&mut hw),
            vec![(2, 1_001_000), (0, 2_001_000), (1, 2_001_000)]
        );
        let usage = hw.link_usage();
        assert_eq!(
            (usage[0].1.bytes, usage[0].1.busy_ns),
            (2_000_000, 2_000_000)
        );
    }

    #[test]
    fn small_ssd_reads_are_bound_by_iops() {
        let mut hw = SimHardware::new(
            HardwareProfile {
                nvme_read_bytes_per_s: 6_500_000_000,
                nvme_read_iops: 1_000_000,
                ..profile()
            },
            16,
        );
        // 4 KiB from disk to host: 1 µs of IOPS (not 0.63 µs of bandwidth) + 10 µs.
        assert_eq!(
            hw.estimate_transfer(Tier::Disk, Tier::Host, 4096),
            Duration::from_nanos(11_000)
        );
        hw.submit(transfer(Tier::Disk, Tier::Host, 4096), Timestamp::ZERO)
            .unwrap();
        assert_eq!(drain(&mut hw), vec![(0, 11_000)]);
    }

    #[test]
    fn a_failed_tier_fails_its_transfers_in_flight_and_refuses_new_ones_until_restored() {
        let mut hw = SimHardware::new(profile(), 16);
        let t0 = Timestamp::ZERO;
        let read = hw
            .submit(transfer(Tier::Disk, Tier::Device, 1_000_000), t0)
            .unwrap();
        let copy = hw
            .submit(transfer(Tier::Host, Tier::Device, 1_000_000), t0)
            .unwrap();
        let at = Timestamp::from_nanos(500_000);
        assert_eq!(hw.fail_tier(Tier::Disk, at), 1);
        assert_eq!(hw.next_deadline(), Some(at));
        assert_eq!(
            hw.poll_completion(at),
            Some(Completion {
                id: read,
                result: Err(TransferError::Failed { tier: Tier::Disk }),
            })
        );
        assert_eq!(
            hw.submit(transfer(Tier::Host, Tier::Disk, 1), at),
            Err(SubmitError::TierUnavailable(Tier::Disk))
        );
        // Until then the two shared PCIe (the read held to the disk's 0.5 GB/s, the copy
        // the other 0.5 GB/s); after it, the copy's last 0.75 MB moves at 1 GB/s: through
        // at 1.25 ms, landing 1 µs later.
        assert_eq!(drain(&mut hw), vec![(copy.get(), 1_251_000)]);
        hw.restore_tier(Tier::Disk);
        assert!(hw.submit(transfer(Tier::Host, Tier::Disk, 1), at).is_ok());
    }

    #[test]
    fn a_host_backend_profile_caps_each_transfer_and_bounds_the_workers() {
        // PCIe 2 GB/s but 1 GB/s per transfer, two workers: three 1 MB host-to-device
        // copies at once: two run at 1 GB/s each (1 ms), the third waits for a worker and
        // runs alone at its 1 GB/s cap (through at 2 ms); each lands 1 µs later.
        let mut hw = SimHardware::new(
            HardwareProfile {
                pcie_bytes_per_s: 2_000_000_000,
                pcie_transfer_bytes_per_s: 1_000_000_000,
                transfer_workers: 2,
                ..profile()
            },
            16,
        );
        assert_eq!(
            hw.estimate_transfer(Tier::Host, Tier::Device, 1_000_000),
            Duration::from_nanos(1_001_000)
        );
        for _ in 0..3 {
            hw.submit(
                transfer(Tier::Host, Tier::Device, 1_000_000),
                Timestamp::ZERO,
            )
            .unwrap();
        }
        assert_eq!(
            drain(&mut hw),
            vec![(0, 1_001_000), (1, 1_001_000), (2, 2_001_000)]
        );
        assert_eq!(hw.link_usage().len(), Link::ALL.len());
        // Zero fields stay out of what a profile serialises to.
        let text = serde_json::to_string(&profile()).unwrap();
        assert!(!text.contains("transfer_workers"), "{text}");
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
