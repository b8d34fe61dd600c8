//! `kvtwin bench serve`: the command line around `kvtwin_plane::bench::serve`, a load
//! generator for an OpenAI-compatible server (the router's front door, or one engine).
//!
//! Owns: the flags, the bearer token's lookup (`--router-token-file`, else
//! `KVTWIN_AUTH_TOKEN`), the tokio runtime, `--out` (one JSON line per request, in the
//! order they end), a progress bar when stderr is a terminal, and where the report goes
//! (one JSON line on stdout, the table on stderr). A run in which no request succeeded
//! exits non-zero after printing its report.
//! Never: make, send or time a request itself (the library does).

use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin_plane::bench::serve::workload::count_trace_rows;
use kvtwin_plane::bench::serve::{
    run_serve_bench, Arrivals, ServeConfig, Synthetic, TraceReplay, Workload,
};
use kvtwin_plane::service::auth::{load_token, TokenSource};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Synthetic requests sent without `--requests`.
const DEFAULT_REQUESTS: u64 = 100;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// The OpenAI-compatible server: a `kvtwin router --engine` front door or one vLLM
    /// engine, e.g. http://127.0.0.1:8080.
    #[arg(long, value_name = "URL")]
    url: String,
    /// The model asked for [default: the first one GET /v1/models lists].
    #[arg(long)]
    model: Option<String>,
    /// A file holding the router's bearer token; without it the KVTWIN_AUTH_TOKEN
    /// environment variable, if set.
    #[arg(long, value_name = "PATH")]
    router_token_file: Option<PathBuf>,
    /// Ask for whole answers instead of streams (no TTFT or ITL then).
    #[arg(long)]
    no_stream: bool,
    /// What is sent and when.
    #[command(flatten)]
    workload: WorkloadArgs,
    /// Each request's deadline in seconds, from sending to its answer's end.
    #[arg(long, default_value_t = 120.0)]
    timeout_s: f64,
    /// Behind `kvtwin router` (or Dynamo's frontend): the engine, by its worker id, that
    /// serves every request (`nvext.backend_instance_id`) instead of the router's choice.
    #[arg(long, value_name = "ID")]
    worker: Option<u64>,
    /// Write one JSON line per request to this file (outcome, status, TTFT, ITL, end to
    /// end, tokens, cached tokens, worker), in the order they end.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

/// What `kvtwin bench serve` and `kvtwin validate --engine` send, and when: synthetic
/// prompts over shared prefixes (closed or open loop), or a trace replayed.
#[derive(Args, Clone, Debug, PartialEq)]
pub(crate) struct WorkloadArgs {
    /// Requests sent [default: 100]; with --trace, rows replayed at most [default: all].
    #[arg(long)]
    requests: Option<u64>,
    /// Distinct shared prefixes; each request starts with one, drawn at random.
    #[arg(long, default_value_t = 4, conflicts_with = "trace")]
    prefixes: u32,
    /// Tokens of each shared prefix (0: no shared prefix).
    #[arg(long, default_value_t = 512, conflicts_with = "trace")]
    prefix_tokens: u32,
    /// Fresh tokens each request adds after its prefix.
    #[arg(long, default_value_t = 64, conflicts_with = "trace")]
    suffix_tokens: u32,
    /// Output tokens each request asks for (with ignore_eos, so it gets them all).
    #[arg(long, default_value_t = 16, conflicts_with = "trace")]
    max_tokens: u32,
    /// Requests in flight at most: the closed loop's width, the open loop's and the
    /// trace's cap.
    #[arg(long, default_value_t = 8)]
    pub(crate) concurrency: usize,
    /// An open loop: Poisson arrivals at this many requests per second (seeded), instead
    /// of a closed loop.
    #[arg(long, value_name = "REQ_PER_S", conflicts_with = "trace")]
    rate: Option<f64>,
    /// Seeds the prompts and arrivals (token ids in [1, 30000)); a new seed gives prompts
    /// no earlier run left in the engines' caches.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Replay a Mooncake-format trace (timestamp ms, input_length, output_length,
    /// hash_ids) instead of synthetic prompts: each hash id becomes --trace-block-size
    /// tokens (equal ids, equal tokens), arrivals at the timestamps.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Tokens per hash id of the trace (Mooncake's own: 512; a trace recorded by
    /// `kvtwin router --record-trace`: its trace block size).
    #[arg(long, default_value_t = 512, requires = "trace")]
    trace_block_size: u32,
    /// Replay the trace this many times faster.
    #[arg(long, default_value_t = 1.0, requires = "trace")]
    speedup: f64,
}

impl WorkloadArgs {
    /// What a command line giving none of these flags parses to: how `kvtwin validate`
    /// tells that one was given where it means nothing.
    pub(crate) fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct Only {
            #[command(flatten)]
            workload: WorkloadArgs,
        }
        <Only as clap::Parser>::parse_from(["kvtwin"]).workload
    }

    /// The workload the flags describe.
    pub(crate) fn workload(&self) -> Workload {
        match &self.trace {
            Some(path) => Workload::Trace(TraceReplay {
                path: path.clone(),
                block_size: self.trace_block_size,
                speedup: self.speedup,
                limit: self.requests,
            }),
            None => Workload::Synthetic(Synthetic {
                requests: self.requests.unwrap_or(DEFAULT_REQUESTS),
                prefixes: self.prefixes,
                prefix_tokens: self.prefix_tokens,
                suffix_tokens: self.suffix_tokens,
                max_tokens: self.max_tokens,
                arrivals: match self.rate {
                    Some(rate_per_s) => Arrivals::Poisson { rate_per_s },
                    None => Arrivals::Closed,
                },
            }),
        }
    }
}

pub(crate) fn run(args: &ServeArgs) -> Result<()> {
    if !(args.timeout_s > 0.0 && args.timeout_s.is_finite()) {
        bail!("--timeout-s must be a positive number of seconds");
    }
    let token = load_token(&TokenSource {
        file: args.router_token_file.clone(),
    })
    .context("--router-token-file")?;
    let config = ServeConfig {
        url: args.url.clone(),
        model: args.model.clone(),
        token,
        stream: !args.no_stream,
        concurrency: args.workload.concurrency,
        timeout: Duration::from_secs_f64(args.timeout_s),
        pinned: args.worker,
        seed: args.workload.seed,
        workload: args.workload.workload(),
    };
    let mut out = match &args.out {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("--out {}", path.display()))?,
        )),
        None => None,
    };
    let len = match &config.workload {
        Workload::Synthetic(spec) => spec.requests,
        // Counting the rows is a pass over the file: only for a bar someone sees.
        Workload::Trace(spec) if std::io::IsTerminal::is_terminal(&std::io::stderr()) => {
            count_trace_rows(&spec.path, spec.limit)?
        }
        Workload::Trace(_) => 0,
    };
    let bar = crate::progress::bar(
        len as usize,
        "{elapsed_precise} [{bar:30}] {pos}/{len} requests {msg}",
    );
    let mut failed = 0u64;
    let mut observer = |record: &kvtwin_plane::bench::serve::RequestRecord| {
        bar.inc(1);
        if !record.succeeded() {
            failed += 1;
            bar.set_message(format!("{failed} failed"));
        }
        match &mut out {
            Some(out) => writeln!(out, "{}", record.to_json()),
            None => Ok(()),
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(run_serve_bench(&config, &mut observer));
    bar.finish_and_clear();
    let report = result.context("kvtwin bench serve")?;
    if let (Some(out), Some(path)) = (&mut out, &args.out) {
        out.flush()
            .with_context(|| format!("--out {}", path.display()))?;
    }
    println!("{}", report.to_json());
    eprint!("{report}");
    if report.requests > 0 && report.succeeded == 0 {
        bail!(
            "kvtwin bench serve: none of the {} requests succeeded",
            report.requests
        );
    }
    Ok(())
}
