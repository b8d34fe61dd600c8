//! `kvtwin store`: the shared KV block store (G4) as a server: its tiers built from the
//! flags (DRAM; a local directory for the disk tier; a local directory, or with the
//! `s3` feature an S3-compatible bucket, for the object tier), what they already hold
//! found again, and the Redis protocol served on `--listen` until Ctrl-C.
//!
//! With `--events-zmq` and / or `--events-nats`, the store publishes KV events of the
//! blocks it holds (kvtwin's connector's frames) so routers credit the shared tier: the
//! transports' publishers start before the store opens, so the blocks a restarted store
//! finds are announced before it serves.
//!
//! Owns: the flags, sizes as people write them (`64MiB`, `2GB`), the token, the start-up
//! line, the wiring of the event transports. Never: the store's logic (`kvtwin_store`),
//! or the events' (`kvtwin_store::events`).

use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin::ids::WorkerId;
use kvtwin_plane::nats::{NatsMode, NatsPublisher, PublisherConfig as NatsPublisherConfig};
use kvtwin_plane::zmq::{PublisherConfig as ZmqPublisherConfig, ZmqPublisher};
use kvtwin_store::events::{publish, StoreEvents, DEFAULT_QUEUE_EVENTS, DEFAULT_WORKER_ID};
use kvtwin_store::resp::Limits;
use kvtwin_store::server::{serve, ServerConfig};
use kvtwin_store::store::{Store, StoreConfig};
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The environment variable a token may come from, kept off `ps`.
const TOKEN_ENV: &str = "KVTWIN_STORE_TOKEN";

#[derive(Args, Debug)]
pub(crate) struct StoreArgs {
    /// Where to serve the Redis protocol (port 0: any free one, printed).
    #[arg(long, default_value = "127.0.0.1:6380")]
    listen: SocketAddr,
    /// DRAM tier's bound (bytes, or with KB, MB, GB, KiB, MiB, GiB).
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    memory: u64,
    /// The disk tier's directory (made if missing; what it holds is found again on a
    /// restart).
    #[arg(long, value_name = "DIR")]
    disk_dir: Option<PathBuf>,
    /// The disk tier's bound.
    #[arg(long, value_name = "SIZE", default_value = "16GiB", value_parser = parse_size, requires = "disk_dir")]
    disk: u64,
    /// The object tier: a local directory (made if missing).
    #[arg(long, value_name = "DIR")]
    object_dir: Option<PathBuf>,
    /// The object tier's bound.
    #[arg(long, value_name = "SIZE", default_value = "256GiB", value_parser = parse_size, requires = "object_dir")]
    object: u64,
    /// The largest value taken.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = parse_size)]
    max_value: u64,
    /// Leave a value read off disk or the object tier where it lies (by default it moves
    /// to DRAM, its hot copy).
    #[arg(long)]
    no_promote: bool,
    /// Serve `GET /metrics` (OpenMetrics: kvtwin_store_* by tier) and `/healthz` here.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Clients served at once.
    #[arg(long, default_value_t = 1024)]
    max_clients: usize,
    /// A file holding the password clients must AUTH with (read once, trimmed);
    /// without it the KVTWIN_STORE_TOKEN environment variable, if set.
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// Serve TLS with this certificate chain (PEM, leaf first): clients connect with
    /// `rediss://` or `redis-cli --tls`; needs --tls-key.
    #[arg(long, value_name = "PATH", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "PATH", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Log lines as text or as one JSON object each (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    log_format: crate::logging::LogFormat,
    /// Where its KV events go.
    #[command(flatten)]
    events: EventArgs,
}

/// `kvtwin store`'s KV events: the blocks it holds, for routers (medium EXTERNAL).
#[derive(Args, Debug)]
pub(crate) struct EventArgs {
    /// Publish KV events in vLLM's format on a ZMQ PUB socket bound here (e.g.
    /// `tcp://*:5600`; port `*` picks one, printed): `kvtwin router --shared-events`.
    #[arg(long, value_name = "ENDPOINT")]
    events_zmq: Option<String>,
    /// The replay ROUTER beside --events-zmq (vLLM's replay protocol: a router that
    /// missed batches asks for them); the last 10,000 batches are kept.
    #[arg(long, value_name = "ENDPOINT", requires = "events_zmq")]
    events_replay: Option<String>,
    /// Publish KV events as Dynamo's RouterEvent JSON on this NATS server.
    #[arg(long, value_name = "URL")]
    events_nats: Option<String>,
    /// The NATS subject of the events.
    #[arg(long, value_name = "SUBJECT", default_value = DEFAULT_EVENTS_SUBJECT, requires = "events_nats")]
    events_subject: String,
    /// Publish into this JetStream stream (created with the subject when missing), so a
    /// router started later replays them, instead of core NATS.
    #[arg(long, value_name = "STREAM", requires = "events_nats")]
    events_jetstream: Option<String>,
    /// Credentials and TLS for a secured NATS server.
    #[command(flatten)]
    nats_auth: crate::args::nats::NatsAuthArgs,
    /// The worker id the events carry [default: 7743504665528911668, the bytes of
    /// "kvtwinG4"].
    #[arg(long, value_name = "ID")]
    events_worker_id: Option<u64>,
    /// Events each transport queues at most while its publisher is behind; past it the
    /// newest are dropped and counted (INFO, /metrics): the store never waits for them.
    #[arg(long, value_name = "EVENTS", default_value_t = DEFAULT_QUEUE_EVENTS)]
    events_queue: usize,
}

/// The NATS subject of the store's events by default: apart from the engines'
/// (`kvtwin.kv_events`), as a router keeps the shared tier's index apart.
pub(crate) const DEFAULT_EVENTS_SUBJECT: &str = "kvtwin.shared.kv_events";

/// The event transports started, and what the start-up line says of them.
struct StartedEvents {
    events: Option<Arc<StoreEvents>>,
    described: String,
    /// The ZMQ publisher's thread (it ends when the store is dropped).
    _zmq: Option<std::thread::JoinHandle<()>>,
}

/// Binds and connects the transports the flags name, their publishers running (the
/// NATS one on the current runtime).
async fn start_events(args: &EventArgs) -> Result<StartedEvents> {
    if args.events_zmq.is_none() && args.events_nats.is_none() {
        return Ok(StartedEvents {
            events: None,
            described: String::new(),
            _zmq: None,
        });
    }
    let worker = WorkerId::new(args.events_worker_id.unwrap_or(DEFAULT_WORKER_ID));
    let mut events = StoreEvents::new();
    let mut described = format!("; KV events as worker {}", worker.get());
    let mut zmq = None;
    if let Some(endpoint) = &args.events_zmq {
        let config = ZmqPublisherConfig::new(endpoint, args.events_replay.as_deref());
        let publisher =
            ZmqPublisher::bind(&config).with_context(|| format!("--events-zmq {endpoint}"))?;
        described.push_str(&format!(" on {}", publisher.endpoint()));
        if let Some(replay) = publisher.replay_endpoint() {
            described.push_str(&format!(" (replay {replay})"));
        }
        let receiver = events.add_transport("zmq", args.events_queue);
        zmq = Some(publish::start_zmq(publisher, receiver).context("the ZMQ events thread")?);
    }
    if let Some(url) = &args.events_nats {
        let mode = match &args.events_jetstream {
            Some(stream) => NatsMode::JetStream {
                stream: stream.clone(),
            },
            None => NatsMode::Core,
        };
        let mut config = NatsPublisherConfig::new(url, &args.events_subject, mode);
        config.connect.auth = args.nats_auth.auth()?;
        let publisher = NatsPublisher::connect(config)
            .await
            .with_context(|| format!("--events-nats {url}"))?;
        described.push_str(&format!(
            "{} NATS {} subject {}",
            if zmq.is_some() { " and" } else { " on" },
            kvtwin_plane::service::nats_source::redact_url(url),
            args.events_subject
        ));
        let receiver = events.add_transport("nats", args.events_queue);
        tokio::spawn(publish::run_nats(publisher, receiver, worker));
    }
    Ok(StartedEvents {
        events: Some(Arc::new(events)),
        described,
        _zmq: zmq,
    })
}

/// A size as people write it: bytes, or a number with KB, MB, GB, TB (powers of 1000)
/// or KiB, MiB, GiB, TiB (powers of 1024).
pub(crate) fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().map_err(|_| {
        format!("{text:?}: not a size (bytes, or a number with KB, MB, GB, KiB, MiB, GiB...)")
    })?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?} (KB, MB, GB, TB, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    let bytes = number * scale;
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(format!("{text:?}: too large"));
    }
    Ok(bytes.round() as u64)
}

fn directory_tier(dir: &Path, flag: &str) -> Result<Arc<dyn ObjectStore>> {
    std::fs::create_dir_all(dir).with_context(|| format!("{flag} {}", dir.display()))?;
    let tier = LocalFileSystem::new_with_prefix(dir)
        .with_context(|| format!("{flag} {}", dir.display()))?;
    Ok(Arc::new(tier))
}

fn token(args: &StoreArgs) -> Result<Option<String>> {
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("--token-file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => std::env::var(TOKEN_ENV).ok().map(|t| t.trim().to_string()),
    };
    if token.as_deref() == Some("") {
        bail!(
            "the store's token is empty ({})",
            args.token_file
                .as_ref()
                .map_or(TOKEN_ENV.to_string(), |p| p.display().to_string())
        );
    }
    Ok(token)
}

/// `kvtwin store`.
pub(crate) fn store(args: &StoreArgs) -> Result<()> {
    crate::logging::init(args.log_format, crate::logging::SERVICE_DEFAULT)?;
    let token = token(args)?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(kvtwin_plane::service::tls::server_config(cert, key)?),
        _ => None,
    };
    if token.is_none() && !args.listen.ip().is_loopback() {
        tracing::warn!("kvtwin store: no token on a non-loopback address: anyone who reaches it may read and write");
    }
    let config = StoreConfig {
        limits: [args.memory, args.disk, args.object],
        disk: args
            .disk_dir
            .as_deref()
            .map(|dir| directory_tier(dir, "--disk-dir"))
            .transpose()?,
        object: args
            .object_dir
            .as_deref()
            .map(|dir| directory_tier(dir, "--object-dir"))
            .transpose()?,
        max_value: args.max_value,
        promote_on_hit: !args.no_promote,
        events: None,
    };
    crate::runtime::runtime()?.block_on(async {
        let stop = crate::runtime::stop_on_signal()?;
        let started = start_events(&args.events).await?;
        let config = StoreConfig {
            events: started.events.clone(),
            ..config
        };
        let store = Arc::new(Store::open(config).await.context("opening the store's tiers")?);
        let listener = tokio::net::TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listening on {}", args.listen))?;
        let address = listener.local_addr().context("the listening address")?;
        let metrics_at = match args.metrics_listen {
            None => None,
            Some(at) => {
                let metrics = tokio::net::TcpListener::bind(at)
                    .await
                    .with_context(|| format!("--metrics-listen {at}"))?;
                let bound = metrics.local_addr().context("the metrics address")?;
                let app = kvtwin_store::metrics::app(store.clone());
                tokio::spawn(async move {
                    if let Err(error) = axum::serve(metrics, app).await {
                        tracing::warn!(%error, "kvtwin store: the metrics server stopped");
                    }
                });
                Some(bound)
            }
        };
        let occupancy = store.occupancy().await;
        tracing::info!(
            "kvtwin store: listening on {}://{address}; memory {} bytes, disk {} bytes{}, object {} bytes{}; {} keys found{}{}{}",
            if tls.is_some() { "rediss" } else { "redis" },
            args.memory,
            occupancy.tiers[1].2,
            args.disk_dir.as_ref().map_or(String::new(), |d| format!(" in {}", d.display())),
            occupancy.tiers[2].2,
            args.object_dir.as_ref().map_or(String::new(), |d| format!(" in {}", d.display())),
            occupancy.keys,
            if token.is_some() { "; AUTH required" } else { "" },
            metrics_at.map_or(String::new(), |at| format!("; metrics on http://{at}/metrics")),
            started.described,
        );
        let server = ServerConfig {
            token,
            max_clients: args.max_clients,
            limits: Limits {
                max_bulk: usize::try_from(args.max_value).unwrap_or(usize::MAX),
                ..Limits::default()
            },
            tls,
        };
        tokio::select! {
            () = serve(listener, store, server) => {}
            () = crate::runtime::stopped(&stop) => {
                tracing::info!("kvtwin store: stopped");
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("2gib"), Ok(2 << 30));
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("lots").unwrap_err().contains("not a size"));
    }
}
