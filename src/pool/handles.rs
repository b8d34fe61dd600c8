//! RAII handles to a pool's blocks.
//!
//! Owns: [`MutableBlock`] (exclusive; states Reset, Partial, Complete as the type
//! parameter, so a transition that is illegal in the current state does not compile) and
//! [`ImmutableBlock`] (shared; state Registered). Dropping a `MutableBlock` returns its
//! block to the free stack; dropping the last `ImmutableBlock` of a block makes it cached.
//! Handles may be dropped on any thread.
//! Never: hold a lock across a call into user code.

use super::{PoolInner, PoolShared};
use crate::block::{BlockError, BlockIdentity, BlockState, Complete, MutableState, Partial, Reset};
use crate::ids::{BlockId, SequenceHash};
use crate::phase::Phase;
use crate::sync::Arc;
use crate::tier::Tier;
use crate::tokens::{HashSeed, Token, TokenBlock};
use std::fmt;

/// An exclusively held block that is not registered; `S` is its state.
pub struct MutableBlock<S: MutableState = Reset> {
    // `None` once the block has been handed on (to a new state or to the registry), so
    // that drop returns it to the pool exactly once.
    pool: Option<Arc<PoolShared>>,
    id: BlockId,
    state: S,
}

impl<S: MutableState> MutableBlock<S> {
    /// The block's index in its pool.
    pub fn block_id(&self) -> BlockId {
        self.id
    }

    /// The pool's tier.
    pub fn tier(&self) -> Tier {
        self.shared().config.tier
    }

    /// The block's state.
    pub fn state(&self) -> BlockState {
        S::STATE
    }

    fn shared(&self) -> &Arc<PoolShared> {
        self.pool
            .as_ref()
            .expect("a live handle always has its pool")
    }

    fn block_size(&self) -> usize {
        self.shared().config.block_size_tokens
    }

    pub(super) fn belongs_to(&self, pool: &Arc<PoolShared>) -> bool {
        self.pool.as_ref().is_some_and(|own| Arc::ptr_eq(own, pool))
    }

    fn into_state<T: MutableState>(mut self, state: T) -> MutableBlock<T> {
        MutableBlock {
            pool: self.pool.take(),
            id: self.id,
            state,
        }
    }

    /// Partial / Complete → Reset: drops the contents, keeps the block.
    pub fn reset(self) -> MutableBlock<Reset> {
        self.into_state(Reset)
    }
}

impl MutableBlock<Reset> {
    pub(super) fn new(pool: Arc<PoolShared>, id: BlockId) -> Self {
        Self {
            pool: Some(pool),
            id,
            state: Reset,
        }
    }

    /// Reset → Partial: starts filling the block that follows `parent` (none for the first
    /// block of a sequence), hashing with `seed` (LoRA / salt).
    pub fn init_sequence(
        self,
        parent: Option<BlockIdentity>,
        seed: HashSeed,
    ) -> MutableBlock<Partial> {
        let partial = Partial::start(self.block_size(), seed, parent);
        self.into_state(partial)
    }

    /// Reset → Complete from a full token block; its size must be the pool's block size.
    pub fn apply_token_block(
        self,
        block: &TokenBlock,
    ) -> Result<MutableBlock<Complete>, (Self, BlockError)> {
        let block_size = self.block_size();
        if block.tokens().len() != block_size {
            let error = BlockError::SizeMismatch {
                got: block.tokens().len(),
                block_size,
            };
            return Err((self, error));
        }
        Ok(
            self.into_state(Complete::from_identity(BlockIdentity::of_token_block(
                block,
            ))),
        )
    }

    /// Reset → Complete with an identity computed elsewhere: an onboarded or offloaded copy
    /// of a registered block, or a block of a hash-only trace.
    pub fn apply_identity(self, identity: BlockIdentity) -> MutableBlock<Complete> {
        self.into_state(Complete::from_identity(identity))
    }
}

impl MutableBlock<Partial> {
    /// Partial → Partial: appends as many tokens as fit; returns how many were taken.
    pub fn add_tokens(&mut self, tokens: &[Token]) -> usize {
        self.state.add_tokens(tokens)
    }

    /// Partial → Partial: removes the last `count` tokens.
    pub fn pop_tokens(&mut self, count: usize) -> Result<(), BlockError> {
        self.state.pop_tokens(count)
    }

    /// The tokens so far.
    pub fn tokens(&self) -> &[Token] {
        self.state.tokens()
    }

    /// Whether the block is full.
    pub fn is_full(&self) -> bool {
        self.state.is_full()
    }

    /// Partial → Complete; requires a full block, otherwise the block comes back with
    /// [`BlockError::NotFull`].
    pub fn commit(mut self) -> Result<MutableBlock<Complete>, (Self, BlockError)> {
        let pool = self.pool.take();
        let id = self.id;
        let partial = std::mem::replace(
            &mut self.state,
            Partial::start(0, HashSeed::default(), None),
        );
        match partial.commit() {
            Ok(complete) => Ok(MutableBlock {
                pool,
                id,
                state: complete,
            }),
            Err((partial, error)) => Err((
                MutableBlock {
                    pool,
                    id,
                    state: partial,
                },
                error,
            )),
        }
    }
}

impl MutableBlock<Complete> {
    /// The identity the block will be registered under.
    pub fn identity(&self) -> &BlockIdentity {
        self.state.identity()
    }

    /// Hands the block to the registry: the handle no longer returns it on drop.
    pub(super) fn into_registration(mut self) -> (BlockId, BlockIdentity) {
        self.pool = None;
        (self.id, *self.state.identity())
    }

    /// [`MutableBlock::into_registration`] in place, for a batch: the handle stays where
    /// it is (dropping it does nothing) and its identity is read there. Moving each
    /// handle out first copied its identity through the stack, and the loads of those
    /// copies waited for the stores that made them (issue 33).
    pub(super) fn hand_to_registry(&mut self) -> (BlockId, &BlockIdentity) {
        self.pool = None;
        (self.id, self.state.identity())
    }
}

impl<S: MutableState> Drop for MutableBlock<S> {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            let mut inner: crate::sync::PoolGuard<'_, PoolInner> = pool.inner.lock();
            inner.return_mutable(self.id);
        }
    }
}

impl<S: MutableState> fmt::Debug for MutableBlock<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutableBlock")
            .field("id", &self.id)
            .field("state", &S::STATE)
            .finish()
    }
}

/// A reference to a registered block. Clones share the block; it becomes cached (and
/// evictable) when the last reference drops.
pub struct ImmutableBlock {
    pool: Option<Arc<PoolShared>>,
    id: BlockId,
    identity: BlockIdentity,
}

impl ImmutableBlock {
    pub(super) fn new(pool: Arc<PoolShared>, id: BlockId, identity: BlockIdentity) -> Self {
        Self {
            pool: Some(pool),
            id,
            identity,
        }
    }

    /// The block's index in its pool.
    pub fn block_id(&self) -> BlockId {
        self.id
    }

    /// What the block is registered as.
    pub fn identity(&self) -> &BlockIdentity {
        &self.identity
    }

    /// The registry key.
    pub fn sequence_hash(&self) -> SequenceHash {
        self.identity.sequence_hash
    }

    /// The pool's tier.
    pub fn tier(&self) -> Tier {
        self.shared().config.tier
    }

    /// Tags the block with `phase` for the priority eviction policy.
    pub fn set_phase(&self, phase: Phase) {
        self.shared().inner.lock().set_phase(self.id, phase);
    }

    fn shared(&self) -> &Arc<PoolShared> {
        self.pool
            .as_ref()
            .expect("a live handle always has its pool")
    }

    /// Stops the handle from releasing on drop and hands over its reference to the
    /// block and to its pool (the caller releases them).
    fn take_reference(&mut self) -> (BlockId, Arc<PoolShared>) {
        let pool = self.pool.take().expect("a live handle always has its pool");
        (self.id, pool)
    }
}

impl Clone for ImmutableBlock {
    fn clone(&self) -> Self {
        let shared = self.shared();
        shared.inner.lock().acquire(self.id);
        Self {
            pool: Some(Arc::clone(shared)),
            id: self.id,
            identity: self.identity,
        }
    }
}

impl Drop for ImmutableBlock {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.inner.lock().release(self.id, super::Placement::Hot);
        }
    }
}

impl fmt::Debug for ImmutableBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImmutableBlock")
            .field("id", &self.id)
            .field("sequence_hash", &self.identity.sequence_hash)
            .finish()
    }
}

/// References to a chain of registered blocks of one pool, parent first (as lookups and
/// registrations return them).
///
/// A chain holds one reference per block but a single handle on its pool, so taking and
/// letting go of a long prefix costs one lock and no per-block atomic operations.
/// Dropping a chain lets go of its blocks leaf first, so that among blocks released
/// together the leaves are evicted before their parents: the eviction order is part of
/// the type, not a convention callers must remember.
#[derive(Default)]
pub struct BlockChain {
    // `None` until the chain is tied to a pool (always, once it holds a block).
    pool: Option<Arc<PoolShared>>,
    blocks: Vec<(BlockId, BlockIdentity)>,
}

impl BlockChain {
    /// An empty chain.
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn for_pool(pool: &Arc<PoolShared>, capacity: usize) -> Self {
        Self {
            pool: Some(Arc::clone(pool)),
            blocks: Vec::with_capacity(capacity),
        }
    }

    /// Takes over one reference to `id` (the caller already counted it in the pool).
    pub(super) fn push_counted(&mut self, id: BlockId, identity: BlockIdentity) {
        debug_assert!(self.pool.is_some(), "a chain with blocks knows its pool");
        self.blocks.push((id, identity));
    }

    /// Makes `pool` this chain's pool; panics if the chain already belongs to another
    /// (a chain never spans pools: that would be a bug in the caller).
    pub(super) fn adopt_pool(&mut self, pool: &Arc<PoolShared>) {
        match &self.pool {
            Some(own) => assert!(Arc::ptr_eq(own, pool), "a chain cannot span two pools"),
            None => self.pool = Some(Arc::clone(pool)),
        }
    }

    /// Reserves room for `additional` more blocks.
    pub fn reserve(&mut self, additional: usize) {
        self.blocks.reserve(additional);
    }

    /// Number of blocks.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the chain holds no block.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The tier of the chain's pool (none for an empty chain).
    pub fn tier(&self) -> Option<Tier> {
        self.pool.as_ref().map(|pool| pool.config.tier)
    }

    /// Identities of the blocks, parent first.
    pub fn identities(&self) -> impl ExactSizeIterator<Item = &BlockIdentity> + '_ {
        self.blocks.iter().map(|(_, identity)| identity)
    }

    /// Sequence hashes of the blocks, parent first.
    pub fn sequence_hashes(&self) -> impl ExactSizeIterator<Item = SequenceHash> + '_ {
        self.blocks
            .iter()
            .map(|(_, identity)| identity.sequence_hash)
    }

    /// Pool indices of the blocks, parent first.
    pub fn block_ids(&self) -> impl ExactSizeIterator<Item = BlockId> + '_ {
        self.blocks.iter().map(|(id, _)| *id)
    }

    /// Appends a block (a child of the current last block) of the same pool.
    pub fn push(&mut self, mut block: ImmutableBlock) {
        let identity = block.identity;
        // The handle's reference moves into the chain, and its pool with it when the
        // chain has none yet: no reference count changes, which are locked operations
        // (a simulation pushes hundreds of thousands of blocks).
        let (id, pool) = block.take_reference();
        match &self.pool {
            Some(own) => assert!(Arc::ptr_eq(own, &pool), "a chain cannot span two pools"),
            None => self.pool = Some(pool),
        }
        self.blocks.push((id, identity));
    }

    /// Appends `other` (its first block a child of this chain's last), of the same pool.
    pub fn append(&mut self, mut other: BlockChain) {
        let Some(pool) = other.pool.take() else {
            return;
        };
        self.adopt_pool(&pool);
        // The references move over; `other` is left empty and releases nothing.
        self.blocks.append(&mut other.blocks);
    }

    /// The references as separate handles, parent first; the caller takes over the
    /// release order.
    pub fn into_vec(mut self) -> Vec<ImmutableBlock> {
        let Some(pool) = self.pool.take() else {
            return Vec::new();
        };
        std::mem::take(&mut self.blocks)
            .into_iter()
            .map(|(id, identity)| ImmutableBlock::new(Arc::clone(&pool), id, identity))
            .collect()
    }

    /// Lets go of the chain so that the blocks whose last reference this is become the
    /// next to evict, leaves before parents (after they were copied to a lower tier).
    pub fn release_cold(mut self) {
        self.release(super::Placement::Cold, |_| false);
    }

    /// [`BlockChain::release_cold`], where the blocks `checked` accepts join the pool's
    /// checked cold prefix (see `checked.rs`).
    pub(super) fn release_cold_checked(mut self, checked: impl Fn(&BlockIdentity) -> bool) {
        self.release(super::Placement::Cold, checked);
    }

    /// Drops the chain's references; with cold placement, the blocks `checked` accepts
    /// join the checked cold prefix as they become cached.
    fn release(&mut self, placement: super::Placement, checked: impl Fn(&BlockIdentity) -> bool) {
        let Some(pool) = self.pool.take() else { return };
        let mut inner = pool.inner.lock();
        // Hot placement appends to the eviction order, so release leaf first; cold
        // placement prepends, so release parent first. Either way the leaf ends colder.
        match placement {
            super::Placement::Hot => self
                .blocks
                .iter()
                .rev()
                .for_each(|(id, _)| inner.release(*id, placement)),
            super::Placement::Cold => self
                .blocks
                .iter()
                .for_each(|(id, identity)| inner.release_as(*id, placement, checked(identity))),
        }
        drop(inner);
        self.blocks.clear();
    }
}

impl Drop for BlockChain {
    fn drop(&mut self) {
        self.release(super::Placement::Hot, |_| false);
    }
}

impl Clone for BlockChain {
    /// Another reference to every block, taken under one lock.
    fn clone(&self) -> Self {
        let Some(pool) = &self.pool else {
            return Self::new();
        };
        let mut inner = pool.inner.lock();
        for (id, _) in &self.blocks {
            inner.acquire(*id);
        }
        drop(inner);
        Self {
            pool: Some(Arc::clone(pool)),
            blocks: self.blocks.clone(),
        }
    }
}

impl fmt::Debug for BlockChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockChain")
            .field("tier", &self.tier())
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl From<Vec<ImmutableBlock>> for BlockChain {
    fn from(blocks: Vec<ImmutableBlock>) -> Self {
        blocks.into_iter().collect()
    }
}

impl FromIterator<ImmutableBlock> for BlockChain {
    /// Collects handles of one pool (a mix of pools is a bug and panics).
    fn from_iter<I: IntoIterator<Item = ImmutableBlock>>(iter: I) -> Self {
        let mut chain = Self::new();
        chain.extend(iter);
        chain
    }
}

impl Extend<ImmutableBlock> for BlockChain {
    fn extend<I: IntoIterator<Item = ImmutableBlock>>(&mut self, iter: I) {
        let iter = iter.into_iter();
        // Room for them all at once: a chain grown a block at a time reallocated on the
        // way to a request's length (issue 33).
        self.blocks.reserve(iter.size_hint().0);
        for block in iter {
            self.push(block);
        }
    }
}

impl IntoIterator for BlockChain {
    type Item = ImmutableBlock;
    type IntoIter = std::vec::IntoIter<ImmutableBlock>;

    /// Hands the references over one by one, parent first; the caller takes over the
    /// release order.
    fn into_iter(self) -> Self::IntoIter {
        self.into_vec().into_iter()
    }
}
