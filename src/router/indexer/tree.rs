//! The compressed radix tree under [`super::KvIndexer`]: nodes, their runs of blocks,
//! who holds them, and the structural edits (split, merge, delete) that keep it compact.
//!
//! Owns: [`BlockTree`], [`Node`] and the block-hash → position map; a run's blocks are a
//! [`RunBlocks`] (`run`), its holders a [`HolderSet`] (`holders`).
//! Never: decides what an event means (the indexer does), or iterates a hash map into
//! anything observable (children are sorted wherever their order shows).
//!
//! Shape: the tree is the trie of token-hash sequences. A node is a *run*: a maximal
//! chain of blocks without branching whose blocks all have the same holders, each holder
//! a worker slot with the tiers it holds them in. So a query walks one node per branch
//! point or holder change, comparing token hashes in a contiguous array, and a worker's
//! score is the sum of the matched run lengths until the first node it does not hold.
//!
//! Invariants (checked by `check_invariants` after every step of the model test):
//! - a node's `depth` is its parent's depth plus the parent's length (root: 0, length 0);
//! - every block's hash is in `locations` with its node and depth, and nothing else is;
//! - every node other than the root has at least one block, and holders or children;
//! - holders are sorted by slot, one entry per slot, with at least one tier bit;
//! - `pairs` is the sum over nodes of length × holders, and `held[slot]` the sum over
//!   the nodes `slot` holds of their lengths;
//! - with recency on, `stamps` has an entry per slab entry: a run's last store or match
//!   (a split copies it, a merge keeps the later).
//!
//! - compactness (not needed for correctness, but it bounds the runs a query visits): no
//!   node is its parent's only child with the same holders; such pairs are merged.

use crate::ids::{LocalBlockHash, SequenceHash};
use hashbrown::HashTable;

/// hashbrown's map (std's wraps the same table) for its `allocation_size`.
type FxHashMap<K, V> = hashbrown::HashMap<K, V, rustc_hash::FxBuildHasher>;
use smallvec::SmallVec;
use std::hash::BuildHasher;

mod holders;
mod retag;
mod run;

pub(super) use holders::{Holder, HolderChange, HolderMask, HolderSet};
pub(super) use run::{NodeBlock, RunBlocks};

/// Index of a node in the slab.
pub(super) type NodeId = u32;

/// The root: no blocks, never deleted; its children are the first blocks of prompts.
pub(super) const ROOT: NodeId = 0;

/// Marks a free slab entry (in `parent`).
const FREE: NodeId = NodeId::MAX;

/// Where a block sits: its node and its depth from the root (0 = a prompt's first
/// block). Depths do not change when runs split or merge, so only `node` is rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Location {
    pub(super) node: NodeId,
    pub(super) depth: u32,
}

/// The table hash of a block hash.
fn hash_of(hash: SequenceHash) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(hash.get())
}

/// The hash of the block a location names, if it names one.
fn hash_at(nodes: &[Node], location: Location) -> Option<SequenceHash> {
    let node = nodes.get(location.node as usize)?;
    let offset = location.depth.checked_sub(node.depth)?;
    node.blocks.get_hash(offset as usize)
}

/// Forgets the position `at`, where the block `hash` was.
fn forget(locations: &mut HashTable<Location>, at: Location, hash: SequenceHash) {
    if let Ok(entry) = locations.find_entry(hash_of(hash), |l| *l == at) {
        entry.remove();
    }
}

/// Children of a node, keyed by their first block's tokens hash. One child (a chain cut
/// by a holder change) lives inside the node; a handful are scanned linearly (one cache
/// line); a wide fan-out (the root, popular system prompts) gets a map.
#[derive(Debug, Default)]
enum Children {
    #[default]
    None,
    One(LocalBlockHash, NodeId),
    Few(Vec<(LocalBlockHash, NodeId)>),
    Many(Box<FxHashMap<LocalBlockHash, NodeId>>),
}

const FEW_CHILDREN: usize = 8;

impl Children {
    #[inline]
    fn get(&self, tokens_hash: LocalBlockHash) -> Option<NodeId> {
        match self {
            Children::None => None,
            Children::One(first, id) => (*first == tokens_hash).then_some(*id),
            Children::Few(few) => few
                .iter()
                .find(|(first, _)| *first == tokens_hash)
                .map(|(_, id)| *id),
            Children::Many(many) => many.get(&tokens_hash).copied(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Children::None => 0,
            Children::One(..) => 1,
            Children::Few(few) => few.len(),
            Children::Many(many) => many.len(),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Children::None)
    }

    /// Inserts or replaces the child starting with `tokens_hash`.
    fn insert(&mut self, tokens_hash: LocalBlockHash, id: NodeId) {
        match self {
            Children::None => *self = Children::One(tokens_hash, id),
            Children::One(first, only) if *first == tokens_hash => *only = id,
            Children::One(first, only) => {
                *self = Children::Few(vec![(*first, *only), (tokens_hash, id)]);
            }
            Children::Few(few) => {
                if let Some(entry) = few.iter_mut().find(|(first, _)| *first == tokens_hash) {
                    entry.1 = id;
                } else if few.len() < FEW_CHILDREN {
                    few.push((tokens_hash, id));
                } else {
                    let mut many: FxHashMap<LocalBlockHash, NodeId> = few.drain(..).collect();
                    many.insert(tokens_hash, id);
                    *self = Children::Many(Box::new(many));
                }
            }
            Children::Many(many) => {
                many.insert(tokens_hash, id);
            }
        }
    }

    fn remove(&mut self, tokens_hash: LocalBlockHash) {
        match self {
            Children::None => {}
            Children::One(first, _) => {
                if *first == tokens_hash {
                    *self = Children::None;
                }
            }
            Children::Few(few) => {
                few.retain(|(first, _)| *first != tokens_hash);
                match few.as_slice() {
                    [] => *self = Children::None,
                    [(first, id)] => *self = Children::One(*first, *id),
                    _ => {}
                }
            }
            Children::Many(many) => {
                many.remove(&tokens_hash);
                if many.len() <= FEW_CHILDREN / 2 {
                    *self = Children::Few(many.drain().collect());
                }
            }
        }
    }

    /// The ids, in no particular order (for re-parenting only).
    fn ids(&self) -> SmallVec<[NodeId; FEW_CHILDREN]> {
        match self {
            Children::None => SmallVec::new(),
            Children::One(_, id) => smallvec::smallvec![*id],
            Children::Few(few) => few.iter().map(|(_, id)| *id).collect(),
            Children::Many(many) => many.values().copied().collect(),
        }
    }

    /// The only child, if there is exactly one.
    fn only(&self) -> Option<NodeId> {
        match self {
            Children::One(_, id) => Some(*id),
            _ => None,
        }
    }

    /// Children sorted by first tokens hash: the order wherever it is observable.
    fn sorted(&self) -> Vec<(LocalBlockHash, NodeId)> {
        let mut out: Vec<(LocalBlockHash, NodeId)> = match self {
            Children::None => Vec::new(),
            Children::One(first, id) => vec![(*first, *id)],
            Children::Few(few) => few.clone(),
            Children::Many(many) => many.iter().map(|(t, id)| (*t, *id)).collect(),
        };
        out.sort_unstable_by_key(|(first, _)| first.get());
        out
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Children::None | Children::One(..) => 0,
            Children::Few(few) => few.capacity() * std::mem::size_of::<(LocalBlockHash, NodeId)>(),
            Children::Many(many) => {
                std::mem::size_of::<FxHashMap<LocalBlockHash, NodeId>>() + many.allocation_size()
            }
        }
    }
}

/// A run of blocks with one set of holders.
#[derive(Debug, Default)]
pub(super) struct Node {
    pub(super) blocks: RunBlocks,
    children: Children,
    pub(super) mask: HolderMask,
    /// Read-only outside this module; change it with `set_holders`, which keeps `mask`.
    pub(super) holders: HolderSet,
    pub(super) parent: NodeId,
    /// Depth of the first block.
    pub(super) depth: u32,
}

impl Node {
    pub(super) fn len(&self) -> usize {
        self.blocks.len()
    }

    /// The holder entry of `slot`.
    pub(super) fn holder(&self, slot: u32) -> Option<Holder> {
        self.holders.iter().copied().find(|h| h.slot() == slot)
    }

    /// The child whose first block has `tokens_hash`.
    #[inline]
    pub(super) fn child(&self, tokens_hash: LocalBlockHash) -> Option<NodeId> {
        self.children.get(tokens_hash)
    }

    pub(super) fn sorted_children(&self) -> Vec<(LocalBlockHash, NodeId)> {
        self.children.sorted()
    }

    fn set_holders(&mut self, holders: HolderSet) {
        self.mask = HolderMask::of(&holders);
        self.holders = holders;
    }

    fn first_tokens_hash(&self) -> LocalBlockHash {
        self.blocks.token(0)
    }
}

// A run visit should cost one or two cache lines: keep the node small.
const _: () = assert!(std::mem::size_of::<Node>() <= 96);

/// The tree and the map from block hash to position.
#[derive(Debug)]
pub(super) struct BlockTree {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    /// Block hash → position. The table keeps only the position (9 bytes a bucket, not
    /// 17): a probe compares the key with the block the position names.
    locations: HashTable<Location>,
    pairs: usize,
    /// Times the position table was rebuilt to shed tombstones (statistics).
    location_rebuilds: u64,
    /// The table's room when empty: entries + room left + tombstones.
    locations_full_capacity: usize,
    /// Blocks each worker slot holds, in any tier (what a per-worker budget counts).
    held: Vec<usize>,
    /// Per slab entry, the run's last store or match (`KvIndexer`'s clock); empty unless
    /// [`BlockTree::track_recency`] was called (an index without a budget pays nothing).
    stamps: Vec<u64>,
}

impl Default for BlockTree {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            locations: HashTable::new(),
            pairs: 0,
            location_rebuilds: 0,
            locations_full_capacity: 0,
            held: Vec::new(),
            stamps: Vec::new(),
        }
    }
}

impl BlockTree {
    #[inline]
    pub(super) fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        &mut self.nodes[id as usize]
    }

    /// (block, holder) pairs.
    pub(super) fn pairs(&self) -> usize {
        self.pairs
    }

    /// Blocks `slot` holds, in any tier.
    pub(super) fn held(&self, slot: u32) -> usize {
        self.held.get(slot as usize).copied().unwrap_or(0)
    }

    /// Counts `len` blocks more (`gained`) or fewer held by `slot`.
    fn count_held(&mut self, slot: u32, len: usize, gained: bool) {
        let slot = slot as usize;
        if self.held.len() <= slot {
            self.held.resize(slot + 1, 0);
        }
        if gained {
            self.held[slot] += len;
        } else {
            self.held[slot] -= len;
        }
    }

    /// Starts keeping a stamp per run (every run starts at 0).
    pub(super) fn track_recency(&mut self) {
        self.stamps = vec![0; self.nodes.len()];
    }

    /// The stamp of run `id` (0 without recency).
    pub(super) fn stamp(&self, id: NodeId) -> u64 {
        self.stamps.get(id as usize).copied().unwrap_or(0)
    }

    /// Stamps run `id` and every run above it with `stamp`: storing or matching a block
    /// uses its whole prefix. Stops early at a run already that recent (so is the rest of
    /// its path). No-op without recency.
    pub(super) fn stamp_path(&mut self, mut id: NodeId, stamp: u64) {
        if self.stamps.is_empty() {
            return;
        }
        while id != ROOT {
            let entry = &mut self.stamps[id as usize];
            if *entry >= stamp {
                return;
            }
            *entry = stamp;
            id = self.nodes[id as usize].parent;
        }
    }

    /// Bytes the position table has allocated (tests only).
    #[cfg(test)]
    pub(super) fn location_table_bytes(&self) -> usize {
        self.locations.allocation_size()
    }

    /// Times the position table was rebuilt at the size its entries need.
    pub(super) fn location_rebuilds(&self) -> u64 {
        self.location_rebuilds
    }

    /// Distinct blocks held by anyone (or kept as the path to a held block).
    pub(super) fn distinct_blocks(&self) -> usize {
        self.locations.len()
    }

    /// A block's node and offset inside it.
    #[inline]
    pub(super) fn locate(&self, hash: SequenceHash) -> Option<(NodeId, usize)> {
        self.locations
            .find(hash_of(hash), |l| hash_at(&self.nodes, *l) == Some(hash))
            .map(|location| {
                let node = self.node(location.node);
                (location.node, (location.depth - node.depth) as usize)
            })
    }

    /// Takes a slab entry for `node`, stamped `stamp` (with recency on).
    fn alloc(&mut self, node: Node, stamp: u64) -> NodeId {
        let id = match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as NodeId
            }
        };
        if !self.stamps.is_empty() {
            if self.stamps.len() <= id as usize {
                self.stamps.resize(id as usize + 1, 0);
            }
            self.stamps[id as usize] = stamp;
        }
        id
    }

    fn release(&mut self, id: NodeId) {
        let node = self.node_mut(id);
        *node = Node::default();
        node.parent = FREE;
        self.free.push(id);
    }

    /// Points the locations of `id`'s blocks at `offsets`, which were in `old` at the
    /// same depths, at `id`.
    fn relabel(&mut self, old: NodeId, id: NodeId, offsets: std::ops::Range<usize>) {
        let node = &self.nodes[id as usize];
        let (from, to) = (offsets.start, offsets.end.min(node.len()));
        for (offset, hash) in (from..).zip(node.blocks.hashes_of(from..to)) {
            let before = Location {
                node: old,
                depth: node.depth + offset as u32,
            };
            if let Some(location) = self.locations.find_mut(hash_of(hash), |l| *l == before) {
                location.node = id;
            }
        }
    }

    fn set_parent_of_children(&mut self, id: NodeId) {
        for child in self.node(id).children.ids() {
            self.node_mut(child).parent = id;
        }
    }

    /// Splits `id` before offset `at` (0 < at < len) and returns (head, tail). The side
    /// with fewer blocks (and children) to relabel moves to a new node.
    fn split(&mut self, id: NodeId, at: usize) -> (NodeId, NodeId) {
        let node = self.node(id);
        let len = node.len();
        debug_assert!(at > 0 && at < len);
        let move_tail_cost = (len - at) + node.children.len();
        let move_head_cost = at + 1;
        if move_tail_cost <= move_head_cost {
            let node = self.node_mut(id);
            let tail = Node {
                blocks: node.blocks.split_off(at),
                holders: node.holders.clone(),
                mask: node.mask,
                children: std::mem::take(&mut node.children),
                parent: id,
                depth: node.depth + at as u32,
            };
            let first = tail.first_tokens_hash();
            node.blocks.trim();
            let tail_id = self.alloc(tail, self.stamp(id));
            self.relabel(id, tail_id, 0..usize::MAX);
            self.set_parent_of_children(tail_id);
            self.node_mut(id).children = Children::One(first, tail_id);
            (id, tail_id)
        } else {
            let node = self.node_mut(id);
            let head = Node {
                blocks: node.blocks.split_front(at),
                holders: node.holders.clone(),
                mask: node.mask,
                children: Children::One(node.blocks.token(0), id),
                parent: node.parent,
                depth: node.depth,
            };
            node.depth += at as u32;
            node.blocks.trim();
            let (parent, first) = (head.parent, head.first_tokens_hash());
            let head_id = self.alloc(head, self.stamp(id));
            self.node_mut(id).parent = head_id;
            self.node_mut(parent).children.insert(first, head_id);
            self.relabel(id, head_id, 0..usize::MAX);
            (head_id, id)
        }
    }

    /// Merges `child`, the only child of `parent`, with the same holders, into one run;
    /// returns the surviving id (whichever side was cheaper to relabel).
    fn merge(&mut self, parent: NodeId, child: NodeId) -> NodeId {
        let stamp = self.stamp(parent).max(self.stamp(child));
        for id in [parent, child] {
            if let Some(entry) = self.stamps.get_mut(id as usize) {
                *entry = stamp;
            }
        }
        let (p, c) = (self.node(parent), self.node(child));
        debug_assert!(parent != ROOT && p.children.only() == Some(child) && p.holders == c.holders);
        if c.len() + c.children.len() <= p.len() + 1 {
            let taken = std::mem::take(&mut self.node_mut(child).blocks);
            let children = std::mem::take(&mut self.node_mut(child).children);
            let node = self.node_mut(parent);
            let from = node.len();
            node.blocks.append(&taken);
            node.children = children;
            self.release(child);
            self.relabel(child, parent, from..usize::MAX);
            self.set_parent_of_children(parent);
            parent
        } else {
            let mut blocks = std::mem::take(&mut self.node_mut(parent).blocks);
            let from_parent = blocks.len();
            let (grandparent, depth) = (self.node(parent).parent, self.node(parent).depth);
            let first = blocks.token(0);
            let node = self.node_mut(child);
            blocks.append(&node.blocks);
            node.blocks = blocks;
            node.parent = grandparent;
            node.depth = depth;
            self.release(parent);
            self.node_mut(grandparent).children.insert(first, child);
            // Only the parent's former blocks (now first in the run) moved.
            self.relabel(parent, child, 0..from_parent);
            child
        }
    }

    /// Deletes `id` if it is an empty leaf (and so on up), then merges what is left with
    /// an equal parent or only child.
    fn normalize(&mut self, mut id: NodeId) {
        loop {
            while id != ROOT {
                let node = self.node(id);
                if !(node.holders.is_empty() && node.children.is_empty()) {
                    break;
                }
                let (parent, first, depth) = (node.parent, node.first_tokens_hash(), node.depth);
                let blocks = std::mem::take(&mut self.node_mut(id).blocks);
                for (offset, hash) in (0..).zip(blocks.hashes_of(..)) {
                    let at = Location {
                        node: id,
                        depth: depth + offset,
                    };
                    forget(&mut self.locations, at, hash);
                }
                self.node_mut(parent).children.remove(first);
                self.release(id);
                id = parent;
            }
            if id == ROOT {
                return;
            }
            // Several runs can change at once (a worker's removal), so merge for as long
            // as a neighbour matches.
            loop {
                let parent = self.node(id).parent;
                if parent != ROOT
                    && self.node(parent).children.only() == Some(id)
                    && self.node(parent).holders == self.node(id).holders
                {
                    id = self.merge(parent, id);
                    continue;
                }
                match self.node(id).children.only() {
                    Some(child) if self.node(child).holders == self.node(id).holders => {
                        id = self.merge(id, child);
                    }
                    _ => break,
                }
            }
            // Merging runs without holders can leave an empty leaf: go round again.
            let node = self.node(id);
            if !(node.holders.is_empty() && node.children.is_empty()) {
                return;
            }
        }
    }

    /// Adds `blocks` (new to the tree; about `expected` of them) held by `holder` after
    /// the block at `at` (or at the root). Stops at a block whose hash the tree already
    /// has elsewhere (only a hash collision can do that) and returns how many were added.
    pub(super) fn append(
        &mut self,
        at: Option<(NodeId, usize)>,
        holder: Holder,
        blocks: impl Iterator<Item = NodeBlock>,
        expected: usize,
    ) -> usize {
        let single: HolderSet = smallvec::smallvec![holder];
        let (target, extend) = match at {
            None => (ROOT, false),
            Some((id, offset)) => {
                let node = self.node(id);
                if offset + 1 < node.len() {
                    (self.split(id, offset + 1).0, false)
                } else {
                    let extend = node.children.is_empty() && node.holders == single;
                    (id, extend)
                }
            }
        };
        let id = if extend {
            target
        } else {
            let parent = self.node(target);
            let mut node = Node {
                blocks: RunBlocks::default(),
                holders: HolderSet::new(),
                mask: HolderMask::default(),
                children: Children::default(),
                parent: target,
                depth: parent.depth + parent.len() as u32,
            };
            node.set_holders(single);
            self.alloc(node, 0)
        };
        let mut added = 0;
        let first_depth = {
            let node = self.node(id);
            node.depth + node.len() as u32
        };
        self.nodes[id as usize].blocks.reserve_exact(expected);
        self.reserve_locations(expected);
        for (depth, block) in (first_depth..).zip(blocks) {
            let nodes = &self.nodes;
            // One probe: growing the table (inside `entry`) rehashes only blocks already
            // placed, and the new location is filled in before anything reads it.
            let entry = self.locations.entry(
                hash_of(block.block_hash),
                |l| hash_at(nodes, *l) == Some(block.block_hash),
                |l| hash_at(nodes, *l).map_or(0, hash_of),
            );
            match entry {
                hashbrown::hash_table::Entry::Occupied(_) => break,
                hashbrown::hash_table::Entry::Vacant(vacant) => {
                    vacant.insert(Location { node: id, depth });
                }
            }
            self.nodes[id as usize].blocks.push(block);
            added += 1;
        }
        if !extend {
            if added == 0 {
                self.release(id);
                return 0;
            }
            let first = self.node(id).first_tokens_hash();
            self.node_mut(target).children.insert(first, id);
        }
        self.pairs += added;
        self.count_held(holder.slot(), added, true);
        added
    }

    /// Makes room in the position table for `additional` more blocks, and sheds the
    /// tombstones removals leave before they pile up.
    ///
    /// Why not let hashbrown manage it: a removal inside a full stretch of the table
    /// leaves a tombstone, which takes room like an entry (`capacity()` is entries plus
    /// room left) and lengthens probes. Once the room is gone, hashbrown cleans up in
    /// place only if entries fill at most half the table, and doubles it otherwise. A
    /// cache at steady state (as many stores as evictions) sits just above half, so its
    /// table ended at four times its entries (Mooncake: 8,192 blocks in 32,768 buckets,
    /// 36 bytes per block). Here the table is rebuilt at the size the entries need
    /// (plus a quarter) whenever it runs out of room or tombstones pass an eighth of the
    /// entries: the size stays near twice the entries, probes stay short (letting
    /// tombstones fill the table before cleaning cost 13 % of event throughput), and a
    /// rebuild comes only after an eighth of the entries' count of removals, so its
    /// cost (one pass over the runs) is amortised O(1) per removal. The table does not
    /// shrink after a peak.
    fn reserve_locations(&mut self, additional: usize) {
        let entries = self.locations.len();
        let needed = entries + additional;
        let tombstones = self
            .locations_full_capacity
            .saturating_sub(self.locations.capacity());
        if needed <= self.locations.capacity() && tombstones <= entries / 8 {
            return;
        }
        // Clearing keeps the allocation (and the pages it has touched).
        let wanted = needed + needed / 4;
        self.locations.clear();
        if self.locations.capacity() < wanted {
            self.locations = HashTable::with_capacity(wanted);
        }
        self.locations_full_capacity = self.locations.capacity();
        let (nodes, table) = (&self.nodes, &mut self.locations);
        let rehash = |l: &Location| hash_at(nodes, *l).map_or(0, hash_of);
        // The table names exactly the blocks in the runs, so walk the slab (runs in
        // memory order) rather than the table (a random read per entry to rehash it).
        for (id, node) in nodes.iter().enumerate() {
            for (offset, hash) in (0..).zip(node.blocks.hashes()) {
                let location = Location {
                    node: id as NodeId,
                    depth: node.depth + offset,
                };
                // Room was made above, so `rehash` (for growing) is never called.
                table.insert_unique(hash_of(SequenceHash::new(*hash)), location, rehash);
            }
        }
        debug_assert_eq!(table.len(), entries);
        self.location_rebuilds += 1;
    }

    /// Takes `slot` out of every holder set and tidies the tree: O(nodes), for the rare
    /// `Cleared` and worker removal.
    pub(super) fn remove_slot(&mut self, slot: u32) {
        let mut touched: Vec<(u32, NodeId)> = Vec::new();
        for (id, node) in self.nodes.iter_mut().enumerate() {
            if node.parent == FREE {
                continue;
            }
            let before = node.holders.len();
            let mut holders = std::mem::take(&mut node.holders);
            holders.retain(|h| h.slot() != slot);
            let after = holders.len();
            node.set_holders(holders);
            if after != before {
                self.pairs -= node.len();
                touched.push((node.depth, id as NodeId));
            }
        }
        if let Some(held) = self.held.get_mut(slot as usize) {
            *held = 0;
        }
        // Deepest first, so that deletions cascade upwards through touched nodes.
        touched.sort_unstable_by(|a, b| b.cmp(a));
        for (_, id) in touched {
            if self.node(id).parent != FREE {
                self.normalize(id);
            }
        }
    }

    /// Heap bytes: the slab, spilled runs and holder sets, child lists and the map.
    pub(super) fn heap_bytes(&self) -> usize {
        let spilled: usize = self
            .nodes
            .iter()
            .map(|node| {
                let blocks = node.blocks.heap_bytes();
                let holders = if node.holders.spilled() {
                    node.holders.capacity() * std::mem::size_of::<Holder>()
                } else {
                    0
                };
                blocks + holders + node.children.heap_bytes()
            })
            .sum();
        self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.free.capacity() * std::mem::size_of::<NodeId>()
            + self.locations.allocation_size()
            + self.held.capacity() * std::mem::size_of::<usize>()
            + self.stamps.capacity() * std::mem::size_of::<u64>()
            + spilled
    }

    /// The live nodes, in slab order.
    pub(super) fn live(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|node| node.parent != FREE)
    }

    /// The live nodes with their ids, in slab order.
    pub(super) fn live_ids(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.parent != FREE)
            .map(|(id, node)| (id as NodeId, node))
    }

    /// Whether `slot` holds a child run of `id`.
    pub(super) fn has_child_held_by(&self, id: NodeId, slot: u32) -> bool {
        self.node(id)
            .children
            .ids()
            .iter()
            .any(|child| self.node(*child).holder(slot).is_some())
    }

    /// Live nodes (for statistics).
    pub(super) fn live_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// Panics if an invariant of the module doc does not hold (tests only).
    #[cfg(test)]
    pub(super) fn check_invariants(&self) {
        let mut pairs = 0;
        let mut blocks = 0;
        let mut held = vec![0; self.held.len()];
        if !self.stamps.is_empty() {
            assert!(self.stamps.len() >= self.nodes.len());
        }
        for (id, node) in self.nodes.iter().enumerate() {
            let id = id as NodeId;
            if node.parent == FREE {
                continue;
            }
            pairs += node.len() * node.holders.len();
            blocks += node.len();
            for holder in &node.holders {
                held[holder.slot() as usize] += node.len();
            }
            assert!(node.holders.windows(2).all(|w| w[0].slot() < w[1].slot()));
            assert!(node.holders.iter().all(|h| h.tiers() != 0));
            assert_eq!(node.mask, HolderMask::of(&node.holders));
            for (offset, block) in node.blocks.iter().enumerate() {
                assert_eq!(self.locate(block.block_hash), Some((id, offset)),);
            }
            for (first, child) in node.children.sorted() {
                let c = self.node(child);
                assert_eq!(c.parent, id);
                assert_eq!(c.first_tokens_hash(), first);
                assert_eq!(c.depth, node.depth + node.len() as u32);
            }
            if id != ROOT {
                assert!(node.len() > 0);
                assert!(!node.holders.is_empty() || !node.children.is_empty());
                assert_eq!(
                    self.node(node.parent).child(node.first_tokens_hash()),
                    Some(id)
                );
                let parent = self.node(node.parent);
                assert!(
                    node.parent == ROOT
                        || parent.children.only() != Some(id)
                        || parent.holders != node.holders,
                    "run {id} could merge with its parent"
                );
            }
        }
        assert_eq!(pairs, self.pairs);
        assert_eq!(held, self.held);
        assert_eq!(blocks, self.locations.len());
    }
}
