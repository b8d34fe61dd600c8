//! Index-linked lists threaded through per-block `prev` / `next` arrays.
//!
//! Owns: O(1) push at either end, O(1) removal from the middle, O(1) pop and O(1) steps
//! to a node's neighbours, for a fixed set of node ids `0..capacity`, in any of `lists`
//! disjoint lists. Each list has a sentinel node (ids `capacity..capacity + lists`), so
//! no operation branches on an empty list (vLLM's `FreeKVCacheBlockQueue`, as arrays of
//! `u32` instead of objects).
//! Invariant: a node is in at most one list; `prev[n] == NIL` exactly when it is in none.
//! Never: allocate after construction.

const NIL: u32 = u32::MAX;

/// Disjoint index-linked lists over node ids `0..capacity`; see the module documentation.
#[derive(Debug, Clone)]
pub struct IndexLists {
    prev: Vec<u32>,
    next: Vec<u32>,
    list_of: Vec<u8>,
    lens: Vec<usize>,
    capacity: u32,
}

impl IndexLists {
    /// `lists` empty lists over node ids `0..capacity`.
    pub fn new(capacity: usize, lists: usize) -> Self {
        let capacity = u32::try_from(capacity).expect("pool capacity fits in u32");
        let total = capacity as usize + lists;
        let mut prev = vec![NIL; total];
        let mut next = vec![NIL; total];
        for list in 0..lists {
            let sentinel = capacity as usize + list;
            prev[sentinel] = sentinel as u32;
            next[sentinel] = sentinel as u32;
        }
        Self {
            prev,
            next,
            list_of: vec![u8::MAX; capacity as usize],
            lens: vec![0; lists],
            capacity,
        }
    }

    #[inline]
    fn sentinel(&self, list: usize) -> u32 {
        self.capacity + list as u32
    }

    /// Whether `node` is in a list.
    #[inline]
    pub fn contains(&self, node: u32) -> bool {
        self.prev[node as usize] != NIL
    }

    /// How many lists there are.
    #[inline]
    pub fn list_count(&self) -> usize {
        self.lens.len()
    }

    /// Nodes in `list`.
    #[inline]
    pub fn len(&self, list: usize) -> usize {
        self.lens[list]
    }

    #[inline]
    fn link_after(&mut self, at: u32, node: u32) {
        let after = self.next[at as usize];
        self.prev[node as usize] = at;
        self.next[node as usize] = after;
        self.next[at as usize] = node;
        self.prev[after as usize] = node;
    }

    /// Appends `node` at the back (hot end) of `list`.
    #[inline]
    pub fn push_back(&mut self, list: usize, node: u32) {
        debug_assert!(!self.contains(node), "node {node} linked twice");
        let last = self.prev[self.sentinel(list) as usize];
        self.link_after(last, node);
        self.list_of[node as usize] = list as u8;
        self.lens[list] += 1;
    }

    /// Prepends `node` at the front (cold end) of `list`.
    #[inline]
    pub fn push_front(&mut self, list: usize, node: u32) {
        debug_assert!(!self.contains(node), "node {node} linked twice");
        self.link_after(self.sentinel(list), node);
        self.list_of[node as usize] = list as u8;
        self.lens[list] += 1;
    }

    /// Unlinks `node` from whatever list holds it; false if none does.
    #[inline]
    pub fn remove(&mut self, node: u32) -> bool {
        let n = node as usize;
        let (before, after) = (self.prev[n], self.next[n]);
        if before == NIL {
            return false;
        }
        self.next[before as usize] = after;
        self.prev[after as usize] = before;
        self.prev[n] = NIL;
        self.next[n] = NIL;
        self.lens[self.list_of[n] as usize] -= 1;
        self.list_of[n] = u8::MAX;
        true
    }

    /// Removes and returns the front (cold end) of `list`.
    #[inline]
    pub fn pop_front(&mut self, list: usize) -> Option<u32> {
        let first = self.next[self.sentinel(list) as usize];
        if first == self.sentinel(list) {
            return None;
        }
        self.remove(first);
        Some(first)
    }

    /// The list holding `node`, if any.
    #[inline]
    pub fn list_of(&self, node: u32) -> Option<usize> {
        self.contains(node)
            .then(|| self.list_of[node as usize] as usize)
    }

    /// The node after `node` (toward the back) in the list holding it; `None` at the
    /// back, or when `node` is in no list.
    #[inline]
    pub fn next_of(&self, node: u32) -> Option<u32> {
        let next = self.next[node as usize];
        (next < self.capacity).then_some(next)
    }

    /// The node before `node` (toward the front) in the list holding it; `None` at the
    /// front, or when `node` is in no list.
    #[inline]
    pub fn prev_of(&self, node: u32) -> Option<u32> {
        let prev = self.prev[node as usize];
        (prev < self.capacity).then_some(prev)
    }

    /// The front (cold end) of `list`, if it has one.
    #[inline]
    pub fn front(&self, list: usize) -> Option<u32> {
        let first = self.next[self.sentinel(list) as usize];
        (first < self.capacity).then_some(first)
    }

    /// The back (hot end) of `list`, if it has one.
    #[inline]
    pub fn back(&self, list: usize) -> Option<u32> {
        let last = self.prev[self.sentinel(list) as usize];
        (last < self.capacity).then_some(last)
    }

    /// The nodes of `list`, front to back.
    pub fn iter(&self, list: usize) -> impl Iterator<Item = u32> + '_ {
        let sentinel = self.sentinel(list);
        let mut at = self.next[sentinel as usize];
        std::iter::from_fn(move || {
            if at == sentinel {
                return None;
            }
            let node = at;
            at = self.next[at as usize];
            Some(node)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_keep_order_and_remove_from_the_middle() {
        let mut lists = IndexLists::new(6, 2);
        for node in [0, 1, 2] {
            lists.push_back(0, node);
        }
        lists.push_front(0, 3);
        lists.push_back(1, 4);
        assert_eq!(lists.iter(0).collect::<Vec<_>>(), vec![3, 0, 1, 2]);
        assert!(lists.remove(0));
        assert!(!lists.remove(0));
        assert_eq!(lists.iter(0).collect::<Vec<_>>(), vec![3, 1, 2]);
        assert_eq!((lists.len(0), lists.len(1)), (3, 1));
        assert_eq!(lists.pop_front(0), Some(3));
        assert_eq!(lists.pop_front(1), Some(4));
        assert_eq!(lists.pop_front(1), None);
        assert!(!lists.contains(4) && lists.contains(1));
        // 1 and 2 are left in list 0: neighbours stop at the ends, never at a sentinel.
        assert_eq!((lists.front(0), lists.back(0)), (Some(1), Some(2)));
        assert_eq!((lists.next_of(1), lists.next_of(2)), (Some(2), None));
        assert_eq!((lists.prev_of(2), lists.prev_of(1)), (Some(1), None));
        assert_eq!((lists.front(1), lists.back(1)), (None, None));
        assert_eq!((lists.list_of(1), lists.list_of(4)), (Some(0), None));
        assert_eq!((lists.next_of(4), lists.prev_of(4)), (None, None));
    }
}
