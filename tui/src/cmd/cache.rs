//! `kvtwin cache`: how big must the cache be for this trace? The trace replayed through
//! one cache of each capacity, or (`--curve`) LRU's hits at every capacity from one
//! pass, estimated from a sample with `--sample-rate` and drawn with `--plot`.
//!
//! Owns: [`CacheOptions`], which of the two runs, and the output: the rows as a table or
//! one JSON line, and for the whole curve its GiB, marginal hits per GiB, saturation and
//! knee. Never: replay or compute a curve itself (`kvtwin_sim::cache` does), or draw
//! (`plot::cache` does).

use crate::args::trace::{read_trace, MismatchArg};
use crate::Policy;
use anyhow::{bail, Context, Result};
use kvtwin::pool::EvictionPolicyKind;
use kvtwin_sim::cache;
use kvtwin_sim::workload::TraceCheck;
use std::path::{Path, PathBuf};

/// What `kvtwin cache` was asked.
pub(crate) struct CacheOptions {
    pub(crate) trace: PathBuf,
    pub(crate) capacity_blocks: Vec<usize>,
    pub(crate) curve: bool,
    pub(crate) block_bytes: Option<u64>,
    pub(crate) block_tokens: usize,
    pub(crate) policy: Policy,
    pub(crate) json: bool,
    pub(crate) sample_rate: Option<f64>,
    pub(crate) compare_exact: bool,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) trace_mismatch: MismatchArg,
}

/// `kvtwin cache`: each listed capacity replayed, or with `--curve` the curve.
pub(crate) fn cache(options: CacheOptions) -> Result<()> {
    let CacheOptions {
        trace,
        capacity_blocks,
        curve,
        block_bytes,
        block_tokens,
        policy,
        json,
        sample_rate,
        compare_exact,
        plot,
        trace_mismatch,
    } = options;
    let check = TraceCheck {
        block_tokens: block_tokens as u64,
        mismatch: trace_mismatch.into(),
    };
    if curve {
        let extras = CurveExtras {
            sample_rate,
            compare_exact,
            plot,
        };
        cache_curve(
            TraceArg {
                path: &trace,
                check,
            },
            &capacity_blocks,
            block_tokens,
            block_bytes,
            policy,
            json,
            &extras,
        )
    } else {
        let trace = TraceArg {
            path: &trace,
            check,
        };
        cache_sizes(trace, &capacity_blocks, block_tokens, policy, json)
    }
}

/// A trace named on the command line and the check to read it with.
#[derive(Clone, Copy)]
struct TraceArg<'a> {
    path: &'a Path,
    check: TraceCheck,
}

fn cache_sizes(
    trace: TraceArg<'_>,
    capacities: &[usize],
    block_tokens: usize,
    policy: Policy,
    json: bool,
) -> Result<()> {
    let requests = read_trace(trace.path, trace.check)?.requests;
    let eviction = match policy {
        Policy::Lru => EvictionPolicyKind::Lru,
        Policy::Priority => EvictionPolicyKind::Priority,
    };
    let mut rows = Vec::with_capacity(capacities.len());
    for &capacity in capacities {
        rows.push(
            cache::replay(&requests, capacity, block_tokens, eviction)
                .with_context(|| format!("capacity {capacity}"))?,
        );
    }
    print_rows(&rows, json);
    Ok(())
}

/// `kvtwin cache`'s rows as the JSON objects of its `"rows"` list, comma separated.
fn rows_json(rows: &[cache::CacheRow]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"capacity_blocks\":{},\"hit_blocks\":{:.6},\"hit_tokens\":{:.6}}}",
                r.capacity_blocks, r.hit_blocks, r.hit_tokens
            )
        })
        .collect();
    rows.join(",")
}

/// `kvtwin cache`'s rows: a table, or `{"rows":[...]}` on one line.
fn print_rows(rows: &[cache::CacheRow], json: bool) {
    if json {
        println!("{{\"rows\":[{}]}}", rows_json(rows));
    } else {
        println!(
            "{:>15} {:>10} {:>10}",
            "capacity_blocks", "hit_blocks", "hit_tokens"
        );
        for row in rows {
            println!(
                "{:>15} {:>10.4} {:>10.4}",
                row.capacity_blocks, row.hit_blocks, row.hit_tokens
            );
        }
    }
}

/// KV bytes per token of Llama-3-8B in fp16 (see `--block-bytes`).
const LLAMA3_8B_KV_BYTES_PER_TOKEN: u64 = 131_072;

/// Share of the reachable hits that defines the printed knee.
pub(crate) const KNEE_FRACTION: f64 = 0.8;

/// `--curve`'s options beyond the exact curve: sampling, its check, and a chart.
struct CurveExtras {
    sample_rate: Option<f64>,
    compare_exact: bool,
    plot: Option<PathBuf>,
}

/// The curve `kvtwin cache --curve` prints: exact, or estimated from a sample.
pub(crate) enum Curve {
    Exact(cache::curve::HitCurve),
    // Boxed: its per-stratum arrays make it ten times the size of the exact one.
    Sampled(Box<cache::shards::SampledCurve>),
}

impl Curve {
    fn row(&self, capacity_blocks: usize) -> cache::CacheRow {
        match self {
            Curve::Exact(curve) => curve.row(capacity_blocks),
            Curve::Sampled(curve) => curve.row(capacity_blocks),
        }
    }

    pub(crate) fn saturation_blocks(&self) -> usize {
        match self {
            Curve::Exact(curve) => curve.saturation_blocks(),
            Curve::Sampled(curve) => curve.saturation_blocks(),
        }
    }

    fn knee(&self, fraction: f64) -> cache::curve::Knee {
        match self {
            Curve::Exact(curve) => curve.knee(fraction),
            Curve::Sampled(curve) => curve.knee(fraction),
        }
    }
}

/// `kvtwin cache --curve`: the listed rows, or the whole curve with its knee; sampled
/// with `--sample-rate` (and checked against the exact one with `--compare-exact`),
/// drawn with `--plot`.
fn cache_curve(
    trace: TraceArg<'_>,
    capacities: &[usize],
    block_tokens: usize,
    block_bytes: Option<u64>,
    policy: Policy,
    json: bool,
    extras: &CurveExtras,
) -> Result<()> {
    if matches!(policy, Policy::Priority) {
        bail!(
            "--curve computes LRU's stack distances; --policy priority has no inclusion \
             property, so replay each capacity without --curve"
        );
    }
    if block_tokens == 0 {
        bail!("--block-tokens must be at least 1");
    }
    if let Some(&zero) = capacities.iter().find(|c| **c == 0) {
        bail!("capacity {zero}: a cache needs at least one block");
    }
    let rate = extras
        .sample_rate
        .map(|r| cache::shards::SampleRate::new(r).with_context(|| format!("--sample-rate {r}")))
        .transpose()?;
    let requests = read_trace(trace.path, trace.check)?.requests;
    let timed = |what: &str, started: std::time::Instant| {
        eprintln!(
            "kvtwin: {what} in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    };
    let exact = if rate.is_none() || extras.compare_exact || extras.plot.is_some() {
        let started = std::time::Instant::now();
        let exact = cache::curve::HitCurve::lru(&requests, block_tokens);
        if extras.compare_exact {
            timed("exact curve", started);
        }
        Some(exact)
    } else {
        None
    };
    let curve = match (rate, &exact) {
        (Some(rate), _) => {
            let started = std::time::Instant::now();
            let sampled = cache::shards::SampledCurve::lru(
                &requests,
                block_tokens,
                rate,
                cache::shards::Estimator::Stratified,
            );
            if extras.compare_exact {
                timed(&format!("sampled curve ({})", percent(rate.get())), started);
            }
            Curve::Sampled(Box::new(sampled))
        }
        (None, Some(exact)) => Curve::Exact(exact.clone()),
        (None, None) => unreachable!("the exact curve is computed whenever nothing is sampled"),
    };
    let block_bytes = block_bytes.unwrap_or(block_tokens as u64 * LLAMA3_8B_KV_BYTES_PER_TOKEN);
    let gib = |blocks: usize| blocks as f64 * block_bytes as f64 / (1u64 << 30) as f64;
    if let (Some(dir), Some(exact)) = (&extras.plot, &exact) {
        for path in crate::plot::cache::plot_curve(dir, exact, &curve, gib)? {
            eprintln!("kvtwin: wrote {}", path.display());
        }
    }
    let listed = !capacities.is_empty();
    let capacities = if listed {
        capacities.to_vec()
    } else {
        cache::curve::doubling_capacities(curve.saturation_blocks())
    };
    let rows: Vec<cache::CacheRow> = capacities.iter().map(|c| curve.row(*c)).collect();
    // The sampled rate and, with --compare-exact, the error over the printed capacities.
    let mut notes = Vec::new();
    if let Curve::Sampled(sampled) = &curve {
        notes.push((
            format!("\"sample_rate\":{}", sampled.rate().get()),
            format!(
                "sampled {} of the blocks ({} references kept)",
                percent(sampled.rate().get()),
                sampled.kept_blocks()
            ),
        ));
    }
    if let (true, Some(exact)) = (extras.compare_exact, &exact) {
        let exact_rows: Vec<cache::CacheRow> = capacities.iter().map(|c| exact.row(*c)).collect();
        let (blocks, tokens) = cache::shards::mean_absolute_error(&rows, &exact_rows);
        notes.push((
            format!("\"mae\":{{\"hit_blocks\":{blocks:.6},\"hit_tokens\":{tokens:.6}}}"),
            format!(
                "mean absolute error against the exact curve over these {} capacities: \
                 hit_blocks {blocks:.4}, hit_tokens {tokens:.4}",
                capacities.len()
            ),
        ));
    }
    let json_notes: String = notes.iter().map(|(j, _)| format!(",{j}")).collect();
    if listed {
        if json {
            println!("{{\"rows\":[{}]{json_notes}}}", rows_json(&rows));
        } else {
            print_rows(&rows, false);
            notes.iter().for_each(|(_, text)| println!("{text}"));
        }
        return Ok(());
    }
    let knee = curve.knee(KNEE_FRACTION);
    let saturation = curve.saturation_blocks();
    if json {
        let rows = rows_json(&rows);
        println!(
            "{{\"rows\":[{}],\"saturation_blocks\":{saturation},\"block_bytes\":{block_bytes},\
             \"knee\":{{\"fraction\":{},\"capacity_blocks\":{}}}{json_notes}}}",
            rows, knee.fraction, knee.capacity_blocks
        );
        return Ok(());
    }
    println!(
        "{:>15} {:>10} {:>10} {:>10} {:>22}",
        "capacity_blocks", "hit_blocks", "hit_tokens", "GiB", "marginal_pp_per_GiB"
    );
    let mut previous = curve.row(0);
    for row in &rows {
        // Percentage points of hit blocks gained per GiB added since the previous row.
        let marginal = 100.0 * (row.hit_blocks - previous.hit_blocks)
            / (gib(row.capacity_blocks) - gib(previous.capacity_blocks));
        println!(
            "{:>15} {:>10.4} {:>10.4} {:>10.1} {:>22.4}",
            row.capacity_blocks,
            row.hit_blocks,
            row.hit_tokens,
            gib(row.capacity_blocks),
            marginal
        );
        previous = *row;
    }
    let reachable = curve.row(saturation);
    println!(
        "hits stop growing at {saturation} blocks ({:.1} GiB): hit_blocks {:.4}, hit_tokens {:.4}",
        gib(saturation),
        reachable.hit_blocks,
        reachable.hit_tokens
    );
    println!(
        "{:.0} % of the reachable hits at {} blocks ({:.1} GiB; hit_blocks {:.4}); {block_bytes} bytes per block",
        knee.fraction * 100.0,
        knee.capacity_blocks,
        gib(knee.capacity_blocks),
        curve.row(knee.capacity_blocks).hit_blocks
    );
    notes.iter().for_each(|(_, text)| println!("{text}"));
    Ok(())
}

/// A sampling rate as a percentage with three significant digits (rates are multiples
/// of 1/2^24, so 1 % is 0.99999905 %).
pub(crate) fn percent(rate: f64) -> String {
    let percent = 100.0 * rate;
    let decimals = (2 - percent.log10().floor() as i32).clamp(0, 6) as usize;
    let text = format!("{percent:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text} %")
}
