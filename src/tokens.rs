//! Token blocks and their two hashes, computed exactly as NVIDIA Dynamo computes them, so
//! that kvtwin's router and Dynamo's index the same blocks under the same keys.
//!
//! Owns: [`Token`], [`HashSeed`] (default 1337, LoRA and salt variants),
//! [`compute_local_hash`] (xxh3-64 over the tokens as u32 little-endian),
//! [`chain_sequence_hash`] (xxh3-64 of `le(parent) ++ le(local)`, always seed 1337),
//! [`TokenBlock`] (a full block) and [`TokenBlockSequence`] (a token stream cut into full
//! blocks plus a partial tail).
//! Invariant: only full blocks are hashed; building a sequence at once or token by token
//! gives the same blocks.
//! Never: I/O, allocation per token beyond the tail buffer, or a per-process random salt.

use crate::ids::{LocalBlockHash, SequenceHash};
use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// A token id.
pub type Token = u32;

/// The seed Dynamo hashes blocks with.
pub const DEFAULT_HASH_SEED: u64 = 1337;

/// The seed of local (tokens-only) block hashes. Requests with different seeds never
/// share blocks: that is how LoRA adapters and tenant salts are kept apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HashSeed(u64);

impl Default for HashSeed {
    fn default() -> Self {
        Self(DEFAULT_HASH_SEED)
    }
}

impl HashSeed {
    /// A seed given explicitly (from config).
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The seed of blocks computed with LoRA adapter `name`:
    /// `1337 wrapping_add xxh3_64(name, seed 0)`, as Dynamo does.
    pub fn for_lora(name: &str) -> Self {
        Self(DEFAULT_HASH_SEED.wrapping_add(xxh3_64_with_seed(name.as_bytes(), 0)))
    }

    /// This seed mixed with a cache salt (a tenant id, say), the same way LoRA names are
    /// mixed in, so salts and adapters compose.
    pub fn with_salt(self, salt: &[u8]) -> Self {
        Self(self.0.wrapping_add(xxh3_64_with_seed(salt, 0)))
    }

    /// The raw seed.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// The hash of one block's tokens alone.
pub fn compute_local_hash(tokens: &[Token], seed: HashSeed) -> LocalBlockHash {
    // Hash the little-endian bytes in stack-sized chunks: no allocation, no `unsafe`.
    let mut hasher = Xxh3::with_seed(seed.get());
    let mut buf = [0u8; 256];
    for chunk in tokens.chunks(buf.len() / 4) {
        for (token, bytes) in chunk.iter().zip(buf.chunks_exact_mut(4)) {
            bytes.copy_from_slice(&token.to_le_bytes());
        }
        hasher.update(&buf[..chunk.len() * 4]);
    }
    LocalBlockHash::new(hasher.digest())
}

/// The sequence hash of the block after `parent` whose tokens hash to `local`.
pub fn chain_sequence_hash(parent: Option<SequenceHash>, local: LocalBlockHash) -> SequenceHash {
    match parent {
        None => SequenceHash::new(local.get()),
        Some(parent) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.get().to_le_bytes());
            bytes[8..].copy_from_slice(&local.get().to_le_bytes());
            SequenceHash::new(xxh3_64_with_seed(&bytes, DEFAULT_HASH_SEED))
        }
    }
}

/// Local hashes of the full blocks of `tokens` (a trailing partial block is ignored).
/// A `block_size` of zero gives no blocks.
pub fn compute_local_hashes(
    tokens: &[Token],
    block_size: usize,
    seed: HashSeed,
) -> Vec<LocalBlockHash> {
    if block_size == 0 {
        return Vec::new();
    }
    tokens
        .chunks_exact(block_size)
        .map(|block| compute_local_hash(block, seed))
        .collect()
}

/// Sequence hashes of a chain of local hashes, first block first.
pub fn compute_sequence_hashes(locals: &[LocalBlockHash]) -> Vec<SequenceHash> {
    let mut out: Vec<SequenceHash> = Vec::with_capacity(locals.len());
    for &local in locals {
        let next = chain_sequence_hash(out.last().copied(), local);
        out.push(next);
    }
    out
}

/// A full block of tokens with its hashes and place in its sequence.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TokenBlock {
    tokens: Box<[Token]>,
    local_hash: LocalBlockHash,
    sequence_hash: SequenceHash,
    parent: Option<SequenceHash>,
    position: usize,
}

impl TokenBlock {
    fn new(
        tokens: &[Token],
        seed: HashSeed,
        parent: Option<SequenceHash>,
        position: usize,
    ) -> Self {
        let local_hash = compute_local_hash(tokens, seed);
        Self {
            tokens: tokens.into(),
            local_hash,
            sequence_hash: chain_sequence_hash(parent, local_hash),
            parent,
            position,
        }
    }

    /// The block's tokens.
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Hash of the tokens alone.
    pub fn local_hash(&self) -> LocalBlockHash {
        self.local_hash
    }

    /// Hash chained with every block before it.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.sequence_hash
    }

    /// Sequence hash of the block before it, if any.
    pub fn parent(&self) -> Option<SequenceHash> {
        self.parent
    }

    /// Index of the block in its sequence (0 for the first).
    pub fn position(&self) -> usize {
        self.position
    }
}

/// Why a token sequence could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// Blocks of zero tokens.
    #[error("block size must be at least one token")]
    ZeroBlockSize,
}

/// A token stream cut into full blocks and a partial tail.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TokenBlockSequence {
    blocks: Vec<TokenBlock>,
    partial: Vec<Token>,
    block_size: usize,
    seed: HashSeed,
}

impl TokenBlockSequence {
    /// Cuts `tokens` into blocks of `block_size`, hashed with `seed`.
    pub fn new(tokens: &[Token], block_size: usize, seed: HashSeed) -> Result<Self, TokensError> {
        if block_size == 0 {
            return Err(TokensError::ZeroBlockSize);
        }
        let mut sequence = Self {
            blocks: Vec::new(),
            partial: Vec::with_capacity(block_size),
            block_size,
            seed,
        };
        sequence.extend(tokens);
        Ok(sequence)
    }

    /// Appends one token; returns the block it completed, if any.
    pub fn push_token(&mut self, token: Token) -> Option<&TokenBlock> {
        self.partial.push(token);
        if self.partial.len() < self.block_size {
            return None;
        }
        self.seal_partial();
        self.blocks.last()
    }

    /// Appends tokens; returns how many blocks they completed.
    pub fn extend(&mut self, tokens: &[Token]) -> usize {
        let before = self.blocks.len();
        let mut rest = tokens;
        while !rest.is_empty() {
            let take = (self.block_size - self.partial.len()).min(rest.len());
            self.partial.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.partial.len() == self.block_size {
                self.seal_partial();
            }
        }
        self.blocks.len() - before
    }

    fn seal_partial(&mut self) {
        let parent = self.blocks.last().map(TokenBlock::sequence_hash);
        let block = TokenBlock::new(&self.partial, self.seed, parent, self.blocks.len());
        self.blocks.push(block);
        self.partial.clear();
    }

    /// Keeps the first `len` tokens (no-op if there are fewer); blocks past the cut are
    /// dropped and the cut block becomes the partial tail.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.total_tokens() {
            return;
        }
        let full = len / self.block_size;
        let tail = len % self.block_size;
        if full < self.blocks.len() {
            let cut = &self.blocks[full];
            let kept: Vec<Token> = cut.tokens()[..tail].to_vec();
            self.blocks.truncate(full);
            self.partial = kept;
        } else {
            self.partial.truncate(tail);
        }
    }

    /// The full blocks.
    pub fn blocks(&self) -> &[TokenBlock] {
        &self.blocks
    }

    /// Tokens after the last full block.
    pub fn partial_tokens(&self) -> &[Token] {
        &self.partial
    }

    /// All tokens held.
    pub fn total_tokens(&self) -> usize {
        self.blocks.len() * self.block_size + self.partial.len()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Sequence hashes of the full blocks.
    pub fn sequence_hashes(&self) -> Vec<SequenceHash> {
        self.blocks.iter().map(TokenBlock::sequence_hash).collect()
    }

    /// Local hashes of the full blocks.
    pub fn local_hashes(&self) -> Vec<LocalBlockHash> {
        self.blocks.iter().map(TokenBlock::local_hash).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raw<T: Copy>(values: &[T], get: impl Fn(T) -> u64) -> Vec<u64> {
        values.iter().map(|v| get(*v)).collect()
    }

    #[test]
    fn design_vector_one_to_twelve_in_blocks_of_four() {
        let tokens: Vec<Token> = (1..=12).collect();
        let locals = compute_local_hashes(&tokens, 4, HashSeed::default());
        assert_eq!(
            raw(&locals, LocalBlockHash::get),
            vec![
                14643705804678351452,
                16777012769546811212,
                483935686894639516
            ]
        );
        assert_eq!(
            raw(&compute_sequence_hashes(&locals), SequenceHash::get),
            vec![
                14643705804678351452,
                4945711292740353085,
                12583592247330656132
            ]
        );
    }

    #[test]
    fn design_vector_zero_to_sixty_four_in_blocks_of_sixteen() {
        let tokens: Vec<Token> = (0..64).collect();
        let locals = compute_local_hashes(&tokens, 16, HashSeed::default());
        assert_eq!(
            raw(&locals, LocalBlockHash::get),
            vec![
                15310707395893867146,
                15292316782987903195,
                5532946206955930018,
                14928757266181269122
            ]
        );
        assert_eq!(
            raw(&compute_sequence_hashes(&locals), SequenceHash::get),
            vec![
                15310707395893867146,
                13769157705258532664,
                11879827756109914528,
                3888788807566526800
            ]
        );
    }

    #[test]
    fn design_vector_lora_seed() {
        let tokens: Vec<Token> = (0..16).collect();
        let local = compute_local_hash(&tokens, HashSeed::for_lora("myLora"));
        assert_eq!(local.get(), 4658809429412599326);
    }

    #[test]
    fn salt_changes_local_hashes_and_composes_with_lora() {
        let tokens: Vec<Token> = (0..16).collect();
        let plain = compute_local_hash(&tokens, HashSeed::default());
        let salted = compute_local_hash(&tokens, HashSeed::default().with_salt(b"tenant-a"));
        let other = compute_local_hash(&tokens, HashSeed::default().with_salt(b"tenant-b"));
        let lora_salted =
            compute_local_hash(&tokens, HashSeed::for_lora("myLora").with_salt(b"tenant-a"));
        assert_ne!(plain, salted);
        assert_ne!(salted, other);
        assert_ne!(lora_salted, salted);
        assert_ne!(lora_salted.get(), 4658809429412599326);
    }

    #[test]
    fn trailing_partial_block_is_not_hashed() {
        let tokens: Vec<Token> = (0..10).collect();
        let sequence = TokenBlockSequence::new(&tokens, 4, HashSeed::default()).unwrap();
        assert_eq!(sequence.blocks().len(), 2);
        assert_eq!(sequence.partial_tokens(), &[8, 9]);
        assert_eq!(sequence.total_tokens(), 10);
        assert_eq!(
            compute_local_hashes(&tokens, 4, HashSeed::default()).len(),
            2
        );
        assert_eq!(
            TokenBlockSequence::new(&tokens, 0, HashSeed::default()).unwrap_err(),
            TokensError::ZeroBlockSize
        );
    }

    #[test]
    fn a_sequence_hash_depends_on_every_earlier_block() {
        let tokens: Vec<Token> = (0..16).collect();
        let mut changed = tokens.clone();
        changed[1] = 999;
        let a = TokenBlockSequence::new(&tokens, 4, HashSeed::default()).unwrap();
        let b = TokenBlockSequence::new(&changed, 4, HashSeed::default()).unwrap();
        let (la, lb) = (a.local_hashes(), b.local_hashes());
        assert_ne!(la[0], lb[0]);
        assert_eq!(la[1..], lb[1..]);
        for (x, y) in a.sequence_hashes().iter().zip(b.sequence_hashes()) {
            assert_ne!(*x, y);
        }
        let block = &a.blocks()[2];
        assert_eq!(block.position(), 2);
        assert_eq!(block.parent(), Some(a.blocks()[1].sequence_hash()));
    }

    proptest! {
        #[test]
        fn pushing_token_by_token_builds_the_same_blocks(
            tokens in proptest::collection::vec(any::<u32>(), 0..200),
            block_size in 1usize..20,
        ) {
            let batch = TokenBlockSequence::new(&tokens, block_size, HashSeed::default()).unwrap();
            let mut incremental = TokenBlockSequence::new(&[], block_size, HashSeed::default()).unwrap();
            let mut completed = 0;
            for &token in &tokens {
                if incremental.push_token(token).is_some() {
                    completed += 1;
                }
            }
            prop_assert_eq!(completed, tokens.len() / block_size);
            prop_assert_eq!(&batch, &incremental);
        }

        #[test]
        fn truncating_then_re_extending_gives_identical_hashes(
            tokens in proptest::collection::vec(any::<u32>(), 0..200),
            block_size in 1usize..20,
            cut in 0usize..200,
        ) {
            let full = TokenBlockSequence::new(&tokens, block_size, HashSeed::default()).unwrap();
            let mut again = full.clone();
            let cut = cut.min(tokens.len());
            again.truncate(cut);
            prop_assert_eq!(again.total_tokens(), cut);
            again.extend(&tokens[cut..]);
            prop_assert_eq!(&full, &again);
        }
    }
}
