//! A Dynamo planner profile as a measured compute table: what an operator who profiled
//! their own engine with Dynamo's profiler (or `kvtwin profile`) hands `kvtwin estimate`
//! or a scenario.
//!
//! Owns: [`table_from_profiles`]. Never: reads files (`load_profiles` does) or
//! interpolates (`compute::table` does).
//!
//! Dynamo's decode table is indexed by KV usage and context length; a batch is the
//! usage's tokens over the context (`kv_usage × max_kv_tokens / context`), so each
//! context length the profiler swept becomes one curve of step time by batch.

use super::{DecodeProfile, PrefillProfile};
use crate::compute::table::{DecodeCurve, TableError, TableModel};
use std::collections::BTreeMap;

/// The compute table `name` of a prefill and a decode profile: prompt times as they
/// are, decode points grouped by context length (rounded to a token) with their
/// batches (rounded, at least 1; a batch measured twice keeps its first time), the
/// replica's GPUs from the prefill throughput per GPU, its KV tokens from the decode
/// profile. Checked as any table is.
pub fn table_from_profiles(
    name: &str,
    prefill: &PrefillProfile,
    decode: &DecodeProfile,
) -> Result<TableModel, TableError> {
    let mut prompts: BTreeMap<u64, f64> = BTreeMap::new();
    for (&isl, &ttft_ms) in prefill.isl.iter().zip(&prefill.ttft_ms) {
        prompts
            .entry(isl.round().max(0.0) as u64)
            .or_insert(ttft_ms);
    }
    // tokens/s/GPU = ISL / TTFT / GPUs, so GPUs = ISL / TTFT / (tokens/s/GPU).
    let gpus = prefill
        .isl
        .iter()
        .zip(&prefill.ttft_ms)
        .zip(&prefill.thpt_per_gpu)
        .find(|((_, ttft), thpt)| **ttft > 0.0 && **thpt > 0.0)
        .map_or(1, |((isl, ttft), thpt)| {
            (isl / (ttft / 1e3) / thpt).round().max(1.0) as u32
        });
    let mut curves: BTreeMap<u64, BTreeMap<u64, f64>> = BTreeMap::new();
    let points = decode
        .kv_usage
        .iter()
        .zip(&decode.context_length)
        .zip(&decode.itl_ms);
    for ((&usage, &context), &itl_ms) in points {
        if context <= 0.0 {
            continue;
        }
        let batch = (usage * decode.max_kv_tokens as f64 / context)
            .round()
            .max(1.0) as u64;
        curves
            .entry(context.round() as u64)
            .or_default()
            .entry(batch)
            .or_insert(itl_ms);
    }
    let table = TableModel {
        name: name.to_string(),
        gpus,
        kv_bytes_per_token: 0,
        max_kv_tokens: decode.max_kv_tokens,
        prefill_isl: prompts.keys().copied().collect(),
        prefill_ms: prompts.values().copied().collect(),
        decode: curves
            .into_iter()
            .map(|(context, points)| DecodeCurve {
                context,
                batch: points.keys().copied().collect(),
                ms: points.values().copied().collect(),
            })
            .collect(),
        // Dynamo's profiles keep no single steps.
        step_spread: Vec::new(),
        request_overhead_ms: 0.0,
        request_overhead_busy_ms: 0.0,
        arrival_stretch_ms: 0.0,
        stalls: Vec::new(),
        prefill_beside_decode: Vec::new(),
    };
    table.validate()?;
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn usage_becomes_a_batch_per_context_and_the_gpus_come_from_the_throughput() {
        let prefill = PrefillProfile {
            isl: vec![1024.0, 4096.0],
            ttft_ms: vec![20.0, 80.0],
            // 1,024 tokens in 20 ms on 2 GPUs: 25,600 tokens/s/GPU.
            thpt_per_gpu: vec![25_600.0, 25_600.0],
        };
        let decode = DecodeProfile {
            max_kv_tokens: 100_000,
            // At 1,000 tokens: usages 0.01 and 0.64 are batches 1 and 64; at 5,000
            // tokens 0.05 is batch 1.
            kv_usage: vec![0.64, 0.01, 0.05],
            context_length: vec![1000.0, 1000.0, 5000.0],
            itl_ms: vec![12.0, 6.0, 7.0],
            thpt_per_gpu: vec![0.0; 3],
        };
        let table = table_from_profiles("dynamo", &prefill, &decode).unwrap();
        assert_eq!(table.gpus, 2);
        assert_eq!(table.max_kv_tokens, 100_000);
        assert_eq!(table.prefill_isl, vec![1024, 4096]);
        assert_eq!(table.decode.len(), 2);
        assert_eq!(table.decode[0].batch, vec![1, 64]);
        assert_eq!(table.decode[0].ms, vec![6.0, 12.0]);
        assert_eq!(table.decode_step(64, 64 * 1000), Duration::from_millis(12));
        assert_eq!(table.prefill(&[(4096, 0)]), Duration::from_millis(80));
    }

    #[test]
    fn a_profile_with_nothing_to_interpolate_is_refused() {
        let prefill = PrefillProfile {
            isl: vec![],
            ttft_ms: vec![],
            thpt_per_gpu: vec![],
        };
        let decode = DecodeProfile {
            max_kv_tokens: 1,
            kv_usage: vec![],
            context_length: vec![],
            itl_ms: vec![],
            thpt_per_gpu: vec![],
        };
        let error = table_from_profiles("empty", &prefill, &decode).unwrap_err();
        assert_eq!(error.field, "prefill_isl");
    }
}
