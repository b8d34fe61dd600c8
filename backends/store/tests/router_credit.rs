//! The router service credits a shared store: a `kvtwin store` publishing its KV events
//! on ZMQ, a `RouterState` following them through its shared source (real sockets, the
//! router's own subscriber and decoder), and the front door's choice between two
//! engines. With nothing cached on either engine, both are credited the store's prefix
//! at the shared credit; an engine holding part of it (its own events, over ZMQ too) is
//! credited only beyond its overlap. The store is never a candidate.

mod common;

use common::{block, resp, serve_store_on_zmq, tokens_of, BLOCK_TOKENS};
use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::tokens::{compute_local_hashes, HashSeed, DEFAULT_HASH_SEED};
use kvtwin_plane::service::http::SharedState;
use kvtwin_plane::service::source::{start_vllm_source, start_vllm_source_to};
use kvtwin_plane::service::state::serving::EngineHealth;
use kvtwin_plane::service::state::shared::{EventTarget, DEFAULT_STORE_WORKER_ID};
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::wire::engine::EngineFormat;
use kvtwin_plane::wire::{BlockStored, EngineBatch, EngineEvent};
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Waits until `ready` holds of the state.
fn wait_for(state: &SharedState, what: &str, ready: impl Fn(&RouterState) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready(&state.lock().unwrap()) {
        assert!(Instant::now() < deadline, "waited for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_credits_a_prefix_found_only_in_the_shared_store_beyond_each_engines_own() {
    let (store, endpoint, replay) = serve_store_on_zmq(10).await;
    let state: SharedState = Arc::new(Mutex::new(RouterState::new(BLOCK_TOKENS as usize)));
    {
        let mut router = state.lock().unwrap();
        router.enable_shared(0.5);
        for worker in [1, 2] {
            router.add_engine(WorkerId::new(worker), &format!("http://127.0.0.1:{worker}"));
            router.set_engine_health(WorkerId::new(worker), EngineHealth::Up);
        }
    }
    let _shared = start_vllm_source_to(
        EventTarget::Shared,
        WorkerId::new(DEFAULT_STORE_WORKER_ID),
        &endpoint,
        Some(&replay),
        &state,
    )
    .unwrap();
    // The store holds a three-block prefix; the prompt has a fourth block of its own.
    resp(
        &store,
        &[
            b"MSET",
            b"m:1",
            &block(1, None),
            b"m:2",
            &block(2, Some(1)),
            b"m:3",
            &block(3, Some(2)),
        ],
    )
    .await;
    let prompt = [tokens_of(1), tokens_of(2), tokens_of(3), tokens_of(99)].concat();
    let query: Vec<LocalBlockHash> = compute_local_hashes(
        &prompt,
        BLOCK_TOKENS as usize,
        HashSeed::new(DEFAULT_HASH_SEED),
    );
    wait_for(&state, "the store's three blocks", |router| {
        router.shared_prefix(&query).blocks == 3
    });
    {
        let mut router = state.lock().unwrap();
        assert_eq!(router.shared().blocks(), 3);
        let (chosen, candidates) = router.choose_engine(&query, None, &[], None).unwrap();
        let weighed: Vec<(u64, u32, u32, f64)> = candidates
            .iter()
            .map(|c| {
                (
                    c.worker.worker.get(),
                    c.overlap_blocks,
                    c.shared_blocks,
                    c.cost,
                )
            })
            .collect();
        // 4 blocks to prefill, 3 of them credited at half: 2.5 each; the store is not
        // a candidate.
        assert_eq!(weighed, [(1, 0, 3, 2.5), (2, 0, 3, 2.5)]);
        assert_eq!(chosen.shared_blocks, 3);
        assert!(router
            .workers()
            .iter()
            .all(|w| w.key.worker.get() != DEFAULT_STORE_WORKER_ID));
        let metrics = router.render_metrics();
        assert!(
            metrics
                .lines()
                .any(|l| l == "kvtwin_router_shared_blocks 3"),
            "{metrics}"
        );
    }
    // Engine 1 computed the first two blocks itself (its own events, over ZMQ).
    let mut engine = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let _engine_source = start_vllm_source(
        WorkerId::new(1),
        engine.endpoint(),
        engine.replay_endpoint(),
        &state,
    )
    .unwrap();
    let stored = EngineEvent::BlockStored(BlockStored {
        block_hashes: vec![101, 102],
        token_ids: [tokens_of(1), tokens_of(2)].concat(),
        block_size: BLOCK_TOKENS,
        ..BlockStored::default()
    });
    let batch = EngineBatch::new(0, 0.0, vec![stored], Some(0));
    engine
        .publish(&batch.to_payload(&EngineFormat::Vllm0_33.options()))
        .unwrap();
    wait_for(&state, "engine 1's two blocks", |router| {
        router
            .route(&query)
            .overlaps
            .iter()
            .any(|o| o.worker.worker.get() == 1 && o.blocks == 2)
    });
    {
        let mut router = state.lock().unwrap();
        let dispatch = router.dispatch(&query, 16, None, &[], None).unwrap();
        assert_eq!(dispatch.worker.worker.get(), 1);
        let (records, _) = router.routes_since(dispatch.route_seq - 1);
        let record = records.last().unwrap();
        let weighed: Vec<(u64, u64, u64)> = record
            .candidates
            .iter()
            .map(|c| (c.worker, c.score, c.shared))
            .collect();
        // Engine 1: 2 blocks its own, the third from the store (4 - 2 - 0.5 = 1.5);
        // engine 2: all three from the store (2.5).
        assert_eq!(weighed, [(1, 2, 1), (2, 0, 3)]);
    }
    // The store lets block 3 go: the shared prefix is two blocks now.
    assert_eq!(resp(&store, &[b"DEL", b"m:3"]).await, ":1\r\n");
    wait_for(&state, "block 3's removal", |router| {
        router.shared_prefix(&query).blocks == 2
    });
    let mut router = state.lock().unwrap();
    let (_, candidates) = router.choose_engine(&query, None, &[], None).unwrap();
    let shared: Vec<u32> = candidates.iter().map(|c| c.shared_blocks).collect();
    assert_eq!(shared, [0, 2]);
}
