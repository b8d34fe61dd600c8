//! Readiness and connection counts of the router's sources on real sockets: `/readyz`
//! answers 503 while a JetStream replay is under way and 200 once it has caught up (with
//! every replayed worker then in `/v1/workers`), and a ZMQ publisher that goes away and
//! comes back is counted as a disconnect and a reconnect of its endpoint in `/metrics`.
//!
//! The JetStream test needs `nats-server` (Debian's, `/usr/sbin/nats-server`): without it
//! it skips with the reason, unless `KVTWIN_REQUIRE_NATS=1` or `CI=true`.

mod support;

use kvtwin::ids::WorkerId;
use kvtwin_plane::nats::{
    ConnectConfig, ConsumeMode, NatsMode, NatsPublisher, NatsServer, PublisherConfig,
    SubscriberConfig,
};
use kvtwin_plane::service::http::{lock, SharedState};
use kvtwin_plane::service::nats_source::{NatsSource, NatsSourceConfig};
use kvtwin_plane::service::source::ZmqSource;
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::wire::{DecodeLimits, EngineDecoder};
use kvtwin_plane::zmq::SubscriberConfig as ZmqSubscriberConfig;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{http, json, start};

const SUBJECT: &str = "kvtwin.readiness.kv_events";
const STREAM: &str = "readiness";
const WORKERS: u64 = 40;
const EVENTS_PER_WORKER: u64 = 25;

/// Polls `check` every 20 ms for up to `limit`; whether it came true.
fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// Worker `worker`'s `event_id`th event: one block stored under the previous one.
fn stored_json(worker: u64, event_id: u64) -> String {
    let block = worker * 1_000 + event_id;
    let parent = if event_id == 0 {
        String::new()
    } else {
        format!("\"parent_hash\":{},", block - 1)
    };
    format!(
        r#"{{"worker_id":{worker},"storage_tier":"device","event":{{"event_id":{event_id},"dp_rank":0,"data":{{"stored":{{{parent}"blocks":[{{"block_hash":{block},"tokens_hash":{}}}]}}}}}}}}"#,
        event_id + 1
    )
}

#[test]
fn readyz_is_503_until_a_jetstream_replay_has_caught_up_then_every_worker_is_there() {
    let test = "readyz_is_503_until_a_jetstream_replay_has_caught_up_then_every_worker_is_there";
    let Some(server) = NatsServer::start_or_skip(test) else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let connect = ConnectConfig {
        request_timeout: Duration::from_secs(5),
        ..ConnectConfig::new(&server.url())
    };
    // The stream holds every event before the router starts.
    runtime.block_on(async {
        let publisher = NatsPublisher::connect(PublisherConfig {
            connect: connect.clone(),
            ..PublisherConfig::new(
                &server.url(),
                SUBJECT,
                NatsMode::JetStream {
                    stream: STREAM.to_string(),
                },
            )
        })
        .await
        .expect("publisher connects");
        for event_id in 0..EVENTS_PER_WORKER {
            for worker in 1..=WORKERS {
                publisher
                    .publish(stored_json(worker, event_id))
                    .await
                    .expect("stored in the stream");
            }
        }
    });
    let state: SharedState = Arc::new(Mutex::new(RouterState::new(16)));
    let (addr, _stop) = start(state.clone());
    assert_eq!(http(addr, "GET", "/readyz", None).0, 200, "no source yet");

    let source = runtime
        .block_on(NatsSource::connect(NatsSourceConfig {
            subscriber: SubscriberConfig {
                connect,
                ..SubscriberConfig::new(
                    &server.url(),
                    SUBJECT,
                    ConsumeMode::Replay {
                        stream: STREAM.to_string(),
                    },
                )
            },
            limits: DecodeLimits::default(),
        }))
        .expect("subscribes");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    // Registered by `run` itself, before the replay has applied anything.
    let applying = source.run(state.clone(), async {
        let _ = stopped.await;
    });
    let (status, body) = http(addr, "GET", "/readyz", None);
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("catching up: nats "), "{body}");
    assert!(body.contains(SUBJECT), "{body}");
    let metrics = http(addr, "GET", "/metrics", None).1;
    assert!(
        metrics.contains("kvtwin_router_source_caught_up{transport=\"nats\""),
        "{metrics}"
    );
    assert!(metrics.contains(&format!("{SUBJECT}\"}} 0\n")), "{metrics}");

    let task = runtime.spawn(applying);
    assert!(
        eventually(Duration::from_secs(30), || http(
            addr, "GET", "/readyz", None
        )
        .0 == 200),
        "never ready: {}",
        http(addr, "GET", "/readyz", None).1
    );
    // Ready means replayed: every worker, every event, with no waiting after the 200.
    let workers = json(&http(addr, "GET", "/v1/workers", None).1);
    let workers = workers["workers"].as_array().unwrap();
    assert_eq!(workers.len() as u64, WORKERS);
    for row in workers {
        assert_eq!(row["events"], EVENTS_PER_WORKER, "{row}");
        assert_eq!(row["blocks"]["device"], EVENTS_PER_WORKER, "{row}");
    }
    assert_eq!(
        lock(&state).metrics().events_applied,
        WORKERS * EVENTS_PER_WORKER
    );
    let _ = stop.send(());
    let stats = runtime.block_on(task).unwrap().expect("the source ran");
    assert_eq!(stats.events, WORKERS * EVENTS_PER_WORKER);
}

#[test]
fn a_zmq_publisher_that_goes_away_and_comes_back_is_a_counted_reconnect() {
    let context = zmq::Context::new();
    let bind = |endpoint: &str| {
        let socket = context.socket(zmq::PUB).unwrap();
        socket.set_linger(0).unwrap();
        socket.bind(endpoint).unwrap();
        socket
    };
    let first = bind("tcp://127.0.0.1:*");
    let endpoint = first.get_last_endpoint().unwrap().unwrap();
    let state: SharedState = Arc::new(Mutex::new(RouterState::new(16)));
    let source = ZmqSource::start(
        WorkerId::new(1),
        ZmqSubscriberConfig::new(&endpoint, None),
        EngineDecoder::default(),
        state.clone(),
    )
    .expect("subscribes");
    let status = |state: &SharedState| {
        let router = lock(state);
        let (_, status) = router.sources().iter().next().expect("registered");
        *status
    };
    // Without a replay socket there is nothing to catch up.
    assert!(status(&state).caught_up);
    assert!(
        eventually(Duration::from_secs(10), || status(&state).connects == 1),
        "{:?}",
        status(&state)
    );
    assert_eq!(status(&state).reconnects, 0);

    drop(first);
    assert!(
        eventually(Duration::from_secs(10), || status(&state).disconnects == 1),
        "{:?}",
        status(&state)
    );
    assert!(!status(&state).connected);
    let _second = bind(&endpoint);
    assert!(
        eventually(Duration::from_secs(15), || status(&state).reconnects == 1),
        "{:?}",
        status(&state)
    );
    let text = lock(&state).render_metrics();
    let labels = format!("{{transport=\"zmq\",endpoint=\"{endpoint}\"}}");
    assert!(
        text.contains(&format!(
            "kvtwin_router_source_reconnects_total{labels} 1\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "kvtwin_router_source_disconnects_total{labels} 1\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("kvtwin_router_source_connected{labels} 1\n")),
        "{text}"
    );
    assert_eq!(lock(&state).metrics().reconnects, 1);
    drop(source);
}
