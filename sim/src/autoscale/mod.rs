//! Autoscaling: what a planner that adds and removes replicas needs from the simulator.
//!
//! Owns: per-replica capacity tables in the format of NVIDIA Dynamo's SLA planner
//! ([`profile`]). Never: scale a cluster itself, or read a clock.

pub mod profile;
