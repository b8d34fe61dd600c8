//! `kvtwin validate --engine ROUTER_URL`: the twin of a running engine cluster against
//! the cluster itself. The same workload goes through the router's front door (to the
//! real engines) and through the twin (`kvtwin_sim::vllm::serve`: the engines' cache
//! sizes and block size read off their metrics, the scheduler settings given, each step
//! priced by the engines' measured profile from `kvtwin profile --engine`, the router's
//! weights). The twin takes the requests in the order the router chose for them (its
//! `x-kvtwin-route-seq`); a closed loop is replayed as a closed loop (each next request
//! when an answer is in, in the twin's time), an open loop or a trace at the times the
//! requests were sent.
//!
//! Owns: the flags, the repeats (each one starts from empty caches: every engine's
//! `POST /reset_prefix_cache`, then the router seen to forget them), the twin's input
//! built from what was sent, the comparison (per request cached tokens one by one; hit
//! ratio, requests per engine, TTFT and ITL p50/p90/p99 and throughput, and where a
//! mean TTFT goes (`ttft_parts.*`: before the engine schedules the request, and the
//! steps that prefill it, from vLLM's queue and prefill histograms read around each
//! repeat and from the twin's `TwinServed::scheduled`), as
//! `validation::Metric`s summarised over the repeats by `validation::spread`, so each
//! error stands beside the real run-to-run spread with a verdict), the table, `--json`
//! (every request, real and twin, too) and `--plot DIR` (CDFs, real against twin).
//! With `--speed-check` (`speed`), each repeat's twin steps at the engines' speed
//! measured around it, and the errors at the profile's own speed are reported beside.
//!
//! The twin's tie-breaks follow a fresh router's seeded RNG: the first repeat on a
//! router just started is choice for choice; later repeats (and a router that has
//! answered `/v1/route` queries) tie-break differently, which moves per-engine counts
//! by the ties. Requests sent one at a time are routed by their prefixes alone and the
//! twin matches them exactly; concurrent ones are routed by the engines' load too, so
//! by their speed, which the profile models and the machine varies.
//! Never: start or stop engines or the router, or time the twin with a wall clock.

mod speed;

use crate::bench::serve::WorkloadArgs;
use crate::cmd::profile::engine::speed::Speed;
use crate::cmd::profile::engine::{
    engine_clocks, engine_info, get_ok, post, reset_prefix_cache, EngineClock, EngineInfo,
};
use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use kvtwin::block::BlockIdentity;
use kvtwin::ids::WorkerId;
use kvtwin::router::scheduler::SchedulerConfig;
use kvtwin::stats::nearest_rank;
use kvtwin::tokens::{compute_local_hashes, HashSeed};
use kvtwin_plane::bench::serve::workload::RequestSource;
use kvtwin_plane::bench::serve::{
    run_serve_bench, Arrivals, RequestRecord, ServeConfig, Synthetic, Workload,
};
use kvtwin_plane::service::frontend::engine_client::{EngineClient, EngineTimeouts};
use kvtwin_sim::compute::ComputeModel;
use kvtwin_sim::validation::Metric;
use kvtwin_sim::validation::{spread, MetricSpread};
use kvtwin_sim::vllm::{
    TwinArrivals, TwinCluster, TwinClusterConfig, TwinRequest, TwinRun, TwinServed,
    VllmCacheConfig, VllmSchedulerConfig,
};
use serde_json::{json, Value};
use speed::{at_profile_line, Levelled, SpeedLevel};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the router may take to show an engine's reset cache.
const RESET_SEEN_WITHIN: Duration = Duration::from_secs(15);

/// The flags of `kvtwin validate` that only `--engine` reads.
#[derive(Args, Debug)]
pub(crate) struct EngineValidateArgs {
    /// The engines' compute profile (`kvtwin profile --engine URL` writes compute.ron):
    /// what the twin's steps take.
    #[arg(long, value_name = "FILE", requires = "engine")]
    compute: Option<PathBuf>,
    /// Each engine's own table (`kvtwin profile` with several `--engine` writes
    /// compute-engines.ron: tables by engine URL): an engine behind the router whose URL
    /// it names steps at its own speed, the others at `--compute`'s.
    #[arg(long, value_name = "FILE", requires = "compute")]
    engine_compute: Option<PathBuf>,
    /// Writes TTFT and ITL CDFs, real against twin, as DIR/cdf-ttft and DIR/cdf-itl
    /// (.svg and .png).
    #[arg(long, value_name = "DIR", requires = "engine")]
    plot: Option<PathBuf>,
    /// The engines' `--max-num-seqs` [default: vLLM's on CPU, 128].
    #[arg(long, value_name = "N", requires = "engine")]
    max_num_seqs: Option<usize>,
    /// The engines' `--max-num-batched-tokens` [default: vLLM's on CPU, 2048].
    #[arg(long, value_name = "TOKENS", requires = "engine")]
    max_num_batched_tokens: Option<u64>,
    /// The router's `--overlap-weight` [default: its own, 1].
    #[arg(long, value_name = "W", requires = "engine")]
    overlap_weight: Option<f64>,
    /// The router's `--request-load-weight` [default: its own, 0].
    #[arg(long, value_name = "W", requires = "engine")]
    request_load_weight: Option<f64>,
    /// Each request's deadline in seconds [default: 120].
    #[arg(long, value_name = "S", requires = "engine")]
    timeout_s: Option<f64>,
    /// Checks every engine's speed against its table before the first repeat and
    /// after each (a second or two: a lone prefill and a decode batch at two of the
    /// table's own points), and runs each repeat's twin at its engines' speed then (the
    /// mean of the checks around it): the profile's shape at the machine's present
    /// speed, for a machine whose speed moves between a profile and a run. The errors
    /// at the profile's own speed are printed beside.
    #[arg(long, requires = "engine")]
    speed_check: bool,
}

/// One engine behind the router.
struct Engine {
    worker: u64,
    url: String,
}

/// One repeat: what was sent, what came back, what the twin said.
struct Repeat {
    records: Vec<RequestRecord>,
    twin: TwinRun,
    /// The index of each record's request in the twin's input.
    twin_index: Vec<usize>,
    /// The engines' own mean time per request from queued to first token (vLLM's
    /// queue and prefill histograms over the repeat), ms; `None` where one does not say.
    engine_ms: Option<f64>,
    /// With `--speed-check`: what the twin was levelled by, and the twin at the
    /// profile's own speed.
    levelled: Option<Levelled>,
}

impl Repeat {
    /// The repeat with the twin at the profile's own speed, where it was levelled.
    fn at_profile_speed(&self) -> Option<Repeat> {
        let levelled = self.levelled.as_ref()?;
        Some(Repeat {
            records: self.records.clone(),
            twin: levelled.at_profile.clone(),
            twin_index: self.twin_index.clone(),
            engine_ms: self.engine_ms,
            levelled: None,
        })
    }
}

pub(crate) fn validate_engine(
    router: &str,
    args: &EngineValidateArgs,
    workload: &WorkloadArgs,
    repeats: usize,
    json_out: bool,
) -> Result<()> {
    let compute_path = args
        .compute
        .as_ref()
        .context("--engine needs --compute FILE: the engines' profile (kvtwin profile --engine URL writes compute.ron)")?;
    let compute: ComputeModel = kvtwin_sim::ron_file::load(compute_path)
        .with_context(|| format!("--compute {}", compute_path.display()))?;
    let timeout = Duration::from_secs_f64(args.timeout_s.unwrap_or(120.0));
    ensure!(!timeout.is_zero(), "--timeout-s must be positive");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let client = EngineClient::new(EngineTimeouts {
        connect: timeout,
        first_byte: timeout,
        idle: timeout,
        probe: timeout.min(Duration::from_secs(10)),
    });
    let engines = runtime.block_on(engines_of(&client, router))?;
    let engine_compute = match &args.engine_compute {
        None => BTreeMap::new(),
        Some(path) => own_tables(path, &engines)?,
    };
    let info = runtime.block_on(cache_of(&client, &engines))?;
    let scheduler = VllmSchedulerConfig {
        max_num_seqs: args.max_num_seqs.unwrap_or(128),
        max_num_batched_tokens: args.max_num_batched_tokens.unwrap_or(2048),
        enable_chunked_prefill: true,
        long_prefill_token_threshold: 0,
        reserve_full_isl: true,
    };
    let twin_config = TwinClusterConfig {
        workers: engines.iter().map(|e| WorkerId::new(e.worker)).collect(),
        scheduler,
        cache: VllmCacheConfig {
            num_gpu_blocks: u32::try_from(info.num_gpu_blocks).unwrap_or(u32::MAX),
            block_size: info.block_size,
            max_model_len: info.max_model_len,
            watermark: 0.0,
        },
        connector: None,
        routing: SchedulerConfig {
            prefill_weight: args.overlap_weight.unwrap_or(1.0),
            request_load_weight: args.request_load_weight.unwrap_or(0.0),
            ..SchedulerConfig::default()
        },
        compute,
        engine_compute,
        // Each repeat's twin draws its steps anew (a table with a measured spread).
        seed: workload.seed,
    };
    let config = ServeConfig {
        url: router.to_string(),
        model: Some(info.model.clone()),
        token: None,
        stream: true,
        concurrency: workload.concurrency,
        timeout,
        pinned: None,
        seed: workload.seed,
        workload: workload.workload(),
    };
    let prompts = prompts_of(&config, info.block_size)?;
    // A closed loop is replayed as one: each next request comes when an answer is in,
    // in the twin's own time. Open loops and traces come at the times they were sent.
    let arrivals = match &config.workload {
        Workload::Synthetic(Synthetic {
            arrivals: Arrivals::Closed,
            ..
        }) => TwinArrivals::Closed {
            clients: config.concurrency,
            think: Duration::ZERO,
        },
        _ => TwinArrivals::Open,
    };
    let bar = crate::progress::bar(
        repeats * prompts.len(),
        "{elapsed_precise} [{bar:30}] {pos}/{len} requests {msg}",
    );
    let engine_urls: Vec<String> = engines.iter().map(|engine| engine.url.clone()).collect();
    let mut speed = match args.speed_check {
        false => None,
        true => Some(SpeedLevel::new(&twin_config, &engines, &info, &config)?),
    };
    let mut speed_before = match &mut speed {
        None => Vec::new(),
        Some(level) => runtime.block_on(level.check(&client, &engine_urls))?,
    };
    let mut runs = Vec::with_capacity(repeats);
    for repeat in 0..repeats {
        bar.set_message(format!("repeat {} of {repeats}", repeat + 1));
        runtime.block_on(reset_caches(&client, router, &engines, &info.model))?;
        let mut records = Vec::with_capacity(prompts.len());
        let mut observer = |record: &RequestRecord| {
            bar.inc(1);
            records.push(record.clone());
            Ok(())
        };
        let clocks_before = runtime.block_on(engine_clocks(&client, &engine_urls));
        runtime
            .block_on(run_serve_bench(&config, &mut observer))
            .context("sending the workload through the router")?;
        let clocks_after = runtime.block_on(engine_clocks(&client, &engine_urls));
        let engine_ms = engine_part_ms(&clocks_before, &clocks_after);
        let (requests, twin_index) = twin_requests(&records, &prompts, info.block_size)?;
        let repeat_config = TwinClusterConfig {
            seed: twin_config.seed.wrapping_add(repeat as u64),
            ..twin_config.clone()
        };
        let twin = TwinCluster::new(repeat_config.clone()).serve(&requests, arrivals);
        let (twin, levelled) = match &mut speed {
            None => (twin, None),
            Some(level) => {
                let after = runtime.block_on(level.check(&client, &engine_urls))?;
                let factors = SpeedLevel::factors(&speed_before, &after);
                let levelled = TwinCluster::new(level.config(&repeat_config, &factors))
                    .serve(&requests, arrivals);
                let before = std::mem::replace(&mut speed_before, after.clone());
                (
                    levelled,
                    Some(Levelled {
                        before,
                        after,
                        factors,
                        at_profile: twin,
                    }),
                )
            }
        };
        runs.push(Repeat {
            records,
            twin,
            twin_index,
            engine_ms,
            levelled,
        });
    }
    bar.finish_and_clear();
    let per_run: Vec<Vec<Metric>> = runs.iter().map(|run| metrics(run, &engines)).collect();
    let summary = spread(&per_run);
    // With `--speed-check`, the same figures at the profile's own speed.
    let at_profile: Vec<Vec<Metric>> = runs
        .iter()
        .filter_map(Repeat::at_profile_speed)
        .map(|run| metrics(&run, &engines))
        .collect();
    let at_profile = (!at_profile.is_empty()).then(|| spread(&at_profile));
    if let Some(dir) = &args.plot {
        let written = plot(dir, &runs)?;
        for path in written {
            eprintln!("wrote {}", path.display());
        }
    }
    if json_out {
        let json = json!({
            "router": router,
            "engines": engines.iter().map(|e| json!({"worker": e.worker, "url": e.url})).collect::<Vec<_>>(),
            "model": info.model,
            "block_size": info.block_size,
            "num_gpu_blocks": info.num_gpu_blocks,
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
            "compute": compute_path,
            // Each engine's own table, by URL, where given (`--engine-compute`).
            "engine_compute": args.engine_compute,
            "requests": prompts.len(),
            "metrics": summary,
            // With --speed-check: the metrics of the twin at the profile's own speed.
            "metrics_at_profile_speed": at_profile,
            "runs": runs.iter().zip(&per_run).map(|(run, metrics)| run_json(run, metrics)).collect::<Vec<_>>(),
        });
        println!("{json}");
        return Ok(());
    }
    print!(
        "{}",
        table(router, &engines, &info, prompts.len(), &runs, &summary)
    );
    if let Some(at_profile) = &at_profile {
        println!("{}", at_profile_line(at_profile));
    }
    if !twin_config.compute.steps_vary() {
        println!(
            "the profile has no step_spread: every twin step takes its figure, and closed-loop clients stay in phase (profile again with kvtwin profile --engine)"
        );
    }
    Ok(())
}

/// The engines the router fronts (`GET /v1/workers`, rank 0 rows with an `engine`).
async fn engines_of(client: &EngineClient, router: &str) -> Result<Vec<Engine>> {
    let workers = router_workers(client, router).await?;
    let mut engines: Vec<Engine> = workers["workers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| row["dp_rank"].as_u64() == Some(0))
        .filter_map(|row| {
            Some(Engine {
                worker: row["worker"].as_u64()?,
                url: row["engine"]["url"]
                    .as_str()?
                    .trim_end_matches('/')
                    .to_string(),
            })
        })
        .collect();
    engines.sort_by_key(|e| e.worker);
    if engines.is_empty() {
        bail!(
            "{router}/v1/workers lists no engine: --engine takes the URL of a `kvtwin router --engine ...` front door"
        );
    }
    Ok(engines)
}

/// The router's `GET /v1/workers`, parsed.
async fn router_workers(client: &EngineClient, router: &str) -> Result<Value> {
    let body = get_ok(client, router, "/v1/workers", 16 << 20).await?;
    serde_json::from_slice(&body).with_context(|| format!("{router}/v1/workers: not JSON"))
}

/// The engines' model and cache, which the twin models as one: they must agree.
async fn cache_of(client: &EngineClient, engines: &[Engine]) -> Result<EngineInfo> {
    let mut first: Option<EngineInfo> = None;
    for engine in engines {
        let info = engine_info(client, &engine.url).await?;
        if let Some(seen) = &first {
            ensure!(
                (seen.block_size, seen.num_gpu_blocks) == (info.block_size, info.num_gpu_blocks),
                "engine {} ({}) caches {} blocks of {} tokens, engine {} {} of {}: the twin models engines alike",
                engine.worker,
                engine.url,
                info.num_gpu_blocks,
                info.block_size,
                engines[0].worker,
                seen.num_gpu_blocks,
                seen.block_size
            );
        } else {
            first = Some(info);
        }
    }
    first.context("no engine")
}

/// Empties every engine's prefix cache and waits until the router holds no block of
/// them: the twin starts from empty caches. vLLM refuses a reset while blocks are held
/// (`{"success": false}`: requests still finishing), so a refusal is retried; and it
/// publishes the reset's `AllBlocksCleared` only with its next step's events, so each
/// engine is then asked for one token of a prompt shorter than a block (nothing cached).
async fn reset_caches(
    client: &EngineClient,
    router: &str,
    engines: &[Engine],
    model: &str,
) -> Result<()> {
    let start = Instant::now();
    for engine in engines {
        reset_prefix_cache(client, &engine.url, RESET_SEEN_WITHIN).await?;
        let flush = json!({"model": model, "prompt": [1, 2, 3, 4], "max_tokens": 1});
        post(client, &engine.url, "/v1/completions", flush.to_string()).await?;
    }
    loop {
        let workers = router_workers(client, router).await?;
        let held: u64 = workers["workers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|row| row["blocks"]["device"].as_u64().unwrap_or(0))
            .sum();
        if held == 0 {
            return Ok(());
        }
        if start.elapsed() > RESET_SEEN_WITHIN {
            bail!(
                "the router still holds {held} blocks {}s after the engines' caches were reset: are its --zmq event streams connected?",
                RESET_SEEN_WITHIN.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The workload's prompts, in order, as (full-block identities, prompt tokens, max
/// tokens): the same seed makes the same ones `run_serve_bench` sends.
fn prompts_of(
    config: &ServeConfig,
    block_size: u64,
) -> Result<Vec<(Vec<BlockIdentity>, u64, u64)>> {
    let mut source = RequestSource::new(&config.workload, config.seed)?;
    let mut prompts = Vec::new();
    while let Some(planned) = source.next_request()? {
        let identities = BlockIdentity::chain(&compute_local_hashes(
            &planned.prompt,
            usize::try_from(block_size).unwrap_or(usize::MAX),
            HashSeed::default(),
        ));
        prompts.push((
            identities,
            planned.prompt.len() as u64,
            u64::from(planned.max_tokens),
        ));
    }
    Ok(prompts)
}

/// The twin's input: each request sent, in the order the router chose for them (its
/// `x-kvtwin-route-seq`; the order of sending where it is missing), each arriving when
/// it was sent or, when the router took it after a later-sent one (requests sent within
/// a millisecond race to it), with that one; and for each record, its request's place
/// in that input.
fn twin_requests(
    records: &[RequestRecord],
    prompts: &[(Vec<BlockIdentity>, u64, u64)],
    block_size: u64,
) -> Result<(Vec<TwinRequest>, Vec<usize>)> {
    let mut order: Vec<usize> = (0..records.len()).collect();
    order.sort_by_key(|&i| {
        let record = &records[i];
        (
            record.route_seq.is_none(),
            record.route_seq,
            record.started,
            record.index,
        )
    });
    let mut twin_index = vec![0; records.len()];
    let mut requests = Vec::with_capacity(records.len());
    let mut arrival = Duration::ZERO;
    for (position, &i) in order.iter().enumerate() {
        let record = &records[i];
        let (blocks, prompt_tokens, max_tokens) = usize::try_from(record.index)
            .ok()
            .and_then(|index| prompts.get(index))
            .with_context(|| format!("request {} is not in the workload", record.index))?;
        twin_index[i] = position;
        arrival = arrival.max(record.started);
        requests.push(TwinRequest::new(
            position,
            arrival,
            blocks,
            *prompt_tokens,
            *max_tokens,
            block_size,
        ));
    }
    Ok((requests, twin_index))
}

/// The tables of `--engine-compute` (by engine URL) of the engines behind the router, by
/// worker; an error naming the file when it names none of them.
fn own_tables(path: &Path, engines: &[Engine]) -> Result<BTreeMap<WorkerId, ComputeModel>> {
    let by_url: BTreeMap<String, ComputeModel> = kvtwin_sim::ron_file::load(path)
        .with_context(|| format!("--engine-compute {}", path.display()))?;
    let own: BTreeMap<WorkerId, ComputeModel> = engines
        .iter()
        .filter_map(|engine| {
            let table = by_url.get(engine.url.trim_end_matches('/'))?;
            Some((WorkerId::new(engine.worker), table.clone()))
        })
        .collect();
    ensure!(
        !own.is_empty(),
        "--engine-compute {}: its tables are for {}, none of the router's engines ({})",
        path.display(),
        by_url.keys().cloned().collect::<Vec<_>>().join(", "),
        engines
            .iter()
            .map(|e| e.url.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(own)
}

/// The engines' mean time per request from queued to first token between two readings,
/// ms, weighted by the requests each finished; `None` unless every engine says.
fn engine_part_ms(before: &[Option<EngineClock>], after: &[Option<EngineClock>]) -> Option<f64> {
    let (mut total_ms, mut requests) = (0.0, 0.0);
    for (before, after) in before.iter().zip(after) {
        let (before, after) = (before.as_ref()?, after.as_ref()?);
        let finished = after.requests_since(before);
        if let Some(ms) = after.ms_per_request_since(before) {
            total_ms += ms * finished;
            requests += finished;
        }
    }
    (requests >= 1.0).then(|| total_ms / requests)
}

/// What both sides said of each request that succeeded: (record, twin's answer).
fn pairs(run: &Repeat) -> impl Iterator<Item = (&RequestRecord, &TwinServed)> {
    run.records
        .iter()
        .zip(&run.twin_index)
        .filter(|(record, _)| record.succeeded())
        .filter_map(|(record, &i)| run.twin.served.get(i)?.as_ref().map(|t| (record, t)))
}

/// One repeat's figures, real against twin, over the requests both served.
fn metrics(run: &Repeat, engines: &[Engine]) -> Vec<Metric> {
    let pairs: Vec<_> = pairs(run).collect();
    let mut out = Vec::new();
    let (mut prompt, mut real_cached, mut twin_cached) = (0u64, 0u64, 0u64);
    for (record, twin) in &pairs {
        prompt += record.prompt_tokens;
        real_cached += record.cached_tokens.unwrap_or(0);
        twin_cached += twin.cached_tokens;
    }
    out.push(Metric::new(
        "cached_tokens".into(),
        real_cached as f64,
        twin_cached as f64,
    ));
    let ratio = |cached: u64| cached as f64 / prompt.max(1) as f64 * 100.0;
    out.push(Metric::new(
        "hit_ratio_pct".into(),
        ratio(real_cached),
        ratio(twin_cached),
    ));
    for engine in engines {
        let count = |real: bool| {
            pairs
                .iter()
                .filter(|(record, twin)| {
                    if real {
                        record.worker == Some(engine.worker)
                    } else {
                        twin.worker.get() == engine.worker
                    }
                })
                .count() as f64
        };
        out.push(Metric::new(
            format!("requests.worker_{}", engine.worker),
            count(true),
            count(false),
        ));
    }
    let real_ttft: Vec<f64> = pairs.iter().filter_map(|(r, _)| real_ttft_ms(r)).collect();
    let twin_ttft: Vec<f64> = pairs.iter().filter_map(|(_, t)| twin_ttft_ms(t)).collect();
    let real_itl: Vec<f64> = pairs
        .iter()
        .filter_map(|(r, _)| per_token_itl_ms(r))
        .collect();
    let twin_itl: Vec<f64> = pairs.iter().filter_map(|(_, t)| twin_itl_ms(t)).collect();
    for (name, real, twin) in [
        ("ttft_ms", &real_ttft, &twin_ttft),
        ("itl_ms", &real_itl, &twin_itl),
    ] {
        for (label, q) in [("p50", 0.5), ("p90", 0.9), ("p99", 0.99)] {
            if let (Some(r), Some(t)) = (percentile(real, q), percentile(twin, q)) {
                out.push(Metric::new(format!("{name}.{label}"), r, t));
            }
        }
    }
    // Where a TTFT goes, on average: before the engine schedules the request (the way
    // in and any wait for a step in flight), then the steps that prefill it (vLLM's own
    // queue and prefill times; the twin's first scheduled step to its first token).
    if let Some(engine_ms) = run.engine_ms {
        let mean = |values: &[f64]| values.iter().sum::<f64>() / values.len().max(1) as f64;
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let twin_before: Vec<f64> = pairs.iter().map(|(_, t)| ms(t.scheduled)).collect();
        let twin_steps: Vec<f64> = pairs
            .iter()
            .map(|(_, t)| ms(t.ttft.saturating_sub(t.scheduled)))
            .collect();
        out.push(Metric::new(
            "ttft_parts.before_scheduled_ms".into(),
            mean(&real_ttft) - engine_ms,
            mean(&twin_before),
        ));
        out.push(Metric::new(
            "ttft_parts.prefill_ms".into(),
            engine_ms,
            mean(&twin_steps),
        ));
    }
    let outputs: u64 = pairs.iter().map(|(r, _)| r.output_tokens).sum();
    let real_span = span(run.records.iter().map(|r| (r.started, r.started + r.e2e)));
    let twin_span = run.twin.makespan;
    if !real_span.is_zero() && !twin_span.is_zero() {
        out.push(Metric::new(
            "output_tokens_per_s".into(),
            outputs as f64 / real_span.as_secs_f64(),
            outputs as f64 / twin_span.as_secs_f64(),
        ));
    }
    out
}

/// A request's time per output token after the first, ms (vLLM's TPOT, which is what the
/// twin's `itl` is). Not the mean gap between chunks: a busy API server merges several
/// tokens into one chunk (41 of 300 requests at concurrency 4 on the 2-core VM, some all
/// 8 tokens in one), which leaves fewer, longer gaps and inflates a mean over chunks.
fn per_token_itl_ms(record: &RequestRecord) -> Option<f64> {
    record
        .time_per_output_token()
        .map(|tpot| tpot.as_secs_f64() * 1e3)
}

fn percentile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    nearest_rank(&sorted, q)
}

/// From the first start to the last end.
fn span(intervals: impl Iterator<Item = (Duration, Duration)>) -> Duration {
    let (mut first, mut last) = (Duration::MAX, Duration::ZERO);
    for (start, end) in intervals {
        first = first.min(start);
        last = last.max(end);
    }
    last.saturating_sub(first)
}

/// Requests whose cached tokens differ, real against twin: (index, real, twin).
fn cached_differences(run: &Repeat) -> Vec<(u64, u64, u64)> {
    pairs(run)
        .filter(|(record, twin)| record.cached_tokens != Some(twin.cached_tokens))
        .map(|(record, twin)| {
            (
                record.index,
                record.cached_tokens.unwrap_or(0),
                twin.cached_tokens,
            )
        })
        .collect()
}

/// One row per request both sides served (see `per_request` in the JSON), in the order
/// the requests were sent.
fn per_request_rows(run: &Repeat) -> Vec<Value> {
    let mut rows: Vec<(Duration, Value)> = pairs(run)
        .map(|(record, twin)| {
            let row = json!([
                record.index,
                record.started.as_secs_f64() * 1e3,
                record.worker,
                twin.worker.get(),
                record.cached_tokens,
                twin.cached_tokens,
                real_ttft_ms(record),
                twin_ttft_ms(twin),
                per_token_itl_ms(record),
                twin_itl_ms(twin),
                record
                    .itl
                    .iter()
                    .map(|gap| gap.as_secs_f64() * 1e3)
                    .collect::<Vec<_>>(),
            ]);
            (record.started, row)
        })
        .collect();
    rows.sort_by_key(|(started, _)| *started);
    rows.into_iter().map(|(_, row)| row).collect()
}

fn run_json(run: &Repeat, metrics: &[Metric]) -> Value {
    let differences = cached_differences(run);
    json!({
        "requests": run.records.len(),
        "failed": run.records.iter().filter(|r| !r.succeeded()).count(),
        "twin_unserved": run.twin.served.iter().filter(|s| s.is_none()).count(),
        "twin_steps": run.twin.steps,
        "cached_differences": differences.len(),
        "cached_differences_first": differences.iter().take(20).map(|(i, r, t)| json!({"request": i, "real": r, "twin": t})).collect::<Vec<_>>(),
        // Every request both served, in the order sent: the engine each chose and the
        // cached tokens each found, real then twin.
        "per_request": {
            "columns": ["request", "sent_ms", "real_worker", "twin_worker", "real_cached", "twin_cached", "real_ttft_ms", "twin_ttft_ms", "real_tpot_ms", "twin_tpot_ms", "real_gaps_ms"],
            "rows": per_request_rows(run),
        },
        "metrics": metrics,
        // With --speed-check: the checks before and after the repeat, and each engine's
        // factor (the engines' order).
        "speed": run.levelled.as_ref().map(|levelled| json!({
            "before": levelled.before.iter().map(Speed::to_json).collect::<Vec<_>>(),
            "after": levelled.after.iter().map(Speed::to_json).collect::<Vec<_>>(),
            "factors": levelled.factors,
        })),
    })
}

fn table(
    router: &str,
    engines: &[Engine],
    info: &EngineInfo,
    requests: usize,
    runs: &[Repeat],
    summary: &[MetricSpread],
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{router}: {} engine(s) of {} ({} blocks of {} tokens) vs their twin; {requests} requests, {} repeat(s), medians",
        engines.len(),
        info.model,
        info.num_gpu_blocks,
        info.block_size,
        runs.len()
    );
    for (n, run) in runs.iter().enumerate() {
        let differences = cached_differences(run);
        let failed = run.records.iter().filter(|r| !r.succeeded()).count();
        let _ = write!(
            out,
            "repeat {}: cached tokens differ on {} of {} requests",
            n + 1,
            differences.len(),
            run.records.len() - failed
        );
        for (index, real, twin) in differences.iter().take(5) {
            let _ = write!(out, "; #{index} real {real} twin {twin}");
        }
        if differences.len() > 5 {
            let _ = write!(out, "; ...");
        }
        let merged = run
            .records
            .iter()
            .filter(|r| r.succeeded() && r.merged_chunks())
            .count();
        if merged > 0 {
            let _ = write!(out, "; {merged} answered with several tokens in a chunk");
        }
        if let Some(levelled) = &run.levelled {
            let factors: Vec<String> = levelled
                .factors
                .iter()
                .map(|factor| factor.map_or_else(|| "?".to_string(), |f| format!("×{f:.2}")))
                .collect();
            let _ = write!(
                out,
                "; the engines ran {} their profile's time",
                factors.join(" and ")
            );
        }
        let unserved = run.twin.served.iter().filter(|s| s.is_none()).count();
        if failed > 0 || unserved > 0 {
            let _ = write!(
                out,
                " ({failed} failed for real, {unserved} never served by the twin)"
            );
        }
        let _ = writeln!(out);
    }
    out.push_str(&super::metric_table(summary, "twin"));
    out
}

type Pick<T> = fn(&T) -> Option<f64>;

/// One CDF chart: its file stem, title, axis label, and what it reads of each side.
struct Chart {
    stem: &'static str,
    title: &'static str,
    label: &'static str,
    real: Pick<RequestRecord>,
    twin: Pick<TwinServed>,
}

fn twin_ttft_ms(twin: &TwinServed) -> Option<f64> {
    Some(twin.ttft.as_secs_f64() * 1e3)
}

fn twin_itl_ms(twin: &TwinServed) -> Option<f64> {
    twin.itl.map(|d| d.as_secs_f64() * 1e3)
}

fn real_ttft_ms(record: &RequestRecord) -> Option<f64> {
    record.ttft.map(|d| d.as_secs_f64() * 1e3)
}

/// The TTFT and ITL CDFs of every repeat pooled, real against twin.
fn plot(dir: &Path, runs: &[Repeat]) -> Result<Vec<PathBuf>> {
    let cdf = |mut values: Vec<f64>| -> Vec<(f64, f64)> {
        values.sort_by(f64::total_cmp);
        let n = values.len() as f64;
        values
            .iter()
            .enumerate()
            .map(|(i, v)| (*v, (i + 1) as f64 / n * 100.0))
            .collect()
    };
    let charts = [
        Chart {
            stem: "cdf-ttft",
            title: "TTFT: real engines vs twin",
            label: "time to first token (ms)",
            real: real_ttft_ms,
            twin: twin_ttft_ms,
        },
        Chart {
            stem: "cdf-itl",
            title: "ITL (each request's time per token after the first): real engines vs twin",
            label: "inter-token latency (ms)",
            real: per_token_itl_ms,
            twin: twin_itl_ms,
        },
    ];
    let mut written = Vec::new();
    for chart in charts {
        let real = runs
            .iter()
            .flat_map(|run| pairs(run).filter_map(|(r, _)| (chart.real)(r)))
            .collect();
        let twin = runs
            .iter()
            .flat_map(|run| pairs(run).filter_map(|(_, t)| (chart.twin)(t)))
            .collect();
        written.extend(crate::plot::cdfs(
            dir,
            chart.stem,
            chart.title,
            chart.label,
            &[
                crate::plot::Series {
                    name: "real".into(),
                    points: cdf(real),
                },
                crate::plot::Series {
                    name: "twin".into(),
                    points: cdf(twin),
                },
            ],
        )?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin_sim::compute::table::{DecodeCurve, TableModel};

    fn table(name: &str) -> ComputeModel {
        ComputeModel::Table(TableModel {
            name: name.into(),
            gpus: 1,
            kv_bytes_per_token: 0,
            max_kv_tokens: 0,
            prefill_isl: vec![32],
            prefill_ms: vec![10.0],
            decode: vec![DecodeCurve {
                context: 128,
                batch: vec![1],
                ms: vec![8.0],
            }],
            step_spread: Vec::new(),
            request_overhead_ms: 0.0,
            request_overhead_busy_ms: 0.0,
            arrival_stretch_ms: 0.0,
            stalls: Vec::new(),
            prefill_beside_decode: Vec::new(),
        })
    }

    #[test]
    fn each_engine_takes_the_table_of_its_url_and_a_file_for_none_of_them_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("compute-engines.ron");
        let by_url = BTreeMap::from([
            ("http://127.0.0.1:8001".to_string(), table("one")),
            ("http://127.0.0.1:8002".to_string(), table("two")),
        ]);
        std::fs::write(&path, ron::to_string(&by_url).unwrap()).unwrap();
        let engines = [
            Engine {
                worker: 7,
                url: "http://127.0.0.1:8002/".into(),
            },
            Engine {
                worker: 9,
                url: "http://127.0.0.1:8003".into(),
            },
        ];
        let own = own_tables(&path, &engines).unwrap();
        assert_eq!(own.len(), 1, "engine 9 has no table of its own");
        assert_eq!(own[&WorkerId::new(7)], table("two"));
        let error = own_tables(&path, &engines[1..]).unwrap_err().to_string();
        assert!(error.contains("none of the router's engines"), "{error}");
        assert!(error.contains("http://127.0.0.1:8003"), "{error}");
    }
}
