//! kvtwin as an engine's KV cache tier: what vLLM's KV connector keeps its blocks in.
//!
//! vLLM loads kvtwin's connector (`KVConnectorBase_V1`, the Python package built from this
//! crate) and hands it the engine's KV tensors. Blocks the engine finished are copied out
//! of them ([`layout::EngineLayout::gather`]) into kvtwin's tiers
//! ([`store::TierStore::save`]: host memory, written through to disk), found again by
//! their sequence hashes when a later prompt shares the prefix
//! ([`store::TierStore::lookup`]) and copied back before the layers need them
//! ([`store::TierStore::load`], then [`layout::EngineLayout::scatter`]), every block
//! checked with BLAKE3.
//!
//! Owns: the engine's layout as regions of memory ([`layout`]), the store of blocks
//! ([`store`]) and its disk tier's journal ([`journal`]), which lets the disk tier
//! outlive the engine, and the shared tier below them ([`shared`]: a `kvtwin store`
//! many engines read and write). Never: schedule the engine's requests (vLLM decides; the connector answers
//! its questions), or be a second block manager (the tiers are a kvtwin `Manager`).

pub mod journal;
pub mod layout;
#[cfg(feature = "python")]
mod python;
pub mod shared;
pub mod store;

pub use layout::{EngineLayout, LayoutError};
pub use store::{Found, HeldChange, LoadError, StoreConfig, StoreError, StoreStats, TierStore};
