//! `kvtwin dash`: the live dashboard of a real cluster (a router's stream, or a router
//! replica fed by the engines) or a simulated one, and its recordings.
//!
//! Owns: [`model`] (what sources say: timed deltas), `app` (the state: folding updates
//! into a `state::World`, rates and chart history in `series`, keys in `keys`, the
//! [`filter`] language, sort, views; no drawing), `ui` (a pure render of the app, with the
//! bodies in `views` and `charts`), the sources and the recording format, and the
//! terminal loop.
//! Never: decode engine events or keep a router's index itself (`kvtwin_plane::service`
//! does, in the replica), or step the simulator other than through `Cluster`.

pub(crate) mod app;
mod charts;
pub(crate) mod cli;
pub(crate) mod filter;
mod keys;
pub(crate) mod model;
pub(crate) mod plane_delta;
pub(crate) mod record;
mod replica_source;
mod router_source;
mod run;
mod series;
mod sim_source;
mod source;
mod state;
pub(crate) mod ui;
mod views;

#[cfg(test)]
mod robust;
#[cfg(test)]
mod snapshots;
