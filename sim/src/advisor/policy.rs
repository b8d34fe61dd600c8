//! Tiering policies over one bounded tier of blocks, each a cache of a fixed number of
//! blocks that is told of hits and asked to take misses: LRU, LFU (least frequently
//! used, least recently used among equals), S3-FIFO (Yang et al., SOSP '23: a small
//! probationary FIFO, a main FIFO with re-insertion, a ghost FIFO of keys) and ARC
//! (Megiddo and Modha, FAST '03: recency and frequency lists with ghosts, adapting their
//! split).
//!
//! Owns: the four policies behind [`TierCache`]. Never: decides what is accessed (the
//! replay does), or iterates a hash map (every order is kept in a `BTreeMap` or a
//! `VecDeque`, so a run is the same on every machine).

use kvtwin::ids::SequenceHash;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};

/// A policy's name, as flags and reports write it (and as scenarios do: `Lru`, `Lfu`,
/// `S3Fifo`, `Arc`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub enum Policy {
    /// Least recently used out first.
    #[default]
    Lru,
    /// Least frequently used out first (least recently used among equals).
    Lfu,
    /// S3-FIFO: small, main and ghost FIFOs.
    S3Fifo,
    /// Adaptive replacement cache.
    Arc,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 4] = [Policy::Lru, Policy::Lfu, Policy::S3Fifo, Policy::Arc];

    /// Its name in flags and reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Lfu => "lfu",
            Policy::S3Fifo => "s3fifo",
            Policy::Arc => "arc",
        }
    }

    /// The policy named `name`.
    pub fn parse(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// An empty cache of `capacity` blocks under this policy.
    pub fn cache(self, capacity: usize) -> Box<dyn TierCache> {
        match self {
            Policy::Lru => Box::new(Lru::new(capacity)),
            Policy::Lfu => Box::new(Lfu::new(capacity)),
            Policy::S3Fifo => Box::new(S3Fifo::new(capacity)),
            Policy::Arc => Box::new(Arc::new(capacity)),
        }
    }
}

/// One bounded tier under a policy.
pub trait TierCache {
    /// Whether it holds `block` (changes nothing).
    fn contains(&self, block: SequenceHash) -> bool;
    /// `block`, held, was used.
    fn hit(&mut self, block: SequenceHash);
    /// `block`, not held, is offered: the blocks it evicts to take it (none when it does
    /// not take it, as S3-FIFO's small queue may not).
    fn insert(&mut self, block: SequenceHash) -> Vec<SequenceHash>;
    /// Blocks held.
    fn len(&self) -> usize;
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Least recently used out first.
pub struct Lru {
    capacity: usize,
    clock: u64,
    order: BTreeMap<u64, SequenceHash>,
    stamp: FxHashMap<SequenceHash, u64>,
}

impl Lru {
    fn new(capacity: usize) -> Lru {
        Lru {
            capacity,
            clock: 0,
            order: BTreeMap::new(),
            stamp: FxHashMap::default(),
        }
    }

    fn touch(&mut self, block: SequenceHash) {
        self.clock += 1;
        if let Some(old) = self.stamp.insert(block, self.clock) {
            self.order.remove(&old);
        }
        self.order.insert(self.clock, block);
    }
}

impl TierCache for Lru {
    fn contains(&self, block: SequenceHash) -> bool {
        self.stamp.contains_key(&block)
    }

    fn hit(&mut self, block: SequenceHash) {
        self.touch(block);
    }

    fn insert(&mut self, block: SequenceHash) -> Vec<SequenceHash> {
        if self.capacity == 0 {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.stamp.len() >= self.capacity {
            let (_, victim) = self.order.pop_first().expect("a full cache has an oldest");
            self.stamp.remove(&victim);
            evicted.push(victim);
        }
        self.touch(block);
        evicted
    }

    fn len(&self) -> usize {
        self.stamp.len()
    }
}

/// Least frequently used out first, least recently used among equals.
pub struct Lfu {
    capacity: usize,
    clock: u64,
    order: BTreeMap<(u64, u64), SequenceHash>,
    key: FxHashMap<SequenceHash, (u64, u64)>,
}

impl Lfu {
    fn new(capacity: usize) -> Lfu {
        Lfu {
            capacity,
            clock: 0,
            order: BTreeMap::new(),
            key: FxHashMap::default(),
        }
    }
}

impl TierCache for Lfu {
    fn contains(&self, block: SequenceHash) -> bool {
        self.key.contains_key(&block)
    }

    fn hit(&mut self, block: SequenceHash) {
        self.clock += 1;
        if let Some(old) = self.key.get(&block).copied() {
            self.order.remove(&old);
            let new = (old.0 + 1, self.clock);
            self.order.insert(new, block);
            self.key.insert(block, new);
        }
    }

    fn insert(&mut self, block: SequenceHash) -> Vec<SequenceHash> {
        if self.capacity == 0 {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.key.len() >= self.capacity {
            let (_, victim) = self
                .order
                .pop_first()
                .expect("a full cache has a least used");
            self.key.remove(&victim);
            evicted.push(victim);
        }
        self.clock += 1;
        self.order.insert((1, self.clock), block);
        self.key.insert(block, (1, self.clock));
        evicted
    }

    fn len(&self) -> usize {
        self.key.len()
    }
}

/// Where an S3-FIFO block lies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small,
    Main,
}

/// S3-FIFO: new blocks enter a small FIFO (a tenth of the tier); one used again while
/// there moves to the main FIFO when it reaches the small one's end, one not used leaves
/// for the ghost FIFO (keys only, as long as the main one); a block offered while its
/// key is a ghost goes straight to main. The main FIFO re-inserts a block used since its
/// last pass (its count, at most 3, less one) instead of evicting it.
pub struct S3Fifo {
    small_capacity: usize,
    main_capacity: usize,
    small: VecDeque<SequenceHash>,
    main: VecDeque<SequenceHash>,
    ghost: VecDeque<SequenceHash>,
    ghosts: FxHashMap<SequenceHash, u32>,
    held: FxHashMap<SequenceHash, (Queue, u8)>,
}

impl S3Fifo {
    fn new(capacity: usize) -> S3Fifo {
        let small_capacity = if capacity == 0 {
            0
        } else {
            (capacity / 10).max(1)
        };
        S3Fifo {
            small_capacity,
            main_capacity: capacity - small_capacity,
            small: VecDeque::new(),
            main: VecDeque::new(),
            ghost: VecDeque::new(),
            ghosts: FxHashMap::default(),
            held: FxHashMap::default(),
        }
    }

    fn capacity(&self) -> usize {
        self.small_capacity + self.main_capacity
    }

    fn remember_ghost(&mut self, block: SequenceHash) {
        *self.ghosts.entry(block).or_insert(0) += 1;
        self.ghost.push_back(block);
        while self.ghost.len() > self.main_capacity.max(1) {
            let old = self.ghost.pop_front().expect("a ghost");
            if let Some(count) = self.ghosts.get_mut(&old) {
                *count -= 1;
                if *count == 0 {
                    self.ghosts.remove(&old);
                }
            }
        }
    }

    /// Evicts one block (from small when it is over its share or main is empty).
    fn evict(&mut self, evicted: &mut Vec<SequenceHash>) {
        loop {
            if self.small.len() >= self.small_capacity.max(1) || self.main.is_empty() {
                let Some(block) = self.small.pop_front() else {
                    return;
                };
                let (_, used) = self.held[&block];
                if used > 0 {
                    self.held.insert(block, (Queue::Main, 0));
                    self.main.push_back(block);
                    if self.main.len() > self.main_capacity {
                        self.evict_main(evicted);
                        return;
                    }
                } else {
                    self.held.remove(&block);
                    self.remember_ghost(block);
                    evicted.push(block);
                    return;
                }
            } else {
                self.evict_main(evicted);
                return;
            }
        }
    }

    fn evict_main(&mut self, evicted: &mut Vec<SequenceHash>) {
        while let Some(block) = self.main.pop_front() {
            let (_, used) = self.held[&block];
            if used > 0 {
                self.held.insert(block, (Queue::Main, used - 1));
                self.main.push_back(block);
            } else {
                self.held.remove(&block);
                evicted.push(block);
                return;
            }
        }
    }
}

impl TierCache for S3Fifo {
    fn contains(&self, block: SequenceHash) -> bool {
        self.held.contains_key(&block)
    }

    fn hit(&mut self, block: SequenceHash) {
        if let Some((_, used)) = self.held.get_mut(&block) {
            *used = (*used + 1).min(3);
        }
    }

    fn insert(&mut self, block: SequenceHash) -> Vec<SequenceHash> {
        if self.capacity() == 0 {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.held.len() >= self.capacity() {
            let before = self.held.len();
            self.evict(&mut evicted);
            if self.held.len() == before && evicted.is_empty() {
                break;
            }
        }
        if self.ghosts.contains_key(&block) {
            self.held.insert(block, (Queue::Main, 0));
            self.main.push_back(block);
        } else {
            self.held.insert(block, (Queue::Small, 0));
            self.small.push_back(block);
        }
        evicted
    }

    fn len(&self) -> usize {
        self.held.len()
    }
}

/// ARC: T1 (seen once lately) and T2 (seen at least twice), each LRU, with ghost lists
/// B1 and B2 of what each evicted; a miss that finds its key in a ghost list moves the
/// target size of T1 (`p`) toward the list that would have hit.
pub struct Arc {
    capacity: usize,
    p: usize,
    t1: Lru,
    t2: Lru,
    b1: Lru,
    b2: Lru,
}

impl Arc {
    fn new(capacity: usize) -> Arc {
        let unbounded = usize::MAX;
        Arc {
            capacity,
            p: 0,
            t1: Lru::new(unbounded),
            t2: Lru::new(unbounded),
            b1: Lru::new(unbounded),
            b2: Lru::new(unbounded),
        }
    }

    fn pop_lru(list: &mut Lru) -> Option<SequenceHash> {
        let (_, block) = list.order.pop_first()?;
        list.stamp.remove(&block);
        Some(block)
    }

    fn remove(list: &mut Lru, block: SequenceHash) {
        if let Some(stamp) = list.stamp.remove(&block) {
            list.order.remove(&stamp);
        }
    }

    /// ARC's REPLACE: one block out of T1 or T2 into its ghost list.
    fn replace(&mut self, in_b2: bool, evicted: &mut Vec<SequenceHash>) {
        let t1 = self.t1.len();
        if t1 > 0 && (t1 > self.p || (in_b2 && t1 == self.p)) {
            if let Some(block) = Self::pop_lru(&mut self.t1) {
                self.b1.touch(block);
                evicted.push(block);
            }
        } else if let Some(block) = Self::pop_lru(&mut self.t2) {
            self.b2.touch(block);
            evicted.push(block);
        } else if let Some(block) = Self::pop_lru(&mut self.t1) {
            self.b1.touch(block);
            evicted.push(block);
        }
    }
}

impl TierCache for Arc {
    fn contains(&self, block: SequenceHash) -> bool {
        self.t1.contains(block) || self.t2.contains(block)
    }

    fn hit(&mut self, block: SequenceHash) {
        if self.t1.contains(block) {
            Self::remove(&mut self.t1, block);
        }
        self.t2.touch(block);
    }

    fn insert(&mut self, block: SequenceHash) -> Vec<SequenceHash> {
        let c = self.capacity;
        if c == 0 {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        if self.b1.contains(block) {
            let delta = (self.b2.len() / self.b1.len().max(1)).max(1);
            self.p = (self.p + delta).min(c);
            self.replace(false, &mut evicted);
            Self::remove(&mut self.b1, block);
            self.t2.touch(block);
            return evicted;
        }
        if self.b2.contains(block) {
            let delta = (self.b1.len() / self.b2.len().max(1)).max(1);
            self.p = self.p.saturating_sub(delta);
            self.replace(true, &mut evicted);
            Self::remove(&mut self.b2, block);
            self.t2.touch(block);
            return evicted;
        }
        let l1 = self.t1.len() + self.b1.len();
        let total = l1 + self.t2.len() + self.b2.len();
        if l1 >= c {
            if self.t1.len() < c {
                Self::pop_lru(&mut self.b1);
                self.replace(false, &mut evicted);
            } else if let Some(block) = Self::pop_lru(&mut self.t1) {
                evicted.push(block);
            }
        } else if total >= c {
            if total >= 2 * c {
                Self::pop_lru(&mut self.b2);
            }
            if self.t1.len() + self.t2.len() >= c {
                self.replace(false, &mut evicted);
            }
        }
        self.t1.touch(block);
        evicted
    }

    fn len(&self) -> usize {
        self.t1.len() + self.t2.len()
    }
}
