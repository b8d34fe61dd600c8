//! The subcommands of `kvtwin`, one module each (`kvtwin bench`'s are in `bench`).
//!
//! Owns: each subcommand's flags beyond those `main` declares, its wiring of library
//! parts and its printing. Never: parse the command line as a whole or choose the
//! subcommand (`main` does), or hold logic that belongs to a library.

pub(crate) mod advisor;
pub(crate) mod cache;
pub(crate) mod calibrate;
pub(crate) mod dash;
pub(crate) mod estimate;
pub(crate) mod plan;
pub(crate) mod profile;
pub(crate) mod relay;
pub(crate) mod router;
pub(crate) mod run;
pub(crate) mod store;
pub(crate) mod sweep;
pub(crate) mod validate;
