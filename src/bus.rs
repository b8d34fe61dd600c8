//! The in-process event plane: workers publish KV events in batches, routers consume them.
//!
//! Owns: [`EventBus`] (a bounded queue of batches shared by publishers and subscribers, safe
//! across threads), [`Publisher`] (batches one worker's events by count and by age) and
//! [`Subscriber`] (reads batches and detects per-worker event-id gaps).
//!
//! Bounds and backpressure: the bus holds at most `capacity_batches` batches. A publisher
//! whose flush finds the bus full keeps its events and reports [`BusError::Full`]; nothing
//! is dropped silently, and the caller decides whether to wait or shed load. Time enters
//! only as `now` arguments (batching by age), so the simulator and a real driver use the
//! same code.
//! Never: spawn threads, read a clock, or reorder one worker's events.

use crate::events::{EventSink, EventSource, KvCacheEvent};
use crate::ids::{Timestamp, WorkerId};
use crate::sync::{lock, Arc, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// The events one worker published together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventBatch {
    /// The publishing worker.
    pub worker: WorkerId,
    /// Its events, in order.
    pub events: Vec<KvCacheEvent>,
}

/// The bus refused a batch.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// The bus holds its maximum of batches; the publisher kept the events.
    #[error("event bus full ({capacity} batches)")]
    Full {
        /// The bound.
        capacity: usize,
    },
}

#[derive(Debug)]
struct Queue {
    batches: VecDeque<EventBatch>,
    capacity: usize,
    refused: u64,
}

/// A bounded queue of event batches.
#[derive(Clone, Debug)]
pub struct EventBus {
    queue: Arc<Mutex<Queue>>,
}

impl EventBus {
    /// A bus holding at most `capacity_batches` batches (at least one).
    pub fn new(capacity_batches: usize) -> Self {
        let queue = Queue {
            batches: VecDeque::new(),
            capacity: capacity_batches.max(1),
            refused: 0,
        };
        Self {
            queue: Arc::new(Mutex::new(queue)),
        }
    }

    fn push(&self, batch: EventBatch) -> Result<(), (EventBatch, BusError)> {
        let mut queue = lock(&self.queue);
        if queue.batches.len() >= queue.capacity {
            queue.refused += 1;
            let capacity = queue.capacity;
            return Err((batch, BusError::Full { capacity }));
        }
        queue.batches.push_back(batch);
        Ok(())
    }

    fn pop(&self) -> Option<EventBatch> {
        lock(&self.queue).batches.pop_front()
    }

    /// Batches waiting.
    pub fn len(&self) -> usize {
        lock(&self.queue).batches.len()
    }

    /// Whether no batch is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Flushes refused because the bus was full.
    pub fn refused(&self) -> u64 {
        lock(&self.queue).refused
    }
}

/// When a publisher sends what it has collected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Send once this many events are pending.
    pub max_events: usize,
    /// Send once the oldest pending event is this old.
    pub max_delay: Duration,
}

/// One worker's side of the bus: collects events, sends them as batches.
#[derive(Debug)]
pub struct Publisher {
    bus: EventBus,
    worker: WorkerId,
    policy: BatchPolicy,
    pending: Vec<KvCacheEvent>,
    oldest: Option<Timestamp>,
}

impl Publisher {
    /// A publisher for `worker` on `bus`.
    pub fn new(bus: EventBus, worker: WorkerId, policy: BatchPolicy) -> Self {
        Self {
            bus,
            worker,
            policy,
            pending: Vec::new(),
            oldest: None,
        }
    }

    /// Adds events (in order) and sends a batch if the count or age bound is reached.
    pub fn handle_events(
        &mut self,
        events: &[KvCacheEvent],
        now: Timestamp,
    ) -> Result<(), BusError> {
        if !events.is_empty() && self.pending.is_empty() {
            self.oldest = Some(now);
        }
        self.pending.extend_from_slice(events);
        self.handle_timeout(now)
    }

    /// Sends the pending events if they are old enough or many enough.
    pub fn handle_timeout(&mut self, now: Timestamp) -> Result<(), BusError> {
        let due = self.poll_timeout().is_some_and(|deadline| deadline <= now);
        if self.pending.len() >= self.policy.max_events.max(1) || due {
            return self.flush();
        }
        Ok(())
    }

    /// When the pending events must be sent at the latest.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.oldest
            .map(|oldest| oldest.saturating_add(self.policy.max_delay))
    }

    /// Sends every pending event now. On `Full` they stay pending.
    pub fn flush(&mut self) -> Result<(), BusError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch = EventBatch {
            worker: self.worker,
            events: std::mem::take(&mut self.pending),
        };
        match self.bus.push(batch) {
            Ok(()) => {
                self.oldest = None;
                Ok(())
            }
            Err((batch, error)) => {
                self.pending = batch.events;
                Err(error)
            }
        }
    }

    /// Events collected and not yet sent.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

impl EventSink for Publisher {
    type Error = BusError;

    /// Sends `events` as one batch right away (together with anything pending).
    fn publish(&mut self, events: &[KvCacheEvent]) -> Result<(), BusError> {
        self.pending.extend_from_slice(events);
        self.flush()
    }
}

/// A gap in one worker's event ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EventGap {
    /// The worker.
    pub worker: WorkerId,
    /// The id that was expected.
    pub expected: u64,
    /// The id that arrived.
    pub got: u64,
}

/// A router's side of the bus.
#[derive(Debug)]
pub struct Subscriber {
    bus: EventBus,
    next_ids: BTreeMap<(WorkerId, u32), u64>,
    gaps: Vec<EventGap>,
    current: VecDeque<(WorkerId, KvCacheEvent)>,
}

impl Subscriber {
    /// A subscriber reading `bus`.
    pub fn new(bus: EventBus) -> Self {
        Self {
            bus,
            next_ids: BTreeMap::new(),
            gaps: Vec::new(),
            current: VecDeque::new(),
        }
    }

    /// The next batch, with gaps in each worker's (and dp rank's) event ids recorded.
    pub fn try_next_batch(&mut self) -> Option<EventBatch> {
        let batch = self.bus.pop()?;
        for event in &batch.events {
            let next = self
                .next_ids
                .entry((batch.worker, event.dp_rank))
                .or_insert(event.event_id);
            if event.event_id != *next {
                self.gaps.push(EventGap {
                    worker: batch.worker,
                    expected: *next,
                    got: event.event_id,
                });
            }
            *next = event.event_id.wrapping_add(1);
        }
        Some(batch)
    }

    /// The next event and its worker, batch by batch.
    pub fn try_next_event(&mut self) -> Option<(WorkerId, KvCacheEvent)> {
        if self.current.is_empty() {
            let batch = self.try_next_batch()?;
            self.current
                .extend(batch.events.into_iter().map(|e| (batch.worker, e)));
        }
        self.current.pop_front()
    }

    /// Gaps seen so far, taken.
    pub fn take_gaps(&mut self) -> Vec<EventGap> {
        std::mem::take(&mut self.gaps)
    }
}

impl EventSource for Subscriber {
    type Error = std::convert::Infallible;

    fn try_next(&mut self) -> Result<Option<KvCacheEvent>, Self::Error> {
        Ok(self.try_next_event().map(|(_, event)| event))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::events::KvCacheEventData;

    fn event(id: u64) -> KvCacheEvent {
        KvCacheEvent {
            event_id: id,
            dp_rank: 0,
            data: KvCacheEventData::Cleared,
        }
    }

    fn policy(max_events: usize, max_delay_ns: u64) -> BatchPolicy {
        BatchPolicy {
            max_events,
            max_delay: Duration::from_nanos(max_delay_ns),
        }
    }

    #[test]
    fn batches_by_count_and_by_age() {
        let bus = EventBus::new(8);
        let mut publisher = Publisher::new(bus.clone(), WorkerId::new(1), policy(3, 100));
        publisher
            .handle_events(&[event(0), event(1)], Timestamp::from_nanos(10))
            .unwrap();
        assert!(bus.is_empty(), "two events, young: held back");
        assert_eq!(publisher.poll_timeout(), Some(Timestamp::from_nanos(110)));
        publisher
            .handle_events(&[event(2)], Timestamp::from_nanos(20))
            .unwrap();
        assert_eq!(bus.len(), 1, "three events: sent");
        publisher
            .handle_events(&[event(3)], Timestamp::from_nanos(30))
            .unwrap();
        publisher
            .handle_timeout(Timestamp::from_nanos(129))
            .unwrap();
        assert_eq!(bus.len(), 1);
        publisher
            .handle_timeout(Timestamp::from_nanos(130))
            .unwrap();
        assert_eq!(bus.len(), 2, "old enough: sent");
        let mut subscriber = Subscriber::new(bus);
        let ids: Vec<u64> = std::iter::from_fn(|| subscriber.try_next_event())
            .map(|(_, e)| e.event_id)
            .collect();
        assert_eq!(ids, vec![0, 1, 2, 3]);
        assert!(subscriber.take_gaps().is_empty());
    }

    #[test]
    fn a_full_bus_is_backpressure_and_loses_nothing() {
        let bus = EventBus::new(1);
        let mut first = Publisher::new(bus.clone(), WorkerId::new(1), policy(1, 0));
        let mut second = Publisher::new(bus.clone(), WorkerId::new(2), policy(1, 0));
        first.handle_events(&[event(0)], Timestamp::ZERO).unwrap();
        assert_eq!(
            second.handle_events(&[event(0)], Timestamp::ZERO),
            Err(BusError::Full { capacity: 1 })
        );
        assert_eq!(second.pending(), 1);
        assert_eq!(bus.refused(), 1);
        let mut subscriber = Subscriber::new(bus.clone());
        assert_eq!(
            subscriber.try_next_batch().map(|b| b.worker),
            Some(WorkerId::new(1))
        );
        second.flush().unwrap();
        assert_eq!(
            subscriber.try_next_batch().map(|b| b.worker),
            Some(WorkerId::new(2))
        );
    }

    #[test]
    fn gaps_are_detected_per_worker() {
        let bus = EventBus::new(8);
        let mut a = Publisher::new(bus.clone(), WorkerId::new(1), policy(1, 0));
        let mut b = Publisher::new(bus.clone(), WorkerId::new(2), policy(1, 0));
        a.publish(&[event(0), event(1)]).unwrap();
        b.publish(&[event(5)]).unwrap();
        a.publish(&[event(3)]).unwrap();
        let mut subscriber = Subscriber::new(bus);
        while subscriber.try_next_event().is_some() {}
        assert_eq!(
            subscriber.take_gaps(),
            vec![EventGap {
                worker: WorkerId::new(1),
                expected: 2,
                got: 3
            }]
        );
    }

    #[test]
    fn publishers_on_other_threads_deliver_every_event_in_order() {
        let bus = EventBus::new(1024);
        let handles: Vec<_> = (0..2u64)
            .map(|w| {
                let bus = bus.clone();
                std::thread::spawn(move || {
                    let mut publisher = Publisher::new(bus, WorkerId::new(w), policy(4, 1_000));
                    for id in 0..100 {
                        publisher
                            .handle_events(&[event(id)], Timestamp::from_nanos(id))
                            .unwrap();
                    }
                    publisher.flush().unwrap();
                })
            })
            .collect();
        handles.into_iter().for_each(|h| h.join().unwrap());
        let mut subscriber = Subscriber::new(bus);
        let mut count = 0;
        while subscriber.try_next_event().is_some() {
            count += 1;
        }
        assert_eq!(count, 200);
        assert!(subscriber.take_gaps().is_empty());
    }
}
