//! A speed check: how fast the engines run now against their profile, in a second or
//! two, so that a twin can run at the machine's present speed with the profile's shape.
//!
//! On a shared VM the engines' speed moves by more than a validation's target between
//! a profile and a run (the 2-core VM: the decode step of batch 2 went from 6.7 to
//! 8.2 ms within three minutes, every point alike), and a twin that steps at the
//! profile's speed is then wrong by that much whatever it models. The check measures
//! two of the profile's own points on every engine at once, as the profile does (the
//! same fresh prompts, the same engine histograms; the caller says where each engine's
//! requests go): a lone prefill of the table's longest prompt (its engine part) and a
//! decode batch at the table's shortest context (vLLM's mean output gap). Each over
//! the table's figure at that point is a ratio; the engine's factor is their
//! geometric mean (a CPU shared with others slows prefill and decode alike, and two
//! ratios halve the noise of one).
//!
//! Owns: the check's points, its requests and its factors. Never: changes a table (the
//! caller levels it with `TableModel::at_speed`), or reads an engine's cache (its
//! prompts are fresh, and they stay cached until the caller empties the caches).

use super::{check, engine_clocks, together, Prompts, Repeats};
use anyhow::Result;
use kvtwin_plane::bench::serve::request::Target;
use kvtwin_plane::bench::serve::workload::PlannedRequest;
use kvtwin_plane::service::frontend::engine_client::EngineClient;
use kvtwin_sim::compute::table::TableModel;
use serde_json::{json, Value};

/// Lone prefills a check sends each engine (one at a time, every engine at once).
const PREFILLS: usize = 6;

/// Decode batches a check streams on each engine.
const DECODES: usize = 3;

/// Outputs of each decoding sequence: the profile's default, so that the decode
/// point is the table's own (its contexts are the prompts' plus half the outputs).
const OSL: u32 = 32;

/// The points a check measures, from the table it checks against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SpeedPoints {
    /// The prefill's prompt tokens: the table's longest that fits the cache.
    pub(crate) isl: u64,
    /// The decode batch's prompt tokens: its shortest context, less half the outputs.
    pub(crate) context: u64,
    /// The decode batch: 2 where the table has it, else its first batch.
    pub(crate) batch: u64,
}

impl SpeedPoints {
    /// The table's points a check can measure on an engine holding `max_kv` tokens;
    /// `None` for a table without a prefill or a decode curve.
    pub(crate) fn of(table: &TableModel, max_kv: u64) -> Option<SpeedPoints> {
        let isl = table
            .prefill_isl
            .iter()
            .copied()
            .filter(|&isl| isl <= max_kv)
            .max()?;
        let curve = table.decode.first()?;
        let batch = if curve.batch.contains(&2) {
            2
        } else {
            *curve.batch.first()?
        };
        let context = curve.context.saturating_sub(u64::from(OSL) / 2).max(1);
        (batch * (context + u64::from(OSL)) <= max_kv).then_some(SpeedPoints {
            isl,
            context,
            batch,
        })
    }

    /// The table's figures at the points: the lone prefill, the decode step, ms.
    fn expected(&self, table: &TableModel) -> (f64, f64) {
        let prefill = table.prefill(&[(self.isl, 0)]).as_secs_f64() * 1e3;
        let per_sequence = self.context + u64::from(OSL) / 2;
        let decode = table
            .decode_step(self.batch, self.batch * per_sequence)
            .as_secs_f64()
            * 1e3;
        (prefill, decode)
    }
}

/// One engine's check: what it took at the points and what its table says.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Speed {
    /// The prefill's engine part, median, ms; `None` where the engine did not say.
    pub(crate) prefill_ms: Option<f64>,
    /// The decode step (vLLM's mean output gap), median, ms; `None` likewise.
    pub(crate) decode_ms: Option<f64>,
    /// The table's figures at the same points, ms.
    pub(crate) expected_ms: (f64, f64),
}

impl Speed {
    /// How much slower (above 1) the engine runs than its table: the geometric mean of
    /// the two points' ratios, the one there is where the other is missing; `None`
    /// without either.
    pub(crate) fn factor(&self) -> Option<f64> {
        let ratio = |measured: Option<f64>, expected: f64| {
            measured.filter(|_| expected > 0.0).map(|ms| ms / expected)
        };
        geometric_mean(
            ratio(self.prefill_ms, self.expected_ms.0),
            ratio(self.decode_ms, self.expected_ms.1),
        )
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({
            "prefill_ms": self.prefill_ms,
            "decode_ms": self.decode_ms,
            "expected_prefill_ms": self.expected_ms.0,
            "expected_decode_ms": self.expected_ms.1,
            "factor": self.factor(),
        })
    }
}

/// The geometric mean of two factors, the one there is where the other is missing.
pub(crate) fn geometric_mean(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some((a * b).sqrt()),
        (one, None) | (None, one) => one,
    }
}

/// The checks of a run: fresh prompts across them all.
pub(crate) struct SpeedCheck {
    prompts: Prompts,
    points: SpeedPoints,
}

impl SpeedCheck {
    /// Checks at `points` with prompts of `block_size`-token blocks.
    pub(crate) fn new(points: SpeedPoints, block_size: u64) -> SpeedCheck {
        SpeedCheck {
            // Apart from a profile's prompts (which count up from 0), should one still
            // be cached.
            prompts: Prompts {
                next: 1 << 40,
                block_size,
            },
            points,
        }
    }

    /// Every engine checked at once: `targets` (each pinned to its engine), `urls`
    /// (where each engine's clock is read) and `tables` (each engine's own), in one
    /// order; the speeds in that order.
    pub(crate) async fn run(
        &mut self,
        client: &EngineClient,
        targets: &[Target],
        urls: &[String],
        tables: &[&TableModel],
    ) -> Result<Vec<Speed>> {
        let points = self.points;
        let mut prefills = vec![Vec::new(); targets.len()];
        for _ in 0..PREFILLS {
            let each = self.batches(targets, 1, points.isl, 1);
            for (engine, ms) in self.engine_ms(client, urls, each, Clock::Prefill).await? {
                prefills[engine].push(ms);
            }
        }
        let mut decodes = vec![Vec::new(); targets.len()];
        for _ in 0..DECODES {
            let each = self.batches(targets, points.batch, points.context, OSL);
            for (engine, ms) in self.engine_ms(client, urls, each, Clock::Decode).await? {
                decodes[engine].push(ms);
            }
        }
        let median = |samples: Vec<f64>| (!samples.is_empty()).then(|| Repeats(samples).median());
        Ok(prefills
            .into_iter()
            .zip(decodes)
            .zip(tables)
            .map(|((prefill, decode), table)| Speed {
                prefill_ms: median(prefill),
                decode_ms: median(decode),
                expected_ms: points.expected(table),
            })
            .collect())
    }

    fn batches<'a>(
        &mut self,
        targets: &'a [Target],
        batch: u64,
        tokens: u64,
        outputs: u32,
    ) -> Vec<(&'a Target, Vec<PlannedRequest>)> {
        targets
            .iter()
            .map(|target| {
                let planned = (0..batch)
                    .map(|_| self.prompts.planned(tokens, outputs))
                    .collect();
                (target, planned)
            })
            .collect()
    }

    /// Each engine's figure for one round of `batches`, read off its clock around it.
    async fn engine_ms(
        &self,
        client: &EngineClient,
        urls: &[String],
        batches: Vec<(&Target, Vec<PlannedRequest>)>,
        clock: Clock,
    ) -> Result<Vec<(usize, f64)>> {
        let before = engine_clocks(client, urls).await;
        for (target, records) in together(client, batches).await? {
            for record in records {
                check(record, target)?;
            }
        }
        let after = engine_clocks(client, urls).await;
        Ok(before
            .iter()
            .zip(&after)
            .enumerate()
            .filter_map(|(engine, pair)| match pair {
                (Some(before), Some(after)) => match clock {
                    Clock::Prefill => after.ms_per_request_since(before),
                    Clock::Decode => after.ms_per_gap_since(before),
                }
                .map(|ms| (engine, ms)),
                _ => None,
            })
            .collect())
    }
}

/// Which of the engine's clocks a round reads.
#[derive(Clone, Copy)]
enum Clock {
    /// Queued to first token per request.
    Prefill,
    /// The mean gap between a request's outputs.
    Decode,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin_sim::compute::table::DecodeCurve;

    fn table() -> TableModel {
        TableModel {
            name: "t".into(),
            gpus: 1,
            kv_bytes_per_token: 0,
            max_kv_tokens: 2048,
            prefill_isl: vec![32, 128, 320],
            prefill_ms: vec![8.0, 11.0, 19.0],
            decode: vec![
                DecodeCurve {
                    context: 144,
                    batch: vec![1, 2, 4],
                    ms: vec![6.0, 7.0, 8.0],
                },
                DecodeCurve {
                    context: 528,
                    batch: vec![1, 2],
                    ms: vec![6.5, 7.5],
                },
            ],
            step_spread: Vec::new(),
            request_overhead_ms: 4.0,
            request_overhead_busy_ms: 7.0,
            arrival_stretch_ms: 2.0,
            stalls: Vec::new(),
            prefill_beside_decode: Vec::new(),
        }
    }

    #[test]
    fn the_check_measures_the_tables_own_points() {
        let points = SpeedPoints::of(&table(), 2048).expect("points");
        assert_eq!(
            points,
            SpeedPoints {
                isl: 320,
                context: 128,
                batch: 2
            }
        );
        // Exactly the table's figures there: no interpolation between points.
        assert_eq!(points.expected(&table()), (19.0, 7.0));
        // A cache too small for the decode batch: no check.
        assert_eq!(SpeedPoints::of(&table(), 200), None);
        // A cache too small for the longest prompt: the longest that fits.
        let mut small = table();
        small.prefill_isl = vec![32, 128, 4096];
        small.prefill_ms = vec![8.0, 11.0, 90.0];
        assert_eq!(SpeedPoints::of(&small, 2048).map(|p| p.isl), Some(128));
    }

    #[test]
    fn the_factor_is_the_geometric_mean_of_the_two_ratios() {
        let speed = |prefill_ms, decode_ms| Speed {
            prefill_ms,
            decode_ms,
            expected_ms: (20.0, 8.0),
        };
        let both = speed(Some(24.0), Some(10.0)).factor().expect("factor");
        assert!((both - (1.2f64 * 1.25).sqrt()).abs() < 1e-12, "{both}");
        assert_eq!(speed(Some(24.0), None).factor(), Some(1.2));
        assert_eq!(speed(None, Some(10.0)).factor(), Some(1.25));
        assert_eq!(speed(None, None).factor(), None);
    }

    #[test]
    fn a_table_at_speed_scales_its_times_and_keeps_its_ratios() {
        let mut table = table();
        table.step_spread = vec![0.8, 1.0, 1.3];
        table.prefill_beside_decode = vec![kvtwin_sim::compute::table::BesideDecode {
            decodes: 1,
            factor: 1.1,
            extra_ms: 0.0,
            overhead_ms: 0.0,
        }];
        let slower = table.at_speed(1.5);
        assert_eq!(slower.prefill_ms, vec![12.0, 16.5, 28.5]);
        assert_eq!(slower.decode[1].ms, vec![9.75, 11.25]);
        assert_eq!(
            (
                slower.request_overhead_ms,
                slower.request_overhead_busy_ms,
                slower.arrival_stretch_ms
            ),
            (6.0, 10.5, 3.0)
        );
        assert_eq!(slower.step_spread, table.step_spread);
        assert_eq!(slower.prefill_beside_decode, table.prefill_beside_decode);
        let points = SpeedPoints::of(&table, 2048).expect("points");
        let (prefill, decode) = points.expected(&slower);
        assert!((prefill - 28.5).abs() < 1e-9 && (decode - 10.5).abs() < 1e-9);
    }
}
