//! kvtwin-sim: the deterministic discrete-event simulator around kvtwin's core.
//!
//! The same `Manager`, pools and events as the real backend run here on a
//! [`hardware::SimHardware`] that completes transfers when their modelled time comes.
//! Owns: the event queue ([`queue`]), the hardware model ([`hardware`], its shared links
//! in [`links`], forward-pass times in [`compute`], the network between the nodes in
//! [`fabric`]), workloads ([`workload`]: synthetic conversations and Mooncake traces),
//! scenarios ([`scenario`], RON, read by [`ron_file`] like every RON input), the
//! steppable cluster and its report ([`cluster`]), the checkers that judge a cluster
//! from outside ([`checkers`]), trace replay through one pool for cache sizing
//! ([`cache`]); traffic that changes over time ([`traffic`]: time-scaling, loops, rate
//! curves); autoscaling what-ifs ([`autoscale`]: planners in the loop, and per-replica
//! capacity tables in Dynamo's planner format); capacity planning over many runs
//! ([`plan`]: sweeps, the SLO-and-cost search); validation scripts run on any two
//! hardwares through one `Manager`, and
//! their comparison ([`validation`]); the twin of a vLLM engine's own cache and
//! scheduler, block for block ([`vllm`]).
//!
//! Invariant: a scenario and a seed fully determine a run: no wall clock, no unseeded
//! randomness, ordered maps wherever iteration order is observable. Latencies it prints
//! are predictions of the model, not measurements.
//! Never: be a dependency of `kvtwin` itself.

pub mod advisor;
pub mod autoscale;
pub mod cache;
pub mod checkers;
pub mod cluster;
pub mod compute;
pub mod fabric;
pub mod hardware;
pub mod ledger;
pub mod links;
pub mod mooncake;
pub mod plan;
pub mod queue;
pub mod ron_file;
pub mod scenario;
pub mod shared;
pub mod traffic;
pub mod validation;
pub mod vllm;
pub mod workload;
