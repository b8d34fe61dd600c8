//! `kvtwin sweep`: the file of a sweep does not depend on how it was made (threads,
//! shards joined by `merge`, a crash and a restart), and bad flags or parts are refused
//! with a message naming them.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A small sweep of the default scenario: 2 × 2 points under 2 seeds, 8 quick runs.
const SMALL: [&str; 7] = [
    "--grid",
    "workload.Conversations.conversations=20,40",
    "--grid",
    "cluster.workers=1,2",
    "--seeds",
    "2",
    "--jobs",
];

fn scenario() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/default.ron")
        .display()
        .to_string()
}

fn kvtwin(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

/// `kvtwin sweep SCENARIO ARGS --out FILE`, which must succeed; its stderr.
fn sweep(args: &[&str], out: &Path) -> String {
    let scenario = scenario();
    let out_arg = out.to_str().unwrap();
    let output = kvtwin(&[&["sweep", &scenario], args, &["--out", out_arg]].concat());
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "kvtwin sweep {args:?}: {stderr}");
    assert!(output.stdout.is_empty(), "stdout stays clean");
    stderr
}

/// The stderr of a `kvtwin` that must fail.
fn refused(args: &[&str]) -> String {
    let output = kvtwin(args);
    assert!(!output.status.success(), "kvtwin {args:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn jobs_do_not_change_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("one.jsonl");
    let two = dir.path().join("two.jsonl");
    let said = sweep(&[&SMALL[..], &["1"]].concat(), &one);
    sweep(&[&SMALL[..], &["2"]].concat(), &two);
    let file = read(&one);
    assert_eq!(file, read(&two));
    assert_eq!(file.lines().count(), 8);
    assert!(file.starts_with(
        "{\"run\":0,\"runs\":8,\"overrides\":{\"workload.Conversations.conversations\":20,\
         \"cluster.workers\":1},\"seed\":20261122,\"summary\":{\"workers\":1,"
    ));
    assert!(
        said.contains("8 runs in") && said.contains("0 failed"),
        "{said}"
    );
    // Run again on the finished file: nothing to run, the same file.
    let again = sweep(&[&SMALL[..], &["2"]].concat(), &two);
    assert!(again.contains("8 of 8 runs already in"), "{again}");
    assert_eq!(read(&two), file);
}

#[test]
fn three_shards_merged_equal_the_whole_sweep() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.jsonl");
    sweep(&[&SMALL[..], &["2"]].concat(), &whole);
    let scenario = scenario();
    let parts: Vec<PathBuf> = (0..3)
        .map(|i| dir.path().join(format!("part-{i}.jsonl")))
        .collect();
    let shards: Vec<_> = parts
        .iter()
        .enumerate()
        .map(|(i, part)| {
            let shard = format!("{i}/3");
            let args = [&["sweep", &scenario], &SMALL[..], &["1", "--shard", &shard]].concat();
            Command::new(env!("CARGO_BIN_EXE_kvtwin"))
                .args(args)
                .args(["--out", part.to_str().unwrap()])
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut shard in shards {
        assert!(shard.wait().unwrap().success());
    }
    assert_eq!(read(&parts[2]).lines().count(), 2, "runs 2 and 5");
    let merged = dir.path().join("merged.jsonl");
    let mut args = vec!["sweep", "merge"];
    args.extend(parts.iter().map(|p| p.to_str().unwrap()));
    args.extend(["--out", merged.to_str().unwrap()]);
    let output = kvtwin(&args);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(read(&merged), read(&whole));

    // Parts of a sweep with other runs, and a merge that lacks a shard.
    let other = dir.path().join("other.jsonl");
    sweep(&["--grid", "cluster.workers=1,2", "--jobs", "1"], &other);
    let (part0, part1) = (parts[0].to_str().unwrap(), parts[1].to_str().unwrap());
    let out = merged.to_str().unwrap();
    let mixed = refused(&[
        "sweep",
        "merge",
        part0,
        other.to_str().unwrap(),
        "--out",
        out,
    ]);
    assert!(
        mixed.contains("run 0 is from another sweep") && mixed.contains("2 runs, not 8"),
        "{mixed}"
    );
    let missing = refused(&["sweep", "merge", part0, part1, "--out", out]);
    assert!(
        missing.contains("2 of 8 runs are in no part, e.g. run 2, 5"),
        "{missing}"
    );
}

#[test]
fn a_killed_sweep_resumes_to_the_file_of_an_uninterrupted_one() {
    // 24 runs of a few hundred milliseconds each on one thread: seconds in all.
    let args = [
        "--grid",
        "workload.Conversations.conversations=300",
        "--grid",
        "cluster.workers=1,2,3",
        "--seeds",
        "8",
        "--jobs",
        "1",
    ];
    let dir = tempfile::tempdir().unwrap();
    let killed = dir.path().join("killed.jsonl");
    let scenario = scenario();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args([&["sweep", &scenario], &args[..]].concat())
        .args(["--out", killed.to_str().unwrap()])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(&killed).map_or(0, |t| t.matches('\n').count()) < 2 {
        assert!(Instant::now() < deadline, "no two lines in a minute");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let before = read(&killed);
    let whole_lines = before.matches('\n').count();
    assert!(
        (2..24).contains(&whole_lines),
        "killed after {whole_lines} of 24 runs: the test needs a sweep still running"
    );
    // A crash in the middle of a write leaves half a line.
    std::fs::write(&killed, format!("{before}{{\"run\":")).unwrap();
    let said = sweep(&args, &killed);
    assert!(
        said.contains(&format!("{whole_lines} of 24 runs already in")) && said.contains("skipped"),
        "{said}"
    );
    assert!(said.contains("was cut mid-write; dropping it"), "{said}");

    let whole = dir.path().join("whole.jsonl");
    sweep(&[&args[..7], &["2"]].concat(), &whole);
    assert_eq!(read(&killed), read(&whole));
}

#[test]
fn bad_flags_are_refused_naming_them() {
    let scenario = scenario();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let out = out.to_str().unwrap();
    let sweep = |args: &[&str]| refused(&[&["sweep", &scenario], args, &["--out", out]].concat());
    let unknown = sweep(&[
        "--grid",
        "cluster.workers=1",
        "--grid",
        "cluster.wrokers=2,3",
    ]);
    assert!(
        unknown.contains("--grid cluster.wrokers: no such field; valid paths:"),
        "{unknown}"
    );
    let empty = sweep(&["--grid", "cluster.workers="]);
    assert!(
        empty.contains("--grid cluster.workers=: no values"),
        "{empty}"
    );
    let none = sweep(&[]);
    assert!(none.contains("an empty grid"), "{none}");
    let shard = sweep(&["--grid", "cluster.workers=1", "--shard", "3/3"]);
    assert!(shard.contains("--shard 3/3: I must be below N"), "{shard}");
    let value = sweep(&["--grid", "cluster.workers=1,lots"]);
    assert!(value.contains("--grid cluster.workers=lots"), "{value}");
    assert!(
        !Path::new(out).exists(),
        "nothing written for refused flags"
    );
    // A file of another sweep is not resumed.
    std::fs::write(
        out,
        "{\"run\":0,\"runs\":1,\"overrides\":{},\"seed\":1,\"error\":\"x\"}\n",
    )
    .unwrap();
    let other = sweep(&["--grid", "cluster.workers=1,2"]);
    assert!(
        other.contains(
            ":1: run 0 is not a run of this sweep (different --grid, --seeds or --shard?)"
        ),
        "{other}"
    );
    let no_out = refused(&["sweep", &scenario, "--grid", "cluster.workers=1"]);
    assert!(no_out.contains("--out"), "{no_out}");
}

fn trace() -> Option<PathBuf> {
    common::mooncake_trace("the trace sweep test")
}

#[test]
fn a_trace_scenario_sweeps_its_own_trace_found_beside_the_scenario() {
    let Some(trace) = trace() else {
        return;
    };
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios/conversation-trace.ron")
        .display()
        .to_string();
    let dir = tempfile::tempdir().unwrap();
    let (own, given) = (dir.path().join("own.jsonl"), dir.path().join("given.jsonl"));
    let grid = ["--grid", "cluster.workers=16", "--jobs", "1"];
    for (out, extra) in [
        (&own, vec![]),
        (&given, vec!["--trace", trace.to_str().unwrap()]),
    ] {
        let args = [
            &["sweep", &scenario][..],
            &grid,
            &extra,
            &["--out", out.to_str().unwrap()],
        ];
        let output = kvtwin(&args.concat());
        assert!(output.status.success(), "{output:?}");
    }
    let file = read(&own);
    assert_eq!(file, read(&given));
    assert!(
        file.contains("\"summary\":{\"workers\":16,\"requests\":12031,\"completed\":12031,"),
        "{file}"
    );
}
