//! Unit tests of `HostHardware` on its own (the manager on top is in `tests/`).

use super::*;
use kvtwin::hardware::Storage;

const BLOCK: usize = 3000;

fn config(tiers: &[(Tier, usize)], dir: Option<&Path>) -> HostConfig {
    HostConfig {
        bytes_per_block: BLOCK as u64,
        tiers: tiers
            .iter()
            .map(|&(tier, capacity_blocks)| TierCapacity {
                tier,
                capacity_blocks,
            })
            .collect(),
        disk_dir: dir.map(Path::to_path_buf),
        disk_io: DiskIo::Auto,
        disk_persistent: false,
        remote: RemoteTier::Absent,
        worker_threads: 2,
        max_in_flight: 8,
        costs: HostCosts::default(),
        cuda_device: None,
    }
}

fn transfer(src: Tier, from: u32, dst: Tier, to: u32) -> TransferRequest {
    TransferRequest {
        src_tier: src,
        src_blocks: vec![BlockId::new(from)],
        dst_tier: dst,
        dst_blocks: vec![BlockId::new(to)],
        bytes: BLOCK as u64,
    }
}

/// Polls until `count` transfers completed (at most 5 s).
fn completions(hw: &mut HostHardware, count: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut done = Vec::new();
    while done.len() < count {
        assert!(Instant::now() < deadline, "transfers did not finish");
        hw.wait_completion(Duration::from_millis(100));
        let now = hw.clock().now();
        done.extend(std::iter::from_fn(|| hw.poll_completion(now)));
    }
    done
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..BLOCK)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn read(hw: &HostHardware, tier: Tier, block: u32) -> Vec<u8> {
    let mut out = vec![0; BLOCK];
    hw.read_block(tier, BlockId::new(block), &mut out).unwrap();
    out
}

#[test]
fn blocks_travel_device_host_disk_and_back() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let tiers = [(Tier::Device, 2), (Tier::Host, 2), (Tier::Disk, 4)];
    let mut hw = HostHardware::new(config(&tiers, Some(dir.path()))).unwrap();
    hw.write_block(Tier::Device, BlockId::new(0), &pattern(1))
        .unwrap();
    let now = hw.clock().now();
    hw.submit(transfer(Tier::Device, 0, Tier::Host, 1), now)
        .unwrap();
    assert_eq!(completions(&mut hw, 1)[0].result, Ok(()));
    hw.submit(transfer(Tier::Host, 1, Tier::Disk, 3), now)
        .unwrap();
    assert_eq!(completions(&mut hw, 1)[0].result, Ok(()));
    hw.submit(transfer(Tier::Disk, 3, Tier::Device, 1), now)
        .unwrap();
    assert_eq!(completions(&mut hw, 1)[0].result, Ok(()));
    assert_eq!(read(&hw, Tier::Device, 1), pattern(1));
    assert_eq!(read(&hw, Tier::Disk, 3), pattern(1));
    let counters = hw.counters();
    assert_eq!(counters.transfers_submitted, 3);
    assert_eq!(counters.transfers_completed, 3);
    assert_eq!(counters.bytes_between(Tier::Host, Tier::Disk), BLOCK as u64);
    assert_eq!(counters.blocks_between(Tier::Disk, Tier::Device), 1);
    assert!(counters.disk_io.is_some());
    assert_eq!(hw.in_flight(), 0);
    assert!(
        !hw.wait_completion(Duration::from_secs(10)),
        "nothing in flight"
    );
}

#[test]
fn a_corrupt_disk_block_completes_corrupt_is_counted_and_never_reaches_the_destination() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let tiers = [(Tier::Device, 2), (Tier::Disk, 4)];
    let mut hw = HostHardware::new(config(&tiers, Some(dir.path()))).unwrap();
    hw.write_block(Tier::Disk, BlockId::new(2), &pattern(5))
        .unwrap();
    // Flip one bit of the block in the file, through the raw storage view.
    let offset = hw.disk_block_offset(BlockId::new(2)).unwrap() + 100;
    let mut byte = [0u8];
    hw.storage().read(offset, &mut byte).unwrap();
    hw.storage().write(offset, &[byte[0] ^ 1]).unwrap();
    hw.write_block(Tier::Device, BlockId::new(0), &[0xAB; BLOCK])
        .unwrap();
    let now = hw.clock().now();
    hw.submit(transfer(Tier::Disk, 2, Tier::Device, 0), now)
        .unwrap();
    assert_eq!(
        completions(&mut hw, 1)[0].result,
        Err(TransferError::Corrupt { tier: Tier::Disk })
    );
    assert_eq!(read(&hw, Tier::Device, 0), vec![0xAB; BLOCK], "not served");
    let mut out = vec![0x11; BLOCK];
    assert_eq!(
        hw.read_block(Tier::Disk, BlockId::new(2), &mut out),
        Err(BlockAccessError::Transfer(TransferError::Corrupt {
            tier: Tier::Disk
        }))
    );
    assert_eq!(out, vec![0x11; BLOCK]);
    // A slot never written has no valid trailer either.
    assert!(hw
        .read_block(Tier::Disk, BlockId::new(1), &mut out)
        .is_err());
    let counters = hw.counters();
    assert_eq!(counters.checksum_failures(Tier::Disk), 3);
    assert_eq!(counters.transfers_failed, 1);
}

#[test]
fn submit_refuses_beyond_the_in_flight_bound_until_completions_are_polled() {
    let tiers = [(Tier::Device, 4), (Tier::Host, 4)];
    let mut hw = HostHardware::new(HostConfig {
        max_in_flight: 2,
        ..config(&tiers, None)
    })
    .unwrap();
    let now = hw.clock().now();
    hw.submit(transfer(Tier::Device, 0, Tier::Host, 0), now)
        .unwrap();
    hw.submit(transfer(Tier::Device, 1, Tier::Host, 1), now)
        .unwrap();
    assert_eq!(
        hw.submit(transfer(Tier::Device, 2, Tier::Host, 2), now),
        Err(SubmitError::QueueFull { depth: 2 })
    );
    // Finished but not yet polled still counts: the manager has not seen it.
    assert!(hw.wait_completion(Duration::from_secs(5)));
    assert_eq!(completions(&mut hw, 2).len(), 2);
    hw.submit(transfer(Tier::Device, 2, Tier::Host, 2), hw.clock().now())
        .unwrap();
    assert_eq!(completions(&mut hw, 1)[0].result, Ok(()));
}

#[test]
fn completions_are_handed_out_only_once_they_finished_by_now() {
    let tiers = [(Tier::Device, 1), (Tier::Host, 1)];
    let mut hw = HostHardware::new(config(&tiers, None)).unwrap();
    let id = hw
        .submit(transfer(Tier::Device, 0, Tier::Host, 0), Timestamp::ZERO)
        .unwrap();
    assert!(hw.wait_completion(Duration::from_secs(5)));
    assert_eq!(hw.poll_completion(Timestamp::ZERO), None);
    let done = hw.poll_completion(hw.clock().now()).unwrap();
    assert_eq!((done.id, done.result), (id, Ok(())));
    assert_eq!(hw.next_deadline(), None);
}

#[test]
fn malformed_and_absent_tier_transfers_are_refused_and_bad_blocks_fail() {
    let tiers = [(Tier::Device, 2), (Tier::Host, 2), (Tier::Remote, 2)];
    let mut hw = HostHardware::new(config(&tiers, None)).unwrap();
    let now = hw.clock().now();
    let mut empty = transfer(Tier::Device, 0, Tier::Host, 0);
    empty.src_blocks.clear();
    assert_eq!(
        hw.submit(empty, now),
        Err(SubmitError::Malformed { src: 0, dst: 1 })
    );
    // The manager's config has a remote tier, this hardware was told it has none.
    assert_eq!(
        hw.submit(transfer(Tier::Device, 0, Tier::Remote, 0), now),
        Err(SubmitError::TierUnavailable(Tier::Remote))
    );
    assert_eq!(
        hw.submit(transfer(Tier::Disk, 0, Tier::Device, 0), now),
        Err(SubmitError::TierUnavailable(Tier::Disk))
    );
    hw.submit(transfer(Tier::Device, 0, Tier::Host, 9), now)
        .unwrap();
    assert_eq!(
        completions(&mut hw, 1)[0].result,
        Err(TransferError::Failed { tier: Tier::Host })
    );
    assert_eq!(
        hw.write_block(Tier::Host, BlockId::new(2), &pattern(0)),
        Err(BlockAccessError::BlockOutOfRange {
            tier: Tier::Host,
            block: BlockId::new(2),
            capacity: 2
        })
    );
    assert_eq!(
        hw.write_block(Tier::Host, BlockId::new(0), &[0; 3]),
        Err(BlockAccessError::WrongLength {
            expected: BLOCK,
            actual: 3
        })
    );
    assert_eq!(
        hw.write_block(Tier::Remote, BlockId::new(0), &pattern(0)),
        Err(BlockAccessError::TierAbsent(Tier::Remote))
    );
}

#[test]
fn the_remote_tier_round_trips_frames_through_the_fabric() {
    let tiers = [(Tier::Device, 2), (Tier::Remote, 2)];
    let mut hw = HostHardware::new(HostConfig {
        remote: RemoteTier::InProcess {
            capacity_bytes: 1 << 20,
        },
        ..config(&tiers, None)
    })
    .unwrap();
    hw.write_block(Tier::Device, BlockId::new(0), &pattern(7))
        .unwrap();
    let now = hw.clock().now();
    hw.submit(transfer(Tier::Device, 0, Tier::Remote, 1), now)
        .unwrap();
    assert_eq!(completions(&mut hw, 1)[0].result, Ok(()));
    assert_eq!(hw.fabric().len(), 1);
    // Read twice: a read pulls the frame and pushes it back.
    for _ in 0..2 {
        hw.submit(transfer(Tier::Remote, 1, Tier::Device, 1), hw.clock().now())
            .unwrap();
        assert_eq!(completions(&mut hw, 1)[0].result, Ok(()));
        assert_eq!(read(&hw, Tier::Device, 1), pattern(7));
    }
    // Overwriting a remote block releases its old frame.
    hw.write_block(Tier::Remote, BlockId::new(1), &pattern(8))
        .unwrap();
    assert_eq!(hw.fabric().len(), 1);
    assert_eq!(read(&hw, Tier::Remote, 1), pattern(8));
    // A remote block never written is not there.
    hw.submit(transfer(Tier::Remote, 0, Tier::Device, 1), hw.clock().now())
        .unwrap();
    assert_eq!(
        completions(&mut hw, 1)[0].result,
        Err(TransferError::Failed { tier: Tier::Remote })
    );
}

#[test]
fn bad_configurations_are_typed_errors() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let disk = [(Tier::Device, 2), (Tier::Disk, 2)];
    let missing = dir.path().join("missing");
    type Expected = fn(&HostError) -> bool;
    let cases: Vec<(HostConfig, Expected)> = vec![
        (
            HostConfig {
                bytes_per_block: 0,
                ..config(&disk, Some(dir.path()))
            },
            |e| matches!(e, HostError::NoBlockBytes),
        ),
        (config(&disk, None), |e| {
            matches!(e, HostError::NoDiskDirectory)
        }),
        (config(&disk, Some(&missing)), |e| {
            matches!(e, HostError::DiskDirectory { .. })
        }),
        (config(&[(Tier::Host, 1), (Tier::Host, 1)], None), |e| {
            matches!(e, HostError::RepeatedTier(Tier::Host))
        }),
        (
            HostConfig {
                worker_threads: 0,
                ..config(&disk, Some(dir.path()))
            },
            |e| matches!(e, HostError::NoWorkers),
        ),
        (
            HostConfig {
                max_in_flight: 0,
                ..config(&disk, Some(dir.path()))
            },
            |e| matches!(e, HostError::NoTransfers),
        ),
        (config(&[(Tier::Device, usize::MAX)], None), |e| {
            matches!(e, HostError::TooLarge { tier: Tier::Device })
        }),
        (config(&[(Tier::Host, 1 << 40)], None), |e| {
            matches!(
                e,
                HostError::OutOfMemory { .. } | HostError::TooLarge { .. }
            )
        }),
    ];
    for (config, expected) in cases {
        let error = HostHardware::new(config.clone()).unwrap_err();
        assert!(expected(&error), "{config:?} gave {error:?}");
        println!("{error}");
    }
}

#[test]
fn dropping_the_hardware_finishes_its_transfers_joins_its_threads_and_removes_its_file() {
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let tiers = [(Tier::Device, 16), (Tier::Disk, 16)];
    let mut hw = HostHardware::new(config(&tiers, Some(dir.path()))).unwrap();
    let path = hw.disk_path().unwrap().to_path_buf();
    assert!(path.exists());
    let now = hw.clock().now();
    for block in 0..8 {
        hw.submit(transfer(Tier::Device, block, Tier::Disk, block), now)
            .unwrap();
    }
    drop(hw);
    assert!(!path.exists());
}

#[test]
fn estimates_follow_the_slower_side_and_recompute_scales_with_blocks() {
    let hw = HostHardware::new(config(&[(Tier::Device, 1)], None)).unwrap();
    // Disk to device at the disk's 2 GB/s: 2 MB take 1 ms.
    assert_eq!(
        hw.estimate_transfer(Tier::Disk, Tier::Device, 2_000_000),
        Duration::from_millis(1)
    );
    assert_eq!(
        hw.estimate_transfer(Tier::Device, Tier::Disk, 2_000_000),
        Duration::from_millis(2)
    );
    assert_eq!(hw.estimate_recompute(3), Duration::from_millis(3));
}
