//! Re-tagging a stretch of a run: giving blocks `lo..hi` of one run a new holder set (a
//! worker's tier bit came or went), and the tidying that keeps the tree compact.
//!
//! Owns: [`BlockTree::retag`] and its two shortcuts.
//! Never: decides which holders a stretch should have (the indexer does), or leaves
//! two runs that a merge would join.
//!
//! Why the shortcuts: a cache evicts a chain's blocks leaf first, one or a few at a time,
//! and onboards them root first. Each such change takes the end of a run to the holders
//! of its only child (or the start of a run to the holders of its parent), and the
//! general path splits a new run off, re-tags it and merges it into that neighbour: a
//! run made and freed, and the child lists edited, per eviction. The shortcuts move the
//! blocks to the neighbour directly and leave the same tree (the simulator's router
//! spent a fifth of a run in re-tags, mostly these).

use super::{forget, BlockTree, Children, HolderChange, Location, NodeId, ROOT};

impl BlockTree {
    /// Makes `change` to the holders of blocks `lo..hi` of `id`, splitting the run as
    /// needed and tidying up afterwards (empty leaves go, equal neighbours merge).
    pub(in crate::router::indexer) fn retag(
        &mut self,
        id: NodeId,
        lo: usize,
        hi: usize,
        change: HolderChange,
    ) {
        let node = self.node(id);
        let was = node.holder(change.slot).map_or(0, |h| h.tiers());
        if was == change.tiers {
            return;
        }
        let len = node.len();
        debug_assert!(lo < hi && hi <= len);
        // A leaf losing its last holder at the end just gets shorter.
        let empties = change.tiers == 0 && node.holders.len() == 1;
        if empties && hi == len && lo > 0 && node.children.is_empty() {
            self.count_change(change, was, hi - lo);
            let node = &mut self.nodes[id as usize];
            for (offset, hash) in (lo..).zip(node.blocks.hashes_of(lo..hi)) {
                let at = Location {
                    node: id,
                    depth: node.depth + offset as u32,
                };
                forget(&mut self.locations, at, hash);
            }
            node.blocks.truncate(lo);
            node.blocks.trim();
            return;
        }
        // The end of a run taking its only child's holders joins the child.
        if hi == len && lo > 0 {
            if let Some(child) = node.children.only() {
                if change.gives(&node.holders, &self.node(child).holders) {
                    self.move_tail_into_child(id, lo, child);
                    self.count_change(change, was, hi - lo);
                    return;
                }
            }
        }
        // The start of a run taking its parent's holders, when it is the parent's only
        // child, joins the parent.
        if lo == 0 && hi < len && node.parent != ROOT {
            let parent = node.parent;
            let p = self.node(parent);
            if p.children.only() == Some(id) && change.gives(&node.holders, &p.holders) {
                self.move_head_into_parent(id, hi, parent);
                self.count_change(change, was, hi);
                return;
            }
        }
        let mut middle = id;
        if hi < len {
            middle = self.split(middle, hi).0;
        }
        if lo > 0 {
            middle = self.split(middle, lo).1;
        }
        let len = self.node(middle).len();
        self.count_change(change, was, len);
        let node = self.node_mut(middle);
        let mut holders = std::mem::take(&mut node.holders);
        change.apply(&mut holders);
        node.set_holders(holders);
        self.normalize(middle);
    }

    /// Moves blocks `lo..` of `id` to the front of `child`, its only child, whose holders
    /// they take: what splitting them off and merging them into the child would leave.
    fn move_tail_into_child(&mut self, id: NodeId, lo: usize, child: NodeId) {
        self.keep_later_stamp(child, id);
        let [node, child_node] = self
            .nodes
            .get_disjoint_mut([id as usize, child as usize])
            .expect("a run and its child are two runs");
        let count = node.len() - lo;
        node.children = Children::One(node.blocks.token(lo), child);
        // Shifted in place: the child keeps its allocation (it grows as its parent shrinks).
        child_node.blocks.prepend_back_of(&mut node.blocks, lo);
        node.blocks.trim();
        child_node.depth -= count as u32;
        self.relabel(id, child, 0..count);
    }

    /// Moves blocks `..hi` of `id` to the end of `parent`, of which `id` is the only
    /// child and whose holders they take: what splitting them off and merging them into
    /// the parent would leave.
    fn move_head_into_parent(&mut self, id: NodeId, hi: usize, parent: NodeId) {
        self.keep_later_stamp(parent, id);
        let [node, parent_node] = self
            .nodes
            .get_disjoint_mut([id as usize, parent as usize])
            .expect("a run and its parent are two runs");
        let from = parent_node.len();
        parent_node.blocks.append_front_of(&mut node.blocks, hi);
        node.blocks.trim();
        node.depth += hi as u32;
        parent_node.children = Children::One(node.blocks.token(0), id);
        self.relabel(id, parent, from..usize::MAX);
    }

    /// Gives `into`, which takes blocks of `from`, the later of their two stamps, as a
    /// merge of the two would (with recency on).
    fn keep_later_stamp(&mut self, into: NodeId, from: NodeId) {
        let stamp = self.stamp(into).max(self.stamp(from));
        if let Some(entry) = self.stamps.get_mut(into as usize) {
            *entry = stamp;
        }
    }

    /// Counts `len` blocks whose slot `change.slot` held them in tiers `was` and now in
    /// `change.tiers`: the pairs, and the blocks the slot holds, change only when it
    /// joins or leaves.
    fn count_change(&mut self, change: HolderChange, was: u8, len: usize) {
        match (was != 0, change.tiers != 0) {
            (false, true) => {
                self.pairs += len;
                self.count_held(change.slot, len, true);
            }
            (true, false) => {
                self.pairs -= len;
                self.count_held(change.slot, len, false);
            }
            _ => {}
        }
    }
}
