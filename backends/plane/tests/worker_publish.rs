//! A kvtwin worker feeding a vLLM-events consumer: a `Manager` (on the core's
//! deterministic `TestHardware`: the transfers are not what is checked here) computes
//! token sequences, writes them through to host and evicts; its events go out as vLLM
//! batches (`WorkerPublisher`, tokens from the driver's sequences) over real ZMQ, and
//! kvtwin's router, reading them as it reads vLLM, ends up holding exactly the blocks
//! the manager's own event stream says it holds, under the same sequence hashes.

use kvtwin::block::BlockIdentity;
use kvtwin::events::RegistryReplica;
use kvtwin::hardware::{Clock, Hardware};
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{SequenceHash, WorkerId};
use kvtwin::layout::{DType, LayoutConfig};
use kvtwin::manager::{Manager, ManagerConfig, OffloadPolicy, OnboardPolicy, TierConfig};
use kvtwin::pool::EvictionPolicyKind;
use kvtwin::testing::{TestHardware, TransferTiming};
use kvtwin::tier::Tier;
use kvtwin::tokens::{HashSeed, TokenBlockSequence};
use kvtwin_plane::service::http::{lock, SharedState};
use kvtwin_plane::service::publish::{PublishError, WorkerPublisher};
use kvtwin_plane::service::source::ZmqSource;
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::wire::{DecodeLimits, EngineDecoder, EngineFormat, UnknownEvents};
use kvtwin_plane::zmq::{PublisherConfig, SubscriberConfig};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BLOCK: usize = 16;
const WORKER: u64 = 4;

fn manager() -> Manager<TestHardware> {
    let layout = LayoutConfig::for_model(2, BLOCK as u32, 2, 8, DType::F16).unwrap();
    let tier = |tier, capacity_blocks, offload| TierConfig {
        tier,
        capacity_blocks,
        eviction: EvictionPolicyKind::Lru,
        offload,
    };
    let config = ManagerConfig {
        worker_id: WorkerId::new(WORKER),
        dp_rank: 0,
        block_size_tokens: BLOCK,
        bytes_per_block: layout.block_bytes().unwrap(),
        tiers: vec![
            tier(Tier::Device, 12, OffloadPolicy::WriteThrough),
            tier(Tier::Host, 24, OffloadPolicy::None),
        ],
        onboard: OnboardPolicy::Always,
        max_inflight_transfers: 16,
    };
    Manager::new(TestHardware::new(TransferTiming::Instant), config).unwrap()
}

/// Computes `tokens` on the device, registers the blocks, lets them go, and completes
/// the write-through copies (instant on `TestHardware`).
fn compute(
    m: &mut Manager<TestHardware>,
    tokens: &[u32],
    known: &mut BTreeMap<SequenceHash, Vec<u32>>,
) {
    let sequence = TokenBlockSequence::new(tokens, BLOCK, HashSeed::default()).unwrap();
    let now = m.hardware().clock().now();
    let blocks = m.allocate(sequence.blocks().len(), now).unwrap();
    let complete = blocks
        .into_iter()
        .zip(sequence.blocks())
        .map(|(block, token_block)| {
            known.insert(token_block.sequence_hash(), token_block.tokens().to_vec());
            block.apply_identity(BlockIdentity::of_token_block(token_block))
        })
        .collect();
    let registered = m.register(complete, now);
    m.device().release(registered);
    for _ in 0..100 {
        if m.transfers_in_flight() == 0 {
            return;
        }
        m.handle_completions(now);
        while m.poll_output().is_some() {}
    }
    panic!("transfers did not finish");
}

#[test]
fn the_router_reads_a_kvtwin_worker_as_it_reads_vllm() {
    let mut m = manager();
    let mut publisher = WorkerPublisher::bind(
        &PublisherConfig::new("tcp://127.0.0.1:*", Some("tcp://127.0.0.1:*")),
        EngineFormat::Vllm0_33.options(),
        BLOCK as u32,
    )
    .unwrap();
    let state: SharedState = Arc::new(Mutex::new(RouterState::new(BLOCK)));
    let source = ZmqSource::start(
        WorkerId::new(WORKER),
        SubscriberConfig::new(
            publisher.publisher().endpoint(),
            publisher.publisher().replay_endpoint(),
        ),
        EngineDecoder::new(DecodeLimits::default(), UnknownEvents::Skip),
        state.clone(),
    )
    .unwrap();

    let mut known = BTreeMap::new();
    let mut replica = RegistryReplica::new();
    let mut sent_events = 0;
    let system: Vec<u32> = (0..48).collect();
    for request in 0..12u32 {
        // A shared 3-block prefix and two blocks of the request's own.
        let mut tokens = system.clone();
        tokens.extend((0..2 * BLOCK as u32).map(|t| 1000 + request * 100 + t));
        compute(&mut m, &tokens, &mut known);
        let events = m.take_events();
        for event in &events {
            replica.apply(event).unwrap();
        }
        sent_events += events.len() as u64;
        publisher
            .publish(&events, f64::from(request), |hash, out| {
                match known.get(&hash) {
                    Some(tokens) => {
                        out.extend_from_slice(tokens);
                        true
                    }
                    None => false,
                }
            })
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while lock(&state).metrics().events_applied < sent_events {
        assert!(Instant::now() < deadline, "{:?}", lock(&state).metrics());
        std::thread::sleep(Duration::from_millis(20));
    }
    let router = lock(&state);
    let held = router.indexer().blocks_of(WorkerWithDpRank {
        worker: WorkerId::new(WORKER),
        dp_rank: 0,
    });
    for tier in [Tier::Device, Tier::Host] {
        let in_router: Vec<SequenceHash> = held
            .iter()
            .filter(|(_, tiers)| *tiers & (1 << tier.index()) != 0)
            .map(|(hash, _)| *hash)
            .collect();
        let in_manager: Vec<SequenceHash> = replica.hashes(tier).iter().copied().collect();
        assert_eq!(in_router, in_manager, "{tier}");
        assert!(!in_manager.is_empty(), "{tier}");
    }
    assert!(
        router.metrics().dropped().is_empty(),
        "{:?}",
        router.metrics()
    );
    drop(router);
    source.stop();

    // A stored block whose tokens the driver does not know is refused before sending.
    let orphan: Vec<u32> = (0..BLOCK as u32).collect();
    compute(
        &mut m,
        &[orphan.clone(), orphan].concat(),
        &mut BTreeMap::new(),
    );
    let events = m.take_events();
    let before = publisher.publisher().next_seq();
    assert!(matches!(
        publisher.publish(&events, 99.0, |_, _| false),
        Err(PublishError::MissingTokens(_))
    ));
    assert_eq!(publisher.publisher().next_seq(), before);
}
