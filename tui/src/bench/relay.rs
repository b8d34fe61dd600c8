//! `kvtwin bench relay`: the command line around `kvtwin_plane::bench::relay`.
//!
//! Owns: the flags and where the report goes (one JSON line on stdout, the table on
//! stderr). Without `nats-server` it fails with a message saying how to get one.
//! Never: time or orchestrate anything itself (the library runs the pipeline).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use kvtwin_plane::bench::relay::{
    run_relay_bench, Pace, RelayBenchConfig, RelayBenchError, Transport,
};
use kvtwin_plane::nats::NatsError;
use kvtwin_plane::service::relay::NatsFormat;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct RelayArgs {
    /// Synthetic engines, each with its own relay.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Seconds the engines publish.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// What the relays publish: one JSON RouterEvent per message, or Dynamo 1.6 envelopes
    /// (one per engine batch, up to 128 events).
    #[arg(long, value_enum, default_value_t = Format::Envelope)]
    format: Format,
    /// Through a JetStream stream (each publish acknowledged, the router replaying the
    /// stream) instead of core NATS.
    #[arg(long)]
    jetstream: bool,
    /// Publish this many blocks per second (all engines together) on a fixed schedule;
    /// without it, as fast as the pipeline takes them (see --window).
    #[arg(long, value_name = "BLOCKS_PER_S")]
    rate: Option<u64>,
    /// Without --rate: batches each engine may have published but not yet applied by
    /// the router.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Requests per engine batch (each a BlockStored, plus BlockRemoveds as it evicts).
    #[arg(long, default_value_t = 16)]
    requests_per_batch: usize,
    /// Blocks of a request's own tokens, at most (uniform from 1): the main knob of
    /// blocks per event.
    #[arg(long, default_value_t = 8)]
    own_blocks: usize,
    /// Blocks of a shared system prompt, at most.
    #[arg(long, default_value_t = 32)]
    prompt_blocks: usize,
    /// Shared system prompts.
    #[arg(long, default_value_t = 8)]
    prompts: usize,
    /// Blocks an engine caches before it evicts.
    #[arg(long, default_value_t = 4096)]
    capacity_blocks: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 16)]
    block_size: u32,
    /// Batches each engine pre-encodes (then an AllBlocksCleared, and the cycle repeats).
    #[arg(long, default_value_t = 2000)]
    cycle_batches: usize,
    /// Seeds the engines (engine i gets seed + i).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Json,
    Envelope,
}

pub(crate) fn run(args: &RelayArgs) -> Result<()> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        bail!("--seconds must be positive");
    }
    let mut config = RelayBenchConfig::new();
    config.engines = args.engines;
    config.duration = Duration::from_secs_f64(args.seconds);
    config.synthetic.requests_per_batch = args.requests_per_batch;
    config.synthetic.own_blocks = args.own_blocks;
    config.synthetic.prompt_blocks = args.prompt_blocks;
    config.synthetic.prompts = args.prompts;
    config.synthetic.capacity_blocks = args.capacity_blocks;
    config.synthetic.block_size = args.block_size;
    config.synthetic.seed = args.seed;
    config.cycle_batches = args.cycle_batches;
    config.nats_format = match args.format {
        Format::Json => NatsFormat::Json,
        Format::Envelope => NatsFormat::Envelope { publisher_id: 0 },
    };
    config.transport = if args.jetstream {
        Transport::JetStream
    } else {
        Transport::Core
    };
    config.pace = match args.rate {
        Some(blocks_per_s) => Pace::Rate { blocks_per_s },
        None => Pace::Window {
            batches: args.window,
        },
    };
    let report = match run_relay_bench(&config) {
        Ok(report) => report,
        Err(RelayBenchError::Nats(error @ NatsError::ServerNotFound { .. })) => {
            return Err(error).context(
                "kvtwin bench relay starts its own nats-server and found none \
                 (Debian: apt-get install nats-server)",
            )
        }
        Err(error) => return Err(error).context("kvtwin bench relay"),
    };
    println!("{}", report.to_json());
    eprint!("{report}");
    if report.batches_applied < report.batches {
        bail!(
            "the router applied {} of {} batches before the drain timed out",
            report.batches_applied,
            report.batches
        );
    }
    Ok(())
}
