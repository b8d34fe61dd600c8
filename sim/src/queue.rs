//! The discrete-event queue: items ordered by (time, insertion sequence).
//!
//! Owns: [`EventQueue`]. Ties at one timestamp pop in insertion order, never in hash or
//! allocation order, so a run is reproducible. Time jumps straight to the next item.
//! Never: read a wall clock.

use kvtwin::ids::Timestamp;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

#[derive(Debug)]
struct Entry<T> {
    at: Timestamp,
    seq: u64,
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl<T> Eq for Entry<T> {}
impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// A min-queue of timed items.
#[derive(Debug)]
pub struct EventQueue<T> {
    heap: BinaryHeap<Reverse<Entry<T>>>,
    next_seq: u64,
}

impl<T> Default for EventQueue<T> {
    fn default() -> Self {
        Self {
            heap: BinaryHeap::new(),
            next_seq: 0,
        }
    }
}

impl<T> EventQueue<T> {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Schedules `item` at `at`.
    pub fn push(&mut self, at: Timestamp, item: T) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.heap.push(Reverse(Entry { at, seq, item }));
    }

    /// The earliest item, if any.
    pub fn pop(&mut self) -> Option<(Timestamp, T)> {
        self.heap.pop().map(|Reverse(entry)| (entry.at, entry.item))
    }

    /// When the earliest item is due.
    pub fn peek_time(&self) -> Option<Timestamp> {
        self.heap.peek().map(|Reverse(entry)| entry.at)
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_by_time_then_by_insertion_order() {
        let mut queue = EventQueue::new();
        queue.push(Timestamp::from_nanos(5), "late");
        queue.push(Timestamp::from_nanos(1), "first");
        queue.push(Timestamp::from_nanos(1), "second");
        assert_eq!(queue.peek_time(), Some(Timestamp::from_nanos(1)));
        let order: Vec<&str> = std::iter::from_fn(|| queue.pop())
            .map(|(_, item)| item)
            .collect();
        assert_eq!(order, vec!["first", "second", "late"]);
        assert!(queue.is_empty());
    }
}
