//! A prompt prefilled while its engine streams other answers: a fresh prompt sent to an
//! engine decoding `k` long answers, for `k` of 1 and the profile's batch sizes. Its
//! time to first token splits, by vLLM's own queue and prefill histograms (read around
//! it while the long answers still stream, so that only the probe has finished in
//! between), into the engine's part and the rest.
//!
//! On vLLM's CPU build the API server and the engine core share the CPU with the
//! forward pass, and streaming others' answers keeps them busy:
//! - the rest (the probe's way in and out) is more than a lone request's overhead (on
//!   the 2-core VM, each engine on a core of its own: 4 ms alone, 8 to 12 ms beside a
//!   decode). It also holds the wait for the step in flight, which the engine's queue
//!   time does not count (vLLM queues a request between steps): the table's
//!   `request_overhead_busy_ms` is the median beside one decode less half a lone step,
//!   since the twin's engine makes a request arriving mid-step wait anyway;
//! - the answer beside it steps slower while the probe comes in and goes out: beside
//!   one answer, its steps in the probe's window (the probe's own pass taken off) are
//!   set against its steps outside, and the same in windows as long without a probe
//!   (the engine's clock is read at both ends of each, and reading it is work too);
//!   the difference of the medians is the table's `arrival_stretch_ms` (on the 2-core
//!   VM about what the probe's way in lost to the steps, as sharing one core fairly
//!   would have it);
//! - the engine's part, the pass that prefills the probe beside the decodes, is longer
//!   than the same prompt's prefill alone by more than the decodes' own work, and by
//!   about as many milliseconds whatever the prompt's length (a 64-token and a
//!   320-token prompt: 1.5 ms beside one decode; 2.3 and 3.2 ms beside two): the
//!   table's `prefill_beside_decode` keeps each `k`'s median less the lone prefill of
//!   the same length (`extra_ms`), and its outside median less half the long answers'
//!   step (`overhead_ms`: the twin makes a request wait for the step in flight
//!   anyway), the way in and out beside `k` requests.
//!
//! Owns: the probes' timing, their samples and what the table takes of them. Never:
//! runs without the engine's histograms (a sample needs them) or measures a lone
//! prefill (the profile's prefill points are the reference).

use super::engine_time::EngineClock;
use super::{check, PlannedRequest, Prompts, Repeats};
use anyhow::Result;
use kvtwin_plane::bench::serve::request::{send, Target};
use kvtwin_plane::service::frontend::engine_client::EngineClient;
use kvtwin_sim::compute::table::BesideDecode;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Outputs of each long answer at least: it decodes well past the probe (48 steps of a
/// few to a few tens of milliseconds); more where the probe's prompt is long against a
/// pass ([`background_tokens`]).
const BACKGROUND_TOKENS: u32 = 48;

/// How many passes' time the long answers outlast a probe's lone time to first token
/// by: beside decodes its prefill is longer and its way in slower (on a 2-core VM with
/// one engine on both cores, a 1,024-token probe took 1.5 times its lone TTFT beside
/// one answer, and its API server lagged behind four fast streams by more).
const OUTLAST: f64 = 6.0;

/// How long after the long answers are sent the probe goes: past their prefills, into
/// their decode.
const PROBE_AFTER: Duration = Duration::from_millis(60);

/// Rounds run past `repeats` while a point has no clean sample of the probe yet, and
/// beside one decode while the probed or the control windows have none (on a loaded
/// machine a sample is spoilt when a long answer ends early or another request finishes
/// in its window), at most this many.
const EXTRA_ROUNDS: usize = 8;

/// The probes at one number of decodes beside: every repeat of every engine.
#[derive(Clone, Debug)]
pub(super) struct BesidePoint {
    /// Long answers streaming beside the probe.
    pub(super) decodes: u64,
    /// The probe's TTFT less the engine's part, ms.
    pub(super) outside: Repeats,
    /// The engine's part (vLLM's queue and prefill times), ms.
    pub(super) inside: Repeats,
}

/// Every probe beside decodes, and the lone prefill they are set against.
#[derive(Clone, Debug)]
pub(super) struct BesideDecodes {
    /// The probes' prompt length, tokens: one of the prefill points.
    pub(super) isl: u64,
    /// That point's median inside the engine, alone, ms.
    pub(super) lone_engine_ms: f64,
    /// Outputs of each long answer.
    pub(super) background_tokens: u32,
    /// By decodes beside, ascending; 1 always among them.
    pub(super) points: Vec<BesidePoint>,
    /// How much a probe lengthened the steps of the one answer beside it.
    pub(super) stretch: Option<Stretch>,
}

/// The probes' plan: the longest prefill point that fits in the cache beside the most
/// decodes measured (`batches` that fit, and 1), and those decodes.
pub(super) fn plan(
    isls: &[u64],
    batches: &[u64],
    block_size: u64,
    max_kv: u64,
    limit: u64,
) -> Option<(usize, Vec<u64>)> {
    let answer = block_size + u64::from(BACKGROUND_TOKENS);
    let mut decodes: Vec<u64> = batches
        .iter()
        .copied()
        .chain([1])
        .filter(|&k| k >= 1 && k * answer + isls.iter().min().copied().unwrap_or(0) <= max_kv)
        .collect();
    decodes.sort_unstable();
    decodes.dedup();
    let most = *decodes.last()?;
    let point = isls
        .iter()
        .enumerate()
        .filter(|(_, &isl)| isl <= limit && most * answer + isl < max_kv)
        .max_by_key(|(_, &isl)| isl)?
        .0;
    Some((point, decodes))
}

/// Outputs of each long answer: enough passes (`pass_ms` each, a short lone prefill's)
/// to outlast [`OUTLAST`] times the probe's lone TTFT (`probe_ttft_ms`), at least
/// [`BACKGROUND_TOKENS`], and no more than `most` answers of `block_size` prompt tokens
/// leave room for the probe's `isl` in `max_kv`. A long answer that ends before the
/// probe spoils the sample (its own time counts in the window).
pub(super) fn background_tokens(
    probe_ttft_ms: f64,
    pass_ms: f64,
    (most, isl, block_size, max_kv): (u64, u64, u64, u64),
) -> u32 {
    let needed = if pass_ms > 0.0 {
        (OUTLAST * probe_ttft_ms / pass_ms).ceil() as u64
    } else {
        0
    };
    let room = (max_kv.saturating_sub(isl + 1) / most.max(1)).saturating_sub(block_size);
    let tokens = needed.max(u64::from(BACKGROUND_TOKENS)).min(room);
    u32::try_from(tokens).unwrap_or(u32::MAX)
}

/// Probes each engine (`targets`, all at once) `repeats` times at each of `decodes`
/// with fresh prompts of `isl` tokens; `lone_engine_ms` is that length's lone prefill.
/// Beside one decode, each probe is followed by a control window as long as
/// `control` with no probe in it (the stretch's reference); rounds go on past `repeats`
/// (up to [`EXTRA_ROUNDS`]) until the probe has a clean sample at each `decodes` and, beside
/// one decode, both kinds of window have one.
#[allow(clippy::too_many_arguments)]
pub(super) async fn measure(
    client: &EngineClient,
    targets: &[(&Target, &str)],
    prompts: &mut Prompts,
    isl: u64,
    lone_engine_ms: f64,
    control: Duration,
    decodes: &[u64],
    repeats: usize,
    background: u32,
) -> Result<BesideDecodes> {
    let block_size = prompts.block_size;
    let mut points = Vec::with_capacity(decodes.len());
    let (mut probed, mut controlled) = (Vec::new(), Vec::new());
    for &k in decodes {
        let (mut outside, mut inside) = (Vec::new(), Vec::new());
        let mut round = 0;
        // Past `repeats` while this point has no sample at all (on a loaded machine
        // every round can be spoilt: a long answer ends inside the probe's window, or
        // the engine's clock is not read), and beside one decode while either kind of
        // stretch window has none.
        while round < repeats
            || ((inside.is_empty() || (k == 1 && (probed.is_empty() || controlled.is_empty())))
                && round < repeats + EXTRA_ROUNDS)
        {
            round += 1;
            for with_probe in [true, false] {
                if !with_probe && k != 1 {
                    continue;
                }
                let planned = targets
                    .iter()
                    .map(|_| {
                        let long: Vec<PlannedRequest> = (0..k)
                            .map(|_| prompts.planned(block_size, background))
                            .collect();
                        (long, with_probe.then(|| prompts.planned(isl, 1)))
                    })
                    .collect();
                for sample in probe(client, targets, planned, control).await? {
                    if let Some((out, engine)) = sample.split {
                        outside.push(out);
                        inside.push(engine);
                    }
                    match (sample.excess, with_probe) {
                        (Some(excess), true) => probed.push(excess),
                        (Some(excess), false) => controlled.push(excess),
                        (None, _) => {}
                    }
                }
            }
        }
        if round > repeats {
            eprintln!(
                "  beside {k} decoding: {} rounds past the {repeats} asked for to find clean \
                 samples ({} of the probe{})",
                round - repeats,
                inside.len(),
                if k == 1 {
                    format!(
                        ", {} windows with a probe, {} without",
                        probed.len(),
                        controlled.len()
                    )
                } else {
                    String::new()
                }
            );
        }
        eprintln!(
            "  prefill {isl:>6} tokens beside {k} decoding: {:.2} ms in the engine, {:.2} \
             outside",
            Repeats(inside.clone()).median(),
            Repeats(outside.clone()).median()
        );
        points.push(BesidePoint {
            decodes: k,
            outside: Repeats(outside),
            inside: Repeats(inside),
        });
    }
    let stretch = (!probed.is_empty() && !controlled.is_empty()).then_some(Stretch {
        probed: Repeats(probed),
        controlled: Repeats(controlled),
    });
    Ok(BesideDecodes {
        isl,
        lone_engine_ms,
        background_tokens: background,
        points,
        stretch,
    })
}

/// What one engine's probe (or control window) says.
struct Sample {
    /// The probe's TTFT less the engine's part, and that part, ms; `None` without a
    /// probe, without the engine's histograms, or when another request finished around
    /// it.
    split: Option<(f64, f64)>,
    /// Beside one long answer: how much longer its steps in the window took than its
    /// steps outside it, the probe's own pass taken off, ms.
    excess: Option<f64>,
}

/// Each engine's sample (in `targets`' order, all at once). The engine's clock is read
/// before the long answers go, around the probe (or the control window, which waits
/// `control` instead) and after the answers end: the window's output gaps against the
/// answers' other gaps give the excess.
async fn probe(
    client: &EngineClient,
    targets: &[(&Target, &str)],
    planned: Vec<(Vec<PlannedRequest>, Option<PlannedRequest>)>,
    control: Duration,
) -> Result<Vec<Sample>> {
    let origin = Instant::now();
    let read = |url| async move { EngineClock::read(client, url).await.ok().flatten() };
    let each = targets
        .iter()
        .zip(planned)
        .map(|(&(target, url), (long, probe))| async move {
            let k = long.len();
            let start = read(url).await;
            let long = futures::future::join_all(
                long.into_iter()
                    .map(|request| send(client, target, request, origin)),
            );
            let probed = async {
                tokio::time::sleep(PROBE_AFTER).await;
                let before = read(url).await;
                let record = match probe {
                    Some(probe) => Some(send(client, target, probe, origin).await),
                    None => {
                        tokio::time::sleep(control).await;
                        None
                    }
                };
                let after = read(url).await;
                (record, before, after)
            };
            let (long, (record, before, after)) = tokio::join!(long, probed);
            let end = read(url).await;
            (target, k, long, record, [start, before, after, end])
        });
    let mut samples = Vec::with_capacity(targets.len());
    for (target, k, long, record, clocks) in futures::future::join_all(each).await {
        for answer in long {
            check(answer, target)?;
        }
        let record = record.map(|record| check(record, target)).transpose()?;
        let [start, before, after, end] = clocks;
        let (Some(before), Some(after)) = (before, after) else {
            samples.push(Sample {
                split: None,
                excess: None,
            });
            continue;
        };
        let finished = after.requests_since(&before);
        let split = match &record {
            Some(record) if finished == 1.0 => {
                let ttft = record.ttft.unwrap_or(record.e2e).as_secs_f64() * 1e3;
                after
                    .ms_per_request_since(&before)
                    .map(|engine| (ttft - engine, engine))
            }
            _ => None,
        };
        let clean = finished == if record.is_some() { 1.0 } else { 0.0 };
        let excess = match (start, end) {
            (Some(start), Some(end)) if k == 1 && clean => {
                let window = after.itl_since(&before);
                let all = end.itl_since(&start);
                let own_pass = split.map(|(_, engine)| engine);
                match own_pass {
                    None if record.is_some() => None,
                    own_pass => {
                        window_excess(window, (all.0 - window.0, all.1 - window.1), own_pass)
                    }
                }
            }
            _ => None,
        };
        samples.push(Sample { split, excess });
    }
    Ok(samples)
}

/// One long answer's steps in a window, over its steps outside it: the `window`'s
/// gaps (sum ms, count) less the probe's `own_pass` (which is one of them, where a
/// probe came) and the rest at the mean of the `other` gaps; `None` where either has
/// no gap.
pub(super) fn window_excess(
    (window_ms, window_gaps): (f64, f64),
    (other_ms, other_gaps): (f64, f64),
    own_pass: Option<f64>,
) -> Option<f64> {
    if other_gaps < 1.0 || window_gaps < 1.0 + f64::from(u8::from(own_pass.is_some())) {
        return None;
    }
    let step = other_ms / other_gaps;
    let passes = window_gaps - f64::from(u8::from(own_pass.is_some()));
    Some(window_ms - own_pass.unwrap_or(0.0) - passes * step)
}

/// Beside one long answer: its steps' excess in windows with a probe and in windows
/// without.
#[derive(Clone, Debug)]
pub(super) struct Stretch {
    probed: Repeats,
    controlled: Repeats,
}

impl BesideDecodes {
    fn point(&self, decodes: u64) -> Option<&BesidePoint> {
        self.points
            .iter()
            .find(|p| p.decodes == decodes && !p.outside.0.is_empty())
    }

    /// The table's `request_overhead_busy_ms`: outside the engine beside one decode,
    /// less half a lone step (the step in flight, which the twin waits for anyway).
    pub(super) fn overhead_busy_ms(&self, lone_step_ms: f64) -> Option<f64> {
        let beside_one = self.point(1)?.outside.median();
        Some((beside_one - lone_step_ms / 2.0).max(0.0))
    }

    /// The table's `prefill_beside_decode`: each point's engine median less the lone
    /// prefill, where it has samples, and its outside median less half the step its
    /// long answers took (`step_ms(batch, context_tokens)`, the table's decode step: the
    /// probe came at a random moment of one, and the twin makes a request arriving
    /// mid-step wait for its end anyway).
    pub(super) fn factors(
        &self,
        block_size: u64,
        step_ms: impl Fn(u64, u64) -> f64,
    ) -> Vec<BesideDecode> {
        // Each long answer's tokens at the middle of its decode.
        let per_answer = block_size + u64::from(self.background_tokens) / 2;
        if self.lone_engine_ms <= 0.0 {
            return Vec::new();
        }
        self.points
            .iter()
            .filter(|p| !p.inside.0.is_empty())
            .map(|p| BesideDecode {
                decodes: p.decodes,
                // The decodes add time, not a share: a 64-token and a 320-token prompt
                // took alike longer beside one decode on the 2-core VM (1.5 ms each).
                factor: 1.0,
                extra_ms: (p.inside.median() - self.lone_engine_ms).max(0.0),
                overhead_ms: if p.outside.0.is_empty() {
                    0.0
                } else {
                    (p.outside.median() - step_ms(p.decodes, p.decodes * per_answer) / 2.0).max(0.0)
                },
            })
            .collect()
    }

    /// The table's `arrival_stretch_ms`: how much longer, at the median, a decode's steps
    /// took around a probe than in a window as long without one; `None` unmeasured.
    pub(super) fn arrival_stretch_ms(&self) -> Option<f64> {
        let stretch = self.stretch.as_ref()?;
        Some((stretch.probed.median() - stretch.controlled.median()).max(0.0))
    }

    /// Every repeat, for `engine_profile.json`.
    pub(super) fn to_json(&self) -> Value {
        json!({
            "isl": self.isl,
            "lone_engine_ms": self.lone_engine_ms,
            "background_tokens": self.background_tokens,
            // Beside one answer, its steps' excess over its other steps in each window
            // with a probe (the probe's pass taken off) and without; the table's
            // `arrival_stretch_ms` is the difference of their medians.
            "steps_excess_with_probe": self.stretch.as_ref().map(|s| s.probed.to_json()),
            "steps_excess_without": self.stretch.as_ref().map(|s| s.controlled.to_json()),
            "points": self.points.iter().map(|p| json!({
                "decodes": p.decodes,
                "outside": p.outside.to_json(),
                "engine": p.inside.to_json(),
            })).collect::<Vec<_>>(),
        })
    }

    /// The outside samples beside one decode (`request_overhead_beside_decode` in the
    /// profile's JSON, as before the other points were measured).
    pub(super) fn beside_one(&self) -> Option<&Repeats> {
        self.point(1).map(|p| &p.outside)
    }

    /// The report's lines; `table` is what the table took of the points ([`Self::factors`]).
    pub(super) fn print(&self, lone_step_ms: f64, busy_ms: f64, table: &[BesideDecode]) {
        if let Some(one) = self.beside_one() {
            println!(
                "the same while the engine decodes another answer: {:.2} ms ({:.2} to {:.2}); \
                 less half a lone step ({:.2} ms), which the twin makes it wait anyway: {:.2} \
                 ms (the table's request_overhead_busy_ms)",
                one.median(),
                one.min(),
                one.max(),
                lone_step_ms / 2.0,
                busy_ms
            );
        }
        if let (Some(stretch), Some(ms)) = (&self.stretch, self.arrival_stretch_ms()) {
            println!(
                "the decode beside it: its steps took {:.2} ms longer than its others \
                 (the probe's own pass taken off), {:.2} ms in as long a window without a \
                 probe: {ms:.2} ms (the table's arrival_stretch_ms)",
                stretch.probed.median(),
                stretch.controlled.median()
            );
        }
        println!(
            "\nprefill beside decodes: a prompt of {} tokens sent while its engine streams \
             other answers, engine ms against {:.2} alone (the table's prefill_beside_decode)",
            self.isl, self.lone_engine_ms
        );
        println!(
            "{:>8}  {:>10}  {:>19}  {:>9}  {:>10}  {:>11}",
            "decodes", "engine ms", "spread ms", "added ms", "outside ms", "overhead ms"
        );
        for p in self.points.iter().filter(|p| !p.inside.0.is_empty()) {
            let taken = table.iter().find(|b| b.decodes == p.decodes);
            println!(
                "{:>8}  {:>10.2}  {:>8.2} to {:>7.2}  {:>9.2}  {:>10.2}  {:>11.2}",
                p.decodes,
                p.inside.median(),
                p.inside.min(),
                p.inside.max(),
                taken.map_or(0.0, |b| b.extra_ms),
                p.outside.median(),
                taken.map_or(0.0, |b| b.overhead_ms)
            );
        }
        println!(
            "(added: the engine's pass over the prompt's alone, the table's extra_ms; \
             overhead: outside less half the answers' step, the table's overhead_ms)"
        );
    }
}
