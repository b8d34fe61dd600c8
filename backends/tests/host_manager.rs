//! A `Manager<HostHardware>` end to end: blocks computed on the (emulated) device with
//! known content, offloaded to host, disk and remote, evicted, looked up and onboarded
//! again, and checked byte for byte; a corrupt disk block; backpressure; bad directories.

use kvtwin::block::BlockIdentity;
use kvtwin::hardware::{Clock, Hardware, Storage, SubmitError};
use kvtwin::ids::{LocalBlockHash, RequestId, SequenceHash, Timestamp, WorkerId};
use kvtwin::layout::{DType, LayoutConfig};
use kvtwin::manager::{
    Manager, ManagerConfig, ManagerOutput, OffloadPolicy, OnboardError, OnboardPolicy, TierConfig,
};
use kvtwin::pool::{BlockChain, EvictionPolicyKind};
use kvtwin::tier::Tier;
use kvtwin_backends::content::KvContent;
use kvtwin_backends::host::{DiskIo, HostConfig, HostError, HostHardware, RemoteTier};
use std::path::Path;
use std::time::{Duration, Instant};

/// 4 layers of 16 tokens × 2 KV heads × 16 dims × 2 (K and V) in f16: 2 KiB a layer.
fn layout() -> LayoutConfig {
    LayoutConfig::for_model(4, 16, 2, 16, DType::F16).unwrap()
}

fn tier(tier: Tier, capacity_blocks: usize, offload: OffloadPolicy) -> TierConfig {
    TierConfig {
        tier,
        capacity_blocks,
        eviction: EvictionPolicyKind::Lru,
        offload,
    }
}

fn manager_config(tiers: Vec<TierConfig>) -> ManagerConfig {
    ManagerConfig {
        worker_id: WorkerId::new(1),
        dp_rank: 0,
        block_size_tokens: 16,
        bytes_per_block: layout().block_bytes().unwrap(),
        tiers,
        onboard: OnboardPolicy::Always,
        max_inflight_transfers: 64,
    }
}

/// A manager on host hardware, with the content of its blocks' shape.
struct Rig {
    m: Manager<HostHardware>,
    content: KvContent,
}

impl Rig {
    fn new(config: ManagerConfig, host: HostConfig) -> Self {
        let hardware = HostHardware::new(host).unwrap();
        Self {
            m: Manager::new(hardware, config).unwrap(),
            content: KvContent::for_layout(&layout()).unwrap(),
        }
    }

    fn now(&self) -> Timestamp {
        self.m.hardware().clock().now()
    }

    /// Drives the manager until no transfer is in flight (at most 5 s); the outputs.
    fn settle(&mut self) -> Vec<ManagerOutput> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut outputs = Vec::new();
        loop {
            let now = self.now();
            self.m.handle_completions(now);
            outputs.extend(std::iter::from_fn(|| self.m.poll_output()));
            let _ = self.m.take_events();
            if self.m.transfers_in_flight() == 0 {
                return outputs;
            }
            assert!(Instant::now() < deadline, "transfers did not finish");
            self.m
                .hardware()
                .wait_completion(Duration::from_millis(100));
        }
    }

    /// Computes `ids` on device: allocates, writes their content, registers, lets go.
    fn compute(&mut self, ids: &[BlockIdentity]) {
        let now = self.now();
        let blocks = self.m.allocate(ids.len(), now).unwrap();
        for (block, id) in blocks.iter().zip(ids) {
            let bytes = self.content.block(id.sequence_hash);
            self.m
                .hardware()
                .write_block(Tier::Device, block.block_id(), &bytes)
                .unwrap();
        }
        let complete = blocks
            .into_iter()
            .zip(ids)
            .map(|(block, id)| block.apply_identity(*id))
            .collect();
        let registered = self.m.register(complete, now);
        self.m.device().release(registered);
    }

    /// Looks `ids` up, onboards every lower-tier hit, and returns the onboarded device
    /// blocks and the blocks that failed.
    fn onboard(&mut self, ids: &[BlockIdentity], from: Tier) -> (BlockChain, usize) {
        let now = self.now();
        let mut plan = self.m.lookup(&hashes(ids), now);
        assert_eq!(plan.device_blocks().len(), 0, "evicted from device");
        assert_eq!(plan.onboard_count(from), ids.len(), "all on {from}");
        assert_eq!(
            self.m.start_onboard(RequestId::new(1), &mut plan, now),
            Ok(1)
        );
        drop(plan);
        let mut done = None;
        for output in self.settle() {
            if let ManagerOutput::OnboardComplete {
                blocks,
                failed_blocks,
                ..
            } = output
            {
                done = Some((blocks, failed_blocks));
            }
        }
        done.expect("the onboarding completed")
    }

    /// Checks every block of `chain` (on device) against its content.
    fn check(&self, chain: &BlockChain) {
        let mut bytes = vec![0; self.content.block_bytes()];
        for (block, hash) in chain.block_ids().zip(chain.sequence_hashes()) {
            self.m
                .hardware()
                .read_block(Tier::Device, block, &mut bytes)
                .unwrap();
            assert_eq!(self.content.check(hash, &bytes), Ok(()), "{block:?}");
        }
    }

    fn holds(&self, tier: Tier, ids: &[BlockIdentity]) -> usize {
        let pool = self.m.pool(tier).unwrap();
        ids.iter()
            .filter(|id| pool.contains(id.sequence_hash))
            .count()
    }
}

fn chain(seed: u64, n: u64) -> Vec<BlockIdentity> {
    let locals: Vec<LocalBlockHash> = (0..n)
        .map(|i| LocalBlockHash::new(seed * 1000 + i))
        .collect();
    BlockIdentity::chain(&locals)
}

fn hashes(ids: &[BlockIdentity]) -> Vec<SequenceHash> {
    ids.iter().map(|id| id.sequence_hash).collect()
}

fn write_through_tiers() -> Vec<TierConfig> {
    vec![
        tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Host, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Disk, 16, OffloadPolicy::None),
    ]
}

/// Chain A ends up on disk only, chain B on device, host and disk.
fn a_on_disk_only(rig: &mut Rig) -> (Vec<BlockIdentity>, Vec<BlockIdentity>) {
    let (a, b) = (chain(1, 4), chain(2, 4));
    rig.compute(&a);
    rig.settle();
    rig.compute(&b);
    rig.settle();
    assert_eq!(
        (rig.holds(Tier::Device, &a), rig.holds(Tier::Host, &a)),
        (0, 0)
    );
    assert_eq!(rig.holds(Tier::Disk, &a), 4);
    (a, b)
}

/// Blocks computed on the device, written through to host and disk, evicted and
/// onboarded from disk and from host, checked byte for byte; the device tier is GPU
/// `cuda_device` when given.
fn round_trip_through_host_and_disk(dir: &Path, disk_io: DiskIo, cuda_device: Option<u32>) {
    let config = manager_config(write_through_tiers());
    let host = HostConfig {
        disk_io,
        cuda_device,
        ..HostConfig::for_manager(&config, Some(dir))
    };
    let mut rig = Rig::new(config, host);
    let (a, b) = a_on_disk_only(&mut rig);
    let (blocks, failed) = rig.onboard(&a, Tier::Disk);
    assert_eq!((blocks.len(), failed), (4, 0));
    assert_eq!(blocks.sequence_hashes().collect::<Vec<_>>(), hashes(&a));
    rig.check(&blocks);
    drop(blocks);
    // A took the device: B is on host (and disk) now, and comes back from the host.
    assert_eq!(rig.holds(Tier::Device, &b), 0);
    let (blocks, failed) = rig.onboard(&b, Tier::Host);
    assert_eq!((blocks.len(), failed), (4, 0));
    rig.check(&blocks);
    let counters = rig.m.hardware().counters();
    let block_bytes = rig.content.block_bytes() as u64;
    assert_eq!(
        counters.bytes_between(Tier::Disk, Tier::Device),
        4 * block_bytes
    );
    assert_eq!(
        counters.bytes_between(Tier::Host, Tier::Device),
        4 * block_bytes
    );
    assert_eq!(counters.blocks_between(Tier::Host, Tier::Disk), 8);
    assert_eq!(counters.checksum_failures(Tier::Disk), 0);
    assert_eq!(rig.m.stats().onboarded_blocks[Tier::Disk.index()], 4);
    println!(
        "{}: disk I/O {:?}",
        dir.display(),
        counters.disk_io.unwrap()
    );
}

#[test]
fn write_through_blocks_come_back_from_host_and_disk_byte_for_byte() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    round_trip_through_host_and_disk(dir.path(), DiskIo::Auto, None);
    round_trip_through_host_and_disk(dir.path(), DiskIo::Buffered, None);
}

/// The same round trip with GPU 0 as the device tier and pinned host memory: batched
/// copies on streams between GPU and host, staged copies between GPU and disk. Skipped
/// with the reason when there is no GPU, unless `KVTWIN_REQUIRE_GPU=1`.
#[cfg(feature = "cuda")]
#[test]
fn write_through_blocks_round_trip_through_a_gpu_device_tier() {
    if let Err(error) = kvtwin_backends::cuda::CudaDevice::open(0) {
        if std::env::var("KVTWIN_REQUIRE_GPU").as_deref() == Ok("1") {
            panic!("KVTWIN_REQUIRE_GPU=1 but there is no usable GPU: {error}");
        }
        println!("skipped: no usable GPU ({error})");
        return;
    }
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    round_trip_through_host_and_disk(dir.path(), DiskIo::Auto, Some(0));
}

/// Without feature `cuda`, asking for a GPU device tier is a clean error.
#[cfg(not(feature = "cuda"))]
#[test]
fn a_gpu_device_tier_without_the_cuda_feature_is_a_clean_error() {
    let config = manager_config(write_through_tiers());
    let host = HostConfig {
        cuda_device: Some(0),
        ..HostConfig::for_manager(&config, None)
    };
    assert!(matches!(
        HostHardware::new(host),
        Err(HostError::CudaNotBuilt)
    ));
}

#[test]
fn the_disk_tier_works_on_tmpfs() {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        println!("skipped: no /dev/shm (tmpfs) on this machine");
        return;
    }
    // tmpfs refuses O_DIRECT before Linux 6.6 (the fallback) and takes it since.
    let dir = tempfile::tempdir_in(shm).unwrap();
    round_trip_through_host_and_disk(dir.path(), DiskIo::Auto, None);
}

#[test]
fn write_back_copies_blocks_down_before_eviction_and_they_come_back_intact() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let config = manager_config(vec![
        tier(
            Tier::Device,
            4,
            OffloadPolicy::WriteBack {
                low_watermark_blocks: 2,
            },
        ),
        tier(
            Tier::Host,
            8,
            OffloadPolicy::WriteBack {
                low_watermark_blocks: 2,
            },
        ),
        tier(Tier::Disk, 32, OffloadPolicy::None),
    ]);
    let host = HostConfig::for_manager(&config, Some(dir.path()));
    let mut rig = Rig::new(config, host);
    let chains: Vec<Vec<BlockIdentity>> = (1..=6).map(|seed| chain(seed, 2)).collect();
    for ids in &chains {
        rig.compute(ids);
        rig.settle();
    }
    assert!(rig.m.stats().offloaded_blocks[Tier::Disk.index()] > 0);
    let mut from = [0usize; 4];
    // Newest first: the newest evicted chains are still on host, the oldest on disk.
    for ids in chains.iter().rev() {
        rig.settle();
        let now = rig.now();
        let mut plan = rig.m.lookup(&hashes(ids), now);
        if plan.device_blocks().len() == ids.len() {
            continue;
        }
        assert_eq!(plan.blocks_to_compute(), 0, "every block is in some tier");
        for block in plan.onboard_blocks() {
            from[block.tier().index()] += 1;
        }
        rig.m
            .start_onboard(RequestId::new(2), &mut plan, now)
            .unwrap();
        drop(plan);
        for output in rig.settle() {
            if let ManagerOutput::OnboardComplete {
                blocks,
                failed_blocks,
                ..
            } = output
            {
                assert_eq!(failed_blocks, 0);
                rig.check(&blocks);
            }
        }
    }
    assert!(
        from[Tier::Host.index()] > 0 && from[Tier::Disk.index()] > 0,
        "onboarded from host and disk: {from:?}"
    );
}

#[test]
fn a_corrupt_disk_block_is_counted_never_served_forgotten_and_recomputed() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let config = manager_config(write_through_tiers());
    let host = HostConfig::for_manager(&config, Some(dir.path()));
    let mut rig = Rig::new(config, host);
    let (a, _) = a_on_disk_only(&mut rig);
    // Flip one byte of A's third block in the extent file.
    let victim = a[2].sequence_hash;
    let disk_block = rig
        .m
        .pool(Tier::Disk)
        .unwrap()
        .get(victim)
        .unwrap()
        .block_id();
    let offset = rig.m.hardware().disk_block_offset(disk_block).unwrap() + 1000;
    let storage = rig.m.hardware_mut().storage();
    let mut byte = [0u8];
    storage.read(offset, &mut byte).unwrap();
    storage.write(offset, &[!byte[0]]).unwrap();

    let (blocks, failed) = rig.onboard(&a, Tier::Disk);
    assert_eq!((blocks.len(), failed), (0, 4), "the whole run failed");
    let counters = rig.m.hardware().counters();
    assert_eq!(counters.checksum_failures(Tier::Disk), 1);
    assert_eq!(counters.transfers_failed, 1);
    assert_eq!(rig.m.stats().onboard_failed_blocks, 4);
    // Never served: no device block holds the corrupt bytes.
    let mut corrupt = rig.content.block(victim);
    corrupt[1000] = !corrupt[1000];
    let mut bytes = vec![0; rig.content.block_bytes()];
    for block in 0..4 {
        rig.m
            .hardware()
            .read_block(Tier::Device, kvtwin::ids::BlockId::new(block), &mut bytes)
            .unwrap();
        assert_ne!(bytes, corrupt);
    }
    // The bad copies are forgotten (the hardware names the tier, not the block, so the
    // whole run goes): the next lookup misses.
    assert_eq!(rig.m.stats().corrupt_blocks_forgotten, 4);
    assert_eq!(rig.holds(Tier::Disk, &a), 0);
    let plan = rig.m.lookup(&hashes(&a), rig.now());
    assert_eq!(plan.blocks_to_compute(), 4);
    drop(plan);
    // The request computes the blocks that did not arrive, and they are right.
    rig.compute(&a);
    rig.settle();
    let plan = rig.m.lookup(&hashes(&a), rig.now());
    assert_eq!(plan.device_blocks().len(), 4);
    rig.check(plan.device_blocks());
    drop(plan);
    // Written through afresh, the disk copies serve the next onboarding intact.
    assert_eq!(rig.holds(Tier::Disk, &a), 4);
    rig.compute(&chain(3, 4));
    rig.settle();
    let (blocks, failed) = rig.onboard(&a, Tier::Disk);
    assert_eq!((blocks.len(), failed), (4, 0));
    rig.check(&blocks);
    assert_eq!(rig.m.hardware().counters().checksum_failures(Tier::Disk), 1);
}

#[test]
fn a_full_transfer_queue_skips_offloads_and_refuses_onboards_until_it_drains() {
    let config = manager_config(vec![
        tier(Tier::Device, 8, OffloadPolicy::WriteThrough),
        tier(Tier::Host, 16, OffloadPolicy::None),
    ]);
    let host = HostConfig {
        max_in_flight: 1,
        ..HostConfig::for_manager(&config, None)
    };
    let mut rig = Rig::new(config, host);
    let (a, b, c, d) = (chain(1, 4), chain(2, 4), chain(3, 4), chain(4, 4));
    rig.compute(&a);
    rig.compute(&b); // A's copy is still in flight (until polled): B's is refused.
    assert_eq!(rig.m.stats().offload_skipped_blocks, 4);
    rig.settle();
    assert_eq!(
        (rig.holds(Tier::Host, &a), rig.holds(Tier::Host, &b)),
        (4, 0)
    );
    rig.compute(&c); // takes A's device blocks
    rig.settle();
    rig.compute(&d); // its copy stays in flight while A is looked up
    let now = rig.now();
    let mut plan = rig.m.lookup(&hashes(&a), now);
    assert_eq!(plan.onboard_count(Tier::Host), 4);
    assert_eq!(
        rig.m.start_onboard(RequestId::new(3), &mut plan, now),
        Err(OnboardError::Submit(SubmitError::QueueFull { depth: 1 }))
    );
    assert_eq!(plan.onboard_count(Tier::Host), 4, "the plan is unchanged");
    rig.settle();
    let now = rig.now();
    assert_eq!(
        rig.m.start_onboard(RequestId::new(3), &mut plan, now),
        Ok(1)
    );
    drop(plan);
    let outputs = rig.settle();
    let Some(ManagerOutput::OnboardComplete { blocks, .. }) = outputs
        .into_iter()
        .find(|o| matches!(o, ManagerOutput::OnboardComplete { .. }))
    else {
        panic!("no onboarding output");
    };
    assert_eq!(blocks.len(), 4);
    rig.check(&blocks);
}

#[test]
fn the_remote_tier_holds_blocks_on_the_fabric_or_is_refused_when_absent() {
    let config = manager_config(vec![
        tier(Tier::Device, 4, OffloadPolicy::WriteThrough),
        tier(Tier::Remote, 8, OffloadPolicy::None),
    ]);
    let host = HostConfig::for_manager(&config, None);
    assert!(matches!(host.remote, RemoteTier::InProcess { .. }));
    let mut rig = Rig::new(config.clone(), host);
    let (a, b) = (chain(1, 4), chain(2, 4));
    rig.compute(&a);
    rig.settle();
    rig.compute(&b);
    rig.settle();
    assert_eq!(rig.m.hardware().fabric().len(), 8);
    let (blocks, failed) = rig.onboard(&a, Tier::Remote);
    assert_eq!((blocks.len(), failed), (4, 0));
    rig.check(&blocks);

    let absent = HostConfig {
        remote: RemoteTier::Absent,
        ..HostConfig::for_manager(&config, None)
    };
    let mut rig = Rig::new(config, absent);
    rig.compute(&a);
    rig.settle();
    assert_eq!(rig.m.stats().offload_skipped_blocks, 4);
    assert_eq!(rig.holds(Tier::Remote, &a), 0);
}

#[test]
fn a_bad_disk_directory_is_a_clean_error() {
    let config = manager_config(write_through_tiers());
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let missing = dir.path().join("not-there");
    assert!(matches!(
        HostHardware::for_manager(&config, Some(&missing)),
        Err(HostError::DiskDirectory { .. })
    ));
    assert!(matches!(
        HostHardware::for_manager(&config, None),
        Err(HostError::NoDiskDirectory)
    ));
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let error = HostHardware::for_manager(&config, Some(&file)).unwrap_err();
    assert!(matches!(error, HostError::DiskDirectory { .. }), "{error}");
}
