//! `kvtwin profile --engine URL`: a running OpenAI-compatible engine measured as
//! Dynamo's profiler measures one, so the twin of a cluster runs on that cluster's own
//! speed.
//!
//! Owns: the engine's description (vLLM's `/v1/models` and its `cache_config_info`
//! metric: the model, the block size, the cache's blocks), the grid and what fits it,
//! the measurements, their spread over repeats, and the files:
//! - prefill: one request alone, a fresh prompt of each length (no prefix hit) and one
//!   output token; its time to first token, and (vLLM's request histograms, read
//!   before and after: `engine_time`) the engine's part of it, queued to first token.
//!   The rest (HTTP, the router, the tokenizer, the queues between vLLM's processes)
//!   is time the engine does not step for: `compute.ron`'s prefills are the engine's
//!   part and its `request_overhead_ms` the median rest, which the twin adds to each
//!   request on its way, not to its engine's steps; Dynamo's tables keep the TTFTs;
//! - the same beside decodes (`beside`): a fresh prompt sent while its engine streams
//!   1 and each batch size of long answers, whose overhead and prefill are longer where
//!   the API server shares the CPU with the pass (the table's
//!   `request_overhead_busy_ms` and `prefill_beside_decode`);
//! - decode: a batch of fresh prompts of one context length streamed together; the step
//!   time is vLLM's own mean gap between a request's outputs (`engine_time`: its
//!   inter-token latency histogram, stamped in the engine core), since a client's gaps
//!   show how its API server delivered: on the 2-core VM one engine's lone answer came
//!   in one chunk in every other repeat. An engine without that histogram is read off
//!   the clients' gaps (`steps`): the median gap while every sequence of the batch is
//!   decoding (after the last first token, before the first last token), so neither
//!   prefill nor a shrinking batch blurs it;
//! - each point `--repeats` times, the median kept and the spread (min, max) beside it;
//! - how much steps stray, as the table's `step_spread` (percentiles, pooled over the
//!   points), which the twin draws from so that its engines fall out of phase as real
//!   ones do: each repeat's engine figure over its point's median, or without the
//!   engine's figures every client gap that is one step (an answer whose chunks are its
//!   tokens) over its point's median;
//! - stalls: the engine's output gaps, from its histogram's buckets, that took many
//!   times any step (the table's `stalls`);
//! - with several engines (`--engine` repeated, the engines of one cluster), each point
//!   on all of them at once, every engine's figure a sample of the point: engines that
//!   share a machine's cores (the local cluster of `scripts/engines`) slow each other,
//!   and the twin of that cluster should step at the speed they reach together, not at
//!   the speed of one engine alone;
//! - with `--router`, every request through that router, pinned to the engine it
//!   measures (`nvext.backend_instance_id`): the router's proxying shares the cores as it
//!   does while the cluster serves, which the twin of a cluster behind it should carry.
//!
//! Writes into `--out`: Dynamo's planner tables (`write_profiles`: the npz and JSON
//! files of its `--profile-results-dir`), `compute.ron` (the `Table` compute model a
//! scenario's hardware or `kvtwin estimate --compute` takes) and `engine_profile.json`
//! (every repeat of every point, the engine and the grid).
//! The engines' prefix caches are emptied first (vLLM's `POST /reset_prefix_cache`):
//! prompts are fresh within a run, the same across runs.
//! Never: simulate anything, or run two points at once (each is alone on its engine);
//! it does leave the engines' caches full of its own prompts.

mod beside;
mod engine_http;
mod engine_time;
mod per_engine;
pub(crate) mod speed;
mod steps;

use anyhow::{bail, Context, Result};
#[cfg(test)]
use engine_http::label;
pub(crate) use engine_http::{engine_info, get_ok, post, reset_prefix_cache};
use engine_time::stalls_of;
pub(crate) use engine_time::EngineClock;
use kvtwin_plane::bench::serve::request::{send, Target};
use kvtwin_plane::bench::serve::workload::{block_tokens, PlannedRequest};
use kvtwin_plane::bench::serve::RequestRecord;
use kvtwin_plane::service::frontend::engine_client::{EngineClient, EngineTimeouts};
use kvtwin_sim::autoscale::profile::{table_from_profiles, write_profiles};
use kvtwin_sim::compute::ComputeModel;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use steps::{percentiles, step_ms, MIN_SINGLE_STEPS};

/// The seed of every prompt's tokens; prompts differ by their blocks' ids.
const PROMPT_SEED: u64 = 0x6b76_7477_696e;
/// Blocks one prompt may span (ids are `prompt × this + block`).
const PROMPT_BLOCKS_MAX: u64 = 1 << 16;

/// What to measure.
#[derive(Clone, Debug)]
pub(crate) struct EngineGrid {
    /// Prompt lengths for prefill; `None`: the block size doubled up to what fits.
    pub(crate) isl: Option<Vec<u64>>,
    /// Prompt lengths of decoding batches; `None`: 4, 16 and 32 blocks, those that fit.
    pub(crate) contexts: Option<Vec<u64>>,
    /// Batch sizes; `None`: 1, 2, 4, 8, 16, 32, those that fit the cache.
    pub(crate) batches: Option<Vec<u64>>,
    /// Output tokens of each decoding sequence.
    pub(crate) osl: u32,
    /// Times each point is measured.
    pub(crate) repeats: usize,
}

/// What the engine says about itself.
#[derive(Clone, Debug)]
pub(crate) struct EngineInfo {
    pub(crate) model: String,
    pub(crate) block_size: u64,
    pub(crate) num_gpu_blocks: u64,
    pub(crate) max_model_len: u64,
}

impl EngineInfo {
    /// Tokens its cache holds: vLLM keeps one block back (its null block).
    fn max_kv_tokens(&self) -> u64 {
        self.num_gpu_blocks.saturating_sub(1) * self.block_size
    }
}

/// One point's repeats, milliseconds, in the order measured.
#[derive(Clone, Debug)]
struct Repeats(Vec<f64>);

impl Repeats {
    fn median(&self) -> f64 {
        let mut sorted = self.0.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        if n == 0 {
            return 0.0;
        }
        if n % 2 == 1 {
            sorted[n / 2]
        } else {
            (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
        }
    }

    fn min(&self) -> f64 {
        self.0.iter().copied().fold(f64::INFINITY, f64::min)
    }

    fn max(&self) -> f64 {
        self.0.iter().copied().fold(f64::NEG_INFINITY, f64::max)
    }

    fn to_json(&self) -> Value {
        json!({
            "ms": self.0,
            "median_ms": self.median(),
            "min_ms": self.min(),
            "max_ms": self.max(),
        })
    }
}

/// `kvtwin profile --engine URL [--engine URL ...] --out DIR`.
pub(crate) fn profile_engine(
    urls: &[String],
    router: Option<&str>,
    grid: &EngineGrid,
    out: &Path,
) -> Result<()> {
    if grid.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    if grid.osl < 2 {
        bail!("--osl must be at least 2: a decode step is the gap between two outputs");
    }
    if urls.is_empty() {
        bail!("--engine URL: no engine to measure");
    }
    let urls: Vec<String> = urls
        .iter()
        .map(|url| url.trim_end_matches('/').to_string())
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let router = router.map(|url| url.trim_end_matches('/').to_string());
    runtime.block_on(measure_and_write(&urls, router.as_deref(), grid, out))
}

/// The engines measured together must serve the same model with the same block size;
/// the smallest cache and the shortest prompt limit bound the grid.
fn common_info(urls: &[String], infos: Vec<EngineInfo>) -> Result<EngineInfo> {
    let mut engines = urls.iter().zip(infos);
    let Some((first_url, mut common)) = engines.next() else {
        bail!("no engine to measure");
    };
    for (url, info) in engines {
        if info.model != common.model || info.block_size != common.block_size {
            bail!(
                "{url} serves {} with blocks of {} tokens, {first_url} {} with {}: engines \
                 profiled together must be alike",
                info.model,
                info.block_size,
                common.model,
                common.block_size
            );
        }
        common.num_gpu_blocks = common.num_gpu_blocks.min(info.num_gpu_blocks);
        common.max_model_len = common.max_model_len.min(info.max_model_len);
    }
    Ok(common)
}

async fn measure_and_write(
    urls: &[String],
    router: Option<&str>,
    grid: &EngineGrid,
    out: &Path,
) -> Result<()> {
    let client = EngineClient::new(EngineTimeouts::default());
    let mut infos = Vec::with_capacity(urls.len());
    for url in urls {
        infos.push(engine_info(&client, url).await?);
    }
    let info = common_info(urls, infos)?;
    let pins: Vec<Option<u64>> = match router {
        None => vec![None; urls.len()],
        Some(router) => {
            let ids = router_engine_ids(&client, router).await?;
            urls.iter()
                .map(|url| {
                    ids.iter()
                        .find(|(_, engine)| engine == url)
                        .map(|(id, _)| Some(*id))
                        .with_context(|| {
                            format!(
                                "--router {router}: {url} is not one of its engines up ({})",
                                ids.iter()
                                    .map(|(id, engine)| format!("{id}: {engine}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )
                        })
                })
                .collect::<Result<_>>()?
        }
    };
    let url = urls.join(", ");
    let url = url.as_str();
    let max_kv = info.max_kv_tokens();
    let limit = max_kv.min(info.max_model_len.saturating_sub(1));
    let isls: Vec<u64> = match &grid.isl {
        Some(isls) => isls.clone(),
        None => std::iter::successors(Some(info.block_size), |isl| Some(isl * 2))
            .take_while(|&isl| isl <= limit)
            .collect(),
    };
    if let Some(&isl) = isls.iter().find(|&&isl| isl == 0 || isl > limit) {
        bail!("--isl {isl}: the engine takes prompts of 1 to {limit} tokens");
    }
    let contexts: Vec<u64> = match &grid.contexts {
        Some(contexts) => contexts.clone(),
        None => [4, 16, 32]
            .iter()
            .map(|blocks| blocks * info.block_size)
            .filter(|&context| context + u64::from(grid.osl) <= limit)
            .collect(),
    };
    let batches = grid
        .batches
        .clone()
        .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 32]);
    // Each engine's requests go to it, or through the router pinned to it; `names`
    // says which in messages, in the targets' order.
    let targets: Vec<Target> = urls
        .iter()
        .zip(&pins)
        .map(|(url, pinned)| Target {
            url: router.map_or_else(|| url.clone(), str::to_string),
            model: info.model.clone(),
            stream: true,
            timeout: Duration::from_secs(600),
            pinned: *pinned,
        })
        .collect();
    eprintln!(
        "kvtwin profile: {url} serve{} {} ({} blocks of {} tokens: {max_kv} KV tokens; \
         prompts up to {} tokens); {} repeats a point{}",
        if targets.len() == 1 { "s" } else { "" },
        info.model,
        info.num_gpu_blocks,
        info.block_size,
        info.max_model_len,
        grid.repeats,
        if targets.len() == 1 {
            String::new()
        } else {
            format!(", on all {} engines at once", targets.len())
        }
    );
    if let Some(router) = router {
        eprintln!("kvtwin profile: every request through {router}, pinned to its engine");
    }
    let mut prompts = Prompts {
        next: 0,
        block_size: info.block_size,
    };
    // Prompts are fresh within a run, not across runs: an earlier profile's may still be
    // cached, and a prefill that hits is not a prefill.
    for url in urls {
        if let Err(error) = reset_prefix_cache(&client, url, Duration::from_secs(15)).await {
            eprintln!(
                "kvtwin profile: could not empty {url}'s prefix cache ({error:#}); prompts of an \
                 earlier profile may be found cached"
            );
        }
    }
    // The first request of an engine pays for what it sets up on first use.
    for target in &targets {
        let warm_up = prompts.planned(info.block_size, 2);
        check(send(&client, target, warm_up, Instant::now()).await, target)?;
    }

    let mut prefill_points = Vec::new();
    // Each prefill repeat's time inside the engine (vLLM's own queue and prefill times),
    // per point; `None` once an engine does not say (then prefills are the clients'
    // TTFTs, overhead and all).
    let mut engine_points: Option<Vec<Repeats>> = Some(Vec::new());
    // A lone request's time outside the engine: its TTFT less the engine's part.
    let mut overheads = Vec::new();
    let mut per_engine = per_engine::PerEngine::new(targets.len(), isls.len());
    for (point, &isl) in isls.iter().enumerate() {
        let mut repeats = Vec::with_capacity(grid.repeats * targets.len());
        let mut inside = Vec::with_capacity(grid.repeats * targets.len());
        for _ in 0..grid.repeats {
            let clocks = engine_clocks(&client, urls).await;
            let batches = targets
                .iter()
                .map(|target| (target, vec![prompts.planned(isl, 1)]))
                .collect();
            let answered = together(&client, batches).await?;
            let later = engine_clocks(&client, urls).await;
            for (i, (_, records)) in answered.into_iter().enumerate() {
                // One output token: its answer's end is its first token. A sampled token
                // whose text is empty (the tiny model's random weights pick such tokens)
                // streams a chunk that counts no token, and leaves `ttft` unset.
                let record = &records[0];
                let ttft = record.ttft.unwrap_or(record.e2e).as_secs_f64() * 1e3;
                repeats.push(ttft);
                match (&later[i], &clocks[i]) {
                    (Some(later), Some(earlier)) => {
                        if let Some(engine_ms) = later.ms_per_request_since(earlier) {
                            inside.push(engine_ms);
                            overheads.push(ttft - engine_ms);
                            per_engine.prefill(i, point, engine_ms, ttft - engine_ms);
                        }
                    }
                    _ => engine_points = None,
                }
            }
        }
        let repeats = Repeats(repeats);
        eprintln!(
            "  prefill {isl:>6} tokens: {:>9.2} ms (min {:.2}, max {:.2}){}",
            repeats.median(),
            repeats.min(),
            repeats.max(),
            if inside.is_empty() {
                String::new()
            } else {
                format!(", {:.2} in the engine", Repeats(inside.clone()).median())
            }
        );
        if inside.is_empty() {
            engine_points = None;
        }
        if let Some(points) = &mut engine_points {
            points.push(Repeats(inside));
        }
        prefill_points.push((isl, repeats));
    }
    let overhead = engine_points.is_some().then_some(Repeats(overheads));
    // The same beside decodes: a fresh prompt sent to each engine while it streams
    // long answers.
    let mut beside = None;
    if let (Some(points), Some(_)) = (&engine_points, &overhead) {
        if let Some((point, decodes)) =
            beside::plan(&isls, &batches, info.block_size, max_kv, limit)
        {
            let pinned: Vec<(&Target, &str)> = targets
                .iter()
                .zip(urls)
                .map(|(target, url)| (target, url.as_str()))
                .collect();
            let probe_ttft_ms = prefill_points[point].1.median().max(0.0);
            // The shortest lone prefill's engine part: about one pass.
            let pass_ms = points
                .iter()
                .map(Repeats::median)
                .fold(f64::INFINITY, f64::min);
            let most = decodes.last().copied().unwrap_or(1);
            let background = beside::background_tokens(
                probe_ttft_ms,
                pass_ms,
                (most, isls[point], info.block_size, max_kv),
            );
            beside = Some(
                beside::measure(
                    &client,
                    &pinned,
                    &mut prompts,
                    isls[point],
                    points[point].median(),
                    Duration::from_secs_f64(probe_ttft_ms / 1e3),
                    &decodes,
                    grid.repeats,
                    background,
                )
                .await?,
            );
        }
    }

    let mut decode_points = Vec::new();
    // The clients' step figures, point by point, and whether every point's figures are
    // the engine's (else they are the clients').
    let mut clients_seen = Vec::new();
    let mut decode_from_engine = true;
    // Each single step and its point's median, every point pooled.
    let mut single_samples: Vec<(f64, f64)> = Vec::new();
    let mut skipped = Vec::new();
    // Every gap the engines count while the batches decode, for their stalls.
    let decode_started = engine_clocks(&client, urls).await;
    for &context in &contexts {
        for &batch in &batches {
            let tokens = batch * (context + u64::from(grid.osl));
            if batch == 0 || tokens > max_kv || context + u64::from(grid.osl) > limit {
                skipped.push(format!("{batch}×{context}"));
                continue;
            }
            // Each repeat's step, every engine's: as the engine saw it (vLLM's mean gap
            // between outputs) and as the client saw it (its streamed gaps).
            let mut inside = Vec::with_capacity(grid.repeats * targets.len());
            let mut seen = Vec::with_capacity(grid.repeats * targets.len());
            // The client's single steps, repeat by repeat.
            let mut singles_of = Vec::new();
            for _ in 0..grid.repeats {
                let batches = targets
                    .iter()
                    .map(|target| {
                        let planned: Vec<PlannedRequest> = (0..batch)
                            .map(|_| prompts.planned(context, grid.osl))
                            .collect();
                        (target, planned)
                    })
                    .collect();
                let clocks = engine_clocks(&client, urls).await;
                let answered = together(&client, batches).await?;
                let later = engine_clocks(&client, urls).await;
                for (i, (target, records)) in answered.into_iter().enumerate() {
                    let (step, singles) = step_ms(&records).with_context(|| {
                        format!(
                            "{}: batch {batch} at context {context}: no output gaps",
                            named(target)
                        )
                    })?;
                    let engine_step = match (&later[i], &clocks[i]) {
                        (Some(later), Some(earlier)) => later.ms_per_gap_since(earlier),
                        _ => None,
                    };
                    inside.push(engine_step);
                    seen.push(step);
                    singles_of.push(singles);
                }
            }
            let from_engine = inside.iter().all(Option::is_some);
            let repeats = if from_engine {
                Repeats(inside.iter().flatten().copied().collect())
            } else {
                Repeats(seen.clone())
            };
            let median = repeats.median();
            // The spread's samples: with the engine's figures, each repeat's (its mean
            // step over the batch's answers); a client's gaps then show how its API
            // server delivered (on the 2-core VM a quarter of them under half a step,
            // chunks held back and sent close together), not how the engine stepped.
            // Without, the clients' single steps.
            if median > 0.0 {
                if from_engine {
                    single_samples.extend(repeats.0.iter().map(|ms| (*ms, median)));
                } else {
                    for singles in &singles_of {
                        single_samples.extend(singles.iter().map(|ms| (*ms, median)));
                    }
                }
            }
            eprintln!(
                "  decode  batch {batch:>3} × {context:>6} tokens: {:>8.2} ms a step (min {:.2}, max {:.2}){}",
                repeats.median(),
                repeats.min(),
                repeats.max(),
                if from_engine {
                    format!(", {:.2} as the client saw it", Repeats(seen.clone()).median())
                } else {
                    String::new()
                }
            );
            if !from_engine {
                decode_from_engine = false;
            }
            clients_seen.push(Repeats(seen));
            decode_points.push((context, batch, repeats));
        }
    }
    if decode_points.is_empty() {
        bail!("no decode point fits the engine's {max_kv} KV tokens");
    }
    let decode_ended = engine_clocks(&client, urls).await;
    let stalls = stalls_of(&decode_started, &decode_ended, &decode_points);
    // The spread is the body of a step's time, the stalls its tail: a single step the
    // stalls count is not counted again.
    let step_ratios: Vec<f64> = single_samples
        .iter()
        .filter(|(ms, _)| stalls.as_ref().is_none_or(|s| *ms < s.threshold_ms))
        .map(|(ms, median)| ms / median)
        .collect();

    let (prefill, decode) = per_engine::dynamo_profiles(
        &prefill_points
            .iter()
            .map(|(isl, r)| (*isl, r.median()))
            .collect::<Vec<_>>(),
        &decode_points
            .iter()
            .map(|(context, batch, r)| (*context, *batch, r.median()))
            .collect::<Vec<_>>(),
        grid.osl,
        max_kv,
    );
    let name = format!("{} measured at {url}", info.model);
    let mut table = table_from_profiles(&name, &prefill, &decode).context("the measured table")?;
    table.max_kv_tokens = max_kv;
    // The twin's engines step for the engine's part of a prefill; the rest delays each
    // request on its way (Dynamo's tables keep the clients' TTFTs: its planner's SLOs
    // are the clients').
    if let (Some(points), Some(overhead)) = (&engine_points, &overhead) {
        table.prefill_ms = points.iter().map(Repeats::median).collect();
        table.request_overhead_ms = overhead.median().max(0.0);
    }
    // Beside a decode, less half the step in flight (the probe came at a random moment
    // of it): the twin makes a request arriving mid-step wait for the step's end.
    let lone_step = decode_points
        .iter()
        .find(|(_, batch, _)| *batch == 1)
        .map_or(0.0, |(_, _, r)| r.median());
    if let Some(beside) = &beside {
        if let Some(busy) = beside.overhead_busy_ms(lone_step) {
            table.request_overhead_busy_ms = busy;
        }
        let step_ms = |batch, context| table.decode_step(batch, context).as_secs_f64() * 1e3;
        table.prefill_beside_decode = beside.factors(info.block_size, step_ms);
        table.arrival_stretch_ms = beside.arrival_stretch_ms().unwrap_or(0.0);
    }
    let step_spread = percentiles(&step_ratios);
    table.step_spread = step_spread.clone();
    if let Some(stalls) = &stalls {
        table.stalls = stalls.stalls.clone();
    }

    std::fs::create_dir_all(out).with_context(|| format!("--out {}", out.display()))?;
    let mut written = write_profiles(out, &prefill, &decode)?;
    // Each engine's own table beside the pooled one, by URL.
    let engine_tables = per_engine.tables(
        &table,
        &prefill_points,
        &decode_points,
        grid.osl,
        engine_points.is_some(),
    )?;
    if let Some(tables) = &engine_tables {
        let by_url: std::collections::BTreeMap<&str, ComputeModel> = urls
            .iter()
            .map(String::as_str)
            .zip(tables.iter().cloned().map(ComputeModel::Table))
            .collect();
        let path = out.join("compute-engines.ron");
        let ron = ron::ser::to_string_pretty(&by_url, Default::default())
            .context("writing the engines' own tables")?;
        write(&path, &(ron + "\n"))?;
        written.push(path);
    }
    let compute = out.join("compute.ron");
    let busy_ms = table.request_overhead_busy_ms;
    let beside_taken = table.prefill_beside_decode.clone();
    let ron = ron::ser::to_string_pretty(&ComputeModel::Table(table), Default::default())
        .context("writing the compute table")?;
    write(&compute, &(ron + "\n"))?;
    written.push(compute);
    let raw = json!({
        "engine": url,
        // Set when every request went through this router, pinned to its engine.
        "router": router,
        // Each point's `ms`: repeat by repeat, every engine's figure in this order.
        "engines": urls,
        "model": info.model,
        "block_size": info.block_size,
        "num_gpu_blocks": info.num_gpu_blocks,
        "max_kv_tokens": max_kv,
        "max_model_len": info.max_model_len,
        "repeats": grid.repeats,
        "decode_output_tokens": grid.osl,
        "prefill": prefill_points.iter().enumerate().map(|(i, (isl, r))| {
            let mut point = r.to_json();
            point["isl"] = json!(isl);
            // The engine's own part of each (vLLM's queue and prefill times).
            if let Some(inside) = engine_points.as_ref().and_then(|points| points.get(i)) {
                point["engine"] = inside.to_json();
            }
            point
        }).collect::<Vec<_>>(),
        // TTFT less the engine's part, every prefill repeat: what the table's
        // `request_overhead_ms` is the median of.
        "request_overhead": overhead.as_ref().map(Repeats::to_json),
        // A probe's TTFT less the engine's part while its engine decodes a long answer,
        // every repeat; the table's `request_overhead_busy_ms` is their median less half
        // of `lone_step_ms` (the step in flight, which the twin waits for anyway).
        "request_overhead_beside_decode": beside.as_ref().and_then(|b| b.beside_one()).map(Repeats::to_json),
        // Every probe beside decodes: outside and inside the engine, by decodes beside;
        // the table's `prefill_beside_decode` is each one's engine median over
        // `lone_engine_ms`.
        "prefill_beside_decode": beside.as_ref().map(beside::BesideDecodes::to_json),
        "lone_step_ms": lone_step,
        // Each point's `ms`: the engine's steps (vLLM's mean gap between outputs) when
        // `decode_from_engine`, else the clients'; `client`: the clients' always.
        "decode_from_engine": decode_from_engine,
        "decode": decode_points.iter().zip(&clients_seen).map(|((context, batch, r), seen)| {
            let mut point = r.to_json();
            point["context"] = json!(context);
            point["batch"] = json!(batch);
            point["client"] = seen.to_json();
            point
        }).collect::<Vec<_>>(),
        "decode_skipped": skipped,
        // Single decode steps over their point's median, pooled: how many, and their
        // percentiles (the table's `step_spread`; empty with fewer than MIN_SINGLE_STEPS).
        "single_steps": step_ratios.len(),
        // The engines' output gaps while the batches decoded (vLLM's histogram), from
        // what length one is a stall, and the table's `stalls`.
        "decode_gaps": stalls.as_ref().map(|s| s.gaps),
        "stall_threshold_ms": stalls.as_ref().map(|s| s.threshold_ms),
        "stalls": stalls.as_ref().map(|s| s.stalls.iter().map(|stall| json!({"ms": stall.ms, "share": stall.share})).collect::<Vec<_>>()),
        "step_spread": step_spread,
    });
    let raw_path = out.join("engine_profile.json");
    write(&raw_path, &(serde_json::to_string_pretty(&raw)? + "\n"))?;
    written.push(raw_path);

    let (on_each, engines) = if targets.len() == 1 {
        ("", String::new())
    } else {
        (
            " on each engine",
            format!(", on {} engines at once", targets.len()),
        )
    };
    println!(
        "{}: {max_kv} KV tokens, measured {} times a point{engines} (median; min to max)",
        info.model, grid.repeats
    );
    println!("\nprefill: one request alone{on_each}, a prompt nothing caches");
    println!(
        "{:>8}  {:>10}  {:>19}  {:>10}",
        "ISL", "TTFT ms", "spread ms", "engine ms"
    );
    for (i, (isl, r)) in prefill_points.iter().enumerate() {
        let inside = engine_points
            .as_ref()
            .and_then(|points| points.get(i))
            .map_or_else(|| "-".to_string(), |r| format!("{:.2}", r.median()));
        println!(
            "{isl:>8}  {:>10.2}  {:>8.2} to {:>7.2}  {inside:>10}",
            r.median(),
            r.min(),
            r.max()
        );
    }
    match &overhead {
        Some(overhead) => println!(
            "a request's time outside the engine (TTFT less vLLM's queue and prefill \
             times): {:.2} ms ({:.2} to {:.2}); the table's prefills are the engine's",
            overhead.median(),
            overhead.min(),
            overhead.max()
        ),
        None => println!(
            "(the engine does not report its queue and prefill times: the table's prefills \
             are the TTFTs, the time outside the engine included)"
        ),
    }
    if let Some(beside) = &beside {
        beside.print(lone_step, busy_ms, &beside_taken);
    }
    println!(
        "\ndecode: a batch streaming together{on_each}, {} outputs each; {}",
        grid.osl,
        if decode_from_engine {
            "ITL the engine's (vLLM's mean gap between a request's outputs), client ms the \
             clients' median streamed gap"
        } else {
            "ITL the clients' (the engine does not report its inter-token latency)"
        }
    );
    println!(
        "{:>8}  {:>6}  {:>8}  {:>19}  {:>10}  {:>9}",
        "context", "batch", "ITL ms", "spread ms", "tokens/s", "client ms"
    );
    for ((context, batch, r), seen) in decode_points.iter().zip(&clients_seen) {
        println!(
            "{context:>8}  {batch:>6}  {:>8.2}  {:>8.2} to {:>7.2}  {:>10.0}  {:>9.2}",
            r.median(),
            r.min(),
            r.max(),
            *batch as f64 / (r.median() / 1e3),
            seen.median()
        );
    }
    if !skipped.is_empty() {
        println!(
            "(not measured, more than the cache holds: {})",
            skipped.join(", ")
        );
    }
    match step_spread.as_slice() {
        [] => println!(
            "\nsingle steps: {} seen (answers merged into chunks hide them), fewer than {MIN_SINGLE_STEPS}: no step_spread, the twin's steps take the figures",
            step_ratios.len()
        ),
        spread => println!(
            "\n{} over their point's median ({} of them, the table's step_spread): fastest {:.2}, p5 {:.2}, p50 {:.2}, p95 {:.2}, p99 {:.2}, slowest {:.2}",
            if decode_from_engine { "the engine's steps, repeat by repeat," } else { "single steps" },
            step_ratios.len(),
            spread[0],
            spread[5],
            spread[50],
            spread[95],
            spread[99],
            spread[100]
        ),
    }
    match &stalls {
        None => println!(
            "stalls: not read (the engine does not report its inter-token latency histogram)"
        ),
        Some(stalls) if stalls.stalls.is_empty() => println!(
            "stalls: none of the engines' {:.0} output gaps while the batches decoded took \
             {:.0} ms or more",
            stalls.gaps, stalls.threshold_ms
        ),
        Some(stalls) => {
            let stalled: f64 = stalls.stalls.iter().map(|stall| stall.share).sum();
            println!(
                "stalls (the table's stalls): {:.0} of the engines' {:.0} output gaps while \
                 the batches decoded took {:.0} ms or more ({:.2} %): {}",
                stalled * stalls.gaps,
                stalls.gaps,
                stalls.threshold_ms,
                stalled * 100.0,
                stalls
                    .stalls
                    .iter()
                    .map(|stall| format!("{:.0} × {:.0} ms", stall.share * stalls.gaps, stall.ms))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    if let Some(tables) = &engine_tables {
        per_engine::print(urls, tables);
    }
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Fresh prompts: each one's blocks have ids no other prompt of the run has, so the
/// engine finds none of them cached.
struct Prompts {
    next: u64,
    block_size: u64,
}

impl Prompts {
    fn planned(&mut self, tokens: u64, max_tokens: u32) -> PlannedRequest {
        let index = self.next;
        self.next += 1;
        let mut prompt = Vec::with_capacity(tokens as usize + self.block_size as usize);
        for block in 0..tokens.div_ceil(self.block_size) {
            let id = index * PROMPT_BLOCKS_MAX + block;
            block_tokens(id, self.block_size as u32, PROMPT_SEED, &mut prompt);
        }
        prompt.truncate(tokens as usize);
        PlannedRequest {
            index,
            at: None,
            prompt,
            max_tokens,
            prefix: None,
            line: None,
        }
    }
}

/// Every engine's batch sent at once (each request of a batch at once too); each
/// engine's records, in the order given, or the first failure.
async fn together<'a>(
    client: &EngineClient,
    batches: Vec<(&'a Target, Vec<PlannedRequest>)>,
) -> Result<Vec<(&'a Target, Vec<RequestRecord>)>> {
    let origin = Instant::now();
    let sent = batches.into_iter().map(|(target, planned)| async move {
        let records = futures::future::join_all(
            planned
                .into_iter()
                .map(|planned| send(client, target, planned, origin)),
        )
        .await;
        (target, records)
    });
    let mut answered = Vec::new();
    for (target, records) in futures::future::join_all(sent).await {
        let records = records
            .into_iter()
            .map(|record| check(record, target))
            .collect::<Result<Vec<_>>>()?;
        answered.push((target, records));
    }
    Ok(answered)
}

/// Each engine's clock (in `urls`' order), `None` for one that does not keep it or
/// could not be read: a profile goes on without the split.
pub(crate) async fn engine_clocks(
    client: &EngineClient,
    urls: &[String],
) -> Vec<Option<EngineClock>> {
    let mut clocks = Vec::with_capacity(urls.len());
    for url in urls {
        clocks.push(EngineClock::read(client, url).await.ok().flatten());
    }
    clocks
}

/// Where `target`'s requests go, for messages.
fn named(target: &Target) -> String {
    match target.pinned {
        None => target.url.clone(),
        Some(worker) => format!("{} (pinned to engine {worker})", target.url),
    }
}

/// The engines a router fronts that are up: (worker id, URL), from its `/v1/engines`.
async fn router_engine_ids(client: &EngineClient, router: &str) -> Result<Vec<(u64, String)>> {
    let body = get_ok(client, router, "/v1/engines", 1 << 20).await?;
    let listing: Value =
        serde_json::from_slice(&body).with_context(|| format!("{router}/v1/engines: not JSON"))?;
    let engines = listing
        .get("engines")
        .and_then(Value::as_array)
        .with_context(|| format!("{router}/v1/engines: no list of engines"))?;
    Ok(engines
        .iter()
        .filter(|engine| engine["health"] == "up")
        .filter_map(|engine| {
            let id = engine["id"].as_u64()?;
            let url = engine["url"].as_str()?.trim_end_matches('/').to_string();
            Some((id, url))
        })
        .collect())
}

/// The record, or why the engine failed it.
fn check(record: RequestRecord, target: &Target) -> Result<RequestRecord> {
    if let Some(failure) = &record.failure {
        bail!(
            "{}: request {} failed ({failure:?}, status {:?})",
            named(target),
            record.index,
            record.status
        );
    }
    Ok(record)
}

fn write(path: &PathBuf, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests;
