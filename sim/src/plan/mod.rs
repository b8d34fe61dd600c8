//! Capacity planning: many runs of one scenario, and what to buy from them.
//!
//! Owns: running one point of a design space ([`run`]: a scenario with overrides and a
//! seed, on loaded or generated requests, or on a prefix of them), the summary of a run
//! that sweep files and the planner keep ([`summary`]), a grid of points under several
//! seeds as the numbered, shardable, resumable lines of a sweep file ([`sweep`]), and
//! occupancy over time for one run's plots ([`timeline`]).
//! Never: read files, print, spawn threads or draw: the command line (`kvtwin sweep`,
//! `kvtwin plan`) does that around these functions, which are deterministic: a point and
//! its requests give the same summary on any machine, in any order, on any thread.

pub mod run;
pub mod summary;
pub mod sweep;
pub mod timeline;
