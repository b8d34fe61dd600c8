//! The router's change stream end to end: a `RouterState` served on a real loopback
//! socket, read by `StreamClient`: a snapshot first, then deltas with the rows events
//! changed and the route decisions answered; the integrity counters in `/v1/workers`.

mod support;

use kvtwin::ids::WorkerId;
use kvtwin::tier::Tier;
use kvtwin_plane::service::client::ClientError;
use kvtwin_plane::service::http::{self, SharedState};
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::service::stream::{StreamMessage, WorkerKey};
use kvtwin_plane::service::stream_client::{StreamClient, StreamClientError};
use kvtwin_plane::wire::{WorkerEvent, WorkerEventData};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::{http as request, json, start};

const BLOCK: usize = 4;

/// Worker `worker`'s event `event_id` storing `tokens`' blocks on device.
fn stored(worker: u64, event_id: u64, tokens: &[u32], state: &RouterState) -> WorkerEvent {
    let hashes = state.hash_tokens(tokens);
    WorkerEvent {
        worker: WorkerId::new(worker),
        dp_rank: 0,
        event_id,
        data: WorkerEventData::Stored {
            parent: None,
            blocks: hashes
                .iter()
                .enumerate()
                .map(|(i, h)| (worker * 1000 + event_id * 100 + i as u64, *h))
                .collect(),
            tier: Tier::Device,
        },
    }
}

/// The next message, within 10 s.
async fn next(client: &mut StreamClient) -> StreamMessage {
    tokio::time::timeout(Duration::from_secs(10), client.next())
        .await
        .expect("a message within 10 s")
        .expect("a readable stream")
        .expect("the stream goes on")
}

/// Messages until one satisfies `done`, within 10 s.
async fn until(client: &mut StreamClient, done: impl Fn(&StreamMessage) -> bool) -> StreamMessage {
    loop {
        let message = next(client).await;
        if done(&message) {
            return message;
        }
    }
}

#[test]
fn the_stream_sends_a_snapshot_then_changed_rows_and_route_records() {
    let shared: SharedState = Arc::new(Mutex::new(RouterState::new(BLOCK)));
    let (addr, _stop) = start(shared.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut client = StreamClient::connect(&format!("http://{addr}"))
            .await
            .expect("connect");
        let first = next(&mut client).await;
        assert!(first.full);
        assert!(first.workers.is_empty());
        assert_eq!(first.block_size, BLOCK as u64);

        let prompt: Vec<u32> = (0..16).collect();
        {
            let mut router = http::lock(&shared);
            let events = [
                stored(7, 0, &prompt, &router),
                // Ids 1 to 4 never came: a gap.
                stored(7, 5, &prompt[..8], &router),
                stored(9, 0, &prompt[..4], &router),
            ];
            router.apply_batch(&events);
        }
        let delta = until(&mut client, |m| !m.workers.is_empty()).await;
        assert!(!delta.full);
        let rows: Vec<(u64, u64, Option<u64>, u64)> = delta
            .workers
            .iter()
            .map(|row| (row.worker, row.events, row.last_event_id, row.gaps))
            .collect();
        assert_eq!(rows, [(7, 2, Some(5), 1), (9, 1, Some(0), 0)]);
        assert_eq!(delta.workers[0].blocks.device, 6);
        assert_eq!(delta.counters.events_applied, 3);
        assert!(delta.counters.apply_latency_p99_s.is_some());

        let body = format!("{{\"tokens\":{prompt:?}}}");
        let (status, text) = request(addr, "POST", "/v1/route", Some(&body));
        assert_eq!(status, 200, "{text}");
        let routed = until(&mut client, |m| !m.routes.is_empty()).await;
        assert!(routed.workers.is_empty(), "routing changes no row");
        assert_eq!(routed.routes_missed, 0);
        let record = &routed.routes[0];
        assert_eq!(record.seq, 1);
        assert_eq!(record.query_blocks, 4);
        assert_eq!(
            record.winner,
            Some(WorkerKey {
                worker: 7,
                dp_rank: 0
            })
        );
        let candidates: Vec<(u64, u64, u64)> = record
            .candidates
            .iter()
            .map(|c| (c.worker, c.score, c.load))
            .collect();
        assert_eq!(candidates, [(7, 4, 6), (9, 1, 1)]);
        assert_eq!(record.candidates[0].overlap.device, 4);
        assert_eq!(routed.counters.routes, 1);
        assert_eq!(routed.counters.route_query_blocks, 4);
        assert_eq!(routed.counters.route_hit_blocks, 4);

        // A restart keeps the row, cleared, and says so.
        http::lock(&shared).restart_worker(WorkerId::new(9));
        let restarted = until(&mut client, |m| !m.workers.is_empty()).await;
        assert_eq!(restarted.workers.len(), 1);
        assert_eq!(restarted.workers[0].worker, 9);
        assert_eq!(restarted.workers[0].restarts, 1);
        assert_eq!(restarted.workers[0].blocks.total(), 0);

        // A second client starts from a full snapshot.
        let mut second = StreamClient::connect(&format!("http://{addr}/v1/stream"))
            .await
            .expect("connect");
        let snapshot = next(&mut second).await;
        assert!(snapshot.full);
        assert_eq!(snapshot.workers.len(), 2);
        assert_eq!(snapshot.routes.len(), 1);
    });

    let (status, text) = request(addr, "GET", "/v1/workers", None);
    assert_eq!(status, 200);
    let workers = json(&text);
    let seven = &workers["workers"][0];
    assert_eq!(seven["worker"], 7);
    assert_eq!(seven["events"], 2);
    assert_eq!(seven["gaps"], 1);
    assert_eq!(seven["out_of_order"], 0);
    assert_eq!(seven["last_event_id"], 5);
    assert_eq!(seven["restarts"], 0);
    let nine = &workers["workers"][1];
    assert_eq!(nine["restarts"], 1);
    assert_eq!(nine["last_event_id"], serde_json::Value::Null);
    for field in [
        "reconnects",
        "block_size_mismatches",
        "lost_batches",
        "dropped",
    ] {
        assert_eq!(seven[field], 0, "{field}");
    }
}

#[test]
fn a_wrong_path_or_no_server_is_a_typed_error() {
    let shared: SharedState = Arc::new(Mutex::new(RouterState::new(BLOCK)));
    let (addr, stop) = start(shared);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let error = StreamClient::connect(&format!("http://{addr}/v1/nope"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                StreamClientError::Client(ClientError::Status { status: 404 })
            ),
            "{error}"
        );
        // A port nothing listens on: bind one, note it, let it go.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let error = StreamClient::connect(&format!("http://{closed}"))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                StreamClientError::Client(ClientError::Connect { .. })
            ),
            "{error}"
        );
    });
    drop(stop);
}
