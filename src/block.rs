//! The block state machine: Reset → Partial → Complete → Registered, and back to Reset.
//!
//! Owns: the four state names ([`BlockState`]), the per-state payloads carried by a
//! [`crate::pool::MutableBlock`] (`Reset`, `Partial`, `Complete`), the identity a
//! registered block is known by ([`BlockIdentity`]), and the errors of the transitions
//! that can fail on input ([`BlockError`]).
//!
//! Transitions (seed 000's table) and where each is enforced:
//!
//! | from → to | operation | enforced by |
//! |---|---|---|
//! | Reset → Partial | `init_sequence` | type: only `MutableBlock<Reset>` has it |
//! | Partial → Partial | `add_tokens`, `pop_tokens` | type; overfill / underflow are errors |
//! | Partial → Complete | `commit` | type; a block that is not full is [`BlockError::NotFull`] |
//! | Reset → Complete | `apply_token_block`, `apply_identity` | type; wrong size is an error |
//! | Complete → Registered | `register` | type: only `MutableBlock<Complete>` has it |
//! | Partial / Complete → Reset | `reset`, or dropping the handle | type |
//! | Registered → Reset | eviction of a cached block, or a cache reset | the pool |
//!
//! Never: touch pools, registries or events; the pool owns those.

use crate::ids::{LocalBlockHash, SequenceHash};
use crate::tokens::{chain_sequence_hash, compute_local_hash, HashSeed, Token, TokenBlock};
use serde::{Deserialize, Serialize};

/// The four states a block can be in, for reports and introspection.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum BlockState {
    /// Empty: free, or just allocated.
    Reset,
    /// Being filled with tokens.
    Partial,
    /// Full, hashed, not yet visible to others.
    Complete,
    /// Visible in its pool's registry; found by sequence hash.
    Registered,
}

/// What a registered block is known by: its hashes and its place in its sequence.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
pub struct BlockIdentity {
    /// The chained hash: the registry key.
    pub sequence_hash: SequenceHash,
    /// The hash of the block's tokens alone.
    pub local_hash: LocalBlockHash,
    /// The sequence hash of the block before it, if any.
    pub parent: Option<SequenceHash>,
    /// Index of the block in its sequence (0 for the first).
    pub position: u32,
}

impl BlockIdentity {
    /// The identity of a full token block.
    pub fn of_token_block(block: &TokenBlock) -> Self {
        Self {
            sequence_hash: block.sequence_hash(),
            local_hash: block.local_hash(),
            parent: block.parent(),
            position: u32::try_from(block.position()).unwrap_or(u32::MAX),
        }
    }

    /// The identity of the block after `parent` whose tokens hash to `local`, chained the
    /// way Dynamo chains it. `parent: None` starts a sequence.
    pub fn chained(parent: Option<&BlockIdentity>, local_hash: LocalBlockHash) -> Self {
        let parent_hash = parent.map(|p| p.sequence_hash);
        Self {
            sequence_hash: chain_sequence_hash(parent_hash, local_hash),
            local_hash,
            parent: parent_hash,
            position: parent.map_or(0, |p| p.position.saturating_add(1)),
        }
    }

    /// Identities of a whole chain of local hashes, parent first.
    pub fn chain(locals: &[LocalBlockHash]) -> Vec<BlockIdentity> {
        let mut out: Vec<BlockIdentity> = Vec::with_capacity(locals.len());
        for &local in locals {
            let next = BlockIdentity::chained(out.last(), local);
            out.push(next);
        }
        out
    }
}

/// A failed transition on a block's own data.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// `commit` of a block that is not full.
    #[error("cannot commit a block holding {tokens} of {block_size} tokens")]
    NotFull {
        /// Tokens held.
        tokens: usize,
        /// Tokens a full block holds.
        block_size: usize,
    },
    /// `pop_tokens` of more tokens than the block holds.
    #[error("cannot pop {requested} tokens from a block holding {tokens}")]
    PopUnderflow {
        /// Tokens asked for.
        requested: usize,
        /// Tokens held.
        tokens: usize,
    },
    /// A token block whose size differs from the pool's block size.
    #[error("token block of {got} tokens does not fit blocks of {block_size} tokens")]
    SizeMismatch {
        /// Tokens in the offered block.
        got: usize,
        /// The pool's block size.
        block_size: usize,
    },
}

/// Payload of a block in state Reset: nothing.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reset;

/// Payload of a block in state Partial: the tokens so far and what the hash needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partial {
    tokens: Vec<Token>,
    block_size: usize,
    seed: HashSeed,
    parent: Option<BlockIdentity>,
}

/// Payload of a block in state Complete: its identity, ready to register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Complete {
    identity: BlockIdentity,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Reset {}
    impl Sealed for super::Partial {}
    impl Sealed for super::Complete {}
}

/// The states a mutable (unregistered, exclusively owned) block can be in.
pub trait MutableState: sealed::Sealed + Send + 'static {
    /// The state's name.
    const STATE: BlockState;
}
impl MutableState for Reset {
    const STATE: BlockState = BlockState::Reset;
}
impl MutableState for Partial {
    const STATE: BlockState = BlockState::Partial;
}
impl MutableState for Complete {
    const STATE: BlockState = BlockState::Complete;
}

impl Partial {
    /// Reset → Partial: an empty block of `block_size` tokens following `parent`.
    pub(crate) fn start(block_size: usize, seed: HashSeed, parent: Option<BlockIdentity>) -> Self {
        Self {
            tokens: Vec::with_capacity(block_size),
            block_size,
            seed,
            parent,
        }
    }

    /// Partial → Partial: appends as many of `tokens` as fit; returns how many were taken.
    pub fn add_tokens(&mut self, tokens: &[Token]) -> usize {
        let taken = tokens.len().min(self.remaining());
        self.tokens.extend_from_slice(&tokens[..taken]);
        taken
    }

    /// Partial → Partial: removes the last `count` tokens.
    pub fn pop_tokens(&mut self, count: usize) -> Result<(), BlockError> {
        let held = self.tokens.len();
        if count > held {
            return Err(BlockError::PopUnderflow {
                requested: count,
                tokens: held,
            });
        }
        self.tokens.truncate(held - count);
        Ok(())
    }

    /// Tokens held.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Tokens that still fit.
    pub fn remaining(&self) -> usize {
        self.block_size - self.tokens.len()
    }

    /// Whether the block is full (and may be committed).
    pub fn is_full(&self) -> bool {
        self.remaining() == 0
    }

    /// Partial → Complete; requires a full block. On error the payload is handed back.
    pub(crate) fn commit(self) -> Result<Complete, (Self, BlockError)> {
        if !self.is_full() {
            let error = BlockError::NotFull {
                tokens: self.tokens.len(),
                block_size: self.block_size,
            };
            return Err((self, error));
        }
        let local = compute_local_hash(&self.tokens, self.seed);
        Ok(Complete {
            identity: BlockIdentity::chained(self.parent.as_ref(), local),
        })
    }
}

impl Complete {
    /// Reset → Complete from an identity computed elsewhere (onboarding, hash-only traces).
    pub(crate) fn from_identity(identity: BlockIdentity) -> Self {
        Self { identity }
    }

    /// The identity the block will be registered under.
    pub fn identity(&self) -> &BlockIdentity {
        &self.identity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokens::compute_local_hashes;

    #[test]
    fn commit_of_a_block_that_is_not_full_is_an_error_and_keeps_the_tokens() {
        let mut partial = Partial::start(4, HashSeed::default(), None);
        assert_eq!(partial.add_tokens(&[1, 2, 3]), 3);
        let (partial, error) = partial.commit().unwrap_err();
        assert_eq!(
            error,
            BlockError::NotFull {
                tokens: 3,
                block_size: 4
            }
        );
        assert_eq!(partial.tokens(), &[1, 2, 3]);
    }

    #[test]
    fn add_tokens_stops_at_the_block_size_and_pop_cannot_underflow() {
        let mut partial = Partial::start(4, HashSeed::default(), None);
        assert_eq!(partial.add_tokens(&[1, 2, 3, 4, 5, 6]), 4);
        assert!(partial.is_full());
        assert_eq!(
            partial.pop_tokens(5),
            Err(BlockError::PopUnderflow {
                requested: 5,
                tokens: 4
            })
        );
        partial.pop_tokens(2).unwrap();
        assert_eq!(partial.tokens(), &[1, 2]);
    }

    #[test]
    fn committed_chain_matches_the_design_test_vectors() {
        // DESIGN.md: tokens 1..=12, block size 4, chained hashes.
        let tokens: Vec<Token> = (1..=12).collect();
        let mut parent = None;
        let mut chained = Vec::new();
        for chunk in tokens.chunks(4) {
            let mut partial = Partial::start(4, HashSeed::default(), parent);
            partial.add_tokens(chunk);
            let complete = partial.commit().unwrap();
            chained.push(complete.identity().sequence_hash.get());
            parent = Some(*complete.identity());
        }
        assert_eq!(
            chained,
            vec![
                14643705804678351452,
                4945711292740353085,
                12583592247330656132
            ]
        );
        let locals = compute_local_hashes(&tokens, 4, HashSeed::default());
        let identities = BlockIdentity::chain(&locals);
        assert_eq!(identities[2].sequence_hash.get(), 12583592247330656132);
        assert_eq!(identities[2].position, 2);
        assert_eq!(identities[2].parent, Some(identities[1].sequence_hash));
    }
}
