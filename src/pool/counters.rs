//! The counters the pools of one manager share: the order of their events across tiers,
//! and a count of their state changes.
//!
//! Owns: [`SharedCounters`]. Each pool writes only its own tier's slots, and only under
//! its own lock, so a plain load and store update them: no locked read-modify-write,
//! which waits for every store before it (a cache-missing registry insert, a slot) and
//! cost a simulation several percent of its time where every registration, eviction and
//! allocation took one (issue 33). Readers (the manager) load without any lock.
//!
//! Why the order holds without a shared atomic counter: a new event is stamped one more
//! than the latest stamp of every pool. A pool's own stamps only grow (its slot is in
//! the maximum, and only it writes the slot). An event that happens after another, on
//! the same thread or after any synchronisation between two threads, sees that event's
//! stamp and gets a larger one. Events of two pools changed at once on two threads may
//! share a stamp; neither order between them is wrong.
//! Never: order events of one pool by anything but the order it pushed them.

use crate::sync::AtomicU64;
use crate::tier::Tier;
use std::sync::atomic::Ordering::Relaxed;

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SharedCounters {
    /// Per tier: the stamp of the pool's latest event (0 before its first).
    latest_stamps: [AtomicU64; Tier::ALL.len()],
    /// Per tier: state changes that push no event (allocation, release, re-tagging...).
    /// A change that pushes one (registration, eviction) is counted by its event alone.
    changes: [AtomicU64; Tier::ALL.len()],
}

impl SharedCounters {
    /// The latest stamp any pool gave an event: it grows exactly when an event is pushed.
    #[inline]
    pub(crate) fn latest_stamp(&self) -> u64 {
        self.latest_stamps
            .iter()
            .map(|stamp| stamp.load(Relaxed))
            .max()
            .unwrap_or(0)
    }

    /// Grows with every state change of the pools, events included: equal readings mean
    /// nothing changed in between.
    pub(crate) fn version(&self) -> u64 {
        self.changes
            .iter()
            .fold(self.latest_stamp(), |sum, changes| {
                sum.wrapping_add(changes.load(Relaxed))
            })
    }

    /// The stamp of a new event of `tier`'s pool; called under that pool's lock.
    #[inline]
    pub(super) fn next_stamp(&self, tier: Tier) -> u64 {
        let stamp = self.latest_stamp() + 1;
        self.latest_stamps[tier.index()].store(stamp, Relaxed);
        stamp
    }

    /// Counts a change of `tier`'s pool that pushes no event; called under its lock.
    #[inline]
    pub(super) fn touch(&self, tier: Tier) {
        let slot = &self.changes[tier.index()];
        slot.store(slot.load(Relaxed).wrapping_add(1), Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamps_follow_the_order_of_events_across_tiers_and_only_grow_per_tier() {
        let counters = SharedCounters::default();
        assert_eq!((counters.latest_stamp(), counters.version()), (0, 0));
        let device = counters.next_stamp(Tier::Device);
        let host = counters.next_stamp(Tier::Host);
        let device_again = counters.next_stamp(Tier::Device);
        assert!(device < host && host < device_again);
        // No other event in between: the next stamp is one more (the pools extend their
        // last event on that).
        assert_eq!(counters.next_stamp(Tier::Device), device_again + 1);
        assert_eq!(counters.latest_stamp(), device_again + 1);
        let before = counters.version();
        counters.touch(Tier::Disk);
        assert_eq!(counters.version(), before + 1);
        assert_eq!(
            counters.latest_stamp(),
            device_again + 1,
            "a change is no event"
        );
        counters.next_stamp(Tier::Remote);
        assert_eq!(counters.version(), before + 2);
    }

    #[cfg(not(loom))]
    #[test]
    fn pools_changed_at_once_on_two_threads_keep_their_own_order() {
        let counters = std::sync::Arc::new(SharedCounters::default());
        let stamps_of = |tier: Tier| {
            let counters = counters.clone();
            std::thread::spawn(move || {
                (0..20_000)
                    .map(|_| counters.next_stamp(tier))
                    .collect::<Vec<u64>>()
            })
        };
        let (device, host) = (stamps_of(Tier::Device), stamps_of(Tier::Host));
        let (device, host) = (device.join().unwrap(), host.join().unwrap());
        for stamps in [&device, &host] {
            assert!(stamps.windows(2).all(|pair| pair[0] < pair[1]));
        }
        // After both (joined: they happened before), a new event comes after them all.
        let last = device.last().max(host.last()).copied().unwrap();
        assert!(counters.next_stamp(Tier::Disk) > last);
    }
}
