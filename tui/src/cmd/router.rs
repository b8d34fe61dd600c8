//! `kvtwin router` and `kvtwin relay`: the event plane's services from the command line.
//!
//! Owns: their flags, the strict parsing of `--zmq WORKER_ID=ENDPOINT[,replay=ENDPOINT]`
//! ([`ZmqSourceArg`]), the tokio runtime, and the wiring of library parts: a
//! `RouterState` fed by `ZmqSource`s or a `NatsSource` and served by `service::http`
//! (with the access flags: a token, `/metrics` open or not, TLS, and the refusal of a
//! non-loopback address without a token), or one `run_relay`. Both run until Ctrl-C (or
//! SIGTERM) and log to stderr, never the token. Stopping is bounded: the router stops
//! accepting and gives requests in flight [`STOP_GRACE`]; the relay publishes what it had
//! queued for `--drain-timeout-s` (10 s) and exits 1 if anything decoded was not
//! acknowledged.
//! Never: decode, translate or apply an event itself (`kvtwin_plane::service` does).

use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin::ids::WorkerId;
use kvtwin::router::indexer::IndexBudget;
use kvtwin_plane::nats::{
    ConsumeMode, NatsAuth, NatsMode, PublisherConfig as NatsPublisherConfig,
    SubscriberConfig as NatsSubscriberConfig,
};
use kvtwin_plane::service::auth::{
    check_exposure, load_token, Access, Exposure, MetricsAccess, TokenSource, TOKEN_ENV,
};
use kvtwin_plane::service::block_size::RouterBlockSize;
use kvtwin_plane::service::http::{app_full, serve_app, SharedState, Transport};
use kvtwin_plane::service::nats_source::{NatsSource, NatsSourceConfig};
use kvtwin_plane::service::relay::{
    run_relay_reporting, serve_metrics, NatsFormat, RelayConfig, RelayStats,
};
use kvtwin_plane::service::source::{start_vllm_source, ZmqSource};
use kvtwin_plane::service::state::{RouterLimits, RouterState};
use kvtwin_plane::service::tls::server_config;
use kvtwin_plane::wire::DecodeLimits;
use kvtwin_plane::zmq::SubscriberConfig;
use serde_json::json;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

/// How long a stopping router lets requests in flight finish.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Dynamo's subject for KV events without a namespace; ours by default.
pub(crate) const DEFAULT_SUBJECT: &str = "kvtwin.kv_events";

/// One engine a router subscribes to: `WORKER_ID=ENDPOINT[,replay=ENDPOINT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ZmqSourceArg {
    /// The worker id its events are indexed under.
    pub(crate) worker: u64,
    /// The engine's PUB endpoint.
    pub(crate) endpoint: String,
    /// The engine's replay ROUTER, if any.
    pub(crate) replay: Option<String>,
}

/// A ZMQ endpoint as libzmq takes it: `transport://address`, nothing around it.
fn check_endpoint(what: &str, endpoint: &str) -> Result<(), String> {
    match endpoint.split_once("://") {
        Some((transport, address))
            if !transport.is_empty()
                && !address.is_empty()
                && !endpoint.chars().any(char::is_whitespace) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{what} {endpoint:?} is not a ZMQ endpoint (transport://address, e.g. tcp://127.0.0.1:5557)"
        )),
    }
}

/// Parses `WORKER_ID=ENDPOINT[,replay=ENDPOINT]`; any other shape is an error that says
/// what was expected.
pub(crate) fn parse_zmq_source(text: &str) -> Result<ZmqSourceArg, String> {
    let expected = concat!(
        "expected WORKER_ID=ENDPOINT[,replay=ENDPOINT], ",
        "e.g. 1=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558"
    );
    let (worker, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: no worker id; {expected}"))?;
    let worker: u64 = worker.parse().map_err(|_| {
        format!("{text:?}: worker id {worker:?} is not an unsigned integer; {expected}")
    })?;
    let mut parts = rest.split(',');
    let endpoint = parts.next().unwrap_or_default();
    check_endpoint("endpoint", endpoint).map_err(|error| format!("{text:?}: {error}"))?;
    let mut replay = None;
    for option in parts {
        match option.split_once('=') {
            Some(("replay", value)) if replay.is_none() => {
                check_endpoint("replay endpoint", value)
                    .map_err(|error| format!("{text:?}: {error}"))?;
                replay = Some(value.to_string());
            }
            Some(("replay", _)) => return Err(format!("{text:?}: replay given twice")),
            _ => return Err(format!("{text:?}: unknown option {option:?}; {expected}")),
        }
    }
    Ok(ZmqSourceArg {
        worker,
        endpoint: endpoint.to_string(),
        replay,
    })
}

#[derive(Args, Debug)]
pub(crate) struct RouterArgs {
    /// Where the HTTP API listens (POST /v1/route, GET /v1/workers, GET /v1/stream,
    /// /healthz, /readyz, /metrics). An address other than loopback needs a token, or
    /// --insecure.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Tokens per block (the engines' block size): how queries' tokens are hashed. A ZMQ
    /// batch storing blocks of another size is refused (`block_size_mismatch`, shown in
    /// /v1/workers and /readyz). Without it the router takes the block size of the first
    /// BlockStored it sees, then holds every engine to it (/readyz waits until then).
    /// Needed with --nats: Dynamo's RouterEvents do not carry it.
    #[arg(long)]
    block_size: Option<u32>,
    /// An engine's KV event stream, vLLM / SGLang over ZMQ (repeat per engine).
    #[arg(
        long = "zmq",
        value_name = "WORKER_ID=ENDPOINT[,replay=ENDPOINT]",
        value_parser = parse_zmq_source,
        required_unless_present_any = ["nats", "engines"],
        conflicts_with = "nats"
    )]
    zmq: Vec<ZmqSourceArg>,
    /// Dynamo RouterEvents (JSON or 1.6 envelopes) from this NATS server.
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// Credentials and TLS for a secured NATS server.
    #[command(flatten)]
    nats_auth: crate::args::nats::NatsAuthArgs,
    /// The NATS subject [default: kvtwin.kv_events].
    #[arg(long)]
    subject: Option<String>,
    /// Consume this JetStream stream from its start (a restarted router rebuilds its
    /// state from it) instead of core NATS.
    #[arg(long, value_name = "STREAM")]
    jetstream: Option<String>,
    /// A file holding the API's bearer token (read once, trimmed); without it the
    /// KVTWIN_AUTH_TOKEN environment variable, if set. With a token every endpoint but
    /// /healthz and /readyz (and /metrics, unless --metrics-auth) needs
    /// `Authorization: Bearer <token>`; without one the API is open.
    #[arg(long, value_name = "PATH")]
    auth_token_file: Option<PathBuf>,
    /// /metrics needs the token too (by default it is open, for scrapers without secrets).
    #[arg(long)]
    metrics_auth: bool,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve on a non-loopback --listen address without a token (refused otherwise).
    #[arg(long)]
    insecure: bool,
    /// The index's memory budget.
    #[command(flatten)]
    budget: BudgetArgs,
    /// Blocks each worker declared it can hold, all tiers (vLLM's events do not carry
    /// it): a rank reporting more is flagged `over_declared` in GET /v1/workers and
    /// /metrics. Unset: not checked.
    #[arg(long, value_name = "BLOCKS")]
    worker_capacity_blocks: Option<u64>,
    /// Log lines as text or as one JSON object each (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    log_format: crate::logging::LogFormat,
    /// The OpenAI front door (`--engine`).
    #[command(flatten)]
    frontend: crate::args::frontend::FrontendArgs,
    /// A shared store's KV events (`kvtwin store --events-*`).
    #[command(flatten)]
    shared: crate::args::shared::SharedArgs,
}

/// `--max-blocks` by default: 2^24 blocks.
const DEFAULT_MAX_BLOCKS: u64 = 1 << 24;

/// `--max-blocks-per-worker` by default: 2^22 blocks.
const DEFAULT_MAX_BLOCKS_PER_WORKER: u64 = 1 << 22;

/// The index budget's flags: `kvtwin router`'s, and `kvtwin dash`'s as a replica (which
/// keeps the same index and so needs the same bound).
#[derive(Args, Clone, Debug)]
pub(crate) struct BudgetArgs {
    /// Distinct blocks the index holds at most, all workers together (0: no cap). Past
    /// it, the worker holding the most loses its least recently used leaves (a cache
    /// miss later, never a wrong answer). The default, 2^24, is about 1.5 GB at the
    /// measured ~90 bytes a block (index and engine hashes; BENCHMARKS.md): well inside
    /// a 24 GiB machine.
    #[arg(long, default_value_t = DEFAULT_MAX_BLOCKS, value_name = "BLOCKS")]
    max_blocks: u64,
    /// Blocks one worker rank holds in the index at most (0: no cap); past it, that
    /// rank's least recently stored or matched leaves are evicted. The default, 2^22,
    /// is above any single engine's cache we know (an 80 GB GPU holds ~10^5 blocks of
    /// 16 tokens, with host and disk tiers ~10^6), so only a flood or a leak reaches it.
    #[arg(long, default_value_t = DEFAULT_MAX_BLOCKS_PER_WORKER, value_name = "BLOCKS")]
    max_blocks_per_worker: u64,
}

impl BudgetArgs {
    /// The budget the flags set (0 is no cap).
    pub(crate) fn budget(&self) -> IndexBudget {
        let cap = |blocks: u64| (blocks > 0).then(|| usize::try_from(blocks).unwrap_or(usize::MAX));
        IndexBudget {
            max_blocks: cap(self.max_blocks),
            max_blocks_per_worker: cap(self.max_blocks_per_worker),
            ..IndexBudget::UNBOUNDED
        }
    }
}

impl RouterArgs {
    /// The state's limits from the flags (0 is no cap).
    fn limits(&self) -> RouterLimits {
        RouterLimits {
            budget: self.budget.budget(),
            worker_capacity_blocks: self.worker_capacity_blocks,
            ..RouterLimits::default()
        }
    }

    /// What clap cannot check: NATS options only with `--nats` (its `requires` is not
    /// enforced against an argument that conflicts with a present one), distinct worker
    /// ids, a block size.
    fn validate(&self) -> Result<()> {
        self.frontend.validate()?;
        if self.nats.is_none() {
            if self.subject.is_some() {
                bail!("--subject needs --nats");
            }
            if self.jetstream.is_some() {
                bail!("--jetstream needs --nats");
            }
        }
        self.shared.validate()?;
        let mut workers = BTreeSet::new();
        for source in &self.zmq {
            if !workers.insert(source.worker) {
                bail!("--zmq: worker id {} given twice", source.worker);
            }
        }
        match self.block_size {
            Some(0) => bail!("--block-size must be at least 1"),
            None if self.nats.is_some() => bail!(
                "--nats needs --block-size: Dynamo's RouterEvents do not carry the engines' \
                 block size, so the router cannot learn it from them"
            ),
            _ => {}
        }
        Ok(())
    }

    /// Who may call the API, from the token flags (the file read here, once), and the
    /// refusal of an open non-loopback address.
    fn access(&self) -> Result<Access> {
        let token = load_token(&TokenSource {
            file: self.auth_token_file.clone(),
        })?;
        if self.metrics_auth && token.is_none() {
            bail!("--metrics-auth needs a token (--auth-token-file PATH or {TOKEN_ENV})");
        }
        let access = Access {
            token,
            metrics: if self.metrics_auth {
                MetricsAccess::Token
            } else {
                MetricsAccess::Open
            },
        };
        let exposure = if self.insecure {
            Exposure::Open
        } else {
            Exposure::LoopbackUnlessToken
        };
        check_exposure(self.listen, &access, exposure)?;
        Ok(access)
    }

    /// Plain HTTP, or HTTPS with the certificate and key given.
    fn transport(&self) -> Result<Transport> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Ok(Transport::Tls(server_config(cert, key)?)),
            (None, None) => Ok(Transport::Plain),
            _ => bail!("--tls-cert and --tls-key go together"),
        }
    }
}

/// How the start-up line describes who may call the API (never the token itself).
fn describe_access(args: &RouterArgs, access: &Access) -> String {
    if access.token.is_none() {
        return if args.listen.ip().is_loopback() {
            String::new()
        } else {
            "; WARNING: no token on a non-loopback address (--insecure)".to_string()
        };
    }
    let from = match &args.auth_token_file {
        Some(path) => path.display().to_string(),
        None => TOKEN_ENV.to_string(),
    };
    let open = match access.metrics {
        MetricsAccess::Open => "/healthz, /readyz, /metrics",
        MetricsAccess::Token => "/healthz, /readyz",
    };
    format!("; bearer token from {from} required except on {open}")
}

#[derive(Args, Debug)]
pub(crate) struct RelayArgs {
    /// The engine's ZMQ KV event stream.
    #[arg(long, value_name = "ENDPOINT", value_parser = zmq_endpoint)]
    zmq: String,
    /// The engine's replay socket (gaps and a late start are filled from it).
    #[arg(long, value_name = "ENDPOINT", value_parser = zmq_endpoint)]
    replay: Option<String>,
    /// The NATS server.
    #[arg(long, value_name = "URL")]
    nats: String,
    /// Credentials and TLS for a secured NATS server.
    #[command(flatten)]
    nats_auth: crate::args::nats::NatsAuthArgs,
    /// The engine's worker id in the events.
    #[arg(long)]
    worker_id: u64,
    /// The NATS subject.
    #[arg(long, default_value = DEFAULT_SUBJECT)]
    subject: String,
    /// Publish into this JetStream stream (created when missing) instead of core NATS.
    #[arg(long, value_name = "STREAM")]
    jetstream: Option<String>,
    /// Dynamo 1.6 msgpack envelopes (up to 128 events each) instead of one JSON event
    /// per message.
    #[arg(long)]
    envelope: bool,
    /// On SIGTERM or Ctrl-C, how long to keep publishing what was queued (JetStream:
    /// waiting for each ack) before giving up on the rest; events given up on make the
    /// exit status 1.
    #[arg(long, default_value_t = 10, value_name = "SECONDS")]
    drain_timeout_s: u64,
    /// Also print the stats line (the one printed at exit) every this many milliseconds
    /// while it changes, so a supervisor knows what was published and acknowledged even if
    /// the relay is killed (`kvtwin bench soak` reads it).
    #[arg(long, value_name = "MS")]
    stats_every_ms: Option<u64>,
    /// Serve the stats as Prometheus metrics (`GET /metrics`, OpenMetrics text, and
    /// `GET /healthz`) on this address (port 0: a free one, logged). The counters are
    /// open to anyone who reaches the address.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Log lines as text or as one JSON object each (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    log_format: crate::logging::LogFormat,
}

fn zmq_endpoint(text: &str) -> Result<String, String> {
    check_endpoint("endpoint", text).map(|()| text.to_string())
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// A watch that turns true on Ctrl-C (or SIGTERM), and a future per subscriber that
/// resolves then. The handlers are installed before this returns, so a signal sent as
/// soon as the caller says it is ready is never missed: until then SIGINT keeps the
/// disposition the process inherited, which under a parent that ignores it (a
/// non-interactive shell's `&`) would make Ctrl-C do nothing at all.
pub(crate) fn stop_on_signal() -> Result<watch::Sender<bool>> {
    let (stop, _) = watch::channel(false);
    let sender = stop.clone();
    #[cfg(unix)]
    let (mut interrupt, mut terminate) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        )
    };
    tokio::spawn(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("stopping");
        signal_stop(&sender);
    });
    Ok(stop)
}

/// Turns the stop watch true, whether or not anything listens yet: a signal can come
/// before the first `stopped` subscribes (right after the router says it listens), and
/// `watch::Sender::send` with no receiver leaves the value as it was, which had left a
/// router interrupted at that moment running forever.
fn signal_stop(stop: &watch::Sender<bool>) {
    stop.send_replace(true);
}

pub(crate) fn stopped(
    stop: &watch::Sender<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut receiver = stop.subscribe();
    async move {
        let _ = receiver.wait_for(|stop| *stop).await;
    }
}

/// Subscribes to each engine of `sources`, applying their events to `state` (the router
/// service's sources, also a dashboard replica's); stopped when dropped.
/// Prints nothing: callers say what they started ([`describe_zmq_source`]), a dashboard
/// cannot print under its screen.
pub(crate) fn start_zmq_sources(
    sources: &[ZmqSourceArg],
    state: &SharedState,
) -> Result<Vec<ZmqSource>> {
    sources
        .iter()
        .map(|source| {
            start_vllm_source(
                WorkerId::new(source.worker),
                &source.endpoint,
                source.replay.as_deref(),
                state,
            )
            .with_context(|| format!("subscribing to {}", source.endpoint))
        })
        .collect()
}

/// "worker W from ENDPOINT (replay ENDPOINT)".
pub(crate) fn describe_zmq_source(source: &ZmqSourceArg) -> String {
    format!(
        "worker {} from {}{}",
        source.worker,
        source.endpoint,
        source
            .replay
            .as_deref()
            .map(|replay| format!(" (replay {replay})"))
            .unwrap_or_default()
    )
}

/// Subscribes to Dynamo RouterEvents on `subject` at `url`: core NATS, or a JetStream
/// stream replayed from its start.
pub(crate) async fn connect_nats(
    url: &str,
    subject: &str,
    jetstream: Option<&str>,
    auth: &NatsAuth,
) -> Result<NatsSource> {
    let mode = match jetstream {
        Some(stream) => ConsumeMode::Replay {
            stream: stream.to_string(),
        },
        None => ConsumeMode::Core,
    };
    let mut subscriber = NatsSubscriberConfig::new(url, subject, mode);
    subscriber.connect.auth = auth.clone();
    let source = NatsSource::connect(NatsSourceConfig {
        subscriber,
        limits: DecodeLimits::default(),
    })
    .await
    .with_context(|| format!("subscribing to {subject} on {url}"))?;
    Ok(source)
}

pub(crate) fn router(args: &RouterArgs) -> Result<()> {
    crate::logging::init(args.log_format, crate::logging::SERVICE_DEFAULT)?;
    args.validate()?;
    // Before the runtime and the socket: a bad token or certificate stops the start.
    let access = args.access()?;
    let transport = args.transport()?;
    let scheme = match transport {
        Transport::Tls(_) => "https",
        _ => "http",
    };
    let access_line = describe_access(args, &access);
    let subject = args.subject.as_deref().unwrap_or(DEFAULT_SUBJECT);
    runtime()?.block_on(async {
        let stop = stop_on_signal()?;
        let limits = args.limits();
        let block_size = args
            .block_size
            .map_or_else(RouterBlockSize::learned, RouterBlockSize::fixed);
        let state: SharedState =
            Arc::new(Mutex::new(RouterState::with_block_size(block_size, limits)));
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let address = listener.local_addr().context("the listening address")?;

        // Dropped (stopped) when the server returns; an engine's is the front door's.
        let zmq_sources = start_zmq_sources(&args.zmq, &state)?;
        for source in &args.zmq {
            tracing::info!("kvtwin router: {}", describe_zmq_source(source));
        }
        let (frontend, zmq_sources) = crate::args::frontend::start_frontend(
            &args.frontend,
            args.block_size,
            &state,
            &args.zmq,
            zmq_sources,
        )?;
        for engine in &args.frontend.engines {
            tracing::info!("kvtwin router: engine {} at {}", engine.worker, engine.url);
        }
        let health_task = frontend
            .clone()
            .map(|frontend| tokio::spawn(frontend.run_health_checks(stopped(&stop))));
        let (shared_source, shared_task) =
            crate::args::shared::start_shared(&args.shared, &args.nats_auth, &state, &stop).await?;
        let mut nats_task = None;
        if let Some(url) = &args.nats {
            let source = connect_nats(
                url,
                subject,
                args.jetstream.as_deref(),
                &args.nats_auth.auth()?,
            )
            .await?;
            tracing::info!(
                "kvtwin router: events from {url}, subject {subject}{}",
                args.jetstream
                    .as_deref()
                    .map(|stream| format!(", JetStream stream {stream} replayed from its start"))
                    .unwrap_or_else(|| ", core NATS".to_string())
            );
            nats_task = Some(tokio::spawn(source.run(state.clone(), stopped(&stop))));
        }
        let front_door = if frontend.is_some() {
            "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, /v1/engines, "
        } else {
            ""
        };
        tracing::info!(
            "kvtwin router: listening on {scheme}://{address} ({front_door}POST /v1/route, GET \
             /v1/workers, GET /v1/stream, /healthz, /readyz, /metrics), block size {}, max \
             blocks {}, per worker {}{access_line}",
            args.block_size.map_or_else(
                || "learned from the first BlockStored".to_string(),
                |size| size.to_string()
            ),
            describe_cap(limits.budget.max_blocks),
            describe_cap(limits.budget.max_blocks_per_worker),
        );
        // Stop accepting at the signal and let requests in flight finish, for at most
        // STOP_GRACE: a `/v1/stream` client never finishes by itself.
        let app = app_full(state.clone(), access, frontend.clone());
        let serving = serve_app(listener, app, transport, stopped(&stop));
        let grace = {
            let stopping = stopped(&stop);
            async move {
                stopping.await;
                tokio::time::sleep(STOP_GRACE).await;
            }
        };
        tokio::select! {
            served = serving => served.context("serving HTTP")?,
            () = grace => tracing::warn!(
                "requests still open {} s after the stop (stream clients); closing them",
                STOP_GRACE.as_secs()
            ),
        }
        signal_stop(&stop);
        if let Some(task) = nats_task {
            let stats = task
                .await
                .context("the NATS source task")?
                .context("the NATS source")?;
            tracing::info!(
                "kvtwin router: NATS messages {}, events {}, refused {}",
                stats.messages,
                stats.events,
                stats.refused
            );
        }
        if let Some(task) = health_task {
            let _ = task.await;
        }
        if let Some(task) = shared_task {
            let _ = task.await;
        }
        drop(shared_source);
        if let Some(frontend) = frontend {
            // Stops the engines' event sources (joined off the runtime's workers).
            tokio::task::spawn_blocking(move || drop(frontend))
                .await
                .context("stopping the engines' sources")?;
        }
        drop(zmq_sources);
        Ok(())
    })
}

fn describe_cap(cap: Option<usize>) -> String {
    cap.map_or_else(|| "unbounded".to_string(), |blocks| blocks.to_string())
}

pub(crate) fn relay(args: &RelayArgs) -> Result<()> {
    crate::logging::init(args.log_format, crate::logging::SERVICE_DEFAULT)?;
    let mode = match &args.jetstream {
        Some(stream) => NatsMode::JetStream {
            stream: stream.clone(),
        },
        None => NatsMode::Core,
    };
    let worker = WorkerId::new(args.worker_id);
    let config = RelayConfig {
        worker,
        zmq: SubscriberConfig::new(&args.zmq, args.replay.as_deref()),
        nats: {
            let mut nats = NatsPublisherConfig::new(&args.nats, &args.subject, mode);
            nats.connect.auth = args.nats_auth.auth()?;
            nats
        },
        format: if args.envelope {
            NatsFormat::Envelope {
                publisher_id: args.worker_id,
            }
        } else {
            NatsFormat::Json
        },
        limits: DecodeLimits::default(),
        // A NATS server restart (a few seconds of reconnecting) costs time, not events.
        publish_attempts: 40,
        drain_timeout: Duration::from_secs(args.drain_timeout_s),
    };
    let stats = runtime()?.block_on(async {
        let stop = stop_on_signal()?;
        tracing::info!(
            "kvtwin relay: worker {} from {}{} to {} subject {} ({}, {})",
            args.worker_id,
            args.zmq,
            args.replay
                .as_deref()
                .map(|replay| format!(" (replay {replay})"))
                .unwrap_or_default(),
            args.nats,
            args.subject,
            args.jetstream
                .as_deref()
                .map(|stream| format!("JetStream stream {stream}"))
                .unwrap_or_else(|| "core NATS".to_string()),
            if args.envelope { "envelopes" } else { "JSON" }
        );
        let progress = (args.stats_every_ms.is_some() || args.metrics_listen.is_some())
            .then(|| watch::channel(RelayStats::default()).0);
        if let (Some(address), Some(sender)) = (args.metrics_listen, &progress) {
            let listener = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("--metrics-listen {address}"))?;
            let address = listener.local_addr().context("the metrics address")?;
            tracing::info!("kvtwin relay: metrics on http://{address}/metrics");
            let serving = serve_metrics(listener, sender.subscribe(), worker, stopped(&stop));
            tokio::spawn(async move {
                if let Err(error) = serving.await {
                    tracing::warn!(%error, "the metrics listener failed");
                }
            });
        }
        if let (Some(ms), Some(sender)) = (args.stats_every_ms, &progress) {
            let mut receiver = sender.subscribe();
            let every = std::time::Duration::from_millis(ms.max(1));
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(every);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                loop {
                    ticks.tick().await;
                    match receiver.has_changed() {
                        Ok(true) => println!("{}", stats_json(&receiver.borrow_and_update())),
                        Ok(false) => {}
                        Err(_) => break,
                    }
                }
            });
        }
        anyhow::Ok(run_relay_reporting(config, stopped(&stop), progress).await?)
    })?;
    println!("{}", stats_json(&stats));
    if stats.unacknowledged() > 0 {
        bail!(
            "not everything decoded was acknowledged: {} publish(es) failed, {} event(s) still \
             queued when the {} s drain ran out",
            stats.publish_failures,
            stats.abandoned_events,
            args.drain_timeout_s
        );
    }
    Ok(())
}

/// The relay's stats line: one JSON object.
fn stats_json(stats: &RelayStats) -> serde_json::Value {
    json!({
        "batches": stats.batches,
        "events": stats.events,
        "blocks": stats.blocks,
        "messages": stats.messages,
        "publish_failures": stats.publish_failures,
        "restarts": stats.restarts,
        "lost_batches": stats.lost_batches,
        "dropped": stats.dropped,
        "abandoned_events": stats.abandoned_events,
        "zmq_reconnects": stats.zmq_reconnects,
        "zmq_disconnects": stats.zmq_disconnects,
        "nats_reconnects": stats.nats_reconnects,
        "salt_evictions": stats.salt_evictions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_signalled_before_anything_listens_still_stops_later_listeners() {
        let (stop, first) = watch::channel(false);
        drop(first);
        signal_stop(&stop);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let late = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), stopped(&stop)).await
        });
        assert!(
            late.is_ok(),
            "a listener subscribed after the signal never stopped"
        );
    }

    #[test]
    fn zmq_sources_parse_with_and_without_replay() {
        assert_eq!(
            parse_zmq_source("1=tcp://127.0.0.1:5557"),
            Ok(ZmqSourceArg {
                worker: 1,
                endpoint: "tcp://127.0.0.1:5557".into(),
                replay: None,
            })
        );
        assert_eq!(
            parse_zmq_source("18446744073709551615=ipc:///tmp/kv,replay=tcp://10.0.0.2:5558"),
            Ok(ZmqSourceArg {
                worker: u64::MAX,
                endpoint: "ipc:///tmp/kv".into(),
                replay: Some("tcp://10.0.0.2:5558".into()),
            })
        );
    }

    #[test]
    fn malformed_zmq_sources_are_refused_with_what_was_expected() {
        for (text, says) in [
            ("tcp://127.0.0.1:5557", "no worker id"),
            ("5557", "no worker id"),
            ("-1=tcp://h:1", "not an unsigned integer"),
            ("w=tcp://h:1", "not an unsigned integer"),
            ("1=", "not a ZMQ endpoint"),
            ("1=127.0.0.1:5557", "not a ZMQ endpoint"),
            ("1=tcp://", "not a ZMQ endpoint"),
            ("1=tcp://h:1,", "unknown option"),
            ("1=tcp://h:1,replay", "unknown option"),
            ("1=tcp://h:1,replay=", "not a ZMQ endpoint"),
            ("1=tcp://h:1,replay=h:2", "not a ZMQ endpoint"),
            (
                "1=tcp://h:1,replay=tcp://h:2,replay=tcp://h:3",
                "replay given twice",
            ),
            ("1=tcp://h:1,topic=kv", "unknown option"),
            ("1=tcp://h 1", "not a ZMQ endpoint"),
        ] {
            let error = parse_zmq_source(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }

    #[test]
    fn the_router_takes_zmq_or_nats_and_refuses_both_or_neither() {
        use clap::Parser;
        #[derive(Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            router: RouterArgs,
        }
        let parsed = Cli::try_parse_from([
            "router",
            "--zmq",
            "1=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558",
            "--zmq",
            "2=tcp://127.0.0.1:5567",
            "--block-size",
            "32",
        ])
        .unwrap();
        assert_eq!(parsed.router.zmq.len(), 2);
        assert_eq!(parsed.router.block_size, Some(32));
        assert_eq!(parsed.router.listen.to_string(), "127.0.0.1:8080");
        let limits = parsed.router.limits();
        assert_eq!(limits.budget.max_blocks, Some(1 << 24));
        assert_eq!(limits.budget.max_blocks_per_worker, Some(1 << 22));
        assert_eq!(limits.worker_capacity_blocks, None);
        let unbounded = Cli::try_parse_from([
            "router",
            "--zmq",
            "1=tcp://h:1",
            "--max-blocks",
            "0",
            "--max-blocks-per-worker",
            "0",
            "--worker-capacity-blocks",
            "5000",
        ])
        .unwrap()
        .router
        .limits();
        assert!(!unbounded.budget.is_bounded());
        assert_eq!(unbounded.worker_capacity_blocks, Some(5000));
        let nats = [
            "router",
            "--nats",
            "nats://127.0.0.1:4222",
            "--jetstream",
            "kv",
        ];
        let parsed = Cli::try_parse_from(nats).unwrap();
        assert_eq!(parsed.router.jetstream.as_deref(), Some("kv"));
        // RouterEvents carry no block size: a NATS router must be told it.
        let error = parsed.router.validate().unwrap_err().to_string();
        assert!(error.contains("--nats needs --block-size"), "{error}");
        let parsed = Cli::try_parse_from(nats.into_iter().chain(["--block-size", "16"])).unwrap();
        assert!(parsed.router.validate().is_ok());
        // A ZMQ router without one learns it.
        let learning = Cli::try_parse_from(["router", "--zmq", "1=tcp://h:1"]).unwrap();
        assert_eq!(learning.router.block_size, None);
        assert!(learning.router.validate().is_ok());
        assert!(Cli::try_parse_from(["router"]).is_err());
        assert!(
            Cli::try_parse_from(["router", "--zmq", "1=tcp://h:1", "--nats", "nats://h:4222"])
                .is_err()
        );
        for extra in [["--jetstream", "kv"], ["--subject", "kv.events"]] {
            let args = ["router", "--zmq", "1=tcp://h:1"].into_iter().chain(extra);
            let error = Cli::try_parse_from(args)
                .unwrap()
                .router
                .validate()
                .unwrap_err();
            assert!(error.to_string().contains("needs --nats"), "{error}");
        }
        let twice = ["router", "--zmq", "1=tcp://h:1", "--zmq", "1=tcp://h:2"];
        let error = Cli::try_parse_from(twice)
            .unwrap()
            .router
            .validate()
            .unwrap_err();
        assert!(error.to_string().contains("given twice"), "{error}");
        let error = Cli::try_parse_from(["router", "--zmq", "1=h:1"]).unwrap_err();
        assert!(error.to_string().contains("not a ZMQ endpoint"), "{error}");
    }

    #[test]
    fn the_access_flags_parse_and_tls_needs_both_files() {
        use clap::Parser;
        #[derive(Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            router: RouterArgs,
        }
        let zmq = ["router", "--zmq", "1=tcp://h:1"];
        let parsed = Cli::try_parse_from(zmq.into_iter().chain([
            "--auth-token-file",
            "/run/token",
            "--metrics-auth",
            "--tls-cert",
            "c.pem",
            "--tls-key",
            "k.pem",
            "--insecure",
        ]))
        .unwrap()
        .router;
        assert_eq!(
            parsed.auth_token_file.as_deref(),
            Some(std::path::Path::new("/run/token"))
        );
        assert!(parsed.metrics_auth && parsed.insecure);
        for half in [["--tls-cert", "c.pem"], ["--tls-key", "k.pem"]] {
            let error = Cli::try_parse_from(zmq.into_iter().chain(half)).unwrap_err();
            assert!(error.to_string().contains("--tls-"), "{error}");
        }
        // No flags: no token wanted, plain HTTP, on loopback.
        let plain = Cli::try_parse_from(zmq).unwrap().router;
        assert!(!plain.metrics_auth && !plain.insecure && plain.tls_cert.is_none());
        assert!(matches!(plain.transport().unwrap(), Transport::Plain));
    }
}
