//! The router's block size: given by a flag, or learned from the first `BlockStored` an
//! engine announces, then enforced on every batch.
//!
//! Owns: [`RouterBlockSize`] (one shared cell: the router state hashes queries with it,
//! each source's decoder checks and, the first time, learns it) and
//! [`BlockSizeMismatch`].
//! Why shared and learned outside the state's lock: a source decodes a batch before it
//! takes the lock (so the network never holds it), and the check belongs with decoding;
//! a compare-and-swap makes the first size seen win when two engines' first batches
//! race, and every later one is checked against it.
//! Never: change once known (a router mixing block sizes would index blocks whose token
//! hashes no query of its own size can ever produce), or learn from a batch that stores
//! no block.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// An engine's batch announced blocks of another size than the router's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizeMismatch {
    /// Tokens per block in the engine's events.
    pub events: u32,
    /// Tokens per block of the router.
    pub router: u32,
}

/// Whether the block size came from a flag or is learned from the events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockSizeOrigin {
    /// Given (`--block-size`): enforced from the start.
    Fixed,
    /// Taken from the first `BlockStored` seen, then enforced.
    Learned,
}

/// The router's block size, shared by the state and its sources' decoders (clones share
/// the cell); see the module documentation.
#[derive(Clone, Debug)]
pub struct RouterBlockSize {
    /// Tokens per block; 0 until learned.
    size: Arc<AtomicU32>,
    origin: BlockSizeOrigin,
}

impl RouterBlockSize {
    /// A block size given by configuration; 0 is treated as "learn it" (no block has
    /// zero tokens).
    pub fn fixed(size: u32) -> Self {
        Self {
            size: Arc::new(AtomicU32::new(size)),
            origin: if size == 0 {
                BlockSizeOrigin::Learned
            } else {
                BlockSizeOrigin::Fixed
            },
        }
    }

    /// A block size to be learned from the first `BlockStored` seen.
    pub fn learned() -> Self {
        Self::fixed(0)
    }

    /// Tokens per block, once known.
    pub fn get(&self) -> Option<u32> {
        match self.size.load(Ordering::Acquire) {
            0 => None,
            size => Some(size),
        }
    }

    /// Where the size comes from.
    pub fn origin(&self) -> BlockSizeOrigin {
        self.origin
    }

    /// Checks the block size `events` a batch announces: learned when none is known yet
    /// (the first caller wins a race), refused when it differs from the known one. A
    /// size of 0 is never learned (it is refused once one is known, and passes before:
    /// such a batch stores no full block a query could match).
    pub fn admit(&self, events: u32) -> Result<(), BlockSizeMismatch> {
        if events == 0 {
            return match self.get() {
                Some(router) => Err(BlockSizeMismatch { events, router }),
                None => Ok(()),
            };
        }
        match self
            .size
            .compare_exchange(0, events, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => {
                tracing::info!(block_size = events, "block size learned from the events");
                Ok(())
            }
            Err(router) if router == events => Ok(()),
            Err(router) => Err(BlockSizeMismatch { events, router }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_size_refuses_others_and_a_learned_one_takes_the_first() {
        let fixed = RouterBlockSize::fixed(16);
        assert_eq!(fixed.origin(), BlockSizeOrigin::Fixed);
        assert_eq!(fixed.admit(16), Ok(()));
        assert_eq!(
            fixed.admit(32),
            Err(BlockSizeMismatch {
                events: 32,
                router: 16
            })
        );

        let learned = RouterBlockSize::learned();
        let shared = learned.clone();
        assert_eq!(learned.origin(), BlockSizeOrigin::Learned);
        assert_eq!(learned.get(), None);
        assert_eq!(learned.admit(0), Ok(()));
        assert_eq!(learned.get(), None);
        assert_eq!(shared.admit(32), Ok(()));
        assert_eq!(learned.get(), Some(32));
        assert_eq!(
            learned.admit(16),
            Err(BlockSizeMismatch {
                events: 16,
                router: 32
            })
        );
        assert!(learned.admit(0).is_err());
        assert_eq!(RouterBlockSize::fixed(0).origin(), BlockSizeOrigin::Learned);
    }
}
