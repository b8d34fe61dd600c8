//! kvtwin-plane: the event plane. KV cache events travel from the engines (vLLM, SGLang)
//! and from kvtwin workers to routers, over ZMQ and NATS, in the engines' and Dynamo's
//! wire formats (WIRE.md).
//!
//! Owns: [`wire`] (the untrusted wire formats: vLLM / SGLang msgpack batches and their ZMQ
//! and replay frames, Dynamo `RouterEvent` JSON and its msgpack envelope; decoders that
//! never panic, their encoders, and the conversions between the stages below), [`zmq`]
//! (subscriber with gap replay and restart detection, publisher with a replay ROUTER),
//! [`nats`] (core or JetStream publisher, core / durable / replay subscriber; with
//! feature `testing`, a `nats-server` harness), [`service`] (the router service: HTTP
//! API, event sources, metrics; the ZMQ → NATS relay; a kvtwin worker's events published
//! as vLLM batches; a synthetic engine) and [`bench`](mod@bench) (the relay and router benches the
//! command line runs).
//! Layers, one way only: `wire` ← `zmq`, `nats` ← `service` ← `bench`; `wire` imports no
//! other module of the crate.
//!
//! The event chain, one name per stage:
//! 1. bytes on a transport: a ZMQ message (`wire::RawBatch` once its frames are
//!    checked) or a NATS message (`nats::NatsMessage`);
//! 2. [`wire::EngineBatch`] of [`wire::EngineEvent`]s: an engine's batch decoded off
//!    the wire, as vLLM / SGLang wrote it (the engine's block hashes, raw token ids);
//! 3. [`wire::WorkerEvent`]: one worker rank's event with each stored block's tokens
//!    hash computed, still in the engine's block hashes (`EngineBatch::worker_events`);
//!    on NATS it travels as Dynamo's [`wire::RouterEvent`] (`EngineBatch::router_events`
//!    in the relay, `RouterEvent::to_worker_event` in the router;
//!    `nats::RouterEventMessage` is a received message with its decoded `RouterEvent`);
//! 4. `kvtwin::events::KvCacheEvent` in kvtwin's chained sequence hashes, translated per
//!    worker by `service::translate::EngineHashes` and applied by the router's
//!    `KvIndexer`.
//!
//! Never: depend on the simulator (`kvtwin-sim`) or on real hardware
//! (`kvtwin-backends`), or put a socket, a thread or a clock into the core.

pub mod bench;
pub mod nats;
pub mod service;
pub mod wire;
pub mod zmq;
