//! `kvtwin bench soak`: the event plane as separate processes on loopback, run for
//! minutes, with processes killed (`kill -9`) and restarted at seeded moments, then
//! checked against the engines' own caches.
//!
//! Owns: [`SoakConfig`] (with [`Chaos`]), [`run_soak`] (`run.rs`: start, publish, kill,
//! recover, drain, check), the kill schedule and the RSS windows (`schedule.rs`), the
//! engine threads (`engines.rs`), the child processes and what they report
//! (`procs.rs`), the router's HTTP API read with plain blocking requests (`observe.rs`)
//! and the [`SoakReport`] with its verdicts (`report.rs`).
//!
//! The pipeline: N seeded synthetic engines (threads of this process, each a
//! `SyntheticEngine` behind a `ZmqPublisher` with vLLM's replay socket, paced at
//! `rate_blocks_per_s / N` blocks a second; each keeps a bounded cache, so stores and
//! removes balance once it is full) → one `kvtwin relay` process per engine (JetStream,
//! Dynamo 1.6 envelopes, its stats on stdout every 50 ms) → a `nats-server -js` with its
//! store on disk (`NatsServer`) → one `kvtwin router --nats --jetstream` process, read
//! through `GET /v1/workers` and `GET /metrics`. Relays and router are this executable
//! (`exe`, normally `std::env::current_exe()`), so a kill is a real `SIGKILL` of a real
//! process; each child runs in its own process group (a Ctrl-C reaches only the soak,
//! which then stops them) and dies with the soak's thread that started it
//! (`PR_SET_PDEATHSIG`).
//!
//! With [`Chaos::On`], each round kills the nats-server, one relay (seeded) and the router
//! at seeded moments, each restarted at once, the next kill waiting until the pipeline
//! recovered from the last (every engine's events reach the router again). Rounds: one
//! per started five minutes. The moments fall in `[warm-up, 40 % of the run)` so that a
//! restarted process has its own warm-up before the last window (see `schedule.rs`).
//! The seed fixes the engines' streams and the schedule; when events arrive relative to
//! a kill depends on the machine, so two runs with one seed differ in their counts, not
//! in their verdicts.
//!
//! The verdicts, each checked and reported:
//! 1. *state*: after the engines stop and a quiet drain, the router's `block_digest`
//!    (and block counts, listed and indexed) of every engine's worker equals the
//!    engine's own cache, and so does a rebuild this process makes from the JetStream
//!    stream alone;
//! 2. *acknowledged*: every event a relay had a JetStream ack for is in the stream and
//!    was received by the router: the relays' acknowledged events (summed over every
//!    relay process, killed ones as of their last stats line, at most 50 ms old) ≤ the
//!    stream's events = the router's received events;
//! 3. *rss*: per process alive at the end (nats-server, relays, router), the mean RSS
//!    over the last window is at most 10 % above the mean over the window just after its
//!    warm-up for kvtwin's own processes, at most twice it for the nats-server (a Go
//!    program whose stream grows through the run; `RssBound` says why); a drop passes,
//!    both figures are reported. Warm-up and last window are each 25 %
//!    of the run, capped at 60 s; a restarted process's warm-up starts at its restart
//!    (its "after warm-up" window is moved back to the last window's start if later).
//!    The soak process itself (the engines and their replay rings) is reported, not
//!    judged: its rings grow by design until full.
//!
//! Never: bind anything but loopback, leave a child running or unreaped on any exit path
//! (errors, panics and Ctrl-C included: guards kill and reap), leave its temporary
//! directory behind, or print (the command line does).

mod engines;
mod observe;
mod procs;
mod report;
mod run;
mod schedule;

pub use report::{ProcessRss, SoakReport, Verdict};
pub use run::{interrupt_flag, run_soak, SoakProgress};
pub use schedule::{Kill, Target};

use crate::nats::NatsError;
use crate::zmq::ZmqError;
use std::time::Duration;

/// The subject the soak's relays publish on.
const SUBJECT: &str = "kvtwin.soak.kv_events";

/// The soak's JetStream stream.
const STREAM: &str = "kvtwin-soak-kv-events";

/// Whether processes are killed during the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Chaos {
    /// `kill -9` and restart the nats-server, a relay and the router, each at least once.
    On,
    /// Nothing is killed: the run measures stability alone.
    Off,
}

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct SoakConfig {
    /// How long the engines publish.
    pub duration: Duration,
    /// Synthetic engines (each with its relay), worker ids 1..=N.
    pub engines: usize,
    /// Blocks stored per second, all engines together (evictions add as many removed
    /// once caches are full).
    pub rate_blocks_per_s: u64,
    /// Blocks each engine caches before it evicts.
    pub capacity_blocks: usize,
    /// Seeds the engines (engine i gets seed + i) and the kill schedule.
    pub seed: u64,
    /// Kills or not.
    pub chaos: Chaos,
    /// How long, after the engines stop, the router may take to match them.
    pub drain_timeout: Duration,
    /// How long, after a restart, the pipeline may take to carry every engine's events
    /// to the router again.
    pub recovery_timeout: Duration,
}

impl SoakConfig {
    /// One minute, two engines, 100 blocks/s, 512 blocks cached per engine, seed 1,
    /// chaos on, 60 s to drain and 60 s to recover from a kill: comfortable on two cores.
    /// The rate also sets how fast the nats-server's RSS climbs in its first minutes
    /// (JetStream caches the message block it is writing): at 200 blocks/s a restarted
    /// server of a one-minute run ended 6 to 10 % above its after-warm-up figure, at 100
    /// about 4 % (BENCHMARKS.md).
    pub fn new() -> Self {
        Self {
            duration: Duration::from_secs(60),
            engines: 2,
            rate_blocks_per_s: 100,
            capacity_blocks: 512,
            seed: 1,
            chaos: Chaos::On,
            drain_timeout: Duration::from_secs(60),
            recovery_timeout: Duration::from_secs(60),
        }
    }
}

impl Default for SoakConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The soak could not run (a failed verdict is not an error: it is in the report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SoakError {
    /// The NATS server could not be started or restarted, or a client failed.
    #[error("NATS: {0}")]
    Nats(#[from] NatsError),
    /// The JetStream stream could not be looked up.
    #[error("JetStream stream {stream}: {source}")]
    StreamInfo {
        /// The stream.
        stream: String,
        /// async-nats's error.
        source: async_nats::jetstream::context::GetStreamError,
    },
    /// An engine's publisher could not bind or send.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// The token file the soak wrote for its router could not be read back.
    #[error("the router's token: {0}")]
    Token(#[from] crate::service::auth::TokenError),
    /// A child process, thread, runtime or temporary directory could not be set up.
    #[error("could not {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A child process did not come up (its log's last lines say why).
    #[error("{process} did not start within {waited:?}; its log ends:\n{log}")]
    NotStarted {
        /// Which process.
        process: String,
        /// How long it was given.
        waited: Duration,
        /// The end of its log.
        log: String,
    },
    /// A child process exited on its own during the run.
    #[error("{process} exited unexpectedly ({status}); its log ends:\n{log}")]
    Exited {
        /// Which process.
        process: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// After a kill and restart, the pipeline did not carry every engine's events to the
    /// router again in time.
    #[error("no recovery within {waited:?} after the kill of {target}: {detail}")]
    NotRecovered {
        /// What was killed.
        target: Target,
        /// How long it was given.
        waited: Duration,
        /// What was still missing.
        detail: String,
    },
    /// Ctrl-C (or SIGTERM): every child was stopped.
    #[error("interrupted; every child process was stopped")]
    Interrupted,
    /// A configuration that cannot run.
    #[error("invalid configuration: {0}")]
    Config(&'static str),
}
