//! Tests of the profile's reading of streamed answers: steps, bursts, spreads.

use super::steps::single_steps;
use super::*;

#[test]
fn a_label_is_found_by_its_whole_name() {
    let line = r#"vllm:cache_config_info{hash_block_size="64",block_size="32",num_gpu_blocks="65",num_gpu_blocks_override="None"} 1.0"#;
    assert_eq!(label(line, "block_size"), Some("32"));
    assert_eq!(label(line, "hash_block_size"), Some("64"));
    assert_eq!(label(line, "num_gpu_blocks"), Some("65"));
    assert_eq!(label(line, "num_gpu_blocks_override"), Some("None"));
    assert_eq!(label(line, "missing"), None);
    assert_eq!(label("no labels 1.0", "block_size"), None);
}

fn record(started_ms: u64, ttft_ms: u64, gaps_ms: &[u64]) -> RequestRecord {
    RequestRecord {
        index: 0,
        prefix: None,
        line: None,
        scheduled: None,
        started: Duration::from_millis(started_ms),
        status: Some(200),
        failure: None,
        ttft: Some(Duration::from_millis(ttft_ms)),
        itl: gaps_ms.iter().map(|&g| Duration::from_millis(g)).collect(),
        e2e: Duration::ZERO,
        prompt_tokens: 0,
        output_tokens: 0,
        cached_tokens: None,
        worker: None,
        route_seq: None,
    }
}

#[test]
fn the_step_time_is_read_where_the_whole_batch_decodes() {
    // The second request's prefill (a 50 ms gap in the first's stream) and the
    // first's last steps alone (5 ms) fall outside the window [60, 120]; the three
    // gaps of each inside it are single steps.
    let first = record(0, 10, &[50, 20, 20, 20, 8, 8]);
    let second = record(0, 60, &[20, 20, 20]);
    assert_eq!(step_ms(&[first, second]), Some((20.0, vec![20.0; 6])));
    // One request alone: its own gaps, each a single step.
    assert_eq!(
        step_ms(&[record(0, 10, &[7, 9, 8])]),
        Some((8.0, vec![7.0, 9.0, 8.0]))
    );
    assert_eq!(step_ms(&[record(0, 10, &[])]), None);
}

#[test]
fn merged_chunks_give_the_time_per_token_instead_of_the_gaps() {
    // 8 tokens in 3 chunks: gaps of 100 and 40 ms are not steps; 140 ms over the 7
    // tokens after the first is 20 ms a token.
    let mut merged = record(0, 10, &[100, 40]);
    merged.output_tokens = 8;
    merged.e2e = Duration::from_millis(150);
    // Merged answers show no single step.
    assert_eq!(step_ms(&[merged.clone()]), Some((20.0, Vec::new())));
    // All in one chunk: no gap at all, still a time per token.
    let mut one = record(0, 10, &[]);
    one.output_tokens = 8;
    one.e2e = Duration::from_millis(80);
    assert_eq!(step_ms(&[merged, one]), Some((15.0, Vec::new())));
    // Every token its own chunk: the gaps, as before.
    let mut whole = record(0, 10, &[7, 9, 8]);
    whole.output_tokens = 4;
    assert_eq!(step_ms(&[whole]), Some((8.0, vec![7.0, 9.0, 8.0])));
}

#[test]
fn bursts_and_the_gaps_that_held_them_are_not_single_steps() {
    // 20 ms steps, then a 40 ms gap that held two steps and a burst of the second
    // (0 ms), then 20 ms steps again.
    let bursty = record(0, 10, &[20, 20, 40, 0, 20, 20]);
    assert_eq!(
        single_steps(&bursty, 0.020)
            .iter()
            .map(|(from, to)| (from.as_millis(), to.as_millis()))
            .collect::<Vec<_>>(),
        vec![(10, 30), (30, 50), (90, 110), (110, 130)]
    );
    assert_eq!(step_ms(&[bursty]), Some((20.0, vec![20.0; 4])));
    // Nothing but bursts: the time per token instead.
    let mut all_at_once = record(0, 10, &[0, 0, 0]);
    all_at_once.output_tokens = 4;
    all_at_once.e2e = Duration::from_millis(40);
    assert_eq!(step_ms(&[all_at_once]), Some((10.0, Vec::new())));
}

#[test]
fn bursts_are_judged_against_the_whole_batch() {
    // Every other gap of the first answer is a burst of 1 ms: its own median (1 ms)
    // would call them steps; its batch's (20 ms) does not.
    let bursty = record(0, 10, &[40, 1, 40, 1, 1, 40, 1]);
    let steady = record(0, 10, &[20; 7]);
    let (step, singles) = step_ms(&[bursty, steady]).unwrap();
    assert_eq!(step, 20.0);
    assert!(singles.iter().all(|&ms| ms >= 20.0), "{singles:?}");
}

#[test]
fn single_steps_give_101_percentiles_or_none() {
    // 21 ratios 0.5, 0.55, ..., 1.5: percentile p is 0.5 + p / 100.
    let ratios: Vec<f64> = (0..21).rev().map(|i| 0.5 + f64::from(i) * 0.05).collect();
    let spread = percentiles(&ratios);
    assert_eq!(spread.len(), 101);
    for (p, q) in spread.iter().enumerate() {
        assert!((q - (0.5 + p as f64 / 100.0)).abs() < 1e-9, "p{p}: {q}");
    }
    // Too few steps, or steps of no time, make no spread.
    assert!(percentiles(&ratios[..MIN_SINGLE_STEPS - 1]).is_empty());
    let mut zeros = ratios[..MIN_SINGLE_STEPS - 1].to_vec();
    zeros.push(0.0);
    assert!(percentiles(&zeros).is_empty());
}

#[test]
fn repeats_give_their_median_and_spread() {
    let r = Repeats(vec![3.0, 1.0, 2.0, 10.0]);
    assert_eq!((r.median(), r.min(), r.max()), (2.5, 1.0, 10.0));
    assert_eq!(Repeats(vec![4.0, 1.0, 2.0]).median(), 2.0);
}

#[test]
fn fresh_prompts_share_no_block() {
    let mut prompts = Prompts {
        next: 0,
        block_size: 32,
    };
    let a = prompts.planned(70, 1);
    let b = prompts.planned(70, 1);
    assert_eq!(a.prompt.len(), 70);
    assert_ne!(a.prompt[..32], b.prompt[..32]);
    assert_ne!(a.prompt[32..64], b.prompt[32..64]);
}

#[test]
fn probes_beside_decodes_take_the_longest_prompt_that_fits_beside_the_most_decodes() {
    // Answers of 32 + 48 tokens: 32 of them do not fit 2,048 tokens; 8 do, and 1,024
    // beside them.
    assert_eq!(
        beside::plan(&[32, 256, 1024], &[1, 4, 8, 32], 32, 2048, 2047),
        Some((2, vec![1, 4, 8]))
    );
    // 20 of them (1,600 tokens) leave room for 256 but not 1,024.
    assert_eq!(
        beside::plan(&[32, 256, 1024], &[20], 32, 2048, 2047),
        Some((1, vec![1, 20]))
    );
    // 1 always among the decodes; a prompt past the limit is never taken.
    assert_eq!(
        beside::plan(&[32, 256, 1024], &[2], 32, 2048, 512),
        Some((1, vec![1, 2]))
    );
    // Nothing fits beside even one answer.
    assert_eq!(beside::plan(&[32], &[1], 32, 100, 99), None);
}

#[test]
fn a_decodes_excess_is_its_window_less_the_probes_pass_and_its_usual_steps() {
    // 5 gaps in the window, 60 ms in all, one of them the probe's 20 ms pass; outside,
    // 40 gaps of 8 ms: 4 steps at 8 ms would be 32 ms, so 8 ms over.
    assert_eq!(
        beside::window_excess((60.0, 5.0), (320.0, 40.0), Some(20.0)),
        Some(8.0)
    );
    // Without a probe every gap of the window is a step of the answer's own.
    assert_eq!(
        beside::window_excess((45.0, 5.0), (320.0, 40.0), None),
        Some(5.0)
    );
    // Nothing to compare with.
    assert_eq!(beside::window_excess((45.0, 5.0), (0.0, 0.0), None), None);
    assert_eq!(
        beside::window_excess((20.0, 1.0), (320.0, 40.0), Some(20.0)),
        None
    );
}

#[test]
fn each_engine_gets_its_own_prefills_decode_steps_and_overhead() {
    use kvtwin_sim::autoscale::profile::table_from_profiles;
    // Two engines, every point's repeats alternating between them.
    let prefill = vec![
        (32, Repeats(vec![14.0, 18.0, 16.0, 20.0])),
        (128, Repeats(vec![20.0, 30.0, 22.0, 32.0])),
    ];
    let decode = vec![
        (128, 1, Repeats(vec![7.0, 9.0, 7.0, 9.0])),
        (128, 4, Repeats(vec![8.0, 12.0, 8.0, 12.0])),
    ];
    let (p, d) = per_engine::dynamo_profiles(
        &prefill
            .iter()
            .map(|(isl, r)| (*isl, r.median()))
            .collect::<Vec<_>>(),
        &decode
            .iter()
            .map(|(c, b, r)| (*c, *b, r.median()))
            .collect::<Vec<_>>(),
        32,
        2048,
    );
    let mut pooled = table_from_profiles("pooled", &p, &d).unwrap();
    pooled.max_kv_tokens = 2048;
    pooled.arrival_stretch_ms = 3.0;
    let mut samples = per_engine::PerEngine::new(2, 2);
    for (engine, inside, outside) in [
        (0, 10.0, 4.0),
        (1, 12.0, 6.0),
        (0, 10.0, 4.0),
        (1, 14.0, 6.0),
    ] {
        samples.prefill(engine, 0, inside, outside);
        samples.prefill(engine, 1, inside + 6.0, outside);
    }
    let tables = samples
        .tables(&pooled, &prefill, &decode, 32, true)
        .unwrap()
        .expect("two engines");
    assert_eq!(tables.len(), 2);
    assert_eq!(tables[0].prefill_ms, [10.0, 16.0]);
    assert_eq!(tables[1].prefill_ms, [13.0, 19.0]);
    assert_eq!(tables[0].request_overhead_ms, 4.0);
    assert_eq!(tables[1].request_overhead_ms, 6.0);
    assert_eq!(tables[0].decode[0].ms, [7.0, 8.0]);
    assert_eq!(tables[1].decode[0].ms, [9.0, 12.0]);
    // What is not split stays the pooled table's.
    assert!(tables.iter().all(|t| t.arrival_stretch_ms == 3.0));
    // Without the engines' parts, the prefills are each engine's clients' TTFTs.
    let clients = samples
        .tables(&pooled, &prefill, &decode, 32, false)
        .unwrap()
        .unwrap();
    assert_eq!(clients[0].prefill_ms, [15.0, 21.0]);
    assert_eq!(clients[1].prefill_ms, [19.0, 31.0]);
    // One engine: nothing of its own to write.
    let one = per_engine::PerEngine::new(1, 2);
    assert!(one
        .tables(&pooled, &prefill, &decode, 32, true)
        .unwrap()
        .is_none());
}

#[test]
fn long_answers_outlast_the_probe_within_the_cache() {
    // A 320-token probe of 26 ms beside passes of 9 ms: the 48 outputs at least.
    assert_eq!(beside::background_tokens(26.0, 9.0, (4, 320, 32, 2048)), 48);
    // A 1,024-token probe of 129 ms beside passes of 7.5 ms: 6 × 129 / 7.5 = 103.2.
    assert_eq!(
        beside::background_tokens(129.0, 7.5, (4, 1024, 32, 2048)),
        104
    );
    // No more than the cache leaves: (2,048 - 1,025) / 4 - 32 = 223.
    assert_eq!(
        beside::background_tokens(500.0, 5.0, (4, 1024, 32, 2048)),
        223
    );
    // An engine that does not say how long a pass takes: the floor.
    assert_eq!(
        beside::background_tokens(129.0, 0.0, (1, 1024, 32, 2048)),
        48
    );
}
