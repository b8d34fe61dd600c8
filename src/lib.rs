//! kvtwin: a KV-cache block manager for LLM inference, built simulation first.
//!
//! This crate is the sans-IO core shared by the simulator (`kvtwin-sim`), the real
//! backends (`kvtwin-backends`) and the event plane (`kvtwin-plane`): ids and hashes, the
//! block state machine (Reset → Partial → Complete → Registered), per-tier block pools
//! with eviction policies, the tier [`manager::Manager`] generic over
//! [`hardware::Hardware`] and its one drain loop ([`manager::settle`]), the KV event
//! outbox and the in-process event bus ([`bus`]), the KV-aware [`router`], memory
//! layouts, latency statistics ([`stats`]), the MRDN v1 wire frame and the frame of a
//! block kept in a shared store ([`block_frame`]).
//!
//! Architecture invariants (see ARCHITECTURE.md):
//! - the core never does I/O, never spawns threads and never reads a clock: time is handed
//!   in as [`ids::Timestamp`];
//! - the only block states are Reset, Partial, Complete and Registered;
//! - the registry of every tier can be rebuilt from the emitted events alone;
//! - nothing observable depends on hash-map iteration order.

pub mod block;
pub mod block_frame;
pub mod bus;
pub mod events;
pub mod fabric;
pub mod hardware;
pub mod ids;
pub mod layout;
pub mod manager;
pub mod phase;
pub mod pool;
pub mod router;
pub mod stats;
pub mod sync;
pub mod testing;
pub mod tier;
pub mod tokens;
pub mod wire;
