//! `kvtwin bench ...`: one module per benchmark, each the command line (flags and the
//! one JSON line it prints) around what it times.
//!
//! Owns: the benchmarks' flags, their set-up (processes, sockets, seeded clients) and
//! their output. Never: a number presented as a measurement that the simulator
//! predicted, or logic that belongs to the library being measured.

pub(crate) mod cuda;
pub(crate) mod dash;
pub(crate) mod gemm;
pub(crate) mod relay;
pub(crate) mod router;
pub(crate) mod serve;
pub(crate) mod sim;
pub(crate) mod soak;
pub(crate) mod store;
