//! `kvtwin dash --once` as a process: one plain-text frame from each kind of source.
//!
//! - A simulation recorded with `--record` replays (`--replay`) to the simulation's own
//!   last frame, every time; `--at` seeks to the same earlier frame every time. (The
//!   tmux test plays one at a speed and finds the same last frame.)
//! - A router that is not there gives a frame whose status line says so and that it
//!   retries; the process still exits cleanly.
//! - A replica (`--zmq`) fed by a seeded engine shows the blocks the engine holds.

use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::EngineFormat;
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use std::process::Command;

/// Runs `kvtwin` with `args`; its stdout (it must succeed).
fn kvtwin(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kvtwin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A frame without its first line (which names the source and the play speed).
fn body(frame: &str) -> String {
    frame.lines().skip(1).collect::<Vec<_>>().join("\n")
}

#[test]
fn a_recording_replays_to_the_runs_frames_and_seeks() {
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/cluster-faults.ron"
    );
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("run.jsonl");
    let recording = recording.to_str().unwrap();
    let live = kvtwin(&[
        "dash", "--sim", scenario, "--seed", "3", "--once", "--record", recording,
    ]);
    assert!(live.contains("finished:"), "{live}");
    let lines = std::fs::read_to_string(recording).unwrap().lines().count();
    assert!(lines > 2, "the recording has {lines} lines");
    // --once plays flat out: the last frame, again and again, and the live run's.
    let replay = |extra: &[&str]| {
        let mut args = vec!["dash", "--replay", recording, "--once"];
        args.extend(extra);
        kvtwin(&args)
    };
    let last = replay(&[]);
    assert_eq!(last, replay(&["--speed", "0.5"]));
    assert_eq!(body(&last), body(&live), "replay:\n{last}\nlive:\n{live}");
    // A seek: the frame 200 s in is the same every time, and not the last one.
    let at_200 = replay(&["--at", "200", "--width", "80", "--height", "24"]);
    assert_eq!(
        at_200,
        replay(&["--at", "200", "--width", "80", "--height", "24"])
    );
    assert!(
        at_200.contains("sim t=1") || at_200.contains("sim t=2"),
        "{at_200}"
    );
    assert!(!at_200.contains("finished:"), "{at_200}");
    let frames = [last];
    assert!(
        frames[0].contains("(recorded from cluster-faults (seed 3))"),
        "{}",
        frames[0]
    );
}

#[test]
fn an_unreachable_router_shows_a_status_line_and_retries() {
    // Port 1 on loopback: nothing listens there.
    let frame = kvtwin(&[
        "dash",
        "--router",
        "http://127.0.0.1:1",
        "--once",
        "--timeout",
        "1",
        "--width",
        "120",
        "--height",
        "20",
    ]);
    assert!(frame.contains("retrying in"), "{frame}");
    assert!(frame.contains("127.0.0.1:1"), "{frame}");
}

#[test]
fn a_replica_fed_over_zmq_shows_what_the_engine_holds() {
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let mut engine = SyntheticEngine::new(SyntheticConfig::small(9));
    let options = EngineFormat::Vllm0_33.options();
    for _ in 0..25 {
        publisher
            .publish(&engine.next_batch().to_payload(&options))
            .unwrap();
    }
    let source = format!(
        "4={},replay={}",
        publisher.endpoint(),
        publisher.replay_endpoint().unwrap()
    );
    // The replica joins after the batches went out: the engine's replay socket gives them.
    let frame = kvtwin(&["dash", "--zmq", &source, "--once", "--timeout", "3"]);
    let row = frame
        .lines()
        .find(|line| line.trim_start_matches(['>', ' ']).starts_with("4 "))
        .unwrap_or_else(|| panic!("no row for worker 4:\n{frame}"));
    let cached = engine.cached_blocks().to_string();
    assert!(
        row.split_whitespace().any(|word| word == cached),
        "want {cached} device blocks in {row:?}:\n{frame}"
    );
    assert!(
        frame.contains("does not route") || frame.contains("replica"),
        "{frame}"
    );
}
