//! NIXL with real bytes: blocks memory to memory between two agents over UCX, memory to
//! file and back over POSIX, and MRDN frames through `NixlFabric`, each checked byte for
//! byte with `KvContent`.
//!
//! The library is loaded from `KVTWIN_NIXL_LIB_DIR`, or from where
//! `scripts/setup-nixl.sh` unpacks it (`target/nixl/`). Without it every test skips
//! with the reason, unless `KVTWIN_REQUIRE_NIXL=1`, which makes that a failure. Tests
//! take one global lock, so one set of agents exists at a time. Run UCX on loopback:
//! `UCX_NET_DEVICES=lo`.
#![cfg(feature = "nixl")]

use kvtwin::fabric::{Fabric, FabricError};
use kvtwin::ids::SequenceHash;
use kvtwin::layout::{
    AnyLayout, BlockLayout, DType, FullyContiguous, LayerSeparate, LayoutConfig, Region,
};
use kvtwin::phase::Phase;
use kvtwin::wire::{self, DecodeError};
use kvtwin_backends::content::KvContent;
use kvtwin_backends::nixl::{
    BlockTarget, FileRegion, HostBuffer, NixlAgent, NixlBackend, NixlError, NixlFabric,
    NixlFabricConfig, NixlLibrary, NixlPeer, Target, TransferOp, LIB_DIR_ENV,
};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

static AGENTS: Mutex<()> = Mutex::new(());

const TIMEOUT: Duration = Duration::from_secs(20);

/// The library and the global lock, or `None` (after printing why) when the library is
/// absent and not required.
fn nixl(test: &str) -> Option<(NixlLibrary, MutexGuard<'static, ()>)> {
    let guard = AGENTS.lock().unwrap_or_else(|e| e.into_inner());
    let dir = std::env::var_os(LIB_DIR_ENV).map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/nixl/.nixl_cu12.mesonpy.libs"),
        PathBuf::from,
    );
    match NixlLibrary::load(&dir) {
        Ok(library) => Some((library, guard)),
        Err(error) if std::env::var("KVTWIN_REQUIRE_NIXL").as_deref() == Ok("1") => {
            panic!("{test}: KVTWIN_REQUIRE_NIXL=1 but NIXL is unavailable: {error}")
        }
        Err(error) => {
            eprintln!("skipping {test}: NIXL is unavailable ({error})");
            None
        }
    }
}

fn config() -> LayoutConfig {
    // 4 layers of 16 tokens × 64 elements of f16: 2 KiB per layer, 8 KiB per block.
    LayoutConfig::for_model(4, 16, 2, 16, DType::F16).unwrap()
}

fn hash(block: usize) -> SequenceHash {
    SequenceHash::new(0x5eed_0000 + block as u64)
}

/// A fully contiguous layout of `blocks` blocks over a new buffer.
fn contiguous(blocks: usize) -> (Arc<HostBuffer>, AnyLayout) {
    let config = config();
    let len = FullyContiguous::required_bytes(&config, blocks).unwrap();
    let buffer = Arc::new(HostBuffer::new(len as usize).unwrap());
    let layout = FullyContiguous::new(config, blocks, buffer.region()).unwrap();
    (buffer, layout.into())
}

/// A layer-separate layout of `blocks` blocks, one region per layer, all in one buffer.
fn layer_separate(blocks: usize) -> (Arc<HostBuffer>, AnyLayout) {
    let config = config();
    let per_layer = LayerSeparate::required_bytes_per_region(&config, blocks).unwrap();
    let layers = u64::from(config.num_layers);
    let buffer = Arc::new(HostBuffer::new((per_layer * layers) as usize).unwrap());
    let regions = (0..layers)
        .map(|layer| Region {
            base_addr: buffer.addr() + layer * per_layer,
            len: per_layer,
            ..buffer.region()
        })
        .collect();
    let layout = LayerSeparate::new(config, blocks, regions).unwrap();
    (buffer, layout.into())
}

/// Fills `block` of `layout` in `buffer` with the content of `hash`, layer by layer.
fn fill(buffer: &HostBuffer, layout: &AnyLayout, block: usize, hash: SequenceHash) {
    let content = KvContent::for_layout(layout.config()).unwrap();
    for layer in 0..content.num_layers() {
        let at = layout.offset(block, layer as usize).unwrap();
        let mut bytes = vec![0; at.len as usize];
        KvContent::fill_layer(hash, layer, &mut bytes);
        buffer.write_at(at.addr, &bytes).unwrap();
    }
}

/// Checks that `block` of `layout` in `buffer` holds the content of `hash`.
fn check(buffer: &HostBuffer, layout: &AnyLayout, block: usize, hash: SequenceHash) {
    let content = KvContent::for_layout(layout.config()).unwrap();
    let mut bytes = Vec::with_capacity(content.block_bytes());
    for layer in 0..content.num_layers() {
        let at = layout.offset(block, layer as usize).unwrap();
        bytes.extend(buffer.to_vec(at.addr, at.len as usize).unwrap());
    }
    content
        .check(hash, &bytes)
        .unwrap_or_else(|e| panic!("block {block} (hash {hash:?}): {e}"));
}

#[test]
fn ucx_moves_blocks_between_two_agents_byte_for_byte() {
    let Some((library, _guard)) = nixl("ucx_moves_blocks_between_two_agents_byte_for_byte") else {
        return;
    };
    let prefill = NixlAgent::new(&library, "kvtwin-test-prefill", &[NixlBackend::Ucx]).unwrap();
    let decode = NixlAgent::new(&library, "kvtwin-test-decode", &[NixlBackend::Ucx]).unwrap();
    // The two sides lay their blocks out differently: the transfer goes layer by layer.
    let (src, src_layout) = contiguous(8);
    let (dst, dst_layout) = layer_separate(8);
    for block in 0..8 {
        fill(&src, &src_layout, block, hash(block));
    }
    let src_reg = prefill.register_host(src.clone()).unwrap();
    let dst_reg = decode.register_host(dst.clone()).unwrap();

    // The decode side describes itself; the description crosses as bytes.
    let wire = decode.describe(&dst_layout).unwrap().encode();
    let peer = prefill.connect(&NixlPeer::decode(&wire).unwrap()).unwrap();
    assert_eq!(peer.name(), "kvtwin-test-decode");
    assert_eq!(peer.layout(), &dst_layout);

    // Write blocks 0, 1, 2, 5 into the decode side's blocks 3, 0, 7, 1.
    let (from, to) = ([0, 1, 2, 5], [3, 0, 7, 1]);
    let mut transfer = prefill
        .transfer_blocks(
            TransferOp::Write,
            &src_reg,
            &src_layout,
            &from,
            BlockTarget::Peer(&peer),
            &to,
        )
        .unwrap();
    assert_eq!(transfer.bytes(), 4 * 8192);
    transfer.wait(TIMEOUT).unwrap();
    drop(transfer);
    for (&f, &t) in from.iter().zip(&to) {
        check(&dst, &dst_layout, t, hash(f));
    }
    // Untouched blocks are still zero.
    for block in [2, 4, 5, 6] {
        let at = dst_layout.offset(block, 0).unwrap();
        assert!(dst
            .to_vec(at.addr, at.len as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 0));
    }

    // And back: read the decode side's block 7 into the prefill side's block 6.
    let mut transfer = prefill
        .transfer_blocks(
            TransferOp::Read,
            &src_reg,
            &src_layout,
            &[6],
            BlockTarget::Peer(&peer),
            &[7],
        )
        .unwrap();
    transfer.wait(TIMEOUT).unwrap();
    drop(transfer);
    check(&src, &src_layout, 6, hash(2));

    // Ranges outside the registration are refused before NIXL sees them.
    let outside = prefill.transfer(
        TransferOp::Write,
        &src_reg,
        &[kvtwin::layout::Address {
            addr: src.addr() + src.len() as u64 - 8,
            len: 16,
        }],
        Target::Remote { agent: peer.name() },
        &[kvtwin::layout::Address {
            addr: dst.addr(),
            len: 16,
        }],
    );
    assert!(matches!(outside, Err(NixlError::OutOfBounds { .. })));
    // Remote ranges are the peer's to check: NIXL refuses memory it did not register.
    let unregistered = prefill.transfer(
        TransferOp::Write,
        &src_reg,
        &[src_layout.offset(0, 0).unwrap()],
        Target::Remote { agent: peer.name() },
        &[kvtwin::layout::Address {
            addr: dst.addr() + dst.len() as u64,
            len: src_layout.offset(0, 0).unwrap().len,
        }],
    );
    assert!(matches!(unregistered, Err(NixlError::Call { .. })));
    // A registration of another agent is refused too.
    let foreign = prefill.transfer_blocks(
        TransferOp::Write,
        &dst_reg,
        &dst_layout,
        &[0],
        BlockTarget::Peer(&peer),
        &[0],
    );
    assert!(matches!(
        foreign,
        Err(NixlError::ForeignRegistration { .. })
    ));
    drop((outside, unregistered, foreign));
    prefill.disconnect(&peer).unwrap();
}

#[test]
fn posix_writes_blocks_to_a_file_and_reads_them_back() {
    let Some((library, _guard)) = nixl("posix_writes_blocks_to_a_file_and_reads_them_back") else {
        return;
    };
    let agent = NixlAgent::new(&library, "kvtwin-test-posix", &[NixlBackend::Posix]).unwrap();
    let (host, host_layout) = contiguous(4);
    for block in 0..4 {
        fill(&host, &host_layout, block, hash(100 + block));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blocks.kv");
    let disk_len = FullyContiguous::required_bytes(&config(), 6).unwrap();
    let file = Arc::new(FileRegion::create(&path, disk_len).unwrap());
    let disk_layout: AnyLayout = FullyContiguous::new(config(), 6, file.region())
        .unwrap()
        .into();
    let host_reg = agent.register_host(host.clone()).unwrap();
    let file_reg = agent.register_file(file).unwrap();
    let target = BlockTarget::File {
        file: &file_reg,
        layout: &disk_layout,
    };

    // Host blocks 0..4 to disk blocks 5, 0, 2, 3.
    let to_disk = [5, 0, 2, 3];
    let mut transfer = agent
        .transfer_blocks(
            TransferOp::Write,
            &host_reg,
            &host_layout,
            &[0, 1, 2, 3],
            target,
            &to_disk,
        )
        .unwrap();
    transfer.wait(TIMEOUT).unwrap();
    drop(transfer);
    // The file itself holds them, read without NIXL.
    let on_disk = std::fs::read(&path).unwrap();
    let content = KvContent::for_layout(&config()).unwrap();
    for (block, &at) in to_disk.iter().enumerate() {
        let start = disk_layout.offset(at, 0).unwrap().addr as usize;
        content
            .check(
                hash(100 + block),
                &on_disk[start..start + content.block_bytes()],
            )
            .unwrap();
    }

    // Clear the host blocks and read them back from disk, in another order.
    host.write_at(host.addr(), &vec![0; host.len()]).unwrap();
    let mut transfer = agent
        .transfer_blocks(
            TransferOp::Read,
            &host_reg,
            &host_layout,
            &[3, 2, 1, 0],
            target,
            &[5, 0, 2, 3],
        )
        .unwrap();
    transfer.wait(TIMEOUT).unwrap();
    drop(transfer);
    for (block, source) in [(3, 0), (2, 1), (1, 2), (0, 3)] {
        check(&host, &host_layout, block, hash(100 + source));
    }

    // A file range past its end is refused.
    let past_end = agent.transfer(
        TransferOp::Write,
        &host_reg,
        &[host_layout.offset(0, 0).unwrap()],
        Target::File(&file_reg),
        &[kvtwin::layout::Address {
            addr: disk_len - 100,
            len: host_layout.offset(0, 0).unwrap().len,
        }],
    );
    assert!(matches!(past_end, Err(NixlError::OutOfBounds { .. })));
    // UCX was not asked for, so a remote transfer has no backend.
    let remote = agent.transfer(
        TransferOp::Write,
        &host_reg,
        &[host_layout.offset(0, 0).unwrap()],
        Target::Remote { agent: "nobody" },
        &[host_layout.offset(0, 0).unwrap()],
    );
    assert!(matches!(
        remote,
        Err(NixlError::NoBackend {
            backend: NixlBackend::Ucx,
            ..
        })
    ));
}

#[test]
fn nixl_fabric_pushes_and_pulls_mrdn_frames() {
    let Some((library, _guard)) = nixl("nixl_fabric_pushes_and_pulls_mrdn_frames") else {
        return;
    };
    let content = KvContent::for_layout(&config()).unwrap();
    let frame = |block: usize| {
        wire::encode(Phase::ThinkComplete, &content.block(hash(200 + block))).unwrap()
    };
    let one = frame(0).len() as u64;
    // Room for three frames at once.
    let fabric = NixlFabric::new(
        &library,
        NixlFabricConfig::new("kvtwin-test-fabric", 3 * one),
    )
    .unwrap();
    assert_eq!(fabric.label(), "nixl-ucx");

    let handles: Vec<_> = (0..3).map(|b| fabric.push(frame(b)).unwrap()).collect();
    assert_eq!(fabric.in_flight_bytes(), 3 * one);
    assert!(matches!(
        fabric.push(frame(3)),
        Err(FabricError::Full { .. })
    ));
    // Pull the middle one first: its range is reused by the next push.
    let middle = fabric.pull(handles[1]).unwrap();
    let decoded = wire::decode(&middle).unwrap();
    assert_eq!(decoded.phase, Phase::ThinkComplete);
    content.check(hash(201), decoded.body).unwrap();
    assert_eq!(
        fabric.pull(handles[1]),
        Err(FabricError::UnknownHandle(handles[1]))
    );
    let fourth = fabric.push(frame(3)).unwrap();
    for (handle, block) in [(handles[0], 0), (fourth, 3), (handles[2], 2)] {
        let payload = fabric.pull(handle).unwrap();
        content
            .check(hash(200 + block), wire::decode(&payload).unwrap().body)
            .unwrap();
    }
    assert!(fabric.is_empty());
    assert_eq!(fabric.in_flight_bytes(), 0);
    assert_eq!(fabric.transport_failures(), 0);

    // A corrupt frame never enters.
    let mut bad = frame(4);
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert_eq!(
        fabric.push(bad),
        Err(FabricError::Frame(DecodeError::ChecksumMismatch))
    );
}

#[test]
fn a_missing_library_is_a_typed_error() {
    // No lock needed: nothing here reaches nixl-sys.
    match NixlLibrary::load(Path::new("/nonexistent/nixl")) {
        Err(NixlError::LibraryMissing { path }) => {
            assert!(path.ends_with("libnixl_capi.so"))
        }
        // Another test of this binary loaded the real library first; it stays loaded.
        Ok(_) => {}
        Err(other) => panic!("unexpected error: {other}"),
    }
}
