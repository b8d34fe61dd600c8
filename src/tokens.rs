//! Token blocks and both of their hashes, computed exactly as NVIDIA Dynamo computes them,
//! so that kvtwin's router and Dynamo's index the same blocks under the same keys.
//!
//! Owns: [`Token`], [`HashSeed`] (1337, or mixed with a LoRA name and a cache salt as
//! Dynamo's router mixes them: [`HashSeed::for_request`]),
//! [`compute_local_hash`] (xxh3-64 over the tokens as u32 little-endian),
//! [`chain_sequence_hash`] (xxh3-64 of `le(parent) ++ le(local)`, always seed 1337),
//! [`TokenBlock`] (one full block) and [`TokenBlockSequence`] (a token stream cut into full
//! blocks plus a partial tail).
//!
//! Invariants: only full blocks are hashed; building a sequence from the whole slice, token
//! by token, or after a truncate gives the same blocks.
//! Never: I/O, a clock, or a per-process random salt (hashes must agree across processes).

use crate::ids::{LocalBlockHash, SequenceHash};
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

/// A token id.
pub type Token = u32;

/// Dynamo's hash seed: the seed of plain local hashes, and of every sequence-hash chaining.
pub const DEFAULT_HASH_SEED: u64 = 1337;

/// Blocks of up to this many tokens are hashed in one shot from a stack buffer; longer ones
/// are streamed through it. 256 tokens covers every usual page size in 1 KiB of stack.
const STACK_TOKENS: usize = 256;

/// The seed of local (tokens-only) block hashes. Requests hashed with different seeds never
/// share blocks: that is how LoRA adapters and tenants (cache salts) are kept apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct HashSeed(u64);

impl Default for HashSeed {
    /// [`DEFAULT_HASH_SEED`]: no LoRA adapter, no salt.
    fn default() -> Self {
        Self(DEFAULT_HASH_SEED)
    }
}

impl HashSeed {
    /// A seed taken from configuration (STYLE: the hash seed comes from config).
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The seed of blocks computed with LoRA adapter `name`:
    /// `1337 wrapping_add xxh3_64(name, seed 0)`, as Dynamo derives it.
    pub fn for_lora(name: &str) -> Self {
        Self::default().with_lora(name)
    }

    /// The seed of a request's blocks: Dynamo's `compute_salt_hash(salt, lora_name)`,
    /// which its router's `block_hash_seed` uses for every block of a request (read in
    /// ai-dynamo/dynamo `lib/kv-hashing/src/salt.rs`, the version the router's
    /// `lib/kv-router/src/protocols.rs` at commit cfa22544 calls with two arguments;
    /// earlier versions hashed a JSON payload, and one mixed in the block size):
    /// 1337, wrapping_add `xxh3_64(lora_name, seed 0)` when there is an adapter,
    /// wrapping_add `xxh3_64(salt, seed 1)` when there is a salt. An empty string counts
    /// as absent, so `Some("")` and `None` share blocks. The sequence-hash chain is not
    /// salted ([`chain_sequence_hash`]).
    pub fn for_request(lora_name: Option<&str>, salt: Option<&str>) -> Self {
        let mut seed = Self::default();
        if let Some(name) = lora_name.filter(|name| !name.is_empty()) {
            seed = seed.with_lora(name);
        }
        if let Some(salt) = salt.filter(|salt| !salt.is_empty()) {
            seed = seed.with_salt(salt.as_bytes());
        }
        seed
    }

    /// This seed mixed with a LoRA adapter's name (inner seed 0, as Dynamo).
    fn with_lora(self, name: &str) -> Self {
        Self(self.0.wrapping_add(xxh3_64_with_seed(name.as_bytes(), 0)))
    }

    /// This seed mixed with a cache salt: `wrapping_add xxh3_64(salt, seed 1)`, as
    /// Dynamo mixes it. The inner seed differs from a LoRA name's (0), so a salt equal to
    /// an adapter's name never stands for that adapter; both are wrapping additions, so
    /// the order in which they are applied is irrelevant. An empty salt still mixes
    /// (use [`HashSeed::for_request`] for Dynamo's "empty is absent").
    pub fn with_salt(self, salt: &[u8]) -> Self {
        Self(self.0.wrapping_add(xxh3_64_with_seed(salt, 1)))
    }

    /// The raw seed.
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// The hash of one block's tokens alone: xxh3-64 with `seed` over the tokens as u32
/// little-endian bytes. Does not allocate.
pub fn compute_local_hash(tokens: &[Token], seed: HashSeed) -> LocalBlockHash {
    let mut buf = [0u8; STACK_TOKENS * 4];
    if tokens.len() <= STACK_TOKENS {
        let len = fill_le_bytes(&mut buf, tokens);
        return LocalBlockHash::new(xxh3_64_with_seed(&buf[..len], seed.get()));
    }
    // Streaming gives the same digest as the one-shot hash of the concatenated bytes.
    let mut hasher = Xxh3::with_seed(seed.get());
    for chunk in tokens.chunks(STACK_TOKENS) {
        let len = fill_le_bytes(&mut buf, chunk);
        hasher.update(&buf[..len]);
    }
    LocalBlockHash::new(hasher.digest())
}

/// Writes `tokens` as little-endian bytes at the start of `buf`; returns the bytes written.
/// Needs `buf.len() >= 4 * tokens.len()`.
fn fill_le_bytes(buf: &mut [u8], tokens: &[Token]) -> usize {
    for (token, bytes) in tokens.iter().zip(buf.chunks_exact_mut(4)) {
        bytes.copy_from_slice(&token.to_le_bytes());
    }
    tokens.len() * 4
}

/// The sequence hash of the block after `parent` whose tokens hash to `local`: the first
/// block's is its local hash, later ones `xxh3_64(le(parent) ++ le(local), 1337)`. The
/// chaining seed is always [`DEFAULT_HASH_SEED`]: LoRA and salt enter through `local` alone.
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

/// Local hashes of the full blocks of `tokens`, first block first; a trailing partial block
/// is ignored. A `block_size` of zero has no full blocks: the result is empty (library
/// functions do not panic on their inputs; `TokenBlockSequence::new` reports it as an
/// error).
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

/// A full, immutable block of tokens with its hashes and its place in its sequence.
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

    /// The block's tokens (exactly the sequence's block size).
    pub fn tokens(&self) -> &[Token] {
        &self.tokens
    }

    /// Hash of the tokens alone.
    pub fn local_hash(&self) -> LocalBlockHash {
        self.local_hash
    }

    /// Hash chained with every block before it: the registry key.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.sequence_hash
    }

    /// Sequence hash of the block before it; `None` for the first block.
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
    /// Blocks of zero tokens were asked for.
    #[error("block size must be at least one token")]
    ZeroBlockSize,
}

/// A token stream cut into full [`TokenBlock`]s and a partial tail shorter than a block.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct TokenBlockSequence {
    blocks: Vec<TokenBlock>,
    partial: Vec<Token>,
    block_size: usize,
    seed: HashSeed,
}

impl TokenBlockSequence {
    /// Cuts `tokens` into blocks of `block_size` tokens, hashed with `seed`.
    ///
    /// # Errors
    /// [`TokensError::ZeroBlockSize`] if `block_size` is zero.
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

    /// Appends one token; returns the block it completed, if it completed one.
    pub fn push_token(&mut self, token: Token) -> Option<&TokenBlock> {
        self.partial.push(token);
        if self.partial.len() < self.block_size {
            return None;
        }
        self.seal_partial();
        self.blocks.last()
    }

    /// Appends `tokens`; returns how many blocks they completed.
    pub fn extend(&mut self, tokens: &[Token]) -> usize {
        let before = self.blocks.len();
        let mut rest = tokens;
        if !self.partial.is_empty() {
            let take = (self.block_size - self.partial.len()).min(rest.len());
            let (head, tail) = rest.split_at(take);
            self.partial.extend_from_slice(head);
            rest = tail;
            if self.partial.len() == self.block_size {
                self.seal_partial();
            }
        }
        // Whole blocks are hashed straight from the input, not copied through the tail.
        let mut chunks = rest.chunks_exact(self.block_size);
        for chunk in &mut chunks {
            self.push_block(chunk);
        }
        self.partial.extend_from_slice(chunks.remainder());
        self.blocks.len() - before
    }

    /// Keeps the first `len` tokens (no-op if it holds no more than `len`): blocks past the
    /// cut are dropped, and the block the cut falls in becomes the partial tail.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.total_tokens() {
            return;
        }
        let full = len / self.block_size;
        let tail = len % self.block_size;
        if let Some(cut) = self.blocks.get(full) {
            self.partial.clear();
            self.partial.extend_from_slice(&cut.tokens()[..tail]);
            self.blocks.truncate(full);
        } else {
            self.partial.truncate(tail);
        }
    }

    /// The full blocks, first block first.
    pub fn blocks(&self) -> &[TokenBlock] {
        &self.blocks
    }

    /// The tokens after the last full block (fewer than a block).
    pub fn partial_tokens(&self) -> &[Token] {
        &self.partial
    }

    /// All tokens held, in full blocks and the tail.
    pub fn total_tokens(&self) -> usize {
        self.blocks.len() * self.block_size + self.partial.len()
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Sequence hashes of the full blocks, first block first.
    pub fn sequence_hashes(&self) -> Vec<SequenceHash> {
        self.blocks.iter().map(TokenBlock::sequence_hash).collect()
    }

    /// Local hashes of the full blocks, first block first.
    pub fn local_hashes(&self) -> Vec<LocalBlockHash> {
        self.blocks.iter().map(TokenBlock::local_hash).collect()
    }

    fn seal_partial(&mut self) {
        let parent = self.blocks.last().map(TokenBlock::sequence_hash);
        let block = TokenBlock::new(&self.partial, self.seed, parent, self.blocks.len());
        self.blocks.push(block);
        self.partial.clear();
    }

    fn push_block(&mut self, tokens: &[Token]) {
        let parent = self.blocks.last().map(TokenBlock::sequence_hash);
        let block = TokenBlock::new(tokens, self.seed, parent, self.blocks.len());
        self.blocks.push(block);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn raw_locals(hashes: &[LocalBlockHash]) -> Vec<u64> {
        hashes.iter().map(|h| h.get()).collect()
    }

    fn raw_sequence(hashes: &[SequenceHash]) -> Vec<u64> {
        hashes.iter().map(|h| h.get()).collect()
    }

    /// Checks the free functions and a `TokenBlockSequence` against one DESIGN.md vector.
    fn check_vector(tokens: &[Token], block_size: usize, locals: &[u64], chained: &[u64]) {
        let computed = compute_local_hashes(tokens, block_size, HashSeed::default());
        assert_eq!(raw_locals(&computed), locals);
        assert_eq!(raw_sequence(&compute_sequence_hashes(&computed)), chained);

        let sequence = TokenBlockSequence::new(tokens, block_size, HashSeed::default())
            .expect("nonzero block size");
        assert_eq!(raw_locals(&sequence.local_hashes()), locals);
        assert_eq!(raw_sequence(&sequence.sequence_hashes()), chained);
    }

    #[test]
    fn tokens_one_to_twelve_in_blocks_of_four_hash_as_dynamo() {
        let tokens: Vec<Token> = (1..=12).collect();
        check_vector(
            &tokens,
            4,
            &[
                14643705804678351452,
                16777012769546811212,
                483935686894639516,
            ],
            &[
                14643705804678351452,
                4945711292740353085,
                12583592247330656132,
            ],
        );
    }

    #[test]
    fn tokens_zero_to_sixty_four_in_blocks_of_sixteen_hash_as_dynamo() {
        let tokens: Vec<Token> = (0..64).collect();
        check_vector(
            &tokens,
            16,
            &[
                15310707395893867146,
                15292316782987903195,
                5532946206955930018,
                14928757266181269122,
            ],
            &[
                15310707395893867146,
                13769157705258532664,
                11879827756109914528,
                3888788807566526800,
            ],
        );
    }

    #[test]
    fn lora_seed_hashes_as_dynamo() {
        let tokens: Vec<Token> = (0..16).collect();
        let local = compute_local_hash(&tokens, HashSeed::for_lora("myLora"));
        assert_eq!(local.get(), 4658809429412599326);
    }

    /// Vectors computed apart from this code, with Python's `xxhash` 4.1.0 from the
    /// definition in [`HashSeed::for_request`]: (lora, salt) -> seed, then the local hash
    /// of tokens `0..16`.
    #[test]
    fn request_seeds_hash_as_dynamo_salts() {
        let tokens: Vec<Token> = (0..16).collect();
        let cases: [(Option<&str>, Option<&str>, u64, u64); 7] = [
            (None, None, 1337, 15_310_707_395_893_867_146),
            (Some(""), Some(""), 1337, 15_310_707_395_893_867_146),
            (
                Some("myLora"),
                None,
                11_054_752_308_025_210_119,
                4_658_809_429_412_599_326,
            ),
            (
                None,
                Some("tenant-a"),
                1_948_188_790_972_764_086,
                2_130_915_519_417_463_704,
            ),
            (
                Some("myLora"),
                Some("tenant-a"),
                13_002_941_098_997_972_868,
                3_007_860_925_445_029_130,
            ),
            // A salt equal to an adapter's name is not that adapter.
            (
                None,
                Some("myLora"),
                3_745_725_848_295_587_597,
                6_909_666_980_021_581_281,
            ),
            (
                Some("myLora"),
                Some(""),
                11_054_752_308_025_210_119,
                4_658_809_429_412_599_326,
            ),
        ];
        for (lora, salt, seed, local) in cases {
            let request = HashSeed::for_request(lora, salt);
            assert_eq!(request.get(), seed, "{lora:?} {salt:?}");
            assert_eq!(compute_local_hash(&tokens, request).get(), local);
        }
        assert_eq!(
            HashSeed::for_request(Some("myLora"), None),
            HashSeed::for_lora("myLora")
        );
    }

    #[test]
    fn salt_changes_hashes_and_composes_with_lora() {
        let tokens: Vec<Token> = (0..32).collect();
        let plain = HashSeed::default();
        let tenant_a = HashSeed::for_request(None, Some("tenant-a"));
        let tenant_b = HashSeed::for_request(None, Some("tenant-b"));
        let lora = HashSeed::for_lora("myLora");
        let lora_a = lora.with_salt(b"tenant-a");

        let hashes = |seed| compute_local_hashes(&tokens, 16, seed);
        let all = [
            hashes(plain),
            hashes(tenant_a),
            hashes(tenant_b),
            hashes(lora),
            hashes(lora_a),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a[0], b[0]);
                assert_ne!(compute_sequence_hashes(a), compute_sequence_hashes(b));
            }
        }
        assert_eq!(
            lora_a,
            HashSeed::for_request(Some("myLora"), Some("tenant-a"))
        );
        assert_eq!(plain.with_salt(b"tenant-a"), tenant_a);
    }

    #[test]
    fn trailing_partial_block_is_ignored() {
        let tokens: Vec<Token> = (0..10).collect();
        let seed = HashSeed::default();
        assert_eq!(
            compute_local_hashes(&tokens, 4, seed),
            compute_local_hashes(&tokens[..8], 4, seed)
        );
        let sequence = TokenBlockSequence::new(&tokens, 4, seed).expect("nonzero block size");
        assert_eq!(sequence.blocks().len(), 2);
        assert_eq!(sequence.partial_tokens(), &[8, 9]);
        assert_eq!(sequence.total_tokens(), 10);
        assert_eq!(sequence.block_size(), 4);
    }

    #[test]
    fn zero_block_size_is_rejected() {
        assert_eq!(
            TokenBlockSequence::new(&[1, 2, 3], 0, HashSeed::default()),
            Err(TokensError::ZeroBlockSize)
        );
    }

    #[test]
    fn zero_block_size_has_no_full_blocks() {
        assert!(compute_local_hashes(&[1, 2, 3], 0, HashSeed::default()).is_empty());
    }

    #[test]
    fn a_sequence_hash_depends_on_every_earlier_block() {
        let tokens: Vec<Token> = (0..16).collect();
        let mut changed = tokens.clone();
        changed[1] = 999;
        let seed = HashSeed::default();
        let a = TokenBlockSequence::new(&tokens, 4, seed).expect("nonzero block size");
        let b = TokenBlockSequence::new(&changed, 4, seed).expect("nonzero block size");

        let (la, lb) = (a.local_hashes(), b.local_hashes());
        assert_ne!(la[0], lb[0]);
        assert_eq!(la[1..], lb[1..]);
        for (x, y) in a.sequence_hashes().iter().zip(b.sequence_hashes()) {
            assert_ne!(*x, y);
        }
    }

    #[test]
    fn blocks_record_their_parent_and_position() {
        let tokens: Vec<Token> = (0..12).collect();
        let sequence =
            TokenBlockSequence::new(&tokens, 4, HashSeed::default()).expect("nonzero block size");
        let blocks = sequence.blocks();
        assert_eq!(blocks[0].parent(), None);
        assert_eq!(
            blocks[0].sequence_hash().get(),
            blocks[0].local_hash().get()
        );
        for (i, block) in blocks.iter().enumerate() {
            assert_eq!(block.position(), i);
            assert_eq!(block.tokens(), &tokens[i * 4..(i + 1) * 4]);
        }
        assert_eq!(blocks[2].parent(), Some(blocks[1].sequence_hash()));
    }

    proptest! {
        #[test]
        fn local_hash_equals_xxh3_of_the_le_bytes(
            tokens in proptest::collection::vec(any::<Token>(), 0..3 * STACK_TOKENS),
            seed in any::<u64>(),
        ) {
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            let seed = HashSeed::default().with_salt(&seed.to_le_bytes());
            prop_assert_eq!(
                compute_local_hash(&tokens, seed).get(),
                xxh3_64_with_seed(&bytes, seed.get())
            );
        }

        #[test]
        fn pushing_incrementally_builds_the_same_blocks_as_the_whole_slice(
            tokens in proptest::collection::vec(any::<Token>(), 0..200),
            block_size in 1usize..20,
            split in 0usize..200,
        ) {
            let seed = HashSeed::for_lora("adapter");
            let batch = TokenBlockSequence::new(&tokens, block_size, seed).expect("nonzero");

            let mut by_token = TokenBlockSequence::new(&[], block_size, seed).expect("nonzero");
            for &token in &tokens {
                let len = by_token.blocks().len();
                let completed = by_token.push_token(token).cloned();
                prop_assert_eq!(completed.as_ref(), by_token.blocks()[len..].first());
            }
            prop_assert_eq!(&batch, &by_token);

            let split = split.min(tokens.len());
            let (head, tail) = tokens.split_at(split);
            let mut by_slice = TokenBlockSequence::new(head, block_size, seed).expect("nonzero");
            let before = by_slice.blocks().len();
            let completed = by_slice.extend(tail);
            prop_assert_eq!(before + completed, tokens.len() / block_size);
            prop_assert_eq!(&batch, &by_slice);
            prop_assert_eq!(
                batch.local_hashes(),
                compute_local_hashes(&tokens, block_size, seed)
            );
            prop_assert_eq!(
                batch.sequence_hashes(),
                compute_sequence_hashes(&batch.local_hashes())
            );
        }

        #[test]
        fn truncate_then_re_extend_gives_identical_hashes(
            tokens in proptest::collection::vec(any::<Token>(), 0..200),
            block_size in 1usize..20,
            cut in 0usize..220,
        ) {
            let seed = HashSeed::default();
            let whole = TokenBlockSequence::new(&tokens, block_size, seed).expect("nonzero");
            let mut again = whole.clone();
            again.truncate(cut);
            let cut = cut.min(tokens.len());
            prop_assert_eq!(again.total_tokens(), cut);
            prop_assert_eq!(
                &again,
                &TokenBlockSequence::new(&tokens[..cut], block_size, seed).expect("nonzero")
            );
            again.extend(&tokens[cut..]);
            prop_assert_eq!(again.sequence_hashes(), whole.sequence_hashes());
            prop_assert_eq!(&again, &whole);
        }
    }
}
