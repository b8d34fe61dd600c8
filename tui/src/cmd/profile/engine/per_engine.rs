//! Each engine's own table, where several engines were profiled together: engines that
//! look alike need not run alike (on the 2-core VM one engine decoded 15-20 % faster
//! than the other, whose core also ran the router and the client), and a router that
//! sends more to the faster engine is only reproduced by a twin whose engines differ
//! the same way.
//!
//! Every point is measured on all engines at once, one figure per engine per repeat in
//! the engines' order, so an engine's own figures are every `n`th of a point's repeats
//! where every engine gave one (the clients' TTFTs, the decode steps). The engine's part
//! of a prefill and the time outside it are kept per engine as they come, since an
//! engine may not say.
//!
//! Owns: those per-engine samples, the Dynamo-shaped profiles a table is built from
//! ([`dynamo_profiles`], pooled or one engine's), and the per-engine tables: the pooled
//! table with the engine's own prefills, decode steps and lone overhead. Never: measures,
//! or splits the figures of the probes beside decodes, the step spread or the stalls
//! (too few samples per engine; each engine's table keeps the pooled ones).

use super::Repeats;
use anyhow::{Context, Result};
use kvtwin_sim::autoscale::profile::{table_from_profiles, DecodeProfile, PrefillProfile};
use kvtwin_sim::compute::table::TableModel;

/// Dynamo's planner profiles of prefill points `(isl, median TTFT ms)` and decode points
/// `(context, batch, median step ms)` measured with `osl` outputs an answer.
pub(super) fn dynamo_profiles(
    prefill: &[(u64, f64)],
    decode: &[(u64, u64, f64)],
    osl: u32,
    max_kv: u64,
) -> (PrefillProfile, DecodeProfile) {
    let prefill = PrefillProfile {
        isl: prefill.iter().map(|(isl, _)| *isl as f64).collect(),
        ttft_ms: prefill.iter().map(|(_, ms)| *ms).collect(),
        thpt_per_gpu: prefill
            .iter()
            .map(|(isl, ms)| *isl as f64 / (ms / 1e3))
            .collect(),
    };
    // Dynamo's decode context is the prompt and half the outputs: the mean while decoding.
    let mean_context = |context: u64| context as f64 + f64::from(osl) / 2.0;
    let decode = DecodeProfile {
        max_kv_tokens: max_kv,
        kv_usage: decode
            .iter()
            .map(|(context, batch, _)| *batch as f64 * mean_context(*context) / max_kv as f64)
            .collect(),
        context_length: decode
            .iter()
            .map(|(context, _, _)| mean_context(*context))
            .collect(),
        itl_ms: decode.iter().map(|(_, _, ms)| *ms).collect(),
        thpt_per_gpu: decode
            .iter()
            .map(|(_, batch, ms)| *batch as f64 / (ms / 1e3))
            .collect(),
    };
    (prefill, decode)
}

/// The samples kept per engine as they come.
pub(super) struct PerEngine {
    /// `[engine][prefill point]`: the engine's part of each repeat, ms.
    inside: Vec<Vec<Vec<f64>>>,
    /// `[engine]`: a lone request's time outside the engine, ms.
    outside: Vec<Vec<f64>>,
}

impl PerEngine {
    pub(super) fn new(engines: usize, prefill_points: usize) -> Self {
        Self {
            inside: vec![vec![Vec::new(); prefill_points]; engines],
            outside: vec![Vec::new(); engines],
        }
    }

    /// Engine `engine`'s part of a prefill at point `point`, and the rest of its TTFT.
    pub(super) fn prefill(&mut self, engine: usize, point: usize, inside_ms: f64, outside_ms: f64) {
        if let Some(points) = self.inside.get_mut(engine) {
            if let Some(samples) = points.get_mut(point) {
                samples.push(inside_ms);
            }
        }
        if let Some(samples) = self.outside.get_mut(engine) {
            samples.push(outside_ms);
        }
    }

    /// Each engine's table: `pooled` with the engine's own prefills (its part, where it
    /// gave one at every point; else its clients' TTFTs as `pooled` has them), decode
    /// steps and lone overhead. `prefill` and `decode` are the pooled points, each
    /// point's repeats one figure per engine in turn; `engine_prefills` whether the
    /// pooled table's prefills are the engines' parts. `None` with one engine or when a
    /// point lacks an engine's figure.
    pub(super) fn tables(
        &self,
        pooled: &TableModel,
        prefill: &[(u64, Repeats)],
        decode: &[(u64, u64, Repeats)],
        osl: u32,
        engine_prefills: bool,
    ) -> Result<Option<Vec<TableModel>>> {
        let engines = self.outside.len();
        if engines < 2 {
            return Ok(None);
        }
        let own = |repeats: &Repeats, engine: usize| -> Option<f64> {
            let mine: Vec<f64> = repeats
                .0
                .iter()
                .skip(engine)
                .step_by(engines)
                .copied()
                .collect();
            (!mine.is_empty() && repeats.0.len().is_multiple_of(engines))
                .then(|| Repeats(mine).median())
        };
        let mut tables = Vec::with_capacity(engines);
        for engine in 0..engines {
            let prefill_points: Option<Vec<(u64, f64)>> = prefill
                .iter()
                .map(|(isl, repeats)| own(repeats, engine).map(|ms| (*isl, ms)))
                .collect();
            let decode_points: Option<Vec<(u64, u64, f64)>> = decode
                .iter()
                .map(|(context, batch, repeats)| {
                    own(repeats, engine).map(|ms| (*context, *batch, ms))
                })
                .collect();
            let (Some(prefill_points), Some(decode_points)) = (prefill_points, decode_points)
            else {
                return Ok(None);
            };
            let (prefill_profile, decode_profile) =
                dynamo_profiles(&prefill_points, &decode_points, osl, pooled.max_kv_tokens);
            let measured = table_from_profiles(&pooled.name, &prefill_profile, &decode_profile)
                .with_context(|| format!("engine {}'s table", engine + 1))?;
            let mut table = pooled.clone();
            table.decode = measured.decode;
            let inside = &self.inside[engine];
            if engine_prefills && inside.iter().all(|s| !s.is_empty()) {
                table.prefill_ms = inside.iter().map(|s| Repeats(s.clone()).median()).collect();
                table.request_overhead_ms = Repeats(self.outside[engine].clone()).median().max(0.0);
            } else {
                table.prefill_ms = measured.prefill_ms;
            }
            tables.push(table);
        }
        Ok(Some(tables))
    }
}

/// The report's lines: each engine's prefills and decode steps, for the reader to see
/// how far apart the engines ran.
pub(super) fn print(urls: &[String], tables: &[TableModel]) {
    println!(
        "\neach engine's own table (compute-engines.ron; `kvtwin validate --engine-compute`):"
    );
    for (url, table) in urls.iter().zip(tables) {
        let prefill: Vec<String> = table
            .prefill_ms
            .iter()
            .map(|ms| format!("{ms:.2}"))
            .collect();
        let decode: Vec<String> = table
            .decode
            .iter()
            .map(|curve| {
                let ms: Vec<String> = curve.ms.iter().map(|ms| format!("{ms:.2}")).collect();
                format!("{} tokens [{}]", curve.context, ms.join(", "))
            })
            .collect();
        println!(
            "  {url}: prefill ms [{}], decode ms {}, overhead {:.2} ms",
            prefill.join(", "),
            decode.join("; "),
            table.request_overhead_ms
        );
    }
}
