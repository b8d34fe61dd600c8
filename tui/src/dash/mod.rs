//! `kvtwin dash`: the live dashboard of a real cluster (a router's stream, or a router
//! replica fed by the engines) or a simulated one, and its recordings.
//!
//! Owns: [`model`] (what sources say: timed deltas), `app` (the state: folding updates,
//! keys, filter, sort, views; no drawing), `ui` (a pure render of the app), the sources
//! and the recording format, and the terminal loop.
//! Never: decode engine events or keep a router's index itself (`kvtwin_plane::service`
//! does, in the replica), or step the simulator other than through `Cluster`.

pub(crate) mod model;
pub(crate) mod record;
pub(crate) mod source;
pub(crate) mod plane_delta;
pub(crate) mod replica_source;
pub(crate) mod router_source;
