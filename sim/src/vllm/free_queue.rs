//! vLLM's free-block queue (`FreeKVCacheBlockQueue` in `vllm/v1/core/kv_cache_utils.py`):
//! a doubly linked list over block ids, in eviction order, front first.
//!
//! Owns: the links and the count. It starts in block-id order; `pop_front` is what
//! `popleft`/`popleft_n` take for a new allocation (the front block is the next one
//! evicted), `remove` takes a cache hit back out of the middle, `push_back_all` and
//! `push_front_all` are `append_n` and `prepend_n` (both keep the order of what they
//! are given). Never: decide which blocks go where (`pool`), or know about hashes.

/// "No link": a block outside the queue has this as both neighbours.
const NONE: u32 = u32::MAX;

/// The queue; ids are `0..len` of the pool it was built for.
#[derive(Clone, Debug)]
pub(crate) struct FreeQueue {
    /// `prev[i]`/`next[i]` for block `i`; the two sentinels are at `blocks` (head) and
    /// `blocks + 1` (tail), as vLLM's fake head and tail, so no link is ever missing
    /// for a block inside the queue.
    prev: Vec<u32>,
    next: Vec<u32>,
    len: usize,
}

impl FreeQueue {
    /// Every block of a pool of `blocks`, in id order.
    pub(crate) fn new(blocks: u32) -> Self {
        let n = blocks as usize;
        let (head, tail) = (blocks, blocks + 1);
        let mut prev = vec![NONE; n + 2];
        let mut next = vec![NONE; n + 2];
        let mut last = head;
        for id in 0..blocks {
            next[last as usize] = id;
            prev[id as usize] = last;
            last = id;
        }
        next[last as usize] = tail;
        prev[tail as usize] = last;
        Self { prev, next, len: n }
    }

    fn head(&self) -> u32 {
        (self.prev.len() - 2) as u32
    }

    fn tail(&self) -> u32 {
        (self.prev.len() - 1) as u32
    }

    /// Blocks in the queue.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether `id` is in the queue.
    pub(crate) fn contains(&self, id: u32) -> bool {
        self.prev[id as usize] != NONE
    }

    /// Takes the front block (the next one evicted), if any.
    pub(crate) fn pop_front(&mut self) -> Option<u32> {
        let first = self.next[self.head() as usize];
        if first == self.tail() {
            return None;
        }
        self.remove(first);
        Some(first)
    }

    /// Takes `id` out of the queue, wherever it is. `id` must be in it.
    pub(crate) fn remove(&mut self, id: u32) {
        debug_assert!(self.contains(id), "block {id} is not in the free queue");
        let (prev, next) = (self.prev[id as usize], self.next[id as usize]);
        self.next[prev as usize] = next;
        self.prev[next as usize] = prev;
        self.prev[id as usize] = NONE;
        self.next[id as usize] = NONE;
        self.len -= 1;
    }

    /// Appends `ids` at the back, in order (the last one is evicted last).
    pub(crate) fn push_back_all(&mut self, ids: &[u32]) {
        for &id in ids {
            let last = self.prev[self.tail() as usize];
            self.link_between(id, last, self.tail());
        }
    }

    /// Puts `ids` at the front, in order (the first one is evicted first).
    pub(crate) fn push_front_all(&mut self, ids: &[u32]) {
        let mut before = self.head();
        for &id in ids {
            let after = self.next[before as usize];
            self.link_between(id, before, after);
            before = id;
        }
    }

    fn link_between(&mut self, id: u32, prev: u32, next: u32) {
        debug_assert!(
            !self.contains(id),
            "block {id} is already in the free queue"
        );
        self.prev[id as usize] = prev;
        self.next[id as usize] = next;
        self.next[prev as usize] = id;
        self.prev[next as usize] = id;
        self.len += 1;
    }

    /// The queue front to back (the eviction order).
    pub(crate) fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        let tail = self.tail();
        let mut at = self.next[self.head() as usize];
        std::iter::from_fn(move || {
            if at == tail {
                return None;
            }
            let id = at;
            at = self.next[id as usize];
            Some(id)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::FreeQueue;

    fn order(queue: &FreeQueue) -> Vec<u32> {
        queue.iter().collect()
    }

    #[test]
    fn it_starts_in_id_order_and_pops_from_the_front() {
        let mut queue = FreeQueue::new(4);
        assert_eq!(order(&queue), [0, 1, 2, 3]);
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), Some(1));
        assert_eq!(queue.len(), 2);
        assert!(!queue.contains(0));
        assert!(queue.contains(2));
    }

    #[test]
    fn append_and_prepend_keep_the_order_given_and_remove_unlinks_anywhere() {
        let mut queue = FreeQueue::new(6);
        let taken: Vec<u32> = (0..6).map(|_| queue.pop_front().unwrap()).collect();
        assert_eq!(queue.pop_front(), None);
        assert_eq!(taken, [0, 1, 2, 3, 4, 5]);
        queue.push_back_all(&[3, 1]);
        queue.push_front_all(&[5, 0]);
        assert_eq!(order(&queue), [5, 0, 3, 1]);
        queue.remove(3);
        assert_eq!(order(&queue), [5, 0, 1]);
        queue.remove(5);
        queue.remove(1);
        assert_eq!(order(&queue), [0]);
        queue.push_back_all(&[4]);
        queue.push_front_all(&[2]);
        assert_eq!(order(&queue), [2, 0, 4]);
        assert_eq!(queue.len(), 3);
    }
}
