use super::*;
use crate::plan::run::{run_point, Workload};
use proptest::prelude::*;
use std::path::Path;

fn scenario() -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/cluster-kv.ron");
    let mut scenario = Scenario::load(&path).unwrap();
    scenario.workload.thin_out(50);
    scenario
}

fn flags(flags: &[&str]) -> Vec<String> {
    flags.iter().map(|f| f.to_string()).collect()
}

fn sweep(grid: &[&str], seeds: u64) -> Sweep {
    Sweep::new(&scenario(), Grid::parse(&flags(grid)).unwrap(), seeds).unwrap()
}

/// A 3 × 2 grid under 2 seeds: 12 runs.
fn twelve() -> Sweep {
    sweep(
        &["cluster.workers=2,4,3", "cluster.routing=RoundRobin,\"Kv\""],
        2,
    )
}

/// Every run's line, with an error for an outcome (no simulation needed).
fn file_of(sweep: &Sweep, shard: Shard) -> String {
    sweep
        .runs(shard)
        .map(|run| line(&run, sweep.total(), Err(&format!("no run {}", run.index))) + "\n")
        .collect()
}

#[test]
fn grid_values_split_at_top_level_commas_only() {
    assert_eq!(split_values("1,2,3"), ["1", "2", "3"]);
    assert_eq!(
        split_values(r#"{"Builtin":"dynosim"},{"Builtin":"h100-llama3-8b"}"#),
        [
            r#"{"Builtin":"dynosim"}"#,
            r#"{"Builtin":"h100-llama3-8b"}"#
        ]
    );
    assert_eq!(
        split_values(r#"[1,2],"a,\"b,c",x"#),
        ["[1,2]", r#""a,\"b,c""#, "x"]
    );
    assert_eq!(split_values("{[1,2],3},]4,5"), ["{[1,2],3}", "]4", "5"]);
}

#[test]
fn a_grid_is_the_flags_axes_with_their_values_as_json() {
    let grid = Grid::parse(&flags(&[
        "cluster.workers=2,4",
        r#"hardware.compute={"Builtin":"dynosim"},null"#,
        "worker.tiers.0.eviction=Lru",
    ]))
    .unwrap();
    let axes = grid.axes();
    assert_eq!(axes.len(), 3);
    assert_eq!(axes[0].values, [serde_json::json!(2), serde_json::json!(4)]);
    assert_eq!(axes[1].values[0], serde_json::json!({"Builtin": "dynosim"}));
    assert_eq!(axes[1].values[1], Value::Null);
    assert_eq!(axes[2].values, [serde_json::json!("Lru")]);
    assert_eq!(axes[2].raw, ["Lru"]);
}

#[test]
fn bad_grids_are_refused_naming_the_flag() {
    let error = |f: &[&str]| Grid::parse(&flags(f)).unwrap_err().to_string();
    assert!(error(&[]).contains("an empty grid"));
    assert!(error(&["cluster.workers"]).contains("\"cluster.workers\""));
    assert!(error(&["=1,2"]).contains("expected PATH=V1,V2"));
    assert!(error(&["cluster.workers="]).contains("cluster.workers=: no values"));
    assert!(error(&["cluster.workers=1,,2"]).contains("cluster.workers: value 2 of 3 is empty"));
    assert!(error(&["cluster.workers=1,"]).contains("value 2 of 2"));
    let twice = error(&["cluster.workers=1", "seed=1", "cluster.workers=2"]);
    assert!(twice.contains("cluster.workers is given twice"), "{twice}");
}

#[test]
fn values_are_checked_against_the_scenario_before_anything_runs() {
    let base = scenario();
    let new = |f: &[&str], seeds| Sweep::new(&base, Grid::parse(&flags(f)).unwrap(), seeds);
    let unknown = new(&["cluster.workers=1", "cluster.wrokers=3"], 1).unwrap_err();
    assert!(
        matches!(unknown, SweepError::UnknownPath { ref path, .. } if path == "cluster.wrokers")
    );
    assert!(unknown
        .to_string()
        .starts_with("--grid cluster.wrokers: no such field"));
    assert!(
        unknown.to_string().contains("cluster.workers"),
        "lists valid paths"
    );
    let bad = new(&["cluster.workers=2,many"], 1).unwrap_err();
    assert!(
        bad.to_string().starts_with("--grid cluster.workers=many:"),
        "{bad}"
    );
    assert!(matches!(
        new(&["cluster.workers=2"], 0),
        Err(SweepError::NoSeeds)
    ));
    let mut late = base.clone();
    late.seed = u64::MAX - 1;
    let overflow = Sweep::new(
        &late,
        Grid::parse(&flags(&["cluster.workers=2"])).unwrap(),
        3,
    );
    assert!(matches!(overflow, Err(SweepError::SeedOverflow { .. })));
}

#[test]
fn runs_are_the_cross_product_first_axis_slowest_seeds_innermost() {
    let sweep = twelve();
    assert_eq!(sweep.total(), 12);
    let base = scenario().seed;
    let runs: Vec<Run> = sweep.runs(Shard::ALL).collect();
    assert_eq!(runs.len(), 12);
    assert_eq!(
        runs[0].sets,
        ["cluster.workers=2", "cluster.routing=RoundRobin"]
    );
    assert_eq!((runs[0].seed, runs[1].seed), (base, base + 1));
    assert_eq!(runs[1].sets, runs[0].sets);
    assert_eq!(
        runs[2].sets,
        ["cluster.workers=2", "cluster.routing=\"Kv\""]
    );
    assert_eq!(runs[2].overrides[1].1, serde_json::json!("Kv"));
    assert_eq!(
        runs[4].sets,
        ["cluster.workers=4", "cluster.routing=RoundRobin"]
    );
    assert_eq!(
        runs[11].sets,
        ["cluster.workers=3", "cluster.routing=\"Kv\""]
    );
    assert_eq!(runs[11].seed, base + 1);
    for (i, run) in runs.iter().enumerate() {
        assert_eq!(run.index, i);
        assert_eq!(*run, sweep.run(i));
    }
}

#[test]
fn shards_split_the_runs_by_number_modulo_their_count() {
    let sweep = twelve();
    let shards: Vec<Vec<usize>> = (0..5)
        .map(|i| {
            let shard = Shard::parse(&format!("{i}/5")).unwrap();
            sweep.runs(shard).map(|r| r.index).collect()
        })
        .collect();
    assert_eq!(shards[0], [0, 5, 10]);
    assert_eq!(shards[4], [4, 9]);
    let mut all: Vec<usize> = shards.concat();
    all.sort();
    assert_eq!(all, (0..12).collect::<Vec<_>>());
    assert_eq!(
        Shard::parse(" 2 / 3").unwrap(),
        Shard { index: 2, count: 3 }
    );
    for (bad, says) in [
        ("3/3", "I must be below N (shards are numbered 0 to 2)"),
        ("0/0", "N must be at least 1"),
        ("1", "expected I/N"),
        ("a/2", "expected I/N"),
        ("-1/2", "expected I/N"),
    ] {
        let error = Shard::parse(bad).unwrap_err().to_string();
        assert!(
            error.contains(says) && error.contains("--shard"),
            "{bad}: {error}"
        );
    }
}

#[test]
fn a_line_reads_back_as_written_with_its_keys_in_grid_order() {
    let base = scenario();
    let sweep = sweep(
        &[
            "seed=1",
            "cluster.workers=3,2",
            "cluster.routing=RoundRobin",
        ],
        1,
    );
    let run = sweep.run(0);
    let (_, summary) = run_point(&base, &run.sets, run.seed, &Workload::Synthetic, 1.0).unwrap();
    let text = line(&run, sweep.total(), Ok(&summary));
    assert!(
        text.starts_with(&format!(
            "{{\"run\":0,\"runs\":2,\"overrides\":{{\"seed\":1,\"cluster.workers\":3,\
             \"cluster.routing\":\"RoundRobin\"}},\"seed\":{},\"summary\":{{\"workers\":3,",
            base.seed
        )),
        "{text}"
    );
    let back = parse_line(&text).unwrap();
    assert_eq!((back.run, back.runs, back.seed), (0, 2, base.seed));
    assert_eq!(back.overrides, run.overrides);
    // serde_json reads decimals back to within an ulp (no float_roundtrip feature).
    let back_summary = back.summary.unwrap();
    assert_eq!(back_summary.completed, summary.completed);
    assert!((back_summary.ttft.p99_ms - summary.ttft.p99_ms).abs() < 1e-9);
    assert_eq!(back.error, None);
    let failed = line(&run, 2, Err("out of \"blocks\""));
    assert!(
        failed.ends_with(",\"error\":\"out of \\\"blocks\\\"\"}"),
        "{failed}"
    );
    assert_eq!(
        parse_line(&failed).unwrap().error.unwrap(),
        "out of \"blocks\""
    );
}

#[test]
fn a_summary_json_cannot_hold_becomes_the_runs_error() {
    let base = scenario();
    let sweep = sweep(&["cluster.workers=2"], 1);
    let run = sweep.run(0);
    let (_, mut summary) =
        run_point(&base, &run.sets, run.seed, &Workload::Synthetic, 0.2).unwrap();
    summary.hit_ratio = f64::NAN;
    let text = line(&run, 1, Ok(&summary));
    let back = parse_line(&text).unwrap();
    assert!(back.error.unwrap().contains("no JSON form"), "{text}");
}

#[test]
fn lines_that_are_not_sweep_lines_are_refused_naming_the_field() {
    let good = line(&twelve().run(3), 12, Err("e"));
    assert!(parse_line(&good).is_ok());
    let missing = parse_line(&good.replace("\"seed\"", "\"sead\"")).unwrap_err();
    assert!(missing.to_string().contains("sead"), "{missing}");
    let both = good.replace("\"error\":\"e\"", "\"error\":\"e\",\"summary\":null");
    assert!(parse_line(&both).is_ok(), "a null summary is no summary");
    let none = good.replace(",\"error\":\"e\"", "");
    assert!(matches!(parse_line(&none), Err(LineError::Outcome)));
    let beyond = good.replace("\"runs\":12", "\"runs\":3");
    assert!(parse_line(&beyond)
        .unwrap_err()
        .to_string()
        .contains("\"run\":3"));
    let twice = good.replace(
        "{\"cluster.workers\":2,",
        "{\"cluster.workers\":2,\"cluster.workers\":2,",
    );
    assert!(parse_line(&twice)
        .unwrap_err()
        .to_string()
        .contains("appears twice"));
}

#[test]
fn resume_keeps_the_finished_runs_and_drops_a_torn_last_line() {
    let sweep = twelve();
    let file = file_of(&sweep, Shard::ALL);
    let cut: Vec<&str> = file.split_inclusive('\n').collect();
    // Runs 0, 1, 5 finished (in any order), then run 7 was cut mid-write.
    let text = format!("{}{}{}{}", cut[5], cut[0], cut[1], &cut[7][..20]);
    let resumed = resume(&sweep, Shard::ALL, "out.jsonl", &text).unwrap();
    assert_eq!(
        resumed.finished.keys().copied().collect::<Vec<_>>(),
        [0, 1, 5]
    );
    assert_eq!(resumed.finished[&5], cut[5].trim_end());
    assert_eq!(resumed.torn_line, Some(4));
    assert_eq!(resumed.keep_bytes, text.len() - 20);
    // A whole last line without its newline is dropped too: it may have been cut short.
    let unended = format!("{}{}", cut[0], cut[1].trim_end());
    let resumed = resume(&sweep, Shard::ALL, "out.jsonl", &unended).unwrap();
    assert_eq!(resumed.finished.len(), 1);
    assert_eq!(
        (resumed.torn_line, resumed.keep_bytes),
        (Some(2), cut[0].len())
    );
    // The complete file, or an empty one.
    let all = resume(&sweep, Shard::ALL, "out.jsonl", &file).unwrap();
    assert_eq!((all.finished.len(), all.torn_line), (12, None));
    assert_eq!(all.keep_bytes, file.len());
    assert_eq!(
        resume(&sweep, Shard::ALL, "f", "").unwrap(),
        Resumed::default()
    );
}

#[test]
fn resume_refuses_a_file_of_another_sweep_naming_the_line() {
    let sweep = twelve();
    let file = file_of(&sweep, Shard::ALL);
    let middle = file.replacen("\n", "\n{\"run\":\n", 1);
    let error = resume(&sweep, Shard::ALL, "out.jsonl", &middle).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("out.jsonl:2: not a sweep line"),
        "{error}"
    );
    let other = super::tests::sweep(&["cluster.workers=2,4,8"], 3);
    for (shard, text, says) in [
        (
            Shard::ALL,
            file_of(&other, Shard::ALL),
            "it has 9 runs, this sweep 12",
        ),
        (
            Shard { index: 1, count: 2 },
            file.clone(),
            "not in shard 1/2",
        ),
        (
            Shard::ALL,
            file.replace("\"RoundRobin\"", "\"Kv\""),
            "overrides",
        ),
        (
            Shard::ALL,
            file.replacen("\"seed\":", "\"seed\":1", 2),
            "seed",
        ),
    ] {
        let error = resume(&sweep, shard, "out.jsonl", &text).unwrap_err();
        let message = error.to_string();
        assert!(matches!(error, FileError::NotThisSweep { .. }), "{message}");
        assert!(
            message.contains("out.jsonl:1: run 0 is not a run of this sweep"),
            "{message}"
        );
        assert!(message.contains(says), "{says}: {message}");
    }
    let conflict = format!(
        "{file}{}",
        file.lines()
            .next()
            .unwrap()
            .replace("\"no run 0\"", "\"x\"")
            + "\n"
    );
    let error = resume(&sweep, Shard::ALL, "o", &conflict).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("o:13: run 0 differs from its line at o:1"),
        "{error}"
    );
    let twice = format!("{file}{}", file.lines().next().unwrap().to_string() + "\n");
    assert_eq!(
        resume(&sweep, Shard::ALL, "o", &twice)
            .unwrap()
            .finished
            .len(),
        12
    );
}

#[test]
fn merged_shards_are_the_whole_sweep_sorted_by_run() {
    let sweep = twelve();
    let whole = file_of(&sweep, Shard::ALL);
    let parts: Vec<(String, String)> = (0..3)
        .map(|i| {
            let shard = Shard { index: i, count: 3 };
            (format!("part-{i}.jsonl"), file_of(&sweep, shard))
        })
        .collect();
    assert_eq!(merge(&parts).unwrap(), whole);
    // A restarted shard repeats lines it had: identical lines merge.
    let mut again = parts.clone();
    again.push(("again.jsonl".into(), parts[1].1.clone()));
    assert_eq!(merge(&again).unwrap(), whole);
    let missing = merge(&parts[..2]).unwrap_err().to_string();
    assert_eq!(missing, "4 of 12 runs are in no part, e.g. run 2, 5, 8, 11");
    let many: Vec<(String, String)> = vec![("a".into(), whole.lines().next().unwrap().into())];
    let error = merge(&many).unwrap_err().to_string();
    assert!(
        error.starts_with("11 of 12 runs") && error.ends_with("8, ..."),
        "{error}"
    );
    let other = super::tests::sweep(&["cluster.workers=2,4,8"], 4);
    let mixed = vec![
        parts[0].clone(),
        ("other".into(), file_of(&other, Shard::ALL)),
    ];
    let error = merge(&mixed).unwrap_err().to_string();
    assert!(
        error.contains("other:1: run 0 is from another sweep than part-0.jsonl:1"),
        "{error}"
    );
    let changed = parts[1].1.replacen("no run", "No run", 1);
    let conflict = vec![parts[1].clone(), ("b".into(), changed)];
    let error = merge(&conflict).unwrap_err().to_string();
    assert_eq!(error, "b:1: run 1 differs from its line at part-1.jsonl:1");
    assert!(matches!(merge(&[]), Err(FileError::NoLines)));
    let torn = vec![("t".into(), format!("{}{{\"run\":", parts[0].1))];
    assert!(merge(&torn)
        .unwrap_err()
        .to_string()
        .starts_with("t:5: not a sweep line"));
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_the_readers(text in "\\PC{0,200}", line_text in "[{}\\[\\]\",:a-z0-9\n]{0,80}") {
        let sweep = twelve();
        let _ = parse_line(&text);
        let _ = parse_line(&line_text);
        let _ = resume(&sweep, Shard::ALL, "f", &text);
        let _ = resume(&sweep, Shard { index: 1, count: 2 }, "f", &line_text);
        let _ = merge(&[("a".into(), text.clone()), ("b".into(), line_text.clone())]);
        let _ = Grid::parse(&[text, line_text]);
    }

    #[test]
    fn splitting_keeps_json_values_whole(values in proptest::collection::vec(json_value(), 1..6)) {
        let texts: Vec<String> = values.iter().map(Value::to_string).collect();
        let joined = texts.join(",");
        let split = split_values(&joined);
        prop_assert_eq!(&split, &texts);
        let parsed: Vec<Value> = split.iter().map(|v| value_of(v)).collect();
        prop_assert_eq!(parsed, values);
    }

    #[test]
    fn a_file_cut_anywhere_resumes_to_a_prefix_of_its_runs(cut in 0usize..4000) {
        let sweep = twelve();
        let file = file_of(&sweep, Shard::ALL);
        let cut = cut.min(file.len());
        let resumed = resume(&sweep, Shard::ALL, "f", &file[..cut]).unwrap();
        let whole_lines = file[..cut].matches('\n').count();
        prop_assert_eq!(resumed.finished.len(), whole_lines);
        prop_assert!(resumed.finished.keys().copied().eq(0..whole_lines));
        prop_assert!(file[..resumed.keep_bytes].ends_with('\n') || resumed.keep_bytes == 0);
    }
}

/// JSON values such as a grid holds: scalars, strings with commas and quotes, and
/// arrays and objects of them.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        "[a-z,\"{}\\[\\] ]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z,\"]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}
