//! Benches of the event plane that the command line runs (`kvtwin bench
//! relay|router|soak|serve`): the measurement itself, with a typed report; the command
//! line only parses flags and prints.
//!
//! Owns: `relay` (feature `testing`: engines → relays → NATS → router on loopback, it
//! starts its own `nats-server`), `soak` (feature `testing`: the same as processes, for
//! minutes, with `kill -9`s, checked against the engines), [`router`] (a
//! `kv-router-workload` file replayed through kvtwin's indexer, inline or sharded over
//! threads) and [`serve`] (a load generator for an OpenAI-compatible server: the router's
//! front door or one engine).
//! Never: be used as a correctness test (the plane's tests are), or print.

#[cfg(feature = "testing")]
pub mod relay;
pub mod router;
pub mod serve;
#[cfg(feature = "testing")]
pub mod soak;
