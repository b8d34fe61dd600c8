//! `kvtwin advisor` on the live event plane: a known stream published on a real NATS
//! server (two subjects) and on a real ZMQ PUB socket (the plane's publisher, vLLM's
//! msgpack), and the live report's occupancy, reuse distances, hot set and
//! recommendations checked against figures worked out by hand; a message that is not an
//! event is counted by its reason; `--record` then `--replay` gives the live report's
//! own replay rows; `--metrics-listen` serves the same figures.
//!
//! The NATS test skips with the reason when there is no nats-server, unless
//! `KVTWIN_REQUIRE_NATS=1` or `CI=true`.

mod common;

use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{LocalBlockHash, SequenceHash, WorkerId};
use kvtwin::tier::Tier;
use kvtwin_plane::nats::{NatsMode, NatsPublisher, NatsServer, PublisherConfig};
use kvtwin_plane::wire::{
    BlockRemoved, BlockStored, DecodeLimits, EngineBatch, EngineEvent, EngineFormat, RouterEvent,
};
use kvtwin_plane::zmq::{PublisherConfig as ZmqPublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const A: u64 = 0xA;
const B: u64 = 0xB;
const C: u64 = 0xC;
const D: u64 = 0xD;
/// The shared store's worker id.
const STORE: u64 = 100;

/// `kvtwin advisor` with its stdout in a file (read while it runs) and its stderr lines.
struct Advisor {
    child: Child,
    stdout: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Advisor {
    fn start(args: &[&str], stdout: PathBuf) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
            .arg("advisor")
            .args(args)
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = sender.send(line);
            }
        });
        Self {
            child,
            stdout,
            lines,
        }
    }

    /// The first stderr line containing `needle` (10 s at most).
    fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line with {needle:?} from kvtwin advisor"),
            }
        }
    }

    /// The reports written so far.
    fn reports(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.stdout)
            .unwrap()
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The first report with `events` events received (20 s at most).
    fn wait_report(&self, events: u64) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(report) = self
                .reports()
                .into_iter()
                .find(|r| r["events_received"] == events)
            {
                return report;
            }
            assert!(
                Instant::now() < deadline,
                "no report with {events} events: {:?}",
                self.reports().last()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGINT, the exit (which must be a success), and the last report.
    fn interrupt(mut self) -> Value {
        let status = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(Instant::now() < deadline, "the advisor did not stop");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(exit.success(), "kvtwin advisor exited with {exit}");
        self.reports().pop().expect("a last report")
    }
}

impl Drop for Advisor {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn router_event(worker: u64, event_id: u64, data: KvCacheEventData) -> RouterEvent {
    RouterEvent {
        worker_id: WorkerId::new(worker),
        event: KvCacheEvent {
            event_id,
            dp_rank: 0,
            data,
        },
    }
}

fn stored(parent: Option<u64>, blocks: &[u64], tier: Tier) -> KvCacheEventData {
    KvCacheEventData::Stored {
        parent_hash: parent.map(SequenceHash::new),
        blocks: blocks
            .iter()
            .map(|&b| StoredBlock {
                block_hash: SequenceHash::new(b),
                tokens_hash: LocalBlockHash::new(b + 1000),
            })
            .collect(),
        tier,
    }
}

fn removed(blocks: &[u64], tier: Tier) -> KvCacheEventData {
    KvCacheEventData::Removed {
        block_hashes: blocks.iter().map(|&b| SequenceHash::new(b)).collect(),
        tier,
    }
}

/// `(worker, dp_rank, tier, blocks)` of each occupancy row.
fn occupancy(report: &Value) -> Vec<(u64, u64, String, u64)> {
    report["occupancy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["worker_id"].as_u64().unwrap(),
                r["dp_rank"].as_u64().unwrap(),
                r["tier"].as_str().unwrap().to_string(),
                r["blocks"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The recording read back.
fn recorded(path: &Path) -> Vec<RouterEvent> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| RouterEvent::from_json(line.as_bytes(), &DecodeLimits::default()).unwrap())
        .collect()
}

/// `kvtwin advisor --replay` of `recording` at `capacities`: its rows, which must be the
/// live report's own replay rows.
fn check_replay_agrees(recording: &Path, capacities: &str, report: &Value) {
    let block_bytes = report["block_bytes"].to_string();
    let stdout = common::kvtwin(&[
        "advisor",
        "--replay",
        recording.to_str().unwrap(),
        "--capacity-blocks",
        capacities,
        "--block-bytes",
        &block_bytes,
        "--json",
    ]);
    let rows: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(rows.len(), 4 * capacities.split(',').count());
    assert_eq!(&Value::Array(rows), &report["replay"]);
}

#[test]
fn the_live_advisor_reports_a_nats_stream_and_its_recording_replays_the_same() {
    let Some(server) = NatsServer::start_or_skip("the_live_advisor_reports_a_nats_stream") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("events.jsonl");
    let url = server.url();
    let advisor = Advisor::start(
        &[
            "--nats",
            &url,
            "--subject",
            "engines.kv",
            "--subject",
            "store.kv",
            "--json",
            "--interval",
            "0.2",
            "--record",
            recording.to_str().unwrap(),
            "--capacity-blocks",
            "1,2,4",
            "--block-bytes",
            "1024",
            "--cold-idle-events",
            "3",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        dir.path().join("reports.jsonl"),
    );
    let line = advisor.wait_line("metrics on http://");
    let metrics_at = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_string();
    advisor.wait_line("kvtwin advisor: listening to nats");

    // Engine 1 computes A B C and drops them; engine 2 computes A B (reuses at distances
    // 1 and 2: A was touched last); engine 1 computes A B C again (distances 1, 2, 3),
    // moves C to its host and drops it from its device. Then the store takes D, which no
    // engine holds (a first access).
    let engines = [
        router_event(1, 0, stored(None, &[A, B, C], Tier::Device)),
        router_event(1, 1, removed(&[A, B, C], Tier::Device)),
        router_event(2, 0, stored(None, &[A, B], Tier::Device)),
        router_event(1, 2, stored(None, &[A, B, C], Tier::Device)),
        router_event(1, 3, stored(Some(B), &[C], Tier::Host)),
        router_event(1, 4, removed(&[C], Tier::Device)),
    ];
    let store = [router_event(STORE, 0, stored(None, &[D], Tier::Remote))];
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let publisher = |subject: &str| {
            NatsPublisher::connect(PublisherConfig::new(&url, subject, NatsMode::Core))
        };
        let on_engines = publisher("engines.kv").await.unwrap();
        on_engines.publish_events(&engines).await.unwrap();
        // Not an event: counted by its reason, never applied.
        on_engines
            .publish(&b"{\"not\": \"an event\"}"[..])
            .await
            .unwrap();
        on_engines.flush().await.unwrap();
        // The store's event after the engines' (two subjects have no order between them).
        advisor.wait_report(6);
        let on_store = publisher("store.kv").await.unwrap();
        on_store.publish_events(&store).await.unwrap();
        on_store.flush().await.unwrap();
    });
    let report = advisor.wait_report(7);

    assert_eq!(
        report["bad_events"].as_object().unwrap().len(),
        1,
        "{report}"
    );
    assert_eq!(
        report["bad_events"].as_object().unwrap().values().next(),
        Some(&Value::from(1))
    );
    assert_eq!(report["counters"]["accesses"], 9, "{report}");
    assert_eq!(report["counters"]["reuses"], 5);
    assert_eq!(report["counters"]["copies"], 1);
    assert_eq!(
        occupancy(&report),
        [
            (1, 0, "device".into(), 2),
            (1, 0, "host".into(), 1),
            (2, 0, "device".into(), 2),
            (STORE, 0, "remote".into(), 1),
        ]
    );
    assert_eq!(report["occupancy"][0]["bytes"], 2048);
    // Distances 1, 2, 1, 2, 3.
    let distance = &report["reuse_distance"];
    assert_eq!(distance["unit"], "distinct_blocks");
    assert_eq!(
        (&distance["p50"], &distance["p90"], &distance["max"]),
        (&Value::from(2), &Value::from(3), &Value::from(3))
    );
    // A and B three accesses each (last at the 4th event), C two, D one.
    let hot: Vec<(u64, u64)> = report["hot_blocks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["block"].as_u64().unwrap(),
                b["accesses"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(hot, [(A, 3), (B, 3), (C, 2), (D, 1)]);
    assert_eq!(report["hot_prefixes"][0]["root"], A);
    assert_eq!(report["hot_prefixes"][0]["accesses"], 8);
    // C, hot, is only in engine 1's host: up to its device.
    let promotions = report["promotions"].as_array().unwrap();
    assert_eq!(promotions.len(), 1, "{report}");
    assert_eq!(
        (
            &promotions[0]["block"],
            &promotions[0]["worker_id"],
            &promotions[0]["from"],
            &promotions[0]["to"]
        ),
        (
            &Value::from(C),
            &Value::from(1),
            &Value::from("host"),
            &Value::from("device")
        )
    );
    // Idle for 3 events at the 7th: A's and B's device copies, C's host copy.
    let demotions = report["demotions"].as_array().unwrap();
    assert_eq!(demotions.len(), 5, "{report}");
    assert_eq!(
        (
            &demotions[0]["block"],
            &demotions[0]["from"],
            &demotions[0]["to"]
        ),
        (
            &Value::from(A),
            &Value::from("device"),
            &Value::from("host")
        )
    );
    assert_eq!(report["tier_sizes"].as_array().unwrap().len(), 4);

    // The metrics say the same (the last report's figures).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, text) = common::http(&metrics_at, "GET", "/metrics", "");
        assert_eq!(status, 200);
        if text.contains("kvtwin_advisor_events_total 7") {
            assert!(
                text.contains(
                    "kvtwin_advisor_blocks{worker_id=\"1\",dp_rank=\"0\",tier=\"host\"} 1"
                ),
                "{text}"
            );
            assert!(text.contains("kvtwin_advisor_reuses_total 5"), "{text}");
            assert!(text.trim_end().ends_with("# EOF"));
            break;
        }
        assert!(Instant::now() < deadline, "{text}");
        std::thread::sleep(Duration::from_millis(50));
    }

    let last = advisor.interrupt();
    assert_eq!(last["events_received"], 7);
    // What was recorded is what was sent, in order, and replays to the same rows.
    let all: Vec<RouterEvent> = engines.iter().chain(&store).cloned().collect();
    assert_eq!(recorded(&recording), all);
    check_replay_agrees(&recording, "1,2,4", &last);
}

#[test]
fn the_live_advisor_reports_an_engines_zmq_stream() {
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("events.jsonl");
    let mut publisher = ZmqPublisher::bind(&ZmqPublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    // ENDPOINT=WORKER: the engine is worker 7.
    let source = format!(
        "{}=7,replay={}",
        publisher.endpoint(),
        publisher.replay_endpoint().unwrap()
    );
    let advisor = Advisor::start(
        &[
            "--zmq",
            &source,
            "--json",
            "--interval",
            "0.2",
            "--record",
            recording.to_str().unwrap(),
            "--capacity-blocks",
            "1,3",
        ],
        dir.path().join("reports.jsonl"),
    );
    advisor.wait_line("kvtwin advisor: listening to zmq");
    let block = |hashes: &[u64], parent: Option<u64>, medium: Option<Tier>| {
        EngineEvent::BlockStored(BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: (0..4 * hashes.len() as u32)
                .map(|t| t + 10 * hashes[0] as u32)
                .collect(),
            block_size: 4,
            medium,
            ..BlockStored::default()
        })
    };
    // 11 12 13 computed and dropped; 11 12 again (distances 1, 2); 13 into the CPU tier
    // (distance 3: 13, 12, 11).
    let batches = [
        vec![block(&[11, 12, 13], None, None)],
        vec![EngineEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![11, 12, 13],
            ..BlockRemoved::default()
        })],
        vec![block(&[11, 12], None, None)],
        vec![block(&[13], Some(12), Some(Tier::Host))],
    ];
    let options = EngineFormat::Vllm0_33.options();
    for (seq, events) in batches.into_iter().enumerate() {
        let batch = EngineBatch::new(seq as u64, 0.0, events, Some(0));
        publisher.publish(&batch.to_payload(&options)).unwrap();
    }
    // Not a batch: counted by its reason.
    publisher.publish(&[0x93, 0xc1]).unwrap();
    let report = advisor.wait_report(4);
    assert_eq!(
        occupancy(&report),
        [(7, 0, "device".into(), 2), (7, 0, "host".into(), 1)]
    );
    let distance = &report["reuse_distance"];
    assert_eq!(
        (&distance["reuses"], &distance["p50"], &distance["max"]),
        (&Value::from(3), &Value::from(2), &Value::from(3))
    );
    // Two accesses each; 13 last (the 4th event).
    assert_eq!(report["hot_blocks"][0]["block"], 13);
    assert_eq!(report["hot_blocks"][0]["accesses"], 2);
    assert_eq!(report["hot_blocks"][1]["block"], 11);
    assert_eq!(report["promotions"][0]["block"], 13);
    assert_eq!(report["promotions"][0]["from"], "host");
    assert_eq!(report["promotions"][0]["worker_id"], 7);
    let deadline = Instant::now() + Duration::from_secs(10);
    while advisor.reports().last().unwrap()["bad_events"]
        .as_object()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "the bad batch was not counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let last = advisor.interrupt();
    assert_eq!(last["events_received"], 4);
    let events = recorded(&recording);
    assert_eq!(events.len(), 4);
    assert!(events.iter().all(|e| e.worker_id == WorkerId::new(7)));
    assert_eq!(
        events.iter().map(|e| e.event.event_id).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    check_replay_agrees(&recording, "1,3", &last);
}

#[test]
fn live_sources_and_replay_do_not_mix_and_a_source_is_needed() {
    let (ok, _, stderr) = common::kvtwin_outcome(&[
        "advisor",
        "--replay",
        "x.jsonl",
        "--nats",
        "nats://127.0.0.1:1",
    ]);
    assert!(!ok && stderr.contains("cannot be used with"), "{stderr}");
    let (ok, _, stderr) = common::kvtwin_outcome(&["advisor", "--json"]);
    assert!(!ok && stderr.contains("required"), "{stderr}");
}

#[test]
fn reports_and_duration_stop_the_live_advisor_on_their_own() {
    let publisher =
        ZmqPublisher::bind(&ZmqPublisherConfig::new("tcp://127.0.0.1:*", None)).unwrap();
    let endpoint = publisher.endpoint().to_string();
    // Two reports, then the exit: no last one.
    let (ok, stdout, stderr) = common::kvtwin_outcome(&[
        "advisor",
        "--zmq",
        &endpoint,
        "--reports",
        "2",
        "--interval",
        "0.1",
        "--json",
    ]);
    assert!(ok, "{stderr}");
    let reports: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(reports.len(), 2, "{stdout}");
    assert_eq!(
        (&reports[0]["report"], &reports[1]["report"]),
        (&Value::from(1), &Value::from(2))
    );
    // A worker id by position: the first --zmq is worker 0.
    assert!(
        reports[0]["sources"][0]["source"]
            .as_str()
            .unwrap()
            .ends_with("worker 0"),
        "{stdout}"
    );
    // --duration before the first interval: one report, the last, as a table.
    let (ok, stdout, stderr) = common::kvtwin_outcome(&[
        "advisor",
        "--zmq",
        &endpoint,
        "--duration",
        "0.3",
        "--interval",
        "60",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(
        stdout.matches("== kvtwin advisor: report").count(),
        1,
        "{stdout}"
    );
    assert!(stdout.contains("report 1 at 0."), "{stdout}");
}
