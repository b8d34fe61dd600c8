//! The README's commands as a user types them: every `kvtwin` command in its `sh` and
//! `bash` blocks (and `cargo run --release -- ARGS`, which is `kvtwin ARGS` built in
//! release) is read out of README.md, continuation lines joined, and run by `bash` in
//! README order, from a directory laid out as a checkout (`scenarios/`, `plans/` and
//! `scripts/` beside it, `../shared` above it), with this build's `kvtwin` first on
//! PATH. Each must succeed.
//!
//! Some commands cannot run here: servers that wait for engines or NATS, benchmarks of
//! minutes, a GPU's. [`RULES`] says so for each, with why and which test covers it
//! instead; a README command no rule names fails the test, so a new one is either run
//! or skipped for a stated reason, never silently untested.

use std::path::Path;
use std::process::Command;

/// What the test does with a README command.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Verdict {
    /// Runs it; it must succeed.
    Run,
    /// Leaves it, for this reason.
    Skip(&'static str),
}
use Verdict::{Run, Skip};

const ENGINES: &str = "needs running vLLM engines (tui/tests/engines_*.rs start their own)";
const SERVICE: &str = "a server that runs until stopped, on addresses of the user's \
                       (tui/tests/router_*.rs, relay_*.rs and store.rs start their own)";
const BENCH: &str = "a benchmark of minutes, or of a service running elsewhere \
                     (tui/tests/bench_*.rs run short ones)";

/// Each README command's verdict, by the start of the command (after `cargo run
/// --release --` became `kvtwin`); the first rule that matches decides.
const RULES: &[(&str, Verdict)] = &[
    ("cargo test", Skip("the test suite itself")),
    ("cargo bench", Skip(BENCH)),
    (
        "cargo run --release -p kvtwin-tui --features cuda",
        Skip("needs a GPU and the cuda feature"),
    ),
    ("python3 scripts/engines/", Skip(ENGINES)),
    (
        "redis-cli",
        Skip("asks a store the README started by hand (store.rs)"),
    ),
    ("kvtwin router", Skip(SERVICE)),
    ("kvtwin relay", Skip(SERVICE)),
    ("kvtwin store", Skip(SERVICE)),
    ("kvtwin profile --engine", Skip(ENGINES)),
    ("kvtwin validate --engine", Skip(ENGINES)),
    (
        "kvtwin run scenarios/vllm-cpu-tiny.ron --trace served.jsonl",
        Skip(ENGINES),
    ),
    (
        "kvtwin run scenarios/vllm-cpu-tiny-connector.ron",
        Skip(ENGINES),
    ),
    (
        "kvtwin run scenarios/autoscale-diurnal.ron",
        Skip("a simulated day: 46 s in a debug build (tui/tests/autoscale.rs)"),
    ),
    (
        "kvtwin calibrate",
        Skip("measures this machine's disk for minutes (calibrate_validate.rs)"),
    ),
    (
        "kvtwin validate scenarios/",
        Skip("needs calibrate's profile, minutes of I/O (calibrate_validate.rs)"),
    ),
    ("kvtwin bench", Skip(BENCH)),
    (
        "kvtwin advisor --replay events.jsonl",
        Skip("needs a recorded stream (tui/tests/advisor.rs writes one)"),
    ),
    (
        "kvtwin advisor --nats",
        Skip("needs NATS and engines (tui/tests/advisor_live.rs)"),
    ),
    (
        "kvtwin estimate --compute measured.ron",
        Skip("the user's own profile"),
    ),
    (
        "kvtwin estimate --compute profiling_results/",
        Skip("the user's own Dynamo profile (estimate.rs reads one)"),
    ),
    ("kvtwin dash --router", Skip(SERVICE)),
    ("kvtwin dash --zmq", Skip(SERVICE)),
    ("kvtwin dash --nats", Skip(SERVICE)),
    (
        "kvtwin dash --replay run.jsonl",
        Skip("replays the router's recording above"),
    ),
    (
        "kvtwin dash --sim scenarios/cluster-faults.ron --speed",
        Skip("an interactive terminal (tui/tests/dash_tmux.rs drives one in tmux)"),
    ),
    ("kvtwin", Run),
];

/// The README's commands: each `sh`/`bash` block's lines joined where they end in `\`,
/// those that start with a command the rules know of, `cargo run --release --` (and a
/// bare `cargo run --release`) written as the `kvtwin` it runs.
fn readme_commands(readme: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in readme.lines() {
        if line.starts_with("```") {
            in_block = !in_block && (line == "```sh" || line == "```bash");
            pending.clear();
            continue;
        }
        if !in_block {
            continue;
        }
        let (body, continued) = match line.trim_end().strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        if !pending.is_empty() {
            pending.push(' ');
        }
        pending.push_str(body.trim());
        if continued {
            continue;
        }
        let command = std::mem::take(&mut pending);
        // What is left of a trailing comment decides (bash drops the comment itself).
        let code = command.split(" #").next().unwrap_or("").trim_end();
        let command = match command.strip_prefix("cargo run --release -- ") {
            Some(args) => format!("kvtwin {args}"),
            None if code == "cargo run --release" => {
                command.replacen("cargo run --release", "kvtwin", 1)
            }
            None => command,
        };
        let known = ["kvtwin", "cargo ", "python3 ", "redis-cli "];
        if known.iter().any(|start| command.starts_with(start)) {
            commands.push(command);
        }
    }
    commands
}

fn verdict(command: &str) -> Option<Verdict> {
    RULES
        .iter()
        .find(|(start, _)| command.starts_with(start))
        .map(|&(_, verdict)| verdict)
}

#[test]
fn the_readmes_commands_run_as_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shared = root.join("../shared");
    if !shared.join("data").is_dir() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but ../shared is missing; the README's trace commands read it"
        );
        eprintln!("skipped: ../shared is absent (the README's trace commands read it)");
        return;
    }
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let commands = readme_commands(&readme);
    assert!(commands.len() > 40, "{commands:#?}");
    let unknown: Vec<&String> = commands.iter().filter(|c| verdict(c).is_none()).collect();
    assert!(
        unknown.is_empty(),
        "README commands no rule names: run or skip them in RULES: {unknown:#?}"
    );

    // A checkout's layout: the commands' relative paths resolve as in the repository.
    let dir = tempfile::tempdir().unwrap();
    let checkout = dir.path().join("kvtwin");
    std::fs::create_dir(&checkout).unwrap();
    for entry in ["scenarios", "plans", "scripts"] {
        std::os::unix::fs::symlink(
            root.join(entry).canonicalize().unwrap(),
            checkout.join(entry),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink(shared.canonicalize().unwrap(), dir.path().join("shared")).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_kvtwin")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let (mut ran, mut failed) = (0, Vec::new());
    for command in &commands {
        match verdict(command).unwrap() {
            Skip(why) => eprintln!("skipped: {command}\n    ({why})"),
            Run => {
                let started = std::time::Instant::now();
                let output = Command::new("bash")
                    .args(["-c", command])
                    .current_dir(&checkout)
                    .env("PATH", &path)
                    .output()
                    .unwrap();
                eprintln!("ran ({:.1} s): {command}", started.elapsed().as_secs_f64());
                ran += 1;
                if !output.status.success() {
                    failed.push(format!(
                        "{command}\n{}",
                        String::from_utf8_lossy(&output.stderr)
                    ));
                }
            }
        }
    }
    assert!(
        failed.is_empty(),
        "README commands that failed:\n{}",
        failed.join("\n")
    );
    assert!(ran >= 25, "only {ran} README commands ran");
}

#[test]
fn readme_commands_are_read_whole() {
    let readme = "text\n```sh\ncargo run --release      # the default\n\
                  cargo run --release -- run a.ron \\\n  --seed 7\nkvtwin sweep s.ron \\\n  \
                  --out x.jsonl\necho no\n```\n```ron\nkvtwin not-a-command\n```\n";
    assert_eq!(
        readme_commands(readme),
        [
            "kvtwin      # the default",
            "kvtwin run a.ron --seed 7",
            "kvtwin sweep s.ron --out x.jsonl"
        ]
    );
    // The README's own first command is its quick start's `cargo run --release`.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let ours = readme_commands(&std::fs::read_to_string(root.join("README.md")).unwrap());
    assert!(ours[0].starts_with("kvtwin  "), "{:?}", &ours[..3]);
    assert_eq!(verdict(&ours[0]), Some(Run));
    assert_eq!(verdict("kvtwin store --listen x"), Some(Skip(SERVICE)));
    assert_eq!(verdict("kvtwin run scenarios/default.ron"), Some(Run));
    assert_eq!(verdict("make all"), None);
}
