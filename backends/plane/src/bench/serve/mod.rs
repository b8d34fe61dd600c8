//! `kvtwin bench serve`: a small load generator for an OpenAI-compatible server (the
//! router's front door, or one vLLM engine), as a library so `kvtwin validate --engine`
//! can replay workloads through it.
//!
//! ```text
//! workload::RequestSource (synthetic prefixes | Mooncake trace, seeded)
//!   ─► run::run_serve_bench: arrivals (closed loop, Poisson, trace times), at most
//!      `concurrency` in flight
//!   ─► request::send: POST /v1/completions (token ids, ignore_eos, streamed with usage)
//!      under one deadline ─► RequestRecord ─► caller's observer (`--out`, progress)
//!   ─► report::Tally ─► ServeReport (JSON line, table)
//! ```
//!
//! Owns: [`ServeConfig`], [`ServeError`], and the submodules `workload` (what is sent and
//! when), `request` (one exchange and its record), `report` (the fold and the report) and
//! `run` (the driver).
//! Invariants: every request sent ends in one record, succeeded or failed with a reason,
//! within its deadline; requests held in flight, samples kept and workers counted are
//! bounded; a seed fixes every prompt and arrival time.
//! Never: print or write files (the caller's observer and the command line do), retry a
//! request, or tokenize (prompts are token ids).

pub mod report;
pub mod request;
pub mod run;
pub mod workload;

pub use report::{ServeReport, Tally};
pub use request::{Failure, RequestRecord};
pub use run::run_serve_bench;
pub use workload::{Arrivals, Synthetic, TraceReplay, Workload, WorkloadError};

use crate::service::auth::AuthToken;
use std::time::Duration;

/// A run of the load generator.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The server, `http://HOST:PORT`.
    pub url: String,
    /// The `model` sent; `None`: the first model `GET /v1/models` lists.
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer` on every request, when given.
    pub token: Option<AuthToken>,
    /// Streamed answers (the default; TTFT and ITL need them).
    pub stream: bool,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// Each request's deadline, sending to the answer's end.
    pub timeout: Duration,
    /// Behind a router, the engine (worker id) every request is pinned to
    /// (`nvext.backend_instance_id`); `None` lets the router choose.
    pub pinned: Option<u64>,
    /// Seeds the prompts and arrivals.
    pub seed: u64,
    /// What is sent and when.
    pub workload: Workload,
}

/// Why a run could not be made (a request that fails is counted, not an error).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// `--url` is not `http://HOST:PORT`.
    #[error("--url: {0}")]
    Url(#[source] crate::service::frontend::engine_client::EngineError),
    /// A flag is out of its range.
    #[error("{flag}: {reason}")]
    BadFlag {
        /// The flag.
        flag: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// The workload could not be made or read.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// No `--model`, and the server's model list could not be had.
    #[error("GET {url}/v1/models (give --model to skip it): {reason}")]
    Models {
        /// The server.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// The observer could not take a record (writing `--out`).
    #[error("recording request {index}: {source}")]
    Observer {
        /// The request.
        index: u64,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}
