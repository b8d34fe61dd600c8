//! `kvtwin advisor`: the storage advisor, offline or live.
//!
//! - `--replay EVENTS` ([`replay`]): a recorded stream through a shared tier of each size
//!   under each policy.
//! - `--nats URL --subject S...` and/or `--zmq SOURCE...` ([`live`]): subscribes to the
//!   event plane (the engines' ZMQ streams, and on NATS whatever publishes Dynamo
//!   RouterEvents there: relays, kvtwin's connectors, the store), keeps the advisor's
//!   index (`kvtwin_sim::advisor`) and reports every `--interval` (a table, or `--json`
//!   lines) until `--duration`, `--reports` or Ctrl-C; `--record FILE` appends what it
//!   received as RouterEvent JSON lines, which `--replay` reads back.
//!
//! Owns: the flags ([`AdvisorArgs`]) and which mode runs. Never: the index, the
//! policies or the replay (`kvtwin_sim::advisor`), or a wire format (`kvtwin_plane`).

mod live;
mod metrics;
mod print;
mod replay;
mod sources;

use crate::args::nats::NatsAuthArgs;
use crate::args::zmq::{parse_zmq_source, ZmqSourceArg};
use anyhow::Result;
use clap::{ArgGroup, Args};
use kvtwin_sim::advisor::policy::Policy;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args, Debug)]
#[command(group(
    ArgGroup::new("source").required(true).multiple(true).args(["replay", "nats", "zmq"])
))]
pub(crate) struct AdvisorArgs {
    /// A recorded event stream: Dynamo RouterEvent JSON, one per line (what `nats sub`
    /// prints of kvtwin relay's or Dynamo's KV event subject, or what --record wrote).
    #[arg(long, value_name = "EVENTS", conflicts_with_all = ["nats", "zmq", "record"])]
    replay: Option<PathBuf>,
    /// Live: a NATS server whose --subject(s) carry Dynamo RouterEvents (one JSON event
    /// per message, or Dynamo 1.6 msgpack envelopes).
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// A NATS subject to subscribe to (repeat for more) [default: kvtwin.kv_events].
    #[arg(long, value_name = "SUBJECT", requires = "nats")]
    subject: Vec<String>,
    #[command(flatten)]
    nats_auth: NatsAuthArgs,
    /// Live: a vLLM / SGLang engine's ZMQ KV event stream (repeat for more), as
    /// WORKER_ID=ENDPOINT[,replay=ENDPOINT] (as `kvtwin router --zmq`) or
    /// ENDPOINT[=WORKER_ID][,replay=ENDPOINT] (without a worker id: its position among
    /// the --zmq flags, from 0).
    #[arg(long, value_name = "SOURCE", value_parser = parse_zmq_spec)]
    zmq: Vec<ZmqSpec>,
    /// The shared tier's sizes to try, blocks, comma separated (needed with --replay;
    /// live, each report also replays its window at these sizes).
    #[arg(long, value_delimiter = ',', value_name = "BLOCKS")]
    capacity_blocks: Vec<usize>,
    /// Policies to try, comma separated: lru, lfu, s3fifo, arc [default: all four].
    #[arg(long, value_delimiter = ',', value_name = "POLICY", value_parser = parse_policy)]
    policy: Vec<Policy>,
    /// Bytes of one block, for the bytes read, written, dropped and held (0: blocks only).
    #[arg(long, default_value_t = 0)]
    block_bytes: u64,
    /// One JSON object per policy and size (--replay), or per report (live), instead of
    /// a table.
    #[arg(long)]
    json: bool,
    /// With --replay: writes the hit ratio against the tier's size, a line per policy,
    /// as DIR/advisor-replay.svg and .png.
    #[arg(long, value_name = "DIR", requires = "replay")]
    plot: Option<PathBuf>,
    /// Live: seconds between reports.
    #[arg(long, default_value = "10", value_name = "SECONDS", value_parser = parse_seconds)]
    interval: Duration,
    /// Live: stop after this many seconds (with a last report).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    duration: Option<Duration>,
    /// Live: stop after this many reports.
    #[arg(long, value_name = "N")]
    reports: Option<u64>,
    /// Live: append every event received to FILE as RouterEvent JSON lines (readable
    /// with --replay).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Live: entries in each list (hot and cold sets, promotions, demotions).
    #[arg(long, default_value_t = 10, value_name = "N")]
    top: usize,
    /// Live: accesses that make a block hot enough to promote.
    #[arg(long, default_value_t = 2, value_name = "N")]
    hot_accesses_min: u64,
    /// Live: events received since a block's last access that make its device and host
    /// copies cold enough to demote.
    #[arg(long, default_value_t = 1000, value_name = "EVENTS")]
    cold_idle_events: u64,
    /// Live: the tier sizes reported are the smallest reaching these fractions of each
    /// policy's asymptotic hit ratio, comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0.9,0.95",
        value_name = "FRACTION"
    )]
    size_for: Vec<f64>,
    /// Live: blocks the index tracks at most (past it the least recently seen are
    /// forgotten, counted).
    #[arg(long, default_value_t = 1 << 20, value_name = "BLOCKS")]
    max_blocks: usize,
    /// Live: block references the sizing window keeps (the oldest stores are dropped,
    /// counted).
    #[arg(long, default_value_t = 1 << 18, value_name = "BLOCKS")]
    window_blocks: usize,
    /// Live: serve the last report's figures as Prometheus metrics (`GET /metrics`,
    /// OpenMetrics text, and `GET /healthz`) on this address (port 0: a free one,
    /// logged). Open to anyone who reaches it.
    #[arg(long, visible_alias = "metrics", value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Live: log lines as text or as one JSON object each (filter with RUST_LOG, default
    /// info).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    log_format: crate::logging::LogFormat,
}

impl AdvisorArgs {
    /// The policies asked for, or all four.
    fn policies(&self) -> Vec<Policy> {
        if self.policy.is_empty() {
            Policy::ALL.to_vec()
        } else {
            self.policy.clone()
        }
    }

    /// The engines' streams, a worker id each.
    fn zmq_sources(&self) -> Vec<ZmqSourceArg> {
        self.zmq
            .iter()
            .enumerate()
            .map(|(position, spec)| ZmqSourceArg {
                worker: spec.worker.unwrap_or(position as u64),
                endpoint: spec.endpoint.clone(),
                replay: spec.replay.clone(),
            })
            .collect()
    }
}

/// One `--zmq`: the worker id if given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ZmqSpec {
    worker: Option<u64>,
    endpoint: String,
    replay: Option<String>,
}

/// `WORKER_ID=ENDPOINT[,replay=ENDPOINT]` or `ENDPOINT[=WORKER_ID][,replay=ENDPOINT]`,
/// checked as `kvtwin router --zmq` checks its own.
fn parse_zmq_spec(text: &str) -> Result<ZmqSpec, String> {
    let (head, options) = match text.split_once(',') {
        Some((head, options)) => (head, format!(",{options}")),
        None => (text, String::new()),
    };
    let (worker, endpoint) = match head.split_once('=') {
        Some((worker, endpoint)) if worker.parse::<u64>().is_ok() => {
            (worker.parse::<u64>().ok(), endpoint)
        }
        _ => match head.rsplit_once('=') {
            Some((endpoint, worker)) => {
                let worker = worker.parse::<u64>().map_err(|_| {
                    format!("{text:?}: worker id {worker:?} is not an unsigned integer")
                })?;
                (Some(worker), endpoint)
            }
            None => (None, head),
        },
    };
    let checked = parse_zmq_source(&format!("{}={endpoint}{options}", worker.unwrap_or(0)))?;
    Ok(ZmqSpec {
        worker,
        endpoint: checked.endpoint,
        replay: checked.replay,
    })
}

fn parse_policy(name: &str) -> Result<Policy, String> {
    Policy::parse(&name.to_ascii_lowercase()).ok_or_else(|| {
        format!(
            "{name:?}: not a policy ({})",
            Policy::ALL.map(Policy::name).join(", ")
        )
    })
}

/// Seconds, whole or not, more than zero.
fn parse_seconds(text: &str) -> Result<Duration, String> {
    let seconds: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    match Duration::try_from_secs_f64(seconds) {
        Ok(span) if !span.is_zero() => Ok(span),
        _ => Err(format!("{text:?}: give a number of seconds above 0")),
    }
}

/// `kvtwin advisor`.
pub(crate) fn advisor(args: &AdvisorArgs) -> Result<()> {
    match &args.replay {
        Some(path) => replay::run(args, path),
        None => live::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zmq_sources_take_either_order_and_default_to_their_position() {
        let spec = |text| parse_zmq_spec(text).unwrap();
        assert_eq!(
            spec("3=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558"),
            ZmqSpec {
                worker: Some(3),
                endpoint: "tcp://127.0.0.1:5557".into(),
                replay: Some("tcp://127.0.0.1:5558".into()),
            }
        );
        assert_eq!(spec("tcp://127.0.0.1:5557=4").worker, Some(4));
        assert_eq!(spec("tcp://127.0.0.1:5557").worker, None);
        assert!(parse_zmq_spec("tcp://127.0.0.1:5557=x").is_err());
        assert!(parse_zmq_spec("nothing").is_err());
        assert!(parse_zmq_spec("tcp://127.0.0.1:1,bogus=1").is_err());
        assert_eq!(parse_seconds("0.25"), Ok(Duration::from_millis(250)));
        assert!(parse_seconds("0").is_err() && parse_seconds("-1").is_err());
    }
}
