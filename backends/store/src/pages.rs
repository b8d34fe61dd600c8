//! The bytes of the values the store holds in memory, in pages it keeps and reuses.
//!
//! A store's DRAM turns over all the time: every put, promotion and demotion frees one
//! value and makes another of about the same size, and reads off the lower tiers make
//! more that live for one reply. Left to the allocator, those long-lived values and
//! short-lived buffers share its heaps (one per thread that allocates, and the lower
//! tiers' reads run on many), holes open between them that no heap gives back, and the
//! process's resident memory drifts far past DRAM's bound (1.8x under `kvtwin bench
//! store`). So a value of [`PAGE`] bytes or more is copied into pages of that size
//! from [`Pages`], and its tail (under a page) into an allocation of its own. A page
//! goes back to the pool when the last [`Bytes`] of it is dropped (the DRAM copy, a
//! reply still being written, a record being moved down), and the pool keeps at most
//! its bound of free pages: the memory values occupy is reused page for page instead
//! of being returned to, and fragmented in, the allocator.
//!
//! Owns: [`Pages`] (the pool and its counters), [`Value`] (a value as parts: pages and
//! a tail) and [`ValueWriter`] (a value filled as its bytes arrive). Never: decides
//! what the store keeps (`index`), or touches a tier.

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of one page: small enough that a value's last page is rarely much wasted (the
/// tail is not paged at all), large enough that a block of a few hundred KiB is a few
/// dozen parts in a reply's `writev`.
pub const PAGE: usize = 16 << 10;

/// Free pages kept besides the bound the store gives (a few values in flight).
pub const SPARE_PAGES: usize = 256;

/// A pool of pages.
#[derive(Clone)]
pub struct Pages {
    shared: Arc<Pool>,
}

struct Pool {
    free: Mutex<Vec<Box<[u8]>>>,
    /// Free pages kept at most; more are given back to the allocator.
    keep: usize,
    /// Pages made since the store started (the allocator asked).
    made: AtomicU64,
    /// Pages taken from the pool again.
    reused: AtomicU64,
    /// Free pages given back to the allocator past `keep`.
    released: AtomicU64,
}

/// The pool's state, for INFO and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageCounts {
    /// Pages made since start.
    pub made: u64,
    /// Pages reused from the pool since start.
    pub reused: u64,
    /// Free pages given back to the allocator since start.
    pub released: u64,
    /// Free pages held now.
    pub free: usize,
}

impl Pages {
    /// A pool keeping up to `bytes` (DRAM's bound) plus [`SPARE_PAGES`] of free pages.
    pub fn new(bytes: u64) -> Pages {
        let bound = usize::try_from(bytes / PAGE as u64).unwrap_or(usize::MAX);
        Pages {
            shared: Arc::new(Pool {
                free: Mutex::new(Vec::new()),
                keep: bound.saturating_add(SPARE_PAGES),
                made: AtomicU64::new(0),
                reused: AtomicU64::new(0),
                released: AtomicU64::new(0),
            }),
        }
    }

    /// What the pool did.
    pub fn counts(&self) -> PageCounts {
        let pool = &self.shared;
        PageCounts {
            made: pool.made.load(Ordering::Relaxed),
            reused: pool.reused.load(Ordering::Relaxed),
            released: pool.released.load(Ordering::Relaxed),
            free: pool.free.lock().map_or(0, |free| free.len()),
        }
    }

    /// `bytes` copied into pages and a tail.
    pub fn copy(&self, bytes: &[u8]) -> Value {
        let mut writer = self.writer(bytes.len());
        writer.extend(bytes);
        writer.finish()
    }

    /// A value of `len` bytes to fill.
    pub fn writer(&self, len: usize) -> ValueWriter {
        ValueWriter {
            pages: self.clone(),
            parts: Vec::with_capacity((len / PAGE + 1).min(4096)),
            page: None,
            filled: 0,
            tail: Vec::new(),
            remaining: len,
        }
    }

    fn take(&self) -> Box<[u8]> {
        let page = self.shared.free.lock().ok().and_then(|mut free| free.pop());
        match page {
            Some(page) => {
                self.shared.reused.fetch_add(1, Ordering::Relaxed);
                page
            }
            None => {
                self.shared.made.fetch_add(1, Ordering::Relaxed);
                vec![0u8; PAGE].into_boxed_slice()
            }
        }
    }
}

/// One full page lent to a [`Bytes`]; back to its pool when that is dropped.
struct Lent {
    page: Option<Box<[u8]>>,
    pool: Arc<Pool>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        self.page.as_deref().unwrap_or(&[])
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        let Some(page) = self.page.take() else {
            return;
        };
        if let Ok(mut free) = self.pool.free.lock() {
            if free.len() < self.pool.keep {
                free.push(page);
                return;
            }
        }
        self.pool.released.fetch_add(1, Ordering::Relaxed);
    }
}

/// A value as the store holds it: its parts in order (full pages, then a tail).
/// Cloning shares the parts.
#[derive(Clone, Debug, Default)]
pub struct Value {
    parts: Vec<Bytes>,
    len: usize,
}

impl Value {
    /// Its length, bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its parts, in order.
    pub fn parts(&self) -> &[Bytes] {
        &self.parts
    }

    /// Its BLAKE3.
    pub fn digest(&self) -> [u8; 32] {
        let mut hasher = blake3::Hasher::new();
        for part in &self.parts {
            hasher.update(part);
        }
        *hasher.finalize().as_bytes()
    }

    /// Its bytes in one piece (copied unless it is one part).
    pub fn to_bytes(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            parts => Bytes::from(parts.concat()),
        }
    }
}

/// Equal bytes, however they are cut into parts.
impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        fn bytes(value: &Value) -> impl Iterator<Item = &u8> {
            value.parts.iter().flat_map(|part| part.iter())
        }
        self.len == other.len && bytes(self).eq(bytes(other))
    }
}

impl Eq for Value {}

impl From<Bytes> for Value {
    /// A value of one part, as it is (not paged).
    fn from(bytes: Bytes) -> Value {
        let len = bytes.len();
        let parts = if len == 0 { Vec::new() } else { vec![bytes] };
        Value { parts, len }
    }
}

/// A [`Value`] of a known length filled as its bytes arrive (a record read in chunks).
pub struct ValueWriter {
    pages: Pages,
    parts: Vec<Bytes>,
    page: Option<Box<[u8]>>,
    filled: usize,
    tail: Vec<u8>,
    remaining: usize,
}

impl ValueWriter {
    /// Bytes still to come.
    pub fn remaining(&self) -> usize {
        self.remaining
    }

    /// Appends `bytes` (at most [`Self::remaining`]; more is ignored).
    pub fn extend(&mut self, mut bytes: &[u8]) {
        bytes = &bytes[..bytes.len().min(self.remaining)];
        while !bytes.is_empty() {
            // What is left after the full pages is the tail.
            let page_left = PAGE - self.filled;
            if self.page.is_none() && self.remaining < PAGE && self.filled == 0 {
                self.tail.reserve_exact(self.remaining);
                self.tail.extend_from_slice(bytes);
                self.remaining -= bytes.len();
                return;
            }
            let page = self.page.get_or_insert_with(|| self.pages.take());
            let n = page_left.min(bytes.len());
            page[self.filled..self.filled + n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            self.remaining -= n;
            bytes = &bytes[n..];
            if self.filled == PAGE {
                let page = self.page.take().expect("a page being filled");
                self.parts.push(Bytes::from_owner(Lent {
                    page: Some(page),
                    pool: self.pages.shared.clone(),
                }));
                self.filled = 0;
            }
        }
    }

    /// The value (callers check [`Self::remaining`] first: a value finished short
    /// holds the bytes that came).
    pub fn finish(mut self) -> Value {
        let len = self.parts.len() * PAGE + self.filled + self.tail.len();
        if let Some(page) = self.page.take() {
            // Only when finished short: the page's bytes so far, copied.
            self.parts
                .push(Bytes::copy_from_slice(&page[..self.filled]));
            drop(Lent {
                page: Some(page),
                pool: self.pages.shared.clone(),
            });
        }
        if !self.tail.is_empty() {
            self.parts.push(Bytes::from(std::mem::take(&mut self.tail)));
        }
        Value {
            parts: self.parts,
            len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pages_come_back_when_their_last_reader_drops_them() {
        let pages = Pages::new(4 * PAGE as u64);
        let bytes: Vec<u8> = (0..(2 * PAGE + 100)).map(|i| i as u8).collect();
        let value = pages.copy(&bytes);
        assert_eq!(value.parts().len(), 3);
        assert_eq!(value.parts()[2].len(), 100);
        assert_eq!(value.to_bytes(), bytes);
        let reply = value.clone();
        drop(value);
        // A reply still holds them: none free yet.
        assert_eq!(pages.counts().free, 0);
        drop(reply);
        assert_eq!(
            pages.counts(),
            PageCounts {
                made: 2,
                reused: 0,
                released: 0,
                free: 2
            }
        );
        // The next value takes them again.
        let again = pages.copy(&bytes);
        assert_eq!(pages.counts().reused, 2);
        assert_eq!(again.digest(), *blake3::hash(&bytes).as_bytes());
    }

    #[test]
    fn free_pages_past_the_bound_go_back_to_the_allocator() {
        let pages = Pages::new(0);
        let values: Vec<Value> = (0..SPARE_PAGES + 3)
            .map(|_| pages.copy(&[1u8; PAGE]))
            .collect();
        drop(values);
        let counts = pages.counts();
        assert_eq!((counts.free, counts.released), (SPARE_PAGES, 3));
    }

    proptest! {
        /// However a value's bytes arrive, it reads back the same.
        #[test]
        fn values_written_in_any_chunks_read_back_whole(
            len in 0usize..(3 * PAGE + 10),
            cuts in proptest::collection::vec(1usize..(PAGE + 7), 1..8),
        ) {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let pages = Pages::new(0);
            let mut writer = pages.writer(len);
            let (mut at, mut cut) = (0, cuts.iter().cycle());
            while at < len {
                let n = (*cut.next().unwrap()).min(len - at);
                writer.extend(&bytes[at..at + n]);
                at += n;
            }
            prop_assert_eq!(writer.remaining(), 0);
            let value = writer.finish();
            prop_assert_eq!(value.len(), len);
            prop_assert_eq!(value.to_bytes(), Bytes::from(bytes));
            prop_assert!(value.parts().iter().rev().skip(1).all(|p| p.len() == PAGE));
        }
    }
}
