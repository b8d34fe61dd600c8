//! The KV-aware router's state: which worker holds which blocks, in which tier.
//!
//! Owns: [`indexer::KvIndexer`] (fed by `KvCacheEvent`s, answers prefix-overlap queries),
//! [`scheduler::Scheduler`] (turns overlaps and load into a worker choice) and
//! [`workload`] (the `kv-router-workload` format shared with peer-bench, and its
//! checksum). The indexer's state is a function of the events it was fed, and `dump`
//! turns it back into events that rebuild it.
//! Never: I/O, clocks or threads; drivers feed events and time queries.

pub mod indexer;
pub mod scheduler;
pub mod workload;
