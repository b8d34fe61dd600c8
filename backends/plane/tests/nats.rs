//! The NATS transport against a real `nats-server -js` started per test on a free loopback
//! port: core delivery in order, JetStream durable consumers that resume where they
//! stopped, replay from the start, and both kinds of subscriber carrying on across a
//! server restart (same port, same store).
//!
//! Without a `nats-server` binary (`$KVTWIN_NATS_SERVER`, `PATH`, `/usr/sbin`) every test
//! skips with the reason, unless `KVTWIN_REQUIRE_NATS=1` or `CI=true`, which make that a
//! failure.
//! Debian: `apt-get install nats-server`.

use kvtwin_plane::nats::{
    ConnectConfig, ConsumeMode, NatsError, NatsMessage, NatsMode, NatsPublisher, NatsServer,
    NatsSubscriber, PublisherConfig, SubscriberConfig,
};
use kvtwin_plane::wire::{DecodeLimits, RouterEvent};
use std::time::{Duration, Instant};

/// How long a test waits for any one message, or for a reconnect.
const WAIT: Duration = Duration::from_secs(5);

const SUBJECT: &str = "namespace.test.component.backend.kv_events";
const STREAM: &str = "kv-events";

/// A running server, or `None` (after printing why) when there is no binary and it is not
/// required. Any other failure to start is a failure.
fn server(test: &str) -> Option<NatsServer> {
    NatsServer::start_or_skip(test)
}

/// Short timeouts and fast reconnects, so failures show quickly.
fn connect_config(server: &NatsServer) -> ConnectConfig {
    ConnectConfig {
        request_timeout: Duration::from_secs(2),
        reconnect_delay_max: Duration::from_millis(100),
        ..ConnectConfig::new(&server.url())
    }
}

async fn publisher(server: &NatsServer, mode: NatsMode) -> NatsPublisher {
    let config = PublisherConfig {
        connect: connect_config(server),
        ..PublisherConfig::new(&server.url(), SUBJECT, mode)
    };
    NatsPublisher::connect(config)
        .await
        .expect("publisher connects")
}

async fn subscriber(server: &NatsServer, mode: ConsumeMode) -> NatsSubscriber {
    let config = SubscriberConfig {
        connect: connect_config(server),
        pull_expires: Duration::from_secs(1),
        ..SubscriberConfig::new(&server.url(), SUBJECT, mode)
    };
    NatsSubscriber::connect(config)
        .await
        .expect("subscriber connects")
}

fn jetstream() -> NatsMode {
    NatsMode::JetStream {
        stream: STREAM.to_string(),
    }
}

fn durable(name: &str) -> ConsumeMode {
    ConsumeMode::Durable {
        stream: STREAM.to_string(),
        name: name.to_string(),
    }
}

fn replay() -> ConsumeMode {
    ConsumeMode::Replay {
        stream: STREAM.to_string(),
    }
}

fn payload(i: usize) -> Vec<u8> {
    format!("event-{i}").into_bytes()
}

/// Publishes payloads `range`, returning what each publish returned.
async fn publish(publisher: &NatsPublisher, range: std::ops::Range<usize>) -> Vec<Option<u64>> {
    let mut sequences = Vec::new();
    for i in range {
        sequences.push(publisher.publish(payload(i)).await.expect("publish"));
    }
    sequences
}

/// The next `count` messages, each within `WAIT`.
async fn take(subscriber: &mut NatsSubscriber, count: usize) -> Vec<NatsMessage> {
    let mut messages = Vec::with_capacity(count);
    while messages.len() < count {
        match subscriber.recv_timeout(WAIT).await.expect("subscriber") {
            Some(message) => messages.push(message),
            None => panic!("{} of {count} messages within {WAIT:?}", messages.len()),
        }
    }
    messages
}

/// Asserts that nothing more arrives for a moment.
async fn assert_quiet(subscriber: &mut NatsSubscriber) {
    let extra = subscriber
        .recv_timeout(Duration::from_millis(300))
        .await
        .expect("subscriber");
    assert_eq!(extra, None, "nothing more was published");
}

/// The payloads as text, so a failed comparison reads well.
fn payloads(messages: &[NatsMessage]) -> Vec<String> {
    messages
        .iter()
        .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
        .collect()
}

fn expected(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("event-{i}")).collect()
}

fn sequences(messages: &[NatsMessage]) -> Vec<Option<u64>> {
    messages.iter().map(|m| m.sequence).collect()
}

fn stream_sequences(range: std::ops::RangeInclusive<u64>) -> Vec<Option<u64>> {
    range.map(Some).collect()
}

/// Waits until `connected()` holds, at most `WAIT`.
async fn until_connected(what: &str, connected: impl Fn() -> bool) {
    let start = Instant::now();
    while !connected() {
        assert!(
            start.elapsed() < WAIT,
            "{what} did not reconnect within {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_subscriber_receives_every_payload_in_order() {
    let Some(server) = server("core_subscriber_receives_every_payload_in_order") else {
        return;
    };
    let mut subscriber = subscriber(&server, ConsumeMode::Core).await;
    let publisher = publisher(&server, NatsMode::Core).await;
    // The subscription is on the server before anything is published.
    subscriber.flush().await.expect("flush");

    let sent = publish(&publisher, 0..500).await;
    assert!(
        sent.iter().all(Option::is_none),
        "core NATS has no sequence"
    );
    publisher.flush().await.expect("flush");

    let messages = take(&mut subscriber, 500).await;
    assert_eq!(payloads(&messages), expected(0..500));
    assert!(messages
        .iter()
        .all(|m| m.sequence.is_none() && m.subject == SUBJECT));
    assert_quiet(&mut subscriber).await;

    let stats = publisher.stats();
    assert_eq!((stats.published, stats.failed), (500, 0));
    assert_eq!(
        stats.published_bytes,
        expected(0..500).concat().len() as u64
    );
    assert_eq!(subscriber.stats().received, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_consumer_gets_the_backlog_then_resumes_after_its_last_message() {
    let test = "durable_consumer_gets_the_backlog_then_resumes_after_its_last_message";
    let Some(server) = server(test) else {
        return;
    };
    let publisher = publisher(&server, jetstream()).await;
    // Published while nobody subscribes: JetStream keeps them.
    let sent = publish(&publisher, 0..50).await;
    assert_eq!(sent, stream_sequences(1..=50));

    let mut first = subscriber(&server, durable("router")).await;
    let messages = take(&mut first, 50).await;
    assert_eq!(payloads(&messages), expected(0..50));
    assert_eq!(sequences(&messages), stream_sequences(1..=50));
    assert_eq!(
        messages.last().and_then(|m| m.pending),
        Some(0),
        "caught up"
    );
    assert_quiet(&mut first).await;
    first.close().await.expect("close");

    // Published while the durable consumer has no subscriber.
    publish(&publisher, 50..80).await;
    let mut second = subscriber(&server, durable("router")).await;
    let messages = take(&mut second, 30).await;
    assert_eq!(payloads(&messages), expected(50..80), "only the new ones");
    assert_eq!(sequences(&messages), stream_sequences(51..=80));
    assert_quiet(&mut second).await;
    let stats = second.stats();
    assert_eq!(
        (stats.received, stats.duplicates, stats.acks_failed),
        (30, 0, 0)
    );

    // Another durable name starts from the beginning of the stream.
    let mut other = subscriber(&server, durable("dashboard")).await;
    assert_eq!(payloads(&take(&mut other, 80).await), expected(0..80));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_subscriber_dropped_without_close_gets_its_unfinished_messages_again() {
    let test = "durable_subscriber_dropped_without_close_gets_its_unfinished_messages_again";
    let Some(server) = server(test) else {
        return;
    };
    let publisher = publisher(&server, jetstream()).await;
    publish(&publisher, 0..40).await;

    // Takes 10 (the pull prefetches more), then stops without closing: the 10th is not
    // acknowledged (the caller never came back for the 11th), nor is the prefetched rest,
    // and the acks sent for the first 9 may not have reached the server either.
    let mut first = subscriber(&server, durable("router")).await;
    assert_eq!(payloads(&take(&mut first, 10).await), expected(0..10));
    drop(first);

    // The next run starts at the first message not known to be finished (the 10th at the
    // latest) and goes on in order without a gap, without waiting for the ack wait (30 s)
    // to pass.
    let mut second = subscriber(&server, durable("router")).await;
    let head = take(&mut second, 1).await;
    let start = head[0].sequence.expect("a stream sequence");
    assert!((1..=10).contains(&start), "resumed at {start}");
    let rest = take(&mut second, 40 - start as usize).await;
    let messages = [head, rest].concat();
    let first_index = start as usize - 1;
    assert_eq!(payloads(&messages), expected(first_index..40));
    assert_eq!(sequences(&messages), stream_sequences(start..=40));
    assert_quiet(&mut second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_data_survives_a_server_restart_and_replays_from_the_start() {
    let test = "jetstream_data_survives_a_server_restart_and_replays_from_the_start";
    let Some(mut server) = server(test) else {
        return;
    };
    let publisher = publisher(&server, jetstream()).await;
    publish(&publisher, 0..100).await;
    let pid = server.pid();

    server.restart().expect("restart");
    assert_ne!(server.pid(), pid, "a new process");

    // A router starting now rebuilds its state from the stream alone.
    let mut fresh = subscriber(&server, replay()).await;
    let messages = take(&mut fresh, 100).await;
    assert_eq!(payloads(&messages), expected(0..100));
    assert_eq!(sequences(&messages), stream_sequences(1..=100));
    assert_eq!(
        messages.last().and_then(|m| m.pending),
        Some(0),
        "caught up"
    );

    // The old publisher reconnected on its own; what it publishes now follows.
    until_connected("publisher", || publisher.is_connected()).await;
    assert_eq!(
        publish(&publisher, 100..110).await,
        stream_sequences(101..=110)
    );
    assert_eq!(payloads(&take(&mut fresh, 10).await), expected(100..110));
    assert_quiet(&mut fresh).await;
    assert!(publisher.stats().connection.reconnected >= 1);

    // A second replay sees all of it, twice over nothing.
    let mut again = subscriber(&server, replay()).await;
    assert_eq!(payloads(&take(&mut again, 110).await), expected(0..110));
    assert_quiet(&mut again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn core_subscriber_continues_after_a_server_restart() {
    let Some(mut server) = server("core_subscriber_continues_after_a_server_restart") else {
        return;
    };
    let mut subscriber = subscriber(&server, ConsumeMode::Core).await;
    let publisher = publisher(&server, NatsMode::Core).await;
    subscriber.flush().await.expect("flush");
    publish(&publisher, 0..10).await;
    assert_eq!(payloads(&take(&mut subscriber, 10).await), expected(0..10));

    server.restart().expect("restart");
    // Connected *again*: a client that has not yet noticed the restart still reads as
    // connected, and core NATS drops what it publishes into the dead connection (CI saw
    // 0 of 50 arrive on a loaded machine).
    until_connected("subscriber", || {
        subscriber.is_connected() && subscriber.stats().connection.reconnected >= 1
    })
    .await;
    until_connected("publisher", || {
        publisher.is_connected() && publisher.stats().connection.reconnected >= 1
    })
    .await;
    // The subscription is re-sent on reconnect, before anything else this client sends.
    subscriber.flush().await.expect("flush");

    publish(&publisher, 10..60).await;
    let messages = take(&mut subscriber, 50).await;
    assert_eq!(payloads(&messages), expected(10..60));
    assert_quiet(&mut subscriber).await;
    let stats = subscriber.stats();
    assert!(stats.connection.reconnected >= 1 && stats.connection.disconnected >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_subscriber_continues_after_a_server_restart() {
    let Some(mut server) = server("durable_subscriber_continues_after_a_server_restart") else {
        return;
    };
    let publisher = publisher(&server, jetstream()).await;
    let mut subscriber = subscriber(&server, durable("router")).await;
    publish(&publisher, 0..20).await;
    assert_eq!(payloads(&take(&mut subscriber, 20).await), expected(0..20));

    server.restart().expect("restart");
    until_connected("publisher", || publisher.is_connected()).await;
    publish(&publisher, 20..40).await;

    // The 20th may come again (its ack was pending at the restart): dropped as a duplicate.
    let messages = take(&mut subscriber, 20).await;
    assert_eq!(payloads(&messages), expected(20..40));
    assert_eq!(sequences(&messages), stream_sequences(21..=40));
    assert_quiet(&mut subscriber).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_subscriber_continues_after_a_server_restart() {
    let Some(mut server) = server("replay_subscriber_continues_after_a_server_restart") else {
        return;
    };
    let publisher = publisher(&server, jetstream()).await;
    publish(&publisher, 0..20).await;
    let mut subscriber = subscriber(&server, replay()).await;
    assert_eq!(payloads(&take(&mut subscriber, 20).await), expected(0..20));

    server.restart().expect("restart");
    until_connected("publisher", || publisher.is_connected()).await;
    publish(&publisher, 20..40).await;

    // The ordered consumer is recreated after the last sequence it handed out.
    let messages = take(&mut subscriber, 20).await;
    assert_eq!(payloads(&messages), expected(20..40));
    assert_eq!(sequences(&messages), stream_sequences(21..=40));
    assert_quiet(&mut subscriber).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_publish_while_the_server_is_down_times_out_and_is_counted() {
    let test = "jetstream_publish_while_the_server_is_down_times_out_and_is_counted";
    let Some(mut server) = server(test) else {
        return;
    };
    let config = PublisherConfig {
        connect: ConnectConfig {
            request_timeout: Duration::from_millis(300),
            ..connect_config(&server)
        },
        ..PublisherConfig::new(&server.url(), SUBJECT, jetstream())
    };
    let publisher = NatsPublisher::connect(config).await.expect("connect");
    server.stop().expect("stop");
    assert_eq!(server.pid(), None);

    let started = Instant::now();
    let error = publisher.publish(payload(0)).await.expect_err("no server");
    assert!(started.elapsed() < WAIT, "bounded by the request timeout");
    assert!(
        matches!(
            error,
            NatsError::Timeout { .. } | NatsError::JetStreamPublish { .. }
        ),
        "{error}"
    );
    let stats = publisher.stats();
    assert_eq!((stats.published, stats.failed), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_publisher_refuses_a_stream_that_does_not_store_its_subject() {
    let test = "jetstream_publisher_refuses_a_stream_that_does_not_store_its_subject";
    let Some(server) = server(test) else {
        return;
    };
    // The stream is created for SUBJECT; another subject is not stored by it.
    drop(publisher(&server, jetstream()).await);
    let config = PublisherConfig {
        connect: connect_config(&server),
        ..PublisherConfig::new(&server.url(), "other.subject", jetstream())
    };
    match NatsPublisher::connect(config).await {
        Err(NatsError::SubjectNotInStream {
            stream, subjects, ..
        }) => {
            assert_eq!(stream, STREAM);
            assert_eq!(subjects, vec![SUBJECT.to_string()]);
        }
        other => panic!("expected SubjectNotInStream, got {other:?}"),
    }
}

#[test]
fn connecting_to_a_closed_port_is_a_typed_error() {
    let Some(mut server) = server("connecting_to_a_closed_port_is_a_typed_error") else {
        return;
    };
    server.stop().expect("stop");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let config = SubscriberConfig::new(&server.url(), SUBJECT, ConsumeMode::Core);
    match runtime.block_on(NatsSubscriber::connect(config)) {
        Err(error @ NatsError::Connect { .. }) => assert_eq!(error.reason(), "connect"),
        other => panic!("expected a connect error, got {other:?}"),
    }
}

/// WIRE.md's three RouterEvent shapes (stored, removed, cleared), with u64 hashes beyond
/// JavaScript's safe integers.
fn router_events() -> Vec<RouterEvent> {
    [
        r#"{"worker_id":123,"storage_tier":"device","event":{"event_id":7,"dp_rank":0,
            "data":{"stored":{"parent_hash":4369,
            "blocks":[{"block_hash":18364758544493064720,"tokens_hash":42}]}}}}"#,
        r#"{"worker_id":123,"storage_tier":"host_pinned","event":{"event_id":8,"dp_rank":0,
            "data":{"removed":{"block_hashes":[5]}}}}"#,
        r#"{"worker_id":124,"event":{"event_id":1,"dp_rank":1,"data":"cleared"}}"#,
    ]
    .iter()
    .map(|json| {
        RouterEvent::from_json(json.as_bytes(), &DecodeLimits::default()).expect("WIRE.md example")
    })
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_events_round_trip_as_json_and_a_bad_payload_does_not_end_the_stream() {
    let test = "router_events_round_trip_as_json_and_a_bad_payload_does_not_end_the_stream";
    let Some(server) = server(test) else {
        return;
    };
    let events = router_events();
    let publisher = publisher(&server, jetstream()).await;
    assert_eq!(
        publisher
            .publish_events(&events[..2])
            .await
            .expect("publish"),
        stream_sequences(1..=2)
    );
    publisher.publish(&b"{not json"[..]).await.expect("publish");
    publisher.publish_event(&events[2]).await.expect("publish");

    let mut subscriber = subscriber(&server, replay()).await;
    let limits = DecodeLimits::default();
    let mut decoded = Vec::new();
    for _ in 0..4 {
        let next = tokio::time::timeout(WAIT, subscriber.next_event(&limits))
            .await
            .expect("in time")
            .expect("subscriber");
        decoded.push(next);
    }
    assert_eq!(decoded[0].event.as_ref().ok(), Some(&events[0]));
    assert_eq!(decoded[1].event.as_ref().ok(), Some(&events[1]));
    assert!(
        decoded[2].event.is_err(),
        "the bad payload is reported, not fatal"
    );
    assert_eq!(decoded[2].message.payload, &b"{not json"[..]);
    assert_eq!(decoded[3].event.as_ref().ok(), Some(&events[2]));
    assert_eq!(decoded[3].message.sequence, Some(4));
}
