//! Autoscaling what-ifs: planners that add and remove workers while a simulated
//! cluster serves traffic that changes, and what that costs and gains.
//!
//! Owns, one piece per file:
//! - `spec`: the scenario's `autoscale` section ([`AutoscaleSpec`]): planner, interval,
//!   bounds, scale-up delay, scale-down by draining or killing, hysteresis, SLO;
//! - `predict`: the predictors of the next interval (constant, moving average,
//!   Holt-Winters);
//! - `planner`: what a planner sees ([`IntervalObservation`]) and the built-in
//!   planners (static, Dynamo's throughput-based, load-based);
//! - `driver`: the run with the planner in the loop ([`Autoscaled`]), bounds and
//!   hysteresis enforced outside every planner;
//! - `report`: the `autoscale` object of the report ([`AutoscaleReport`]);
//! - [`profile`]: one replica's capacity measured by the simulator, as the
//!   interpolation tables of NVIDIA Dynamo's SLA planner.
//!
//! Never: change the cluster except through its commands, or know how a planner
//! decides (the driver holds every planner to the same bounds).

mod driver;
mod planner;
mod predict;
pub mod profile;
mod report;
mod spec;

pub use driver::{Autoscaled, Step};
pub use planner::{
    planner_of, IntervalLatency, IntervalObservation, LoadPlanner, Planner, PoolKind,
    PoolObservation, Profiled, Rates, StaticPlanner, Target, ThroughputPlanner, WorkerLoad,
};
pub use predict::Forecaster;
pub use report::{AutoscaleReport, Decision, IntervalSample};
pub use spec::{
    AutoscaleSpec, Capacity, Hysteresis, PlannerSpec, Predictor, ScaleDown, SloTargets,
};

#[cfg(test)]
mod tests;
