//! The store's bookkeeping, apart from any bytes: which copy of each key lies on which
//! tier, how full each tier is, what is least recently used, which copies readers hold
//! (leases) and which copies wait for their last reader before they are deleted.
//!
//! Tiers are DRAM, local disk and an object store, in that order, each bounded in bytes
//! (a record's length: header, key and value) and least recently used first out. A value
//! goes to the highest tier that can hold it; room is made by moving that tier's least
//! recently used unleased entries one tier down, where room is made the same way, and
//! an entry that finds no room below (the lowest tier, or one full of leased entries) is
//! evicted from the store. Every change is returned as [`Step`]s, lower tiers first, for
//! the caller to carry out in order: this module does no I/O, so it is tested alone and
//! property-checked against its bounds.
//!
//! A lease pins a copy where it lies: a reader that found a value on disk or in the
//! object tier leases its copy, reads it without the store's lock, and releases it. A
//! leased copy is never moved or evicted; one that is overwritten or deleted meanwhile
//! is dead, still counted against its tier, and deleted when its last lease ends.
//!
//! Owns: entries, per-tier LRU order and bytes, leases, dead copies, copy ids. Never:
//! reads or writes bytes, or a clock (order is a counter).

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};

/// A tier of the store, highest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Host DRAM: lost on a restart.
    Memory,
    /// Local disk: files under the store's directory.
    Disk,
    /// An object store (a local directory by default; S3-compatible when configured).
    Object,
}

impl Tier {
    /// Every tier, highest first.
    pub const ALL: [Tier; 3] = [Tier::Memory, Tier::Disk, Tier::Object];

    /// The tier's name in metrics and replies.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Memory => "memory",
            Tier::Disk => "disk",
            Tier::Object => "object",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn below(self) -> Option<Tier> {
        match self {
            Tier::Memory => Some(Tier::Disk),
            Tier::Disk => Some(Tier::Object),
            Tier::Object => None,
        }
    }
}

/// Where a key's value lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its copy: a number no other value of the store's life has had.
    pub copy: u64,
    /// Its tier.
    pub tier: Tier,
    /// Its record's length, bytes.
    pub size: u64,
    /// BLAKE3 of its value.
    pub digest: [u8; 32],
    stamp: u64,
}

/// One change for the caller to carry out, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Move `copy` of `key` from one tier to the next one down (room made there
    /// already).
    Demote {
        /// The key.
        key: Bytes,
        /// Its copy.
        copy: u64,
        /// Where it lies.
        from: Tier,
        /// Where it goes.
        to: Tier,
    },
    /// Delete `copy` of `key` from `tier`.
    Delete {
        /// The key.
        key: Bytes,
        /// Its copy.
        copy: u64,
        /// Where it lies.
        tier: Tier,
        /// Why: `true` when the store let the key go for room (it is gone from every
        /// tier), `false` when a newer copy replaced it or a client deleted it.
        evicted: bool,
    },
}

/// A value the store cannot take now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// Larger than every tier.
    #[error("a value of {size} bytes is larger than every tier")]
    TooLarge {
        /// Its record's length.
        size: u64,
    },
    /// Its tier's room is held by readers' leases.
    #[error("no room in {tier}: {leased} of its {limit} bytes are being read", tier = .tier.name())]
    Leased {
        /// The tier it would go to.
        tier: Tier,
        /// Bytes leased or dead there.
        leased: u64,
        /// The tier's bound.
        limit: u64,
    },
}

/// The bookkeeping of one store.
#[derive(Debug)]
pub struct TierIndex {
    limits: [u64; 3],
    entries: HashMap<Bytes, Entry>,
    /// Per tier: stamp → key, least recently used first.
    lru: [BTreeMap<u64, Bytes>; 3],
    used: [u64; 3],
    /// Leased copies: copy → (leases, tier, size).
    leases: HashMap<u64, (u32, Tier, u64)>,
    /// Per tier: bytes of copies leased or dead, which making room cannot move.
    pinned: [u64; 3],
    /// Copies replaced or deleted while leased: copy → key.
    dead: BTreeMap<u64, Bytes>,
    next_stamp: u64,
    next_copy: u64,
}

impl TierIndex {
    /// An empty index with these bounds, bytes, highest tier first (0: no such tier).
    pub fn new(limits: [u64; 3]) -> TierIndex {
        TierIndex {
            limits,
            entries: HashMap::new(),
            lru: Default::default(),
            used: [0; 3],
            leases: HashMap::new(),
            pinned: [0; 3],
            dead: BTreeMap::new(),
            next_stamp: 0,
            next_copy: 1,
        }
    }

    /// A copy id never given before (in this index's life or any recovered one's).
    pub fn new_copy(&mut self) -> u64 {
        let copy = self.next_copy;
        self.next_copy += 1;
        copy
    }

    /// Bytes used on `tier` (dead copies included).
    pub fn used(&self, tier: Tier) -> u64 {
        self.used[tier.index()]
    }

    /// `tier`'s bound, bytes.
    pub fn limit(&self, tier: Tier) -> u64 {
        self.limits[tier.index()]
    }

    /// Keys whose value lies on `tier`.
    pub fn count(&self, tier: Tier) -> usize {
        self.lru[tier.index()].len()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Copies leased now.
    pub fn leased(&self) -> usize {
        self.leases.len()
    }

    /// Every key held, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &Bytes> {
        self.entries.keys()
    }

    /// Where `key` lies, without touching its recency.
    pub fn peek(&self, key: &[u8]) -> Option<Entry> {
        self.entries.get(key).copied()
    }

    /// Where `key` lies, now its most recently used; a copy off DRAM is leased to the
    /// caller, who releases it ([`Self::release`]) once read.
    pub fn get(&mut self, key: &[u8]) -> Option<Entry> {
        let stamp = self.stamp();
        let entry = self.entries.get_mut(key)?;
        let tier = entry.tier.index();
        let key = self.lru[tier]
            .remove(&entry.stamp)
            .expect("every entry is in its tier's order");
        entry.stamp = stamp;
        self.lru[tier].insert(stamp, key);
        let entry = *entry;
        if entry.tier != Tier::Memory {
            let lease = self
                .leases
                .entry(entry.copy)
                .or_insert((0, entry.tier, entry.size));
            if lease.0 == 0 {
                self.pinned[entry.tier.index()] += entry.size;
            }
            lease.0 += 1;
        }
        Some(entry)
    }

    /// A reader is done with `copy`: the delete of a copy that died meanwhile, if this
    /// was its last lease.
    pub fn release(&mut self, copy: u64) -> Option<Step> {
        let lease = self.leases.get_mut(&copy)?;
        lease.0 -= 1;
        if lease.0 > 0 {
            return None;
        }
        let (_, tier, size) = self.leases.remove(&copy)?;
        self.pinned[tier.index()] -= size;
        let key = self.dead.remove(&copy)?;
        self.used[tier.index()] -= size;
        Some(Step::Delete {
            key,
            copy,
            tier,
            evicted: false,
        })
    }

    /// `key`'s new value, copy `copy` of `size` bytes: where it goes, and the steps that
    /// make room there and drop the value it replaces. Nothing changes on an error.
    pub fn place(
        &mut self,
        key: Bytes,
        copy: u64,
        size: u64,
        digest: [u8; 32],
    ) -> Result<(Tier, Vec<Step>), Full> {
        let tier = Tier::ALL
            .into_iter()
            .find(|tier| self.limits[tier.index()] >= size)
            .ok_or(Full::TooLarge { size })?;
        // Making room cannot move leased and dead copies.
        let pinned = self.pinned[tier.index()];
        let limit = self.limits[tier.index()];
        if pinned + size > limit {
            return Err(Full::Leased {
                tier,
                leased: pinned,
                limit,
            });
        }
        let mut steps = Vec::new();
        if let Some(old) = self.entries.get(&key).copied() {
            steps.extend(self.drop_entry(&key, old, false));
        }
        self.make_room(tier, size, &mut steps);
        self.insert(key, copy, tier, size, digest);
        Ok((tier, steps))
    }

    /// `key` deleted by a client: the step that deletes its copy (none while it is
    /// leased: then it goes with its last lease). `None` if the store did not hold it.
    pub fn remove(&mut self, key: &[u8]) -> Option<Vec<Step>> {
        let (key, entry) = self.entries.get_key_value(key)?;
        let (key, entry) = (key.clone(), *entry);
        Some(self.drop_entry(&key, entry, false).into_iter().collect())
    }

    /// Copies found on the tiers after a restart, as (key, copy, tier, record length,
    /// digest), in any order: the newest copy of each key is kept, LRU order is copy
    /// order (older first), and the steps delete the older copies of a key and whatever
    /// no longer fits its tier's bound.
    pub fn recover(&mut self, mut found: Vec<(Bytes, u64, Tier, u64, [u8; 32])>) -> Vec<Step> {
        found.sort_by_key(|(_, copy, ..)| *copy);
        let mut steps = Vec::new();
        for (key, copy, tier, size, digest) in found {
            self.next_copy = self.next_copy.max(copy + 1);
            if let Some(old) = self.entries.get(&key).copied() {
                steps.extend(self.drop_entry(&key, old, false));
            }
            self.insert(key, copy, tier, size, digest);
        }
        for tier in Tier::ALL {
            while self.used[tier.index()] > self.limits[tier.index()] {
                let Some((_, key)) = self.lru[tier.index()].first_key_value() else {
                    break;
                };
                let key = key.clone();
                let entry = self.entries[&key];
                steps.extend(self.drop_entry(&key, entry, true));
            }
        }
        steps
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    fn insert(&mut self, key: Bytes, copy: u64, tier: Tier, size: u64, digest: [u8; 32]) {
        let stamp = self.stamp();
        self.lru[tier.index()].insert(stamp, key.clone());
        self.used[tier.index()] += size;
        self.entries.insert(
            key,
            Entry {
                copy,
                tier,
                size,
                digest,
                stamp,
            },
        );
    }

    /// Takes `entry` out of the index: its delete step, or none while it is leased (then
    /// it is dead, and its bytes stay counted until its last lease ends).
    fn drop_entry(&mut self, key: &Bytes, entry: Entry, evicted: bool) -> Option<Step> {
        self.entries.remove(key);
        self.lru[entry.tier.index()].remove(&entry.stamp);
        if self.leases.contains_key(&entry.copy) {
            // Pinned already, by its lease; counted until the last one ends.
            self.dead.insert(entry.copy, key.clone());
            return None;
        }
        self.used[entry.tier.index()] -= entry.size;
        Some(Step::Delete {
            key: key.clone(),
            copy: entry.copy,
            tier: entry.tier,
            evicted,
        })
    }

    /// Moves `tier`'s least recently used unleased entries down (or out) until `size`
    /// more bytes fit; the caller has checked that they can.
    fn make_room(&mut self, tier: Tier, size: u64, steps: &mut Vec<Step>) {
        let limit = self.limits[tier.index()];
        while self.used[tier.index()] + size > limit {
            let victim = self.lru[tier.index()]
                .values()
                .find(|key| !self.leases.contains_key(&self.entries[*key].copy))
                .cloned();
            let Some(key) = victim else {
                return;
            };
            let entry = self.entries[&key];
            let room_below = tier.below().filter(|below| {
                self.limits[below.index()] >= entry.size
                    && self.pinned[below.index()] + entry.size <= self.limits[below.index()]
            });
            match room_below {
                Some(below) => {
                    self.make_room(below, entry.size, steps);
                    self.lru[tier.index()].remove(&entry.stamp);
                    self.used[tier.index()] -= entry.size;
                    self.entries.remove(&key);
                    self.insert(key.clone(), entry.copy, below, entry.size, entry.digest);
                    steps.push(Step::Demote {
                        key,
                        copy: entry.copy,
                        from: tier,
                        to: below,
                    });
                }
                None => steps.extend(self.drop_entry(&key, entry, true)),
            }
        }
    }
}

#[cfg(test)]
mod tests;
