//! The store's KV events on real sockets: a `kvtwin store` server (its Redis front on a
//! loopback port) takes MSETs of kvtwin's block frames, and a consumer decodes what it
//! publishes with the plane's own decoders: vLLM batches on a ZMQ SUB (BlockStored with
//! the block hash, parent, tokens and medium EXTERNAL; BlockRemoved on eviction and
//! DEL), Dynamo RouterEvents on a real `nats-server` (skipped with the reason when there
//! is none, unless `KVTWIN_REQUIRE_NATS=1` or `CI=true`).

mod common;

use common::{block, resp, serve_store_on_zmq, tokens_of};
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::WorkerId;
use kvtwin::tier::Tier;
use kvtwin_plane::nats::{ConsumeMode, NatsMode, NatsPublisher, NatsServer, NatsSubscriber};
use kvtwin_plane::nats::{PublisherConfig, SubscriberConfig};
use kvtwin_plane::wire::{DecodeLimits, EngineDecoder, EngineEvent, RouterEvent};
use kvtwin_plane::zmq::{SubscriberConfig as ZmqSubscriberConfig, SubscriberItem, ZmqSubscriber};
use kvtwin_store::events::{publish, StoreEvents};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);

/// Every engine event the store publishes until `done` says enough, decoded.
fn collect_zmq(
    subscriber: &mut ZmqSubscriber,
    done: impl Fn(&[EngineEvent]) -> bool,
) -> Vec<EngineEvent> {
    let decoder = EngineDecoder::default();
    let mut events = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !done(&events) {
        assert!(
            Instant::now() < deadline,
            "waited for events; got {events:?}"
        );
        if let Some(SubscriberItem::Batch(batch)) =
            subscriber.next(Duration::from_millis(100)).unwrap()
        {
            let decoded = decoder.decode_payload(batch.seq, &batch.payload).unwrap();
            assert!(decoded.skipped.is_empty(), "{decoded:?}");
            events.extend(decoded.events);
        }
    }
    events
}

fn stored_hashes(events: &[EngineEvent]) -> Vec<u64> {
    events
        .iter()
        .flat_map(|event| match event {
            EngineEvent::BlockStored(stored) => stored.block_hashes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

/// Every stored block: its hash, its parent's and its tokens.
fn stored_blocks(events: &[EngineEvent]) -> Vec<(u64, Option<u64>, Vec<u32>)> {
    let mut blocks = Vec::new();
    for event in events {
        if let EngineEvent::BlockStored(stored) = event {
            let size = stored.block_size as usize;
            for (i, hash) in stored.block_hashes.iter().enumerate() {
                let parent = match i {
                    0 => stored.parent_block_hash,
                    _ => Some(stored.block_hashes[i - 1]),
                };
                let tokens = stored.token_ids[i * size..(i + 1) * size].to_vec();
                blocks.push((*hash, parent, tokens));
            }
        }
    }
    blocks
}

fn removed_hashes(events: &[EngineEvent]) -> Vec<u64> {
    events
        .iter()
        .flat_map(|event| match event {
            EngineEvent::BlockRemoved(removed) => removed.block_hashes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msets_of_block_frames_are_published_as_vllm_events_on_zmq() {
    // Room for three blocks in memory and nothing below: a fourth evicts the first.
    let (address, endpoint, replay) = serve_store_on_zmq(3).await;
    let mut subscriber =
        ZmqSubscriber::new(ZmqSubscriberConfig::new(&endpoint, Some(&replay))).unwrap();
    // A chain of three, then another value of some other client.
    let reply = resp(
        &address,
        &[
            b"MSET",
            b"m:1",
            &block(1, None),
            b"m:2",
            &block(2, Some(1)),
            b"m:3",
            &block(3, Some(2)),
            b"lmcache",
            b"raw kv bytes",
        ],
    )
    .await;
    assert_eq!(reply, "+OK\r\n");
    let events = collect_zmq(&mut subscriber, |e| stored_hashes(e).len() >= 3);
    // Each block with its parent and tokens, however the publisher grouped them (a
    // chain that arrives together goes out as one event).
    assert_eq!(
        stored_blocks(&events),
        [
            (1, None, tokens_of(1)),
            (2, Some(1), tokens_of(2)),
            (3, Some(2), tokens_of(3))
        ]
    );
    for event in &events {
        let EngineEvent::BlockStored(stored) = event else {
            panic!("{events:?}");
        };
        assert_eq!(stored.medium, Some(Tier::Remote));
        assert_eq!(stored.block_size, 4);
    }
    // The fourth block evicts the least recently used, block 1; DEL removes block 2.
    resp(&address, &[b"SET", b"m:4", &block(4, Some(3))]).await;
    let more = collect_zmq(&mut subscriber, |e| {
        removed_hashes(e).contains(&1) && !stored_hashes(e).is_empty()
    });
    assert_eq!(stored_blocks(&more), [(4, Some(3), tokens_of(4))]);
    assert_eq!(removed_hashes(&more), [1]);
    assert!(more.iter().all(|e| match e {
        EngineEvent::BlockRemoved(removed) => removed.medium == Some(Tier::Remote),
        _ => true,
    }));
    assert_eq!(resp(&address, &[b"DEL", b"m:2"]).await, ":1\r\n");
    let more = collect_zmq(&mut subscriber, |e| !removed_hashes(e).is_empty());
    assert_eq!(removed_hashes(&more), [2]);
    // INFO counts what was announced and what was not. The publisher counts a batch once
    // its send returned, which can be after the subscriber has it (CI saw published=5
    // here): INFO is read again until the count catches up, or the wait runs out.
    let deadline = Instant::now() + WAIT;
    let info = loop {
        let info = resp(&address, &[b"INFO"]).await;
        if info.contains("kv_events_zmq:published=6,") || Instant::now() >= deadline {
            break info;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for line in [
        "kv_events_stored:4",
        "kv_events_removed:2",
        "non_block_values:1",
        "announced_blocks:2",
        "kv_events_zmq:published=6,dropped=0,errors=0",
    ] {
        assert!(info.contains(line), "no {line} in {info}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn msets_of_block_frames_are_published_as_router_events_on_nats() {
    let Some(server) = NatsServer::start_or_skip("store_events_on_nats") else {
        return;
    };
    let subject = "kvtwin.shared.kv_events";
    let mut subscriber = NatsSubscriber::connect(SubscriberConfig::new(
        &server.url(),
        subject,
        ConsumeMode::Core,
    ))
    .await
    .unwrap();
    subscriber.flush().await.unwrap();
    let mut events = StoreEvents::new();
    let receiver = events.add_transport("nats", 1024);
    let publisher =
        NatsPublisher::connect(PublisherConfig::new(&server.url(), subject, NatsMode::Core))
            .await
            .unwrap();
    tokio::spawn(publish::run_nats(publisher, receiver, WorkerId::new(77)));
    let store = common::serve_store(2, Some(events)).await;
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
    let mut stored = Vec::new();
    let mut removed = Vec::new();
    let mut ids = Vec::new();
    let deadline = Instant::now() + WAIT;
    while stored.len() < 3 || removed.is_empty() {
        let message =
            tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), subscriber.next())
                .await
                .expect("the store's events on NATS")
                .unwrap();
        let event = RouterEvent::from_json(&message.payload, &DecodeLimits::default()).unwrap();
        assert_eq!(event.worker_id, WorkerId::new(77));
        assert_eq!(event.storage_tier(), Tier::Remote);
        ids.push(event.event.event_id);
        match event.event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                ..
            } => {
                for (i, block) in blocks.iter().enumerate() {
                    let parent = if i == 0 {
                        parent_hash
                    } else {
                        Some(blocks[i - 1].block_hash)
                    };
                    stored.push((block.block_hash.get(), parent.map(|p| p.get())));
                    assert_eq!(
                        block.tokens_hash,
                        kvtwin::tokens::compute_local_hash(
                            &tokens_of(block.block_hash.get()),
                            kvtwin::tokens::HashSeed::new(kvtwin::tokens::DEFAULT_HASH_SEED)
                        )
                    );
                }
            }
            KvCacheEventData::Removed { block_hashes, .. } => {
                removed.extend(block_hashes.iter().map(|h| h.get()))
            }
            KvCacheEventData::Cleared => panic!("cleared"),
        }
    }
    // Room for two: the third evicted the first.
    assert_eq!(stored, [(1, None), (2, Some(1)), (3, Some(2))]);
    assert_eq!(removed, [1]);
    assert_eq!(
        ids,
        (0..ids.len() as u64).collect::<Vec<_>>(),
        "numbered from 0"
    );
}
