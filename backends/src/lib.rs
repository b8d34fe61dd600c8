//! kvtwin-backends: real [`kvtwin::hardware::Hardware`] for the sans-IO `Manager`.
//!
//! Owns: [`host::HostHardware`] (always built: device tier emulated in host memory, host
//! tier in memory, disk tier in an extent file with a BLAKE3 per block, remote tier on an
//! in-process fabric; transfers on a bounded pool of worker threads) and
//! [`content::KvContent`], the deterministic KV bytes that let a test check any round
//! trip byte for byte. With feature `nixl`, module `nixl`: NIXL agents moving blocks memory to
//! memory over UCX and memory to file over POSIX, and `NixlFabric`, MRDN frames between
//! two agents. With feature `cuda`, module `cuda`: the GPU as `HostHardware`'s device
//! tier (pinned host tier, block copies batched on streams and completed by CUDA events)
//! and the block-copy benchmark. [`calibrate`]: microbenchmarks through `HostHardware`'s
//! transfer path and the simulator's `HardwareProfile` fitted to them; [`validate`]: a
//! validation script on `HostHardware` and on the simulator, compared.
//! Never: be needed by `cargo test` without its features, put I/O, threads or clocks
//! into the core (they stay on this side of the `Hardware` trait), or carry the event
//! plane (wire codecs, ZMQ, NATS, the router service: `kvtwin-plane`), so no tokio,
//! axum, ZMQ or NATS is built for it.

pub mod calibrate;
pub mod content;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host;
#[cfg(feature = "nixl")]
pub mod nixl;
pub mod validate;
