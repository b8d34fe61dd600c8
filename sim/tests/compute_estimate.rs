//! The built-in compute profiles against NVIDIA AIConfigurator's measured estimates
//! (sim/data/aiconfigurator-vllm.csv: its version, commands and date are in the file's
//! header; scripts/aiconfigurator_grid.py wrote it, scripts/fit_compute_profiles.py fitted
//! the profiles to its `fit` rows). No Python is needed: the table is committed.
//!
//! On the rows the fit never saw (`holdout`: ISLs, batches and contexts between the
//! fitted ones), every profile's static estimate is within 10 % of AIConfigurator's for
//! prefill time and decode step time, with a median absolute error of at most 5 %, but
//! for the points in [`KNOWN_MISSES`].

use kvtwin_sim::compute::estimate::{estimate, EstimateError, EstimateRequest};
use kvtwin_sim::compute::ComputeModel;
use std::collections::BTreeMap;

const TABLE: &str = include_str!("../data/aiconfigurator-vllm.csv");

/// Held-out points more than 10 % off, all on A100 (whose AIConfigurator data is its
/// older vLLM 0.14.0 database), each within 20 %: (profile, phase, isl, batch, context).
/// The reference itself is not smooth there, so no roofline follows it: a 192-token
/// prompt costs 52 % more than a 128-token one and 2 % less than a 256-token one; the
/// KV of a 32-sequence decode batch reads at 65 % of the HBM bandwidth where 16 and 64
/// sequences read at 80 to 86 %. A point that comes within 10 % must leave the list.
const KNOWN_MISSES: [(&str, &str, u64, u64, u64); 5] = [
    ("a100-llama3-8b", "prefill", 192, 1, 0),
    ("a100-llama3-8b", "decode", 0, 32, 8192),
    ("a100-llama3-8b", "decode", 0, 32, 12288),
    ("a100x8-llama3-70b", "prefill", 768, 8, 0),
    ("a100x8-llama3-70b", "decode", 0, 512, 1024),
];

/// One row of the table.
struct Row {
    profile: String,
    phase: String,
    role: String,
    isl: u64,
    prefix: u64,
    batch: u64,
    context: u64,
    ms: f64,
}

fn rows() -> Vec<Row> {
    let mut lines = TABLE.lines().filter(|line| !line.starts_with('#'));
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (profile, phase, role) = (column("profile"), column("phase"), column("role"));
    let (isl, prefix, batch) = (column("isl"), column("prefix"), column("batch"));
    let (context, ms) = (column("context"), column("ms"));
    lines
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            let number = |at: usize| fields[at].parse::<u64>().unwrap();
            Row {
                profile: fields[profile].to_string(),
                phase: fields[phase].to_string(),
                role: fields[role].to_string(),
                isl: number(isl),
                prefix: number(prefix),
                batch: number(batch),
                context: number(context),
                ms: fields[ms].parse().unwrap(),
            }
        })
        .collect()
}

/// kvtwin's figure for a row: the estimate's TTFT for a prefill row; one decode step
/// of the batch at that context (AIConfigurator's TPOT over a 2-token output) for a
/// decode row.
fn predicted_ms(model: &ComputeModel, row: &Row) -> f64 {
    match row.phase.as_str() {
        "prefill" => {
            let request = EstimateRequest {
                isl: row.isl,
                osl: 1,
                batch: row.batch,
                prefix: row.prefix,
                capacity_tokens: None,
            };
            estimate(model, &request).unwrap().ttft
        }
        "decode" => {
            let request = EstimateRequest {
                isl: row.context,
                osl: 2,
                batch: row.batch,
                prefix: 0,
                capacity_tokens: None,
            };
            match estimate(model, &request) {
                Ok(estimate) => estimate.tpot,
                // AIConfigurator counts a GPU's whole memory; kvtwin's estimate keeps 10 %
                // of it for activations, as vLLM does, and refuses the largest batches.
                // The model still times the step.
                Err(EstimateError::DoesNotFit { .. }) => {
                    let context = row.batch * (row.context + 1);
                    model.decode_step(row.batch, context, 1 << 20).as_secs_f64() * 1e3
                }
                Err(error) => panic!("{} {request:?}: {error}", row.profile),
            }
        }
        other => panic!("phase {other}"),
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

#[test]
fn every_builtin_profile_is_within_ten_percent_of_aiconfigurator_on_held_out_points() {
    assert!(KNOWN_MISSES.iter().all(|miss| miss.0.starts_with("a100")));
    let rows = rows();
    // (profile, phase) -> absolute relative errors of its held-out rows.
    let mut errors: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    let mut report = Vec::new();
    let mut outside = Vec::new();
    for row in rows.iter().filter(|row| row.role == "holdout") {
        let model = ComputeModel::builtin(&row.profile).unwrap();
        let predicted = predicted_ms(&model, row);
        let error = predicted / row.ms - 1.0;
        let known = KNOWN_MISSES.contains(&(
            row.profile.as_str(),
            row.phase.as_str(),
            row.isl,
            row.batch,
            row.context,
        ));
        let bound = if known { 0.20 } else { 0.10 };
        if known && error.abs() <= 0.10 {
            outside.push(format!(
                "{} {} isl={} batch={} context={} is within 10 % ({:+.1} %): take it out of \
                 KNOWN_MISSES",
                row.profile,
                row.phase,
                row.isl,
                row.batch,
                row.context,
                error * 100.0
            ));
        }
        if error.abs() > bound {
            outside.push(format!(
                "{} {} isl={} prefix={} batch={} context={}: kvtwin {predicted:.2} ms, \
                 AIConfigurator {:.2} ms ({:+.1} %)",
                row.profile,
                row.phase,
                row.isl,
                row.prefix,
                row.batch,
                row.context,
                row.ms,
                error * 100.0
            ));
        }
        errors
            .entry((row.profile.clone(), row.phase.clone()))
            .or_default()
            .push(error.abs());
    }
    // Every built-in roofline profile and both phases are in the table.
    let profiles: Vec<&str> = ComputeModel::BUILTIN
        .into_iter()
        .filter(|name| *name != "dynosim")
        .collect();
    for profile in &profiles {
        for phase in ["prefill", "decode"] {
            let key = (profile.to_string(), phase.to_string());
            assert!(errors.get(&key).is_some_and(|e| e.len() >= 10), "{key:?}");
        }
    }
    let mut medians_over = Vec::new();
    for ((profile, phase), values) in &mut errors {
        let worst = values.iter().copied().fold(0.0, f64::max);
        let median = median(values);
        report.push(format!(
            "{profile} {phase}: {} points, median {:.1} %, max {:.1} %",
            values.len(),
            median * 100.0,
            worst * 100.0
        ));
        if median > 0.05 {
            medians_over.push(format!("{profile} {phase}: median {:.1} %", median * 100.0));
        }
    }
    println!("{}", report.join("\n"));
    assert!(
        outside.is_empty() && medians_over.is_empty(),
        "held-out points over their bound:\n{}\nmedians over 5 %:\n{}\nall:\n{}",
        outside.join("\n"),
        medians_over.join("\n"),
        report.join("\n")
    );
}

#[test]
fn the_table_holds_what_its_header_says() {
    let header: Vec<&str> = TABLE.lines().take_while(|l| l.starts_with('#')).collect();
    assert!(header[0].contains("AIConfigurator 0.12.0"), "{header:?}");
    assert!(header.iter().any(|line| line.contains("static_ctx")));
    assert!(header.iter().any(|line| line.contains("static_gen")));
    let rows = rows();
    assert!(rows.iter().all(|row| row.ms > 0.0));
    assert!(rows.iter().any(|row| row.role == "fit"));
}
