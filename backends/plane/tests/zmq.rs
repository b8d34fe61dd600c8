//! The ZMQ transport on loopback with real sockets: a `ZmqPublisher` (or a bare PUB
//! socket sending bad frames) and a `ZmqSubscriber`, checking order, gap recovery
//! through replay, what replay cannot supply, publisher restarts and malformed messages.

use kvtwin_plane::wire::ReplayLayout;
use kvtwin_plane::zmq::{
    CatchUp, Delivery, PublisherConfig, SubscriberConfig, SubscriberItem, ZmqPublisher,
    ZmqSubscriber,
};
use std::time::{Duration, Instant};

const ANY_PORT: &str = "tcp://127.0.0.1:*";

fn publisher(replay: bool) -> ZmqPublisher {
    let config = PublisherConfig {
        topic: "kv@test".into(),
        ..PublisherConfig::new(ANY_PORT, replay.then_some(ANY_PORT))
    };
    ZmqPublisher::bind(&config).unwrap()
}

fn subscriber(publisher: &ZmqPublisher) -> ZmqSubscriber {
    ZmqSubscriber::new(SubscriberConfig::new(
        publisher.endpoint(),
        publisher.replay_endpoint(),
    ))
    .unwrap()
}

fn payload(n: u64) -> Vec<u8> {
    format!("batch {n}").into_bytes()
}

/// Publishes a probe until the subscriber hears one (ZMQ's slow joiner: a SUB misses
/// what is published before its subscription reaches the PUB); returns the items it got.
fn join(publisher: &mut ZmqPublisher, subscriber: &mut ZmqSubscriber) -> Vec<SubscriberItem> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seq = publisher.next_seq();
        publisher.publish(&payload(seq)).unwrap();
        let items = drain(subscriber, Duration::from_millis(50));
        if !items.is_empty() {
            return items;
        }
        assert!(Instant::now() < deadline, "the subscriber never joined");
    }
}

/// Everything the subscriber hands out until it is quiet for `quiet`.
fn drain(subscriber: &mut ZmqSubscriber, quiet: Duration) -> Vec<SubscriberItem> {
    let mut items = Vec::new();
    while let Some(item) = subscriber.next(quiet).unwrap() {
        items.push(item);
    }
    items
}

fn seqs(items: &[SubscriberItem]) -> Vec<u64> {
    items
        .iter()
        .filter_map(|item| match item {
            SubscriberItem::Batch(batch) => Some(batch.seq),
            _ => None,
        })
        .collect()
}

#[test]
fn batches_arrive_in_order_and_those_before_joining_come_from_replay() {
    let mut publisher = publisher(true);
    // Published before anyone listens: only replay can deliver these.
    for n in 0..20 {
        publisher.publish(&payload(n)).unwrap();
    }
    let mut subscriber = subscriber(&publisher);
    let mut items = join(&mut publisher, &mut subscriber);
    let first = publisher.next_seq();
    for n in first..first + 200 {
        publisher.publish(&payload(n)).unwrap();
    }
    items.extend(drain(&mut subscriber, Duration::from_millis(200)));
    let expected: Vec<u64> = (0..first + 200).collect();
    assert_eq!(seqs(&items), expected);
    for item in &items {
        if let SubscriberItem::Batch(batch) = item {
            assert_eq!(batch.payload, payload(batch.seq));
            assert_eq!(batch.topic, b"kv@test");
        }
    }
    let stats = subscriber.stats();
    assert!(stats.replayed >= 20, "{stats:?}");
    assert_eq!((stats.lost, stats.restarts, stats.malformed), (0, 0, 0));
}

#[test]
fn batches_lost_on_the_wire_are_fetched_from_replay_in_order() {
    let mut publisher = publisher(true);
    let mut subscriber = subscriber(&publisher);
    let mut items = join(&mut publisher, &mut subscriber);
    let start = publisher.next_seq();
    for n in start..start + 100 {
        // Every seventh batch, and a run of five, never reach the live stream.
        let withheld = (n - start) % 7 == 3 || (start + 40..start + 45).contains(&n);
        let delivery = if withheld {
            Delivery::BufferOnly
        } else {
            Delivery::Live
        };
        publisher.publish_with(&payload(n), delivery).unwrap();
    }
    items.extend(drain(&mut subscriber, Duration::from_millis(200)));
    // The last batch is live, so every gap before it was noticed and filled.
    let last = start + 99;
    assert!((last - start) % 7 != 3);
    assert_eq!(seqs(&items), (0..=last).collect::<Vec<_>>());
    let stats = subscriber.stats();
    assert!(stats.gaps >= 10, "{stats:?}");
    assert_eq!(stats.lost, 0, "{stats:?}");
    // Replay supplied the withheld batches (and any the slow joiner missed); the live
    // stream the rest; nothing twice.
    let withheld = publisher.stats().withheld;
    assert!(stats.replayed >= withheld, "{stats:?}");
    assert_eq!(
        stats.live + stats.replayed,
        last + 1 + stats.duplicates,
        "{stats:?}"
    );
}

#[test]
fn without_replay_a_gap_is_reported_lost_and_the_stream_goes_on() {
    let mut publisher = publisher(false);
    let mut subscriber = subscriber(&publisher);
    let mut items = join(&mut publisher, &mut subscriber);
    let start = publisher.next_seq();
    publisher.publish(&payload(start)).unwrap();
    publisher
        .publish_with(&payload(start + 1), Delivery::BufferOnly)
        .unwrap();
    publisher
        .publish_with(&payload(start + 2), Delivery::BufferOnly)
        .unwrap();
    publisher.publish(&payload(start + 3)).unwrap();
    items.extend(drain(&mut subscriber, Duration::from_millis(200)));
    assert!(items.contains(&SubscriberItem::Lost {
        first: start + 1,
        last: start + 2
    }));
    let got = seqs(&items);
    assert_eq!(&got[got.len() - 2..], &[start, start + 3]);
    let stats = subscriber.stats();
    assert_eq!((stats.gaps, stats.replay_requests), (1, 0), "{stats:?}");
    assert!(stats.lost >= 2, "{stats:?}");
}

#[test]
fn a_publisher_restart_is_reported_and_the_new_run_is_followed_from_its_start() {
    let mut first_run = publisher(true);
    let (endpoint, replay) = (
        first_run.endpoint().to_string(),
        first_run.replay_endpoint().map(str::to_string),
    );
    let mut subscriber =
        ZmqSubscriber::new(SubscriberConfig::new(&endpoint, replay.as_deref())).unwrap();
    let mut items = join(&mut first_run, &mut subscriber);
    for _ in 0..10 {
        let seq = first_run.next_seq();
        first_run.publish(&payload(seq)).unwrap();
    }
    items.extend(drain(&mut subscriber, Duration::from_millis(100)));
    let before = first_run.next_seq();
    assert_eq!(seqs(&items), (0..before).collect::<Vec<_>>());
    drop(first_run);

    // Same endpoints, sequence back at 0.
    let config = PublisherConfig {
        topic: "kv@test".into(),
        ..PublisherConfig::new(&endpoint, replay.as_deref())
    };
    let mut second_run = ZmqPublisher::bind(&config).unwrap();
    let mut after = join(&mut second_run, &mut subscriber);
    for _ in 0..10 {
        let seq = second_run.next_seq();
        second_run.publish(&payload(seq)).unwrap();
    }
    after.extend(drain(&mut subscriber, Duration::from_millis(100)));
    let restart = after
        .iter()
        .position(|item| matches!(item, SubscriberItem::Restarted { .. }))
        .expect("a restart was reported");
    // After the restart: the new run from 0 (what reconnecting missed came by replay).
    assert_eq!(
        seqs(&after[restart..]),
        (0..second_run.next_seq()).collect::<Vec<_>>()
    );
    assert_eq!(subscriber.stats().restarts, 1);
}

/// vLLM's case: the engine restarts, then sits idle (it publishes nothing until a
/// request comes), so the subscriber's idle probe finds the restart before any live
/// batch of the new run does; that batch, when it comes, must not count it again.
#[test]
fn a_restart_found_by_the_idle_probe_counts_once_when_the_new_run_publishes() {
    let mut first_run = publisher(true);
    let (endpoint, replay) = (
        first_run.endpoint().to_string(),
        first_run.replay_endpoint().map(str::to_string),
    );
    let mut subscriber = ZmqSubscriber::new(SubscriberConfig {
        idle_probe: Some(Duration::from_millis(100)),
        replay_timeout: Duration::from_millis(300),
        ..SubscriberConfig::new(&endpoint, replay.as_deref())
    })
    .unwrap();
    let mut items = join(&mut first_run, &mut subscriber);
    for _ in 0..5 {
        let seq = first_run.next_seq();
        first_run.publish(&payload(seq)).unwrap();
    }
    items.extend(drain(&mut subscriber, Duration::from_millis(100)));
    assert_eq!(seqs(&items), (0..first_run.next_seq()).collect::<Vec<_>>());
    drop(first_run);

    let config = PublisherConfig {
        topic: "kv@test".into(),
        ..PublisherConfig::new(&endpoint, replay.as_deref())
    };
    let mut second_run = ZmqPublisher::bind(&config).unwrap();
    // Idle: only the probe can see the new run.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut after = Vec::new();
    while !after
        .iter()
        .any(|item| matches!(item, SubscriberItem::Restarted { .. }))
    {
        assert!(
            Instant::now() < deadline,
            "the probe never found the restart"
        );
        if let Some(item) = subscriber.next(Duration::from_millis(50)).unwrap() {
            after.push(item);
        }
    }
    assert_eq!(subscriber.stats().restarts, 1);
    after.extend(join(&mut second_run, &mut subscriber));
    for _ in 0..5 {
        let seq = second_run.next_seq();
        second_run.publish(&payload(seq)).unwrap();
    }
    after.extend(drain(&mut subscriber, Duration::from_millis(300)));
    let restarts = after
        .iter()
        .filter(|item| matches!(item, SubscriberItem::Restarted { .. }))
        .count();
    assert_eq!(restarts, 1, "{after:?}");
    assert_eq!(subscriber.stats().restarts, 1);
    assert_eq!(seqs(&after), (0..second_run.next_seq()).collect::<Vec<_>>());
}

#[test]
fn malformed_messages_are_skipped_with_a_reason_and_the_stream_goes_on() {
    let context = zmq::Context::new();
    let raw = context.socket(zmq::PUB).unwrap();
    raw.bind(ANY_PORT).unwrap();
    let endpoint = raw.get_last_endpoint().unwrap().unwrap();
    let mut subscriber = ZmqSubscriber::new(SubscriberConfig {
        catch_up: CatchUp::FromFirstReceived,
        ..SubscriberConfig::new(&endpoint, None)
    })
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut items = Vec::new();
    // Join with good messages.
    let mut seq = 0u64;
    while items.is_empty() {
        raw.send_multipart([&b""[..], &seq.to_be_bytes(), b"ok"], 0)
            .unwrap();
        seq += 1;
        items = drain(&mut subscriber, Duration::from_millis(50));
        assert!(Instant::now() < deadline, "never joined");
    }
    raw.send_multipart([&b""[..], b"ok"], 0).unwrap();
    raw.send_multipart([&b""[..], &[1, 2, 3][..], b"ok"], 0)
        .unwrap();
    raw.send_multipart([&b""[..], &seq.to_be_bytes(), b"ok"], 0)
        .unwrap();
    items.extend(drain(&mut subscriber, Duration::from_millis(200)));
    let reasons: Vec<&str> = items
        .iter()
        .filter_map(|item| match item {
            SubscriberItem::Malformed(error) => Some(error.reason()),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, ["frame_count", "sequence_width"]);
    assert_eq!(seqs(&items).last(), Some(&seq));
    assert_eq!(subscriber.stats().malformed, 2);
}

#[test]
fn legacy_replay_replies_without_a_topic_are_understood() {
    let config = PublisherConfig {
        replay_layout: ReplayLayout::Legacy,
        ..PublisherConfig::new(ANY_PORT, Some(ANY_PORT))
    };
    let mut publisher = ZmqPublisher::bind(&config).unwrap();
    for n in 0..5 {
        publisher.publish(&payload(n)).unwrap();
    }
    let mut subscriber = subscriber(&publisher);
    let mut items = join(&mut publisher, &mut subscriber);
    items.extend(drain(&mut subscriber, Duration::from_millis(100)));
    assert_eq!(seqs(&items), (0..publisher.next_seq()).collect::<Vec<_>>());
    assert!(publisher.stats().replay_requests >= 1);
}

#[test]
fn a_replay_socket_that_never_answers_times_out_into_a_loss() {
    let mut publisher = publisher(false);
    // A replay endpoint nobody serves: the request waits out its timeout.
    let context = zmq::Context::new();
    let silent = context.socket(zmq::ROUTER).unwrap();
    silent.bind(ANY_PORT).unwrap();
    let silent_endpoint = silent.get_last_endpoint().unwrap().unwrap();
    let mut subscriber = ZmqSubscriber::new(SubscriberConfig {
        replay_timeout: Duration::from_millis(200),
        catch_up: CatchUp::FromFirstReceived,
        idle_probe: None,
        ..SubscriberConfig::new(publisher.endpoint(), Some(&silent_endpoint))
    })
    .unwrap();
    let mut items = join(&mut publisher, &mut subscriber);
    let start = publisher.next_seq();
    publisher
        .publish_with(&payload(start), Delivery::BufferOnly)
        .unwrap();
    publisher.publish(&payload(start + 1)).unwrap();
    items.extend(drain(&mut subscriber, Duration::from_millis(300)));
    assert!(items.contains(&SubscriberItem::Lost {
        first: start,
        last: start
    }));
    let stats = subscriber.stats();
    assert_eq!(
        (stats.replay_requests, stats.replay_failures),
        (1, 1),
        "{stats:?}"
    );
    assert_eq!(seqs(&items).last(), Some(&(start + 1)));
}

#[test]
fn a_batch_lost_at_the_end_of_a_burst_is_fetched_when_the_stream_goes_quiet() {
    let mut publisher = publisher(true);
    let mut subscriber = ZmqSubscriber::new(SubscriberConfig {
        idle_probe: Some(Duration::from_millis(100)),
        ..SubscriberConfig::new(publisher.endpoint(), publisher.replay_endpoint())
    })
    .unwrap();
    let mut items = join(&mut publisher, &mut subscriber);
    let start = publisher.next_seq();
    publisher.publish(&payload(start)).unwrap();
    // No later batch will reveal these two as a gap: only the idle probe can.
    publisher
        .publish_with(&payload(start + 1), Delivery::BufferOnly)
        .unwrap();
    publisher
        .publish_with(&payload(start + 2), Delivery::BufferOnly)
        .unwrap();
    items.extend(drain(&mut subscriber, Duration::from_millis(400)));
    assert_eq!(seqs(&items), (0..start + 3).collect::<Vec<_>>());
    let stats = subscriber.stats();
    assert_eq!(
        (stats.gaps, stats.lost, stats.restarts),
        (0, 0, 0),
        "{stats:?}"
    );
}
