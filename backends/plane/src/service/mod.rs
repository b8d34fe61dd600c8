//! The routing service and the relay: kvtwin's router fed by engine events off the wire.
//!
//! Owns: [`block_size`] (the router's block size, fixed or learned from the events),
//! [`translate`] (engine block hashes to kvtwin's chained hashes, per worker),
//! [`state::RouterState`] (the indexer, per-worker views, route answers), [`metrics`]
//! (counters and the Prometheus text), [`http`] (the HTTP/JSON API), [`auth`] (its
//! bearer token and who needs it), [`tls`] (HTTPS with rustls), [`client`] (the
//! connection every in-repository client makes: http or https, the token), [`stream`] (the
//! change stream's messages and the cursor that makes them), [`sse`] (server-sent events
//! framing), [`stream_client`] (a client of `/v1/stream`), [`source`] (engine
//! event sources: a ZMQ subscriber thread per engine applying decoded batches; a
//! shared store's go to the state's shared index, `state::shared`),
//! [`nats_source`] (Dynamo `RouterEvent`s from NATS, core or replayed from JetStream) and
//! [`relay`] (one engine's ZMQ events onto NATS), [`publish`] (a kvtwin worker's events
//! as vLLM batches over ZMQ), [`synthetic`] (a seeded engine event
//! stream for tests and benches).
//! Never: decode wire formats (`crate::wire` does) or own sockets beyond what a source
//! needs; the index itself is `kvtwin::router`'s.

pub mod auth;
pub mod block_size;
pub mod client;
pub mod frontend;
pub mod http;
pub mod metrics;
pub mod nats_source;
pub mod publish;
pub mod relay;
pub mod source;
pub mod sse;
pub mod state;
pub mod stream;
pub mod stream_client;
pub mod synthetic;
pub mod tls;
pub mod translate;
pub mod warn;
