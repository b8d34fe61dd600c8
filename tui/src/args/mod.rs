//! Flags and their wiring that several subcommands share, flattened into their clap
//! structs: the router's OpenAI front door (`--engine`), secured NATS, a shared store's
//! events, `--trace-mismatch`, and an engine's ZMQ events (`--zmq`).
//!
//! Owns: the parsing of those flags and starting what they name. Never: a subcommand of
//! its own (those are `cmd`'s), or the logic of what they start (the libraries').

pub(crate) mod frontend;
pub(crate) mod nats;
pub(crate) mod shared;
pub(crate) mod trace;
pub(crate) mod zmq;
