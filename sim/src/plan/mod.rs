//! Capacity planning: many runs of one scenario, and what to buy from them.
//!
//! Owns: running one point of a design space ([`run`]: a scenario with overrides and a
//! seed, on loaded or generated requests, or on a prefix of them), the summary of a run
//! that sweep files and the planner keep ([`summary`]), a grid of points under several
//! seeds as the numbered, shardable, resumable lines of a sweep file ([`sweep`]),
//! occupancy over time for one run's plots ([`timeline`]); the planner's inputs (a
//! design space, [`space`]; prices, [`prices`]; an SLO, [`slo`]), its search
//! ([`search`]) and its tables ([`pareto`]).
//! Never: read files, print, spawn threads or draw: the command line (`kvtwin sweep`,
//! `kvtwin plan`) does that around these functions, which are deterministic: a point and
//! its requests give the same summary on any machine, in any order, on any thread.

pub mod pareto;
pub mod prices;
pub mod run;
pub mod search;
pub mod slo;
pub mod space;
pub mod summary;
pub mod sweep;
pub mod timeline;
