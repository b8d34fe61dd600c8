//! `kvtwin dash`'s flags, and the choice of source they make.
//!
//! Owns: [`DashArgs`] (one source per invocation: `--router` (with its token and CA),
//! `--zmq`, `--nats`, `--sim` or `--replay`; `--record`, `--speed`, `--once`) and [`dash`] (build the source, run
//! the loop or print one frame).
//! Never: fold updates or draw (the app and the ui do), or parse engine events.

use super::app::{AppConfig, SourceKind};
use super::record::{Recorder, Recording};
use super::replica_source::{NatsInput, ReplicaInput, ReplicaSource};
use super::router_source::RouterSource;
use super::run::{interactive, once, LoopConfig, OnceUntil};
use super::sim_source::{SimSource, TraceError};
use super::source::{ReplaySource, Source};
use crate::args::zmq::{parse_zmq_source, ZmqSourceArg};
use crate::cmd::router::BudgetArgs;
use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin_plane::service::auth::{load_token, TokenSource};
use kvtwin_plane::service::client::ClientAccess;
use kvtwin_plane::service::tls::client_config;
use kvtwin_sim::scenario::Scenario;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

/// Dynamo's subject for KV events without a namespace, as `kvtwin router` uses.
const DEFAULT_SUBJECT: &str = "kvtwin.kv_events";

/// `kvtwin dash`.
#[derive(Args, Debug)]
#[command(group(
    clap::ArgGroup::new("source")
        .required(true)
        .args(["router", "zmq", "nats", "sim", "replay"]),
))]
pub(crate) struct DashArgs {
    /// A running `kvtwin router` (its /v1/stream), e.g. http://127.0.0.1:8080 or
    /// https://router.example:8443.
    #[arg(long, value_name = "URL")]
    router: Option<String>,
    /// A file holding the router's bearer token (with --router); without it the
    /// KVTWIN_AUTH_TOKEN environment variable, if set.
    #[arg(long, value_name = "PATH", requires = "router")]
    router_token_file: Option<PathBuf>,
    /// The CA certificate (PEM) an https router's certificate is checked against, e.g.
    /// its own self-signed one (with --router); without it, the system's roots.
    #[arg(long, value_name = "PATH", requires = "router")]
    router_ca: Option<PathBuf>,
    /// Be a router replica fed by this engine's ZMQ KV events (repeat per engine).
    #[arg(long = "zmq", value_name = "WORKER_ID=ENDPOINT[,replay=ENDPOINT]", value_parser = parse_zmq_source)]
    zmq: Vec<ZmqSourceArg>,
    /// The engines' block size (with --zmq): batches of another size are refused.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// The replica's index budget (with --zmq or --nats), as `kvtwin router` keeps it.
    #[command(flatten)]
    budget: BudgetArgs,
    /// Be a router replica fed by Dynamo RouterEvents from this NATS server.
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// Credentials and TLS for a secured NATS server.
    #[command(flatten)]
    nats_auth: crate::args::nats::NatsAuthArgs,
    /// The NATS subject [default: kvtwin.kv_events].
    #[arg(long)]
    subject: Option<String>,
    /// Replay this JetStream stream from its start instead of core NATS.
    #[arg(long, value_name = "STREAM")]
    jetstream: Option<String>,
    /// Simulate this scenario and play it.
    #[arg(long, value_name = "SCENARIO")]
    sim: Option<PathBuf>,
    /// Replaces the scenario's seed (with --sim).
    #[arg(long)]
    seed: Option<u64>,
    /// Replaces the scenario's workload with a Mooncake-format trace (with --sim).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Play a recording.
    #[arg(long, value_name = "FILE")]
    replay: Option<PathBuf>,
    /// Play speed for --sim and --replay: simulated (recorded) seconds per second
    /// (--once plays flat out).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// With --replay --once: the frame at this many seconds into the recording (on its
    /// clock), instead of the last.
    #[arg(long, value_name = "SECONDS")]
    at: Option<f64>,
    /// Also write everything the source says to this recording.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Print one plain-text frame and exit: a simulation's or a recording's last, a
    /// router's first full picture, a replica's after --timeout.
    #[arg(long)]
    once: bool,
    /// Frame width for --once.
    #[arg(long, default_value_t = 160)]
    width: u16,
    /// Frame height for --once.
    #[arg(long, default_value_t = 48)]
    height: u16,
    /// How long --once waits for a live source (a router, a replica), seconds; a
    /// simulation or a recording plays to its end.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// A worker with no event for this long is stale, seconds.
    #[arg(long, default_value_t = 10.0)]
    stale_after: f64,
}

impl DashArgs {
    /// What clap cannot check.
    fn validate(&self) -> Result<()> {
        if !(self.speed.is_finite() && self.speed > 0.0) {
            bail!("--speed must be a positive number, not {}", self.speed);
        }
        if self.nats.is_none() && (self.subject.is_some() || self.jetstream.is_some()) {
            bail!("--subject and --jetstream need --nats");
        }
        if self.sim.is_none() && (self.seed.is_some() || self.trace.is_some()) {
            bail!("--seed and --trace need --sim");
        }
        if self.block_size == 0 {
            bail!("--block-size must be at least 1");
        }
        if self.width < 20 || self.height < 8 {
            bail!("--width and --height must be at least 20 and 8");
        }
        if self.at.is_some() && !(self.replay.is_some() && self.once) {
            bail!("--at needs --replay and --once");
        }
        if self.at.is_some_and(|at| !(at.is_finite() && at >= 0.0)) {
            bail!("--at must be a number of seconds, at least 0");
        }
        if !(self.timeout.is_finite() && self.timeout > 0.0) {
            bail!("--timeout must be a positive number of seconds");
        }
        Ok(())
    }
}

/// Runs `kvtwin dash`.
pub(crate) fn dash(args: &DashArgs) -> Result<()> {
    args.validate()?;
    if !args.once && !std::io::stdout().is_terminal() {
        bail!("standard output is not a terminal: run kvtwin dash in one, or add --once for a plain-text frame");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        let (source, kind, until) = open_source(args).await?;
        let recorder = match &args.record {
            Some(path) => Some(Recorder::create(path, &source.label())?),
            None => None,
        };
        let config = LoopConfig {
            app: AppConfig {
                source: source.label(),
                kind,
                stale_after_ms: (args.stale_after * 1e3) as u64,
                speed: args.speed,
                ..AppConfig::new(source.label(), kind)
            },
            recorder,
        };
        if args.once {
            let frame = once(
                source,
                config,
                until,
                Duration::from_secs_f64(args.timeout),
                (args.width, args.height),
            )
            .await?;
            print!("{frame}");
            Ok(())
        } else {
            interactive(source, config).await
        }
    })
}

/// The source the flags name, what kind it is, and when `--once` prints.
async fn open_source(args: &DashArgs) -> Result<(Box<dyn Source>, SourceKind, OnceUntil)> {
    if let Some(url) = &args.router {
        let access = ClientAccess {
            token: load_token(&TokenSource {
                file: args.router_token_file.clone(),
            })?,
            tls: match &args.router_ca {
                Some(ca) => Some(client_config(Some(ca))?),
                None => None,
            },
        };
        let source = RouterSource::start(url, access).context("--router")?;
        return Ok((Box::new(source), SourceKind::Router, OnceUntil::FirstFull));
    }
    if !args.zmq.is_empty() {
        let source = ReplicaSource::start(
            ReplicaInput::Zmq {
                sources: args.zmq.clone(),
                block_size: args.block_size,
            },
            args.budget.budget(),
        )
        .await?;
        return Ok((Box::new(source), SourceKind::Replica, OnceUntil::Deadline));
    }
    if let Some(url) = &args.nats {
        let source = ReplicaSource::start(
            ReplicaInput::Nats(Box::new(NatsInput {
                url: url.clone(),
                subject: args
                    .subject
                    .clone()
                    .unwrap_or_else(|| DEFAULT_SUBJECT.into()),
                jetstream: args.jetstream.clone(),
                auth: args.nats_auth.auth()?,
            })),
            args.budget.budget(),
        )
        .await?;
        return Ok((Box::new(source), SourceKind::Replica, OnceUntil::Deadline));
    }
    if let Some(path) = &args.sim {
        let mut scenario =
            Scenario::load(path).with_context(|| format!("loading scenario {}", path.display()))?;
        if let Some(seed) = args.seed {
            scenario.seed = seed;
        }
        let speed = if args.once { f64::INFINITY } else { args.speed };
        let source = match crate::cmd::run::requests_of(&scenario, path, args.trace.clone()) {
            crate::cmd::run::Requests::Trace(trace) => {
                let check = crate::args::trace::trace_check(&scenario, None);
                let reader = kvtwin_sim::workload::MooncakeTraceReader::open(&trace, check)
                    .with_context(|| format!("reading trace {}", trace.display()))?;
                // A bad line ends the requests there; the run goes on with those before
                // it, and the status line says why it ended when the run finishes.
                let error = TraceError::default();
                let first_error = error.clone();
                let requests = reader.map_while(move |request| match request {
                    Ok(request) => Some(request),
                    Err(e) => {
                        if let Ok(mut slot) = first_error.lock() {
                            slot.get_or_insert_with(|| e.to_string());
                        }
                        None
                    }
                });
                SimSource::start(scenario, requests, speed, error)
            }
            crate::cmd::run::Requests::Generated(mut requests) => {
                // Arrival order, as `simulate` puts them (a stable sort keeps ties in
                // generation order).
                requests.sort_by_key(|request| request.arrival);
                SimSource::start(scenario, requests, speed, TraceError::default())
            }
        };
        return Ok((Box::new(source), SourceKind::Sim, OnceUntil::End));
    }
    if let Some(path) = &args.replay {
        let recording = Recording::open(path)?;
        if recording.torn_tail {
            eprintln!(
                "kvtwin dash: {}: the last line was cut mid-write and is skipped",
                path.display()
            );
        }
        let label = format!("{} (recorded from {})", path.display(), recording.source);
        let speed = if args.once { f64::INFINITY } else { args.speed };
        let mut source = ReplaySource::new(recording, label, speed);
        if let Some(at) = args.at {
            source.end_at((at * 1e3) as u64);
        }
        return Ok((Box::new(source), SourceKind::Replay, OnceUntil::End));
    }
    bail!("name a source: --router, --zmq, --nats, --sim or --replay")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        dash: DashArgs,
    }

    #[test]
    fn a_replica_takes_the_routers_budget_flags_and_defaults() {
        let parse = |extra: &[&str]| {
            let args = ["dash", "--zmq", "1=tcp://127.0.0.1:5557"]
                .iter()
                .chain(extra)
                .copied();
            Cli::try_parse_from(args).unwrap().dash.budget.budget()
        };
        let default = parse(&[]);
        assert_eq!(default.max_blocks, Some(1 << 24));
        assert_eq!(default.max_blocks_per_worker, Some(1 << 22));
        let small = parse(&["--max-blocks", "100", "--max-blocks-per-worker", "0"]);
        assert_eq!(small.max_blocks, Some(100));
        assert_eq!(small.max_blocks_per_worker, None);
    }
}
