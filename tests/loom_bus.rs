//! loom model of the in-process event plane: publishers and a subscriber on different
//! threads. Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_bus`.
#![cfg(loom)]

use kvtwin::bus::{BatchPolicy, EventBus, Publisher, Subscriber};
use kvtwin::events::{EventSink, KvCacheEvent, KvCacheEventData};
use kvtwin::ids::WorkerId;
use loom::thread;
use std::time::Duration;

fn event(id: u64) -> KvCacheEvent {
    KvCacheEvent {
        event_id: id,
        dp_rank: 0,
        data: KvCacheEventData::Cleared,
    }
}

#[test]
fn concurrent_publishers_lose_and_reorder_nothing() {
    loom::model(|| {
        let bus = EventBus::new(2);
        let policy = BatchPolicy {
            max_events: 1,
            max_delay: Duration::ZERO,
        };
        let publishers: Vec<_> = (0..2u64)
            .map(|w| {
                let bus = bus.clone();
                thread::spawn(move || {
                    let mut publisher = Publisher::new(bus, WorkerId::new(w), policy);
                    // A full bus pushes back; retry until the batch is in.
                    while publisher.publish(&[event(0), event(1)]).is_err() {
                        thread::yield_now();
                    }
                })
            })
            .collect();
        let consumer = {
            let bus = bus.clone();
            thread::spawn(move || {
                let mut subscriber = Subscriber::new(bus);
                let mut seen = Vec::new();
                while seen.len() < 4 {
                    match subscriber.try_next_event() {
                        Some((worker, event)) => seen.push((worker.get(), event.event_id)),
                        None => thread::yield_now(),
                    }
                }
                assert!(subscriber.take_gaps().is_empty());
                seen
            })
        };
        publishers.into_iter().for_each(|p| p.join().unwrap());
        let seen = consumer.join().unwrap();
        for worker in 0..2 {
            let ids: Vec<u64> = seen
                .iter()
                .filter(|(w, _)| *w == worker)
                .map(|(_, id)| *id)
                .collect();
            assert_eq!(ids, vec![0, 1], "worker {worker}");
        }
        assert!(bus.is_empty());
    });
}
