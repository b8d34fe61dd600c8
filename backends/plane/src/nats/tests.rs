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
fn reconnects_start_at_once_and_back_off_to_the_cap() {
    let max = Duration::from_millis(100);
    assert_eq!(reconnect_delay(0, max), Duration::ZERO);
    assert_eq!(reconnect_delay(1, max), Duration::ZERO);
    assert_eq!(reconnect_delay(2, max), Duration::from_millis(2));
    assert_eq!(reconnect_delay(4, max), Duration::from_millis(8));
    assert_eq!(reconnect_delay(9, max), max);
    assert_eq!(reconnect_delay(usize::MAX, max), max);
}
