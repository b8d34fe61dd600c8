//! A run's blocks, stored as two parallel arrays: every tokens hash, then every sequence
//! hash, in one allocation.
//!
//! Owns: [`RunBlocks`], the container a [`super::Node`] keeps its blocks in, and the edits
//! the tree makes to it (append, cut, split, move between neighbours).
//! Never: knows about holders, positions or the tree's shape; it keeps words in order.
//!
//! Why split: a query reads only the tokens hashes of the runs it walks, and a long
//! match reads many of them in a row. Interleaved with the sequence hashes (16 bytes a
//! block) half of every cache line a query pulls in was unused; here a query reads 8
//! bytes a block. The sequence hashes are read by the position table's probe (one block
//! at a time) and by removals and stores that already name a block, which lose nothing.
//! One allocation with both arrays (not two vectors) keeps the node at its size and one
//! allocation a run; a run of one block lives in the node itself, as before.

use crate::ids::{LocalBlockHash, SequenceHash};

/// One block of a run, by value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::router::indexer) struct NodeBlock {
    pub(in crate::router::indexer) tokens_hash: LocalBlockHash,
    pub(in crate::router::indexer) block_hash: SequenceHash,
}

/// The blocks of a run (see the module documentation).
#[derive(Clone, Debug, Default)]
pub(in crate::router::indexer) enum RunBlocks {
    #[default]
    Empty,
    /// One block, inside the node.
    One { tokens: u64, hash: u64 },
    /// `words[..cap]` are tokens hashes and `words[cap..]` sequence hashes, where `cap`
    /// is half of `words`; the first `len` of each are the run's.
    Spilled { words: Box<[u64]>, len: u32 },
}

// The node keeps its size (see `Node`): as small as the vector it replaces.
const _: () = assert!(std::mem::size_of::<RunBlocks>() <= 24);

impl RunBlocks {
    pub(in crate::router::indexer) fn len(&self) -> usize {
        match self {
            RunBlocks::Empty => 0,
            RunBlocks::One { .. } => 1,
            RunBlocks::Spilled { len, .. } => *len as usize,
        }
    }

    pub(in crate::router::indexer) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks it has room for without reallocating.
    pub(in crate::router::indexer) fn capacity(&self) -> usize {
        match self {
            RunBlocks::Empty | RunBlocks::One { .. } => 1,
            RunBlocks::Spilled { words, .. } => words.len() / 2,
        }
    }

    /// Heap bytes (0 while the run fits in the node).
    pub(in crate::router::indexer) fn heap_bytes(&self) -> usize {
        match self {
            RunBlocks::Spilled { words, .. } => std::mem::size_of_val::<[u64]>(words),
            _ => 0,
        }
    }

    /// The tokens hashes, as words: what a query compares, contiguous.
    #[inline]
    pub(in crate::router::indexer) fn tokens(&self) -> &[u64] {
        match self {
            RunBlocks::Empty => &[],
            RunBlocks::One { tokens, .. } => std::slice::from_ref(tokens),
            RunBlocks::Spilled { words, len } => &words[..*len as usize],
        }
    }

    /// The sequence hashes, as words.
    #[inline]
    pub(in crate::router::indexer) fn hashes(&self) -> &[u64] {
        match self {
            RunBlocks::Empty => &[],
            RunBlocks::One { hash, .. } => std::slice::from_ref(hash),
            RunBlocks::Spilled { words, len } => {
                let cap = words.len() / 2;
                &words[cap..cap + *len as usize]
            }
        }
    }

    /// Tokens hash of block `i` (panics past the end, as indexing does).
    #[inline]
    pub(in crate::router::indexer) fn token(&self, i: usize) -> LocalBlockHash {
        LocalBlockHash::new(self.tokens()[i])
    }

    /// Sequence hash of block `i` (panics past the end, as indexing does).
    #[inline]
    pub(in crate::router::indexer) fn hash(&self, i: usize) -> SequenceHash {
        SequenceHash::new(self.hashes()[i])
    }

    /// Sequence hash of block `i`, if there is one: what every probe of the position
    /// table reads, so straight to the word.
    #[inline]
    pub(in crate::router::indexer) fn get_hash(&self, i: usize) -> Option<SequenceHash> {
        let word = match self {
            RunBlocks::Spilled { words, len } if i < *len as usize => words[words.len() / 2 + i],
            RunBlocks::One { hash, .. } if i == 0 => *hash,
            _ => return None,
        };
        Some(SequenceHash::new(word))
    }

    /// The sequence hashes of blocks `range` (`..` for all).
    pub(in crate::router::indexer) fn hashes_of(
        &self,
        range: impl std::ops::RangeBounds<usize>,
    ) -> impl Iterator<Item = SequenceHash> + '_ {
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        self.hashes()[range].iter().map(|h| SequenceHash::new(*h))
    }

    /// Every block, in order.
    pub(in crate::router::indexer) fn iter(&self) -> impl Iterator<Item = NodeBlock> + '_ {
        self.tokens()
            .iter()
            .zip(self.hashes())
            .map(|(tokens, hash)| NodeBlock {
                tokens_hash: LocalBlockHash::new(*tokens),
                block_hash: SequenceHash::new(*hash),
            })
    }

    /// The run of blocks `front` then `back` (each `(tokens, hashes)`) with room for
    /// `cap`: one block or none lives inline, more in one allocation written once.
    fn from_parts(front: (&[u64], &[u64]), back: (&[u64], &[u64]), cap: usize) -> Self {
        let len = front.0.len() + back.0.len();
        debug_assert!(front.0.len() == front.1.len() && back.0.len() == back.1.len());
        debug_assert!(cap >= len);
        if cap <= 1 {
            let mut blocks = front.0.iter().zip(front.1).chain(back.0.iter().zip(back.1));
            return match blocks.next() {
                None => RunBlocks::Empty,
                Some((tokens, hash)) => RunBlocks::One {
                    tokens: *tokens,
                    hash: *hash,
                },
            };
        }
        let mut words = Vec::with_capacity(2 * cap);
        words.extend_from_slice(front.0);
        words.extend_from_slice(back.0);
        words.resize(cap, 0);
        words.extend_from_slice(front.1);
        words.extend_from_slice(back.1);
        words.resize(2 * cap, 0);
        RunBlocks::Spilled {
            words: words.into_boxed_slice(),
            len: len as u32,
        }
    }

    /// The run of blocks `range` of this one, with room for `cap`.
    fn copy_of(&self, range: std::ops::Range<usize>, cap: usize) -> Self {
        let part = (&self.tokens()[range.clone()], &self.hashes()[range]);
        RunBlocks::from_parts(part, (&[], &[]), cap)
    }

    /// Moves the blocks into an allocation for `cap` blocks (`cap >= len`). A spilled
    /// run grows in place where the allocator can (then only the sequence hashes move).
    fn reallocate(&mut self, cap: usize) {
        let len = self.len();
        match self {
            RunBlocks::Spilled { words, .. } if cap > words.len() / 2 => {
                let old_cap = words.len() / 2;
                let mut grown = std::mem::take(words).into_vec();
                grown.reserve_exact(2 * cap - grown.len());
                grown.resize(2 * cap, 0);
                grown.copy_within(old_cap..old_cap + len, cap);
                *words = grown.into_boxed_slice();
            }
            _ => *self = self.copy_of(0..len, cap),
        }
    }

    /// Room for `additional` more blocks, allocated exactly (the run's expected length).
    pub(in crate::router::indexer) fn reserve_exact(&mut self, additional: usize) {
        let needed = self.len() + additional;
        if needed > self.capacity() {
            self.reallocate(needed);
        }
    }

    /// Room for `additional` more, growing to a power of two as a vector would.
    fn reserve(&mut self, additional: usize) {
        let needed = self.len() + additional;
        if needed > self.capacity() {
            self.reallocate(needed.next_power_of_two());
        }
    }

    /// Writable views of both arrays (their full capacity) and the length; the caller
    /// must have made room.
    fn parts_mut(&mut self) -> (&mut [u64], &mut [u64], &mut u32) {
        match self {
            RunBlocks::Spilled { words, len } => {
                let cap = words.len() / 2;
                let (tokens, hashes) = words.split_at_mut(cap);
                (tokens, hashes, len)
            }
            _ => unreachable!("only a spilled run is written in place"),
        }
    }

    /// Adds a block at the end.
    #[inline]
    pub(in crate::router::indexer) fn push(&mut self, block: NodeBlock) {
        let (tokens, hash) = (block.tokens_hash.get(), block.block_hash.get());
        // Every stored block comes through here, mostly into a run with room.
        if let RunBlocks::Spilled { words, len } = self {
            let (cap, at) = (words.len() / 2, *len as usize);
            if at < cap {
                words[at] = tokens;
                words[cap + at] = hash;
                *len += 1;
                return;
            }
        }
        if let RunBlocks::Empty = self {
            *self = RunBlocks::One { tokens, hash };
            return;
        }
        self.reserve(1);
        let (t, h, len) = self.parts_mut();
        t[*len as usize] = tokens;
        h[*len as usize] = hash;
        *len += 1;
    }

    /// Appends `tokens` and `hashes` (blocks of another run).
    fn extend_from(&mut self, tokens: &[u64], hashes: &[u64]) {
        let n = tokens.len();
        if n == 0 {
            return;
        }
        if self.is_empty() {
            *self = RunBlocks::from_parts((tokens, hashes), (&[], &[]), n);
            return;
        }
        self.reserve(n);
        let (t, h, len) = self.parts_mut();
        let at = *len as usize;
        t[at..at + n].copy_from_slice(tokens);
        h[at..at + n].copy_from_slice(hashes);
        *len += n as u32;
    }

    /// Appends every block of `other`.
    pub(in crate::router::indexer) fn append(&mut self, other: &RunBlocks) {
        self.extend_from(other.tokens(), other.hashes());
    }

    /// Appends blocks `..at` of `other` and takes them out of it.
    pub(in crate::router::indexer) fn append_front_of(&mut self, other: &mut RunBlocks, at: usize) {
        self.extend_from(&other.tokens()[..at], &other.hashes()[..at]);
        other.remove_front(at);
    }

    /// Puts blocks `from..` of `other` in front of this run's and takes them out of
    /// `other`. Shifted in place when there is room: a run that grows as its parent
    /// shrinks keeps its allocation.
    pub(in crate::router::indexer) fn prepend_back_of(
        &mut self,
        other: &mut RunBlocks,
        from: usize,
    ) {
        let (front_tokens, front_hashes) = (&other.tokens()[from..], &other.hashes()[from..]);
        let n = front_tokens.len();
        let old = self.len();
        if n == 0 {
            return;
        }
        if old + n > self.capacity() || !matches!(self, RunBlocks::Spilled { .. }) {
            let cap = (old + n).next_power_of_two().max(self.capacity());
            let back = (self.tokens(), self.hashes());
            *self = RunBlocks::from_parts((front_tokens, front_hashes), back, cap);
        } else {
            // Room for old + n > 1 blocks: spilled.
            let (t, h, len) = self.parts_mut();
            t.copy_within(..old, n);
            h.copy_within(..old, n);
            t[..n].copy_from_slice(front_tokens);
            h[..n].copy_from_slice(front_hashes);
            *len += n as u32;
        }
        other.truncate(from);
    }

    /// Keeps the first `keep` blocks.
    pub(in crate::router::indexer) fn truncate(&mut self, keep: usize) {
        if keep >= self.len() {
            return;
        }
        match self {
            RunBlocks::Spilled { len, .. } => *len = keep as u32,
            _ => *self = RunBlocks::Empty,
        }
    }

    /// Takes blocks `..at` out, shifting the rest to the front in place.
    fn remove_front(&mut self, at: usize) {
        let old = self.len();
        if at == 0 {
            return;
        }
        if at >= old {
            self.truncate(0);
            return;
        }
        let (t, h, len) = self.parts_mut();
        t.copy_within(at..old, 0);
        h.copy_within(at..old, 0);
        *len = (old - at) as u32;
    }

    /// Blocks `at..` as a run of their own (allocated exactly), taken out of this one.
    pub(in crate::router::indexer) fn split_off(&mut self, at: usize) -> RunBlocks {
        let tail = self.copy_of(at..self.len(), self.len() - at);
        self.truncate(at);
        tail
    }

    /// Blocks `..at` as a run of their own (allocated exactly), taken out of this one.
    pub(in crate::router::indexer) fn split_front(&mut self, at: usize) -> RunBlocks {
        let head = self.copy_of(0..at, at);
        self.remove_front(at);
        head
    }

    /// Gives back spare room once more than three quarters of it is unused (after a
    /// split or a cut), so that memory follows the blocks held, not the longest run ever
    /// seen. Not sooner: LRU eviction cuts a leaf a few blocks at a time, and shrinking
    /// at half reallocated on most cuts.
    pub(in crate::router::indexer) fn trim(&mut self) {
        let len = self.len();
        if self.capacity() > 4 * len + 4 {
            self.reallocate(len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn block(i: u64) -> NodeBlock {
        NodeBlock {
            tokens_hash: LocalBlockHash::new(i),
            block_hash: SequenceHash::new(1_000 + i),
        }
    }

    /// An edit of a run, applied alike to a `RunBlocks` and to a `Vec` (the reference).
    #[derive(Clone, Debug)]
    enum Edit {
        Push(u64),
        Reserve(usize),
        Truncate(usize),
        SplitOff(usize),
        SplitFront(usize),
        /// Moves the front `n` of a second run (of `m` fresh blocks) to this one's end.
        AppendFrontOf(usize, usize),
        /// Moves the back of a second run (of `m` fresh blocks, from `n`) to the front.
        PrependBackOf(usize, usize),
        Trim,
    }

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            3 => (0u64..1_000).prop_map(Edit::Push),
            1 => (0usize..40).prop_map(Edit::Reserve),
            1 => (0usize..40).prop_map(Edit::Truncate),
            1 => (0usize..40).prop_map(Edit::SplitOff),
            1 => (0usize..40).prop_map(Edit::SplitFront),
            1 => (0usize..20, 0usize..20).prop_map(|(n, m)| Edit::AppendFrontOf(n, m)),
            1 => (0usize..20, 0usize..20).prop_map(|(n, m)| Edit::PrependBackOf(n, m)),
            1 => Just(Edit::Trim),
        ]
    }

    fn run_of(blocks: &[NodeBlock]) -> RunBlocks {
        let mut run = RunBlocks::default();
        for b in blocks {
            run.push(*b);
        }
        run
    }

    proptest! {
        /// Any sequence of edits leaves the blocks a vector of blocks would hold, in the
        /// same order, both arrays in step.
        #[test]
        fn edits_keep_the_blocks_a_vector_would(edits in proptest::collection::vec(edit(), 0..60)) {
            let (mut run, mut reference) = (RunBlocks::default(), Vec::<NodeBlock>::new());
            let mut fresh = 10_000u64;
            for edit in edits {
                let len = reference.len();
                match edit {
                    Edit::Push(i) => {
                        run.push(block(i));
                        reference.push(block(i));
                    }
                    Edit::Reserve(n) => {
                        run.reserve_exact(n);
                        prop_assert!(run.capacity() >= len + n);
                    }
                    Edit::Truncate(n) => {
                        run.truncate(n);
                        reference.truncate(n);
                    }
                    Edit::SplitOff(at) => {
                        let at = at.min(len);
                        let tail = run.split_off(at);
                        let expected = reference.split_off(at);
                        prop_assert_eq!(tail.iter().collect::<Vec<_>>(), expected);
                    }
                    Edit::SplitFront(at) => {
                        let at = at.min(len);
                        let head = run.split_front(at);
                        let expected: Vec<NodeBlock> = reference.drain(..at).collect();
                        prop_assert_eq!(head.iter().collect::<Vec<_>>(), expected);
                    }
                    Edit::AppendFrontOf(n, m) => {
                        let other: Vec<NodeBlock> = (fresh..fresh + m as u64).map(block).collect();
                        fresh += m as u64;
                        let mut other_run = run_of(&other);
                        let n = n.min(m);
                        run.append_front_of(&mut other_run, n);
                        reference.extend_from_slice(&other[..n]);
                        prop_assert_eq!(other_run.iter().collect::<Vec<_>>(), other[n..].to_vec());
                    }
                    Edit::PrependBackOf(n, m) => {
                        let other: Vec<NodeBlock> = (fresh..fresh + m as u64).map(block).collect();
                        fresh += m as u64;
                        let mut other_run = run_of(&other);
                        let from = n.min(m);
                        run.prepend_back_of(&mut other_run, from);
                        reference.splice(0..0, other[from..].iter().copied());
                        prop_assert_eq!(other_run.iter().collect::<Vec<_>>(), other[..from].to_vec());
                    }
                    Edit::Trim => {
                        run.trim();
                        prop_assert!(run.capacity() <= 4 * reference.len() + 4);
                    }
                }
                prop_assert_eq!(run.len(), reference.len());
                prop_assert!(run.capacity() >= run.len());
                prop_assert_eq!(run.iter().collect::<Vec<_>>(), reference.clone());
                let tokens: Vec<u64> = reference.iter().map(|b| b.tokens_hash.get()).collect();
                prop_assert_eq!(run.tokens(), &tokens[..]);
                for (i, b) in reference.iter().enumerate() {
                    prop_assert_eq!(run.hash(i), b.block_hash);
                    prop_assert_eq!(run.token(i), b.tokens_hash);
                }
                prop_assert_eq!(run.get_hash(reference.len()), None);
            }
        }
    }

    #[test]
    fn a_run_of_one_block_stays_in_the_node_and_a_longer_one_keeps_both_arrays_apart() {
        let mut run = RunBlocks::default();
        run.push(block(1));
        assert!(matches!(run, RunBlocks::One { .. }));
        assert_eq!(run.heap_bytes(), 0);
        run.push(block(2));
        run.push(block(3));
        // Four blocks of room: tokens hashes first, then sequence hashes.
        assert_eq!(run.heap_bytes(), 4 * 16);
        assert_eq!(run.tokens(), &[1, 2, 3]);
        assert_eq!(run.hashes(), &[1_001, 1_002, 1_003]);
        // Cut to one block in four of room: kept (LRU cuts a few blocks at a time).
        run.truncate(1);
        run.trim();
        assert_eq!(run.capacity(), 4);
        for i in 4..=20 {
            run.push(block(i));
        }
        assert_eq!(run.capacity(), 32);
        // Past three quarters unused: given back, exactly.
        run.truncate(2);
        run.trim();
        assert_eq!((run.capacity(), run.tokens()), (2, &[1u64, 4][..]));
        run.truncate(1);
        run.trim();
        assert_eq!(run.capacity(), 2);
    }
}
