//! kvtwin's shared KV block store (G4): one server many engines read and write blocks
//! through, with tiers DRAM → local disk → an object store (the `object_store` crate: a
//! local directory by default, S3-compatible with the `s3` feature), each bounded in
//! bytes and least recently used first out, BLAKE3 on every value, and leases so that a
//! value being read is never moved or deleted under its reader.
//!
//! - [`index`]: the bookkeeping (which copy lies where, LRU, leases), as steps for the
//!   store to carry out; no I/O.
//! - [`record`]: a value's self-describing form on the disk and object tiers.
//! - [`pages`]: the bytes of values in memory, in pages the store reuses, so its
//!   resident memory follows DRAM's bound rather than the allocator's fragmentation.
//! - [`store`]: [`store::Store`], the tiers' bytes behind the index: put, get, delete,
//!   recovery after a restart.
//! - [`resp`] and [`server`]: the Redis protocol (RESP2) subset that `redis-cli`, the
//!   `redis` Python client and LMCache's Redis connector speak.
//! - [`metrics`]: `/metrics` and `/healthz`.
//! - [`events`]: the KV events of the blocks it holds (kvtwin's connector's `KVB2`
//!   frames), published in vLLM's format on ZMQ and Dynamo's on NATS so routers credit
//!   the shared tier.
//!
//! Never: routing or simulation (the router and the simulator model this tier; this
//! crate is the real one).

pub mod events;
pub mod index;
pub mod metrics;
pub mod pages;
pub mod record;
pub mod resp;
pub mod server;
pub mod store;
