//! `kvtwin relay`: one engine's ZMQ KV events relayed onto NATS as Dynamo RouterEvents
//! until Ctrl-C (or SIGTERM).
//!
//! Owns: the flags ([`RelayArgs`]), the wiring of one `run_relay_reporting`, the stats
//! line (at exit, and every `--stats-every-ms`) and `--metrics-listen`. It logs to
//! stderr. Stopping is bounded: the relay publishes what it had queued for
//! `--drain-timeout-s` (10 s) and exits 1 if anything decoded was not acknowledged.
//! Never: decode, translate or publish an event itself (`kvtwin_plane::service::relay`
//! does).

use crate::args::nats::DEFAULT_SUBJECT;
use crate::args::zmq::zmq_endpoint;
use crate::runtime::{runtime, stop_on_signal, stopped};
use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin::ids::WorkerId;
use kvtwin_plane::nats::{NatsMode, PublisherConfig as NatsPublisherConfig};
use kvtwin_plane::service::relay::{
    run_relay_reporting, serve_metrics, NatsFormat, RelayConfig, RelayStats,
};
use kvtwin_plane::wire::DecodeLimits;
use kvtwin_plane::zmq::SubscriberConfig;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::watch;

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
