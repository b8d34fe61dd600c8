//! `kvtwin router --engine`: the flags that make the router its engines' OpenAI front
//! door, and the wiring of `kvtwin_plane::service::frontend` from them.
//!
//! Owns: [`FrontendArgs`] (flattened into the router's flags), the strict parsing of
//! `--engine WORKER_ID=URL` ([`EngineArg`]) and [`start_frontend`].
//! Never: proxy, tokenize or check an engine itself (the plane's frontend does).

use crate::args::zmq::ZmqSourceArg;
use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin::ids::WorkerId;
use kvtwin::router::scheduler::SchedulerConfig;
use kvtwin_plane::service::frontend::engine_client::{check_engine_url, EngineTimeouts};
use kvtwin_plane::service::frontend::health::HealthConfig;
use kvtwin_plane::service::frontend::tokenizer::PromptTokenizer;
use kvtwin_plane::service::frontend::trace::TraceRecorder;
use kvtwin_plane::service::frontend::{Frontend, FrontendConfig};
use kvtwin_plane::service::http::{lock, SharedState};
use kvtwin_plane::service::source::ZmqSource;
use kvtwin_plane::service::state::{ServingConfig, DEFAULT_MAX_INFLIGHT};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// One engine the router fronts: `WORKER_ID=http://HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EngineArg {
    /// Its worker id: the one its `--zmq` events are indexed under.
    pub(crate) worker: u64,
    /// Its OpenAI server.
    pub(crate) url: String,
}

/// Parses `WORKER_ID=http://HOST:PORT`.
pub(crate) fn parse_engine(text: &str) -> Result<EngineArg, String> {
    let expected = "expected WORKER_ID=http://HOST:PORT";
    let (worker, url) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: {expected}"))?;
    let worker = worker
        .parse::<u64>()
        .map_err(|_| format!("{text:?}: the worker id {worker:?} is not a number; {expected}"))?;
    let url = check_engine_url(url).map_err(|error| format!("{text:?}: {error}"))?;
    Ok(EngineArg { worker, url })
}

/// The front door's flags.
#[derive(Args, Debug, Default)]
pub(crate) struct FrontendArgs {
    /// An engine's OpenAI server, fronted by the router (repeat per engine): POST
    /// /v1/completions and /v1/chat/completions are routed to the engines (KV overlap
    /// and load), forwarded and streamed back. Its --zmq events (same id) give the
    /// overlap; without them it is routed on load alone.
    #[arg(long = "engine", value_name = "WORKER_ID=URL", value_parser = parse_engine)]
    pub(crate) engines: Vec<EngineArg>,
    /// The model's tokenizer (its tokenizer.json, or the model directory; a
    /// tokenizer_config.json beside it gives the chat template), so text and chat
    /// prompts are hashed as the engine tokenizes them. Without it only token-id prompts
    /// are routed on their overlap.
    #[arg(long, value_name = "PATH", requires = "engines")]
    tokenizer: Option<PathBuf>,
    /// Append every served request to this file as a Mooncake-format JSON line
    /// (timestamp, input_length, output_length, hash_ids, and the worker, cached
    /// tokens, TTFT, ITL, end to end), for `kvtwin run SCENARIO --trace FILE`.
    #[arg(long, value_name = "FILE", requires = "engines")]
    record_trace: Option<PathBuf>,
    /// Tokens per hash id in the recorded trace [default: --block-size; needed without
    /// it].
    #[arg(long, value_name = "TOKENS", requires = "record_trace")]
    trace_block_size: Option<u32>,
    /// The recorded trace's file grows to this many bytes at most; later rows are
    /// dropped and counted.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 30, requires = "record_trace")]
    record_trace_max_bytes: u64,
    /// Weight of the blocks a prompt still has to prefill on an engine against the
    /// blocks running there (Dynamo's --kv-overlap-score-weight).
    #[arg(long, value_name = "W", default_value_t = 1.0)]
    overlap_weight: f64,
    /// Weight of each request running on an engine, beside its blocks.
    #[arg(long, value_name = "W", default_value_t = 0.0)]
    request_load_weight: f64,
    /// 0 sends each request to the cheapest engine; above 0 samples engines by a
    /// softmax of their normalised costs (Dynamo's --router-temperature).
    #[arg(long, value_name = "T", default_value_t = 0.0)]
    router_temperature: f64,
    /// Requests in flight at most; more are refused with 503.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_INFLIGHT)]
    max_inflight: usize,
    /// Other engines a request is sent to when its engine fails before answering.
    #[arg(long, value_name = "N", default_value_t = 1)]
    retries: u32,
    /// Seconds an engine may take to start answering a request (prefill included).
    #[arg(long, value_name = "S", default_value_t = 120)]
    first_byte_timeout_s: u64,
    /// Seconds an engine may pause within an answer.
    #[arg(long, value_name = "S", default_value_t = 60)]
    idle_timeout_s: u64,
    /// Milliseconds between two health checks of every engine (GET /health); an engine
    /// failing two in a row is marked down.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    health_period_ms: u64,
}

impl FrontendArgs {
    /// Whether the router fronts engines.
    pub(crate) fn enabled(&self) -> bool {
        !self.engines.is_empty()
    }

    /// What clap cannot check.
    pub(crate) fn validate(&self) -> Result<()> {
        let mut seen = std::collections::BTreeSet::new();
        for engine in &self.engines {
            if !seen.insert(engine.worker) {
                bail!("--engine: worker id {} given twice", engine.worker);
            }
        }
        if !(self.overlap_weight.is_finite() && self.overlap_weight >= 0.0) {
            bail!("--overlap-weight must be a number at least 0");
        }
        if !(self.request_load_weight.is_finite() && self.request_load_weight >= 0.0) {
            bail!("--request-load-weight must be a number at least 0");
        }
        if !(self.router_temperature.is_finite() && self.router_temperature >= 0.0) {
            bail!("--router-temperature must be a number at least 0");
        }
        if self.max_inflight == 0 {
            bail!("--max-inflight must be at least 1");
        }
        if self.trace_block_size == Some(0) {
            bail!("--trace-block-size must be at least 1");
        }
        if self.health_period_ms == 0 || self.first_byte_timeout_s == 0 || self.idle_timeout_s == 0
        {
            bail!("--health-period-ms, --first-byte-timeout-s and --idle-timeout-s must be at least 1");
        }
        Ok(())
    }

    fn config(&self) -> FrontendConfig {
        FrontendConfig {
            timeouts: EngineTimeouts {
                first_byte: Duration::from_secs(self.first_byte_timeout_s),
                idle: Duration::from_secs(self.idle_timeout_s),
                ..EngineTimeouts::default()
            },
            health: HealthConfig {
                period: Duration::from_millis(self.health_period_ms),
                ..HealthConfig::default()
            },
            retries: self.retries,
            ..FrontendConfig::default()
        }
    }
}

/// The front door over `state` for `args`' engines: the tokenizer loaded, the trace
/// opened, each engine added, the `--zmq` sources of engines handed to it (so removing
/// an engine stops its events). `None` without `--engine`; the sources of workers that
/// are not engines are returned to the caller to keep.
pub(crate) fn start_frontend(
    args: &FrontendArgs,
    block_size: Option<u32>,
    state: &SharedState,
    zmq: &[ZmqSourceArg],
    sources: Vec<ZmqSource>,
) -> Result<(Option<Arc<Frontend>>, Vec<ZmqSource>)> {
    if !args.enabled() {
        return Ok((None, sources));
    }
    let tokenizer = args
        .tokenizer
        .as_deref()
        .map(|path| {
            PromptTokenizer::load(path).with_context(|| format!("--tokenizer {}", path.display()))
        })
        .transpose()?;
    let recorder = args
        .record_trace
        .as_deref()
        .map(|path| {
            let Some(trace_block_size) = args.trace_block_size.or(block_size) else {
                bail!("--record-trace needs --trace-block-size (or --block-size)");
            };
            TraceRecorder::open(path, trace_block_size as usize, args.record_trace_max_bytes)
                .context("--record-trace")
        })
        .transpose()?;
    lock(state).configure_serving(ServingConfig {
        scheduler: SchedulerConfig {
            prefill_weight: args.overlap_weight,
            request_load_weight: args.request_load_weight,
            temperature: args.router_temperature,
            ..SchedulerConfig::default()
        },
        max_inflight: args.max_inflight,
    });
    let frontend = Frontend::new(state.clone(), args.config(), tokenizer, recorder);
    let mut kept = Vec::new();
    for (spec, source) in zmq.iter().zip(sources) {
        if args
            .engines
            .iter()
            .any(|engine| engine.worker == spec.worker)
        {
            frontend.adopt_source(
                WorkerId::new(spec.worker),
                &spec.endpoint,
                spec.replay.as_deref(),
                source,
            );
        } else {
            kept.push(source);
        }
    }
    for engine in &args.engines {
        frontend
            .add_engine(WorkerId::new(engine.worker), &engine.url, None)
            .with_context(|| format!("--engine {}={}", engine.worker, engine.url))?;
    }
    Ok((Some(frontend), kept))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_parse_and_bad_ones_say_what_was_expected() {
        assert_eq!(
            parse_engine("2=http://127.0.0.1:8000/").unwrap(),
            EngineArg {
                worker: 2,
                url: "http://127.0.0.1:8000".into()
            }
        );
        for bad in [
            "http://h:1",
            "x=http://h:1",
            "1=h:1",
            "1=https://h:1",
            "1=http://h",
        ] {
            let error = parse_engine(bad).unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }
}
