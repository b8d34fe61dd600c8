//! `kvtwin router`: a routing service fed by engine KV events (ZMQ, one `--zmq` per
//! engine, or NATS), answering over HTTP/JSON until Ctrl-C (or SIGTERM).
//!
//! Owns: its flags (with [`BudgetArgs`], the index budget a dashboard replica shares) and
//! the wiring of library parts: a `RouterState` fed by `ZmqSource`s or a `NatsSource`
//! and served by `service::http` (with the access flags: a token, `/metrics` open or
//! not, TLS, and the refusal of a non-loopback address without a token), the OpenAI
//! front door (`args::frontend`) and a shared store's events (`args::shared`). It logs
//! to stderr, never the token. Stopping is bounded: the router stops accepting and gives
//! requests in flight [`STOP_GRACE`].
//! Never: decode, translate or apply an event itself (`kvtwin_plane::service` does).

use crate::args::nats::{connect_nats, DEFAULT_SUBJECT};
use crate::args::zmq::{describe_zmq_source, parse_zmq_source, start_zmq_sources, ZmqSourceArg};
use crate::runtime::{runtime, signal_stop, stop_on_signal, stopped};
use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin::router::indexer::IndexBudget;
use kvtwin_plane::service::auth::{
    check_exposure, load_token, Access, Exposure, MetricsAccess, TokenSource, TOKEN_ENV,
};
use kvtwin_plane::service::block_size::RouterBlockSize;
use kvtwin_plane::service::http::{app_full, serve_app, SharedState, Transport};
use kvtwin_plane::service::state::{RouterLimits, RouterState};
use kvtwin_plane::service::tls::server_config;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a stopping router lets requests in flight finish.
const STOP_GRACE: Duration = Duration::from_secs(10);

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

#[cfg(test)]
mod tests {
    use super::*;

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
