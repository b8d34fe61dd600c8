//! How the router hashes a request's tokens: in blocks of its block size, seeded with
//! the request's LoRA adapter and cache salt as Dynamo seeds them, so a request matches
//! only blocks stored under its own adapter and salt.
//!
//! Owns: [`RouterState::hash_tokens`], [`RouterState::hash_request`] (what `/v1/route`
//! and the proxy call) and [`HashRequestError`].
//! Never: hash differently from the events' tokens hashes (`crate::wire::convert`), or
//! guess a block size it does not know.

use super::RouterState;
use kvtwin::ids::LocalBlockHash;
use kvtwin::tokens::{compute_local_hashes, HashSeed};

/// Why a request's tokens could not be hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HashRequestError {
    /// No block size yet: none was given and no `BlockStored` has been seen.
    #[error("the block size is not known yet (no --block-size given, no BlockStored seen)")]
    BlockSizeUnknown,
}

impl HashRequestError {
    /// A stable label for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            HashRequestError::BlockSizeUnknown => "block_size_unknown",
        }
    }
}

impl RouterState {
    /// The token hashes of `tokens`' full blocks, as the engines' events carry them
    /// (none while the block size is still to be learned).
    pub fn hash_tokens(&self, tokens: &[u32]) -> Vec<LocalBlockHash> {
        compute_local_hashes(tokens, self.block_size().unwrap_or(0), self.seed)
    }

    /// The token hashes of a request's full blocks, seeded as Dynamo seeds them for its
    /// LoRA adapter and cache salt (`HashSeed::for_request`; empty strings are absent):
    /// what the proxy and `/v1/route` query the index with, so a request matches only
    /// blocks stored under its own adapter and salt.
    ///
    /// # Errors
    /// [`HashRequestError::BlockSizeUnknown`] while the block size is still to be learned.
    pub fn hash_request(
        &self,
        tokens: &[u32],
        lora_name: Option<&str>,
        cache_salt: Option<&str>,
    ) -> Result<Vec<LocalBlockHash>, HashRequestError> {
        let block_size = self
            .block_size()
            .ok_or(HashRequestError::BlockSizeUnknown)?;
        let seed = HashSeed::for_request(lora_name, cache_salt);
        Ok(compute_local_hashes(tokens, block_size, seed))
    }
}
