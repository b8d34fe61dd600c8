//! The `cuda` feature: a GPU as `HostHardware`'s device tier, with pinned host memory.
//!
//! Without a driver or a GPU, opening one is a typed error (checked on every machine).
//! The tests that need a GPU print why they skip when there is none, unless
//! `KVTWIN_REQUIRE_GPU=1`, which makes that a failure. They move known bytes
//! (`KvContent`) GPU to host, host to GPU, GPU to GPU, GPU to disk and back, and check
//! them byte for byte; refuse a transfer naming a block twice without hanging; and run
//! the block-copy benchmark small.
#![cfg(feature = "cuda")]

use kvtwin::hardware::{Clock, Hardware, TransferError, TransferRequest};
use kvtwin::ids::{BlockId, SequenceHash};
use kvtwin::tier::Tier;
use kvtwin_backends::content::KvContent;
use kvtwin_backends::cuda::{bench, CudaDevice, CudaError};
use kvtwin_backends::host::{
    DiskIo, HostConfig, HostCosts, HostError, HostHardware, RemoteTier, TierCapacity,
};
use std::time::Duration;

/// Whether GPU 0 can be used; prints why not, or fails under `KVTWIN_REQUIRE_GPU=1`.
fn gpu(test: &str) -> bool {
    match CudaDevice::open(0) {
        Ok(device) => {
            println!("{test}: GPU 0 is {}", device.name());
            true
        }
        Err(error) if std::env::var("KVTWIN_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("{test}: KVTWIN_REQUIRE_GPU=1 but there is no usable GPU: {error}")
        }
        Err(error) => {
            println!("{test}: skipped, no usable GPU ({error})");
            false
        }
    }
}

const BLOCK_BYTES: usize = 64 << 10;
const LAYERS: u32 = 4;

fn config(dir: &std::path::Path) -> HostConfig {
    let tier = |tier, capacity_blocks| TierCapacity {
        tier,
        capacity_blocks,
    };
    HostConfig {
        bytes_per_block: BLOCK_BYTES as u64,
        tiers: vec![
            tier(Tier::Device, 32),
            tier(Tier::Host, 16),
            tier(Tier::Disk, 16),
        ],
        disk_dir: Some(dir.to_path_buf()),
        disk_io: DiskIo::Auto,
        disk_persistent: false,
        remote: RemoteTier::Absent,
        worker_threads: 2,
        max_in_flight: 8,
        costs: HostCosts::default(),
        cuda_device: Some(0),
    }
}

fn ids(range: std::ops::Range<u32>) -> Vec<BlockId> {
    range.map(BlockId::new).collect()
}

fn hash(block: u32) -> SequenceHash {
    SequenceHash::new(0x5eed_0000 + u64::from(block))
}

/// Runs one transfer to completion; its result.
fn transfer(
    hw: &mut HostHardware,
    src_tier: Tier,
    src_blocks: Vec<BlockId>,
    dst_tier: Tier,
    dst_blocks: Vec<BlockId>,
) -> Result<(), TransferError> {
    let bytes = (src_blocks.len() * BLOCK_BYTES) as u64;
    let request = TransferRequest {
        src_tier,
        src_blocks,
        dst_tier,
        dst_blocks,
        bytes,
    };
    let now = hw.clock().now();
    let id = hw.submit(request, now).expect("submitted");
    assert!(hw.wait_completion(Duration::from_secs(30)), "finished");
    let now = hw.clock().now();
    let completion = hw.poll_completion(now).expect("a completion");
    assert_eq!(completion.id, id);
    completion.result
}

fn check(hw: &HostHardware, content: &KvContent, tier: Tier, blocks: &[BlockId], first: u32) {
    let mut bytes = vec![0; BLOCK_BYTES];
    for (offset, block) in blocks.iter().enumerate() {
        hw.read_block(tier, *block, &mut bytes).unwrap();
        let expected = hash(first + offset as u32);
        assert_eq!(content.check(expected, &bytes), Ok(()), "{tier} {block:?}");
    }
}

#[test]
fn without_a_gpu_opening_one_is_a_typed_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    match CudaDevice::open(0) {
        Ok(device) => {
            println!(
                "GPU present ({}): checking a missing ordinal",
                device.name()
            );
            assert!(matches!(
                CudaDevice::open(u32::MAX),
                Err(CudaError::NoSuchDevice { .. })
            ));
        }
        Err(error) => {
            println!("no usable GPU: {error}");
            assert!(matches!(
                HostHardware::new(config(dir.path())),
                Err(HostError::Cuda(_))
            ));
            assert!(matches!(
                bench::run(bench::BlockCopyConfig::default()),
                Err(bench::BenchError::Cuda(_))
            ));
        }
    }
}

#[test]
fn blocks_move_between_gpu_pinned_host_and_disk_byte_for_byte() {
    if !gpu("blocks_move_between_gpu_pinned_host_and_disk_byte_for_byte") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut hw = HostHardware::new(config(dir.path())).unwrap();
    let content = KvContent::new(LAYERS, BLOCK_BYTES / LAYERS as usize).unwrap();
    for block in 0..8 {
        let bytes = content.block(hash(block));
        hw.write_block(Tier::Device, BlockId::new(block), &bytes)
            .unwrap();
    }
    // GPU 0..8 to pinned host 8..16 in reverse (one batch), back to GPU 16..24.
    let reversed: Vec<BlockId> = ids(8..16).into_iter().rev().collect();
    transfer(
        &mut hw,
        Tier::Device,
        ids(0..8),
        Tier::Host,
        reversed.clone(),
    )
    .unwrap();
    let back: Vec<BlockId> = ids(0..8).iter().map(|b| reversed[b.index()]).collect();
    check(&hw, &content, Tier::Host, &back, 0);
    transfer(&mut hw, Tier::Host, back, Tier::Device, ids(16..24)).unwrap();
    check(&hw, &content, Tier::Device, &ids(16..24), 0);
    // Within the GPU, then to disk and back (staged through the worker's buffer).
    transfer(
        &mut hw,
        Tier::Device,
        ids(16..24),
        Tier::Device,
        ids(24..32),
    )
    .unwrap();
    check(&hw, &content, Tier::Device, &ids(24..32), 0);
    transfer(&mut hw, Tier::Device, ids(24..32), Tier::Disk, ids(0..8)).unwrap();
    transfer(&mut hw, Tier::Disk, ids(0..8), Tier::Device, ids(8..16)).unwrap();
    check(&hw, &content, Tier::Device, &ids(8..16), 0);
    let counters = hw.counters();
    assert_eq!(counters.blocks_between(Tier::Device, Tier::Host), 8);
    assert_eq!(counters.blocks_between(Tier::Host, Tier::Device), 8);
    assert_eq!(counters.blocks_between(Tier::Device, Tier::Device), 8);
    assert_eq!(counters.blocks_between(Tier::Disk, Tier::Device), 8);
}

#[test]
fn a_transfer_naming_a_block_twice_fails_instead_of_waiting_on_itself() {
    if !gpu("a_transfer_naming_a_block_twice_fails_instead_of_waiting_on_itself") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut hw = HostHardware::new(config(dir.path())).unwrap();
    let twice = vec![BlockId::new(1), BlockId::new(1)];
    assert_eq!(
        transfer(&mut hw, Tier::Host, ids(0..2), Tier::Device, twice.clone()),
        Err(TransferError::Failed { tier: Tier::Device })
    );
    assert_eq!(
        transfer(&mut hw, Tier::Device, ids(1..3), Tier::Device, ids(2..4)),
        Err(TransferError::Failed { tier: Tier::Device })
    );
    // The hardware carries on.
    transfer(&mut hw, Tier::Host, ids(0..2), Tier::Device, ids(4..6)).unwrap();
}

#[test]
fn the_block_copy_benchmark_reports_every_figure() {
    if !gpu("the_block_copy_benchmark_reports_every_figure") {
        return;
    }
    let report = bench::run(bench::BlockCopyConfig {
        ordinal: 0,
        block_bytes: 2 << 20,
        blocks: 16,
        blocks_per_transfer: 4,
        repeats: 2,
    })
    .unwrap();
    println!("{report:?}");
    for figures in [report.host_to_device, report.device_to_host] {
        assert!(figures.bulk_bytes_per_s > 0.0);
        assert!(figures.blocks_bytes_per_s > 0.0);
        assert!(figures.hardware_bytes_per_s > 0.0);
    }
}
