//! `kvtwin dash --once` as a process: one plain-text frame from each kind of source.
//!
//! - A simulation recorded with `--record` replays (`--replay`) to the simulation's own
//!   last frame, every time; `--at` seeks to the same earlier frame every time. (The
//!   tmux test plays one at a speed and finds the same last frame.)
//! - A simulation plays to its end however short `--timeout` (live sources only).
//! - A router that is not there gives a frame whose status line says so and that it
//!   retries; the process still exits cleanly.
//! - A replica (`--zmq`) fed by a seeded engine shows the blocks the engine holds; so
//!   does one on NATS (`--nats --jetstream`, a relay between), and a router's stream
//!   (`--router`). A NATS server that is not there gives a retrying status line.
//!
//! The NATS test skips with the reason when there is no nats-server, unless
//! `KVTWIN_REQUIRE_NATS=1` or `CI=true`.

mod common;

use common::{kvtwin, listening_on, start_jetstream_relay, wait_worker, Process};
use kvtwin_plane::nats::NatsServer;
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::EngineFormat;
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};

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
    assert_eq!(body(&last), body(&replay(&["--speed", "0.5"])));
    assert_eq!(body(&last), body(&live), "replay:\n{last}\nlive:\n{live}");
    // A seek: the frame 200 s in is the same every time, and not the last one.
    // (160 wide: at 80 the simulated clock gives way to the requests served.)
    let at_200 = replay(&["--at", "200", "--width", "160", "--height", "48"]);
    assert_eq!(
        at_200,
        replay(&["--at", "200", "--width", "160", "--height", "48"])
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
fn a_simulation_plays_to_its_end_whatever_the_live_sources_timeout() {
    // --timeout is how long --once waits for a live source; a simulation that takes
    // longer (3 s here, more on a busy machine) still prints its last frame.
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/default.ron");
    let frame = kvtwin(&["dash", "--sim", scenario, "--once", "--timeout", "0.001"]);
    assert!(frame.contains("finished:"), "{frame}");
    assert!(frame.contains("0 in flight"), "{frame}");
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

/// An engine with its ZMQ publisher that has published `batches` batches; the
/// `--zmq` argument for `worker`, the blocks it caches, and the events it published.
fn engine(worker: u64, batches: usize) -> (ZmqPublisher, String, usize, u64) {
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let mut engine = SyntheticEngine::new(SyntheticConfig::small(worker));
    let options = EngineFormat::Vllm0_33.options();
    let mut events = 0;
    for _ in 0..batches {
        let batch = engine.next_batch();
        events += batch.events.len() as u64;
        publisher.publish(&batch.to_payload(&options)).unwrap();
    }
    let source = format!(
        "{worker}={},replay={}",
        publisher.endpoint(),
        publisher.replay_endpoint().unwrap()
    );
    (publisher, source, engine.cached_blocks(), events)
}

/// Asserts `frame`'s table has a row for `worker` with `blocks` in it.
fn assert_row(frame: &str, worker: u64, blocks: usize) {
    let row = frame
        .lines()
        .find(|line| {
            line.trim_start_matches(['>', ' '])
                .starts_with(&format!("{worker} "))
        })
        .unwrap_or_else(|| panic!("no row for worker {worker}:\n{frame}"));
    let blocks = blocks.to_string();
    assert!(
        row.split_whitespace().any(|word| word == blocks),
        "want {blocks} device blocks in {row:?}:\n{frame}"
    );
}

#[test]
fn a_replica_fed_over_zmq_shows_what_the_engine_holds() {
    let (_publisher, source, cached, _) = engine(4, 25);
    // The replica joins after the batches went out: the engine's replay socket gives them.
    let frame = kvtwin(&["dash", "--zmq", &source, "--once", "--timeout", "3"]);
    assert_row(&frame, 4, cached);
    assert!(frame.contains("replica of"), "{frame}");
}

#[test]
fn a_routers_stream_shows_what_the_engine_holds() {
    let (_publisher, source, cached, events) = engine(6, 25);
    let router = Process::start(&["router", "--zmq", &source, "--listen", "127.0.0.1:0"]);
    let address = listening_on(&router);
    wait_worker(&address, 6, events - 1);
    let frame = kvtwin(&["dash", "--router", &format!("http://{address}"), "--once"]);
    assert_row(&frame, 6, cached);
    assert!(
        frame.contains(&format!("connected to http://{address}")),
        "{frame}"
    );
}

#[test]
fn a_replica_on_nats_replays_the_stream_and_an_absent_server_is_retried() {
    let frame = kvtwin(&[
        "dash",
        "--nats",
        "nats://127.0.0.1:1",
        "--once",
        "--timeout",
        "1",
        "--width",
        "120",
    ]);
    assert!(frame.contains("retrying in"), "{frame}");
    let Some(server) = NatsServer::start_or_skip("a_replica_on_nats_replays_the_stream") else {
        return;
    };
    let url = server.url();
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let relay = start_jetstream_relay(&publisher, &url, 8, &[]);
    let mut engine = SyntheticEngine::new(SyntheticConfig::small(8));
    let options = EngineFormat::Vllm0_33.options();
    let mut events = 0;
    for _ in 0..20 {
        let batch = engine.next_batch();
        events += batch.events.len() as u64;
        publisher.publish(&batch.to_payload(&options)).unwrap();
    }
    // Stored in the stream before the dashboard starts: it replays them from the start.
    let cached = engine.cached_blocks();
    // Each look listens longer than the last: on a loaded machine (CI runs this beside
    // other process tests) the dashboard's connect and the relay's catch-up both slow.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut listen_s = 2;
    let frame = loop {
        let frame = kvtwin(&[
            "dash",
            "--nats",
            &url,
            "--jetstream",
            "kv",
            "--once",
            "--timeout",
            &listen_s.to_string(),
        ]);
        if frame.contains(&format!(" {cached} ")) {
            break frame;
        }
        if std::time::Instant::now() >= deadline {
            // What the relay said and counted tells a relay that never published from a
            // dashboard that never read.
            let lines = relay.lines_now(std::time::Duration::from_millis(200));
            let stats = relay.interrupt();
            panic!(
                "never caught up ({events} events published to the engine):\n{frame}\n\
                 relay stderr:\n{}\nrelay stats: {stats}",
                lines.join("\n")
            );
        }
        listen_s = (listen_s * 2).min(8);
    };
    assert_row(&frame, 8, cached);
    let stats: serde_json::Value = serde_json::from_str(relay.interrupt().trim()).unwrap();
    assert_eq!(stats["events"], events, "{stats}");
}
