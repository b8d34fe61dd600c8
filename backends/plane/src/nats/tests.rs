//! Unit tests of the pure helpers: subject matching and the reconnect schedule.

use super::{reconnect_delay, subject_matches};
use std::time::Duration;

#[test]
fn subject_patterns_match_like_nats() {
    assert!(subject_matches("kv.events", "kv.events"));
    assert!(!subject_matches("kv.events", "kv.event"));
    assert!(!subject_matches("kv.events", "kv.events.more"));
    assert!(!subject_matches("kv.events.more", "kv.events"));
    assert!(subject_matches("kv.*", "kv.events"));
    assert!(!subject_matches("kv.*", "kv.events.more"));
    assert!(subject_matches("kv.>", "kv.events.more"));
    assert!(!subject_matches("kv.>", "kv"));
    assert!(subject_matches(">", "anything.at.all"));
    assert!(subject_matches(
        "namespace.*.component.*.kv_events",
        "namespace.dynamo.component.backend.kv_events"
    ));
}

#[test]
fn reconnects_start_at_once_and_back_off_to_the_cap_with_jitter() {
    let max = Duration::from_millis(100);
    let within = |attempts: usize, step: Duration, seed: u64| {
        let delay = reconnect_delay(attempts, max, seed);
        assert!(
            delay >= step / 2 && delay <= step,
            "attempt {attempts}: {delay:?} outside [{:?}, {step:?}]",
            step / 2
        );
        delay
    };
    for seed in [0, 1, 0xDEAD_BEEF, u64::MAX] {
        assert_eq!(reconnect_delay(0, max, seed), Duration::ZERO);
        assert_eq!(reconnect_delay(1, max, seed), Duration::ZERO);
        within(2, Duration::from_millis(2), seed);
        within(4, Duration::from_millis(8), seed);
        within(9, max, seed);
        within(usize::MAX, max, seed);
    }
    // Clients with different seeds come back at different moments; one client's delay
    // for an attempt is the same every time it is asked.
    let delays: std::collections::BTreeSet<Duration> =
        (0..32).map(|seed| within(9, max, seed)).collect();
    assert!(delays.len() > 16, "{delays:?}");
    assert_eq!(reconnect_delay(9, max, 7), reconnect_delay(9, max, 7));
}
