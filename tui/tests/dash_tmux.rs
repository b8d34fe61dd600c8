//! `kvtwin dash` in a real terminal: tmux runs it in a detached pane, keys go in with
//! `send-keys`, and the screen comes back with `capture-pane`.
//!
//! - A real `kvtwin router` fed over ZMQ by three seeded synthetic engines, and `kvtwin
//!   dash --router` watching it: sorted, filtered, then frozen; while frozen the engines
//!   publish more, and the frozen screen's per-worker, per-tier blocks still equal what
//!   `GET /v1/workers` said at the freeze; unfrozen, they follow the router again.
//! - `kvtwin dash --sim` on a small scenario played fast: its last frame's completed
//!   requests and hit ratio equal `kvtwin run --json` for the same seed.
//!
//! Each quits a different way (q, SIGTERM, Ctrl-C) and the terminal comes back.
//!
//! Skips with the reason when tmux is missing, unless `CI=true`.

mod common;

use common::{http, kvtwin, listening_on, Process};
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::EngineFormat;
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// One test at a time: each runs real processes flat out (a router and engines, a
/// simulation at a million times real time), and on two cores a replay sharing them
/// would miss its timings.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A tmux server of our own (its own socket), killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Whether tmux can run here; when it cannot, the test skips (or fails in CI).
    fn available() -> bool {
        let found = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "tmux is missing (CI installs it: apt-get install tmux)"
            );
            eprintln!("skipping: tmux is not installed (apt-get install tmux)");
        }
        found
    }

    /// Runs `args` (a kvtwin command line) in a detached `width` × `height` pane that
    /// stays on screen after the program exits.
    fn start(name: &str, args: &[&str], width: u16, height: u16) -> Self {
        let socket = format!("kvtwin-test-{name}-{}", std::process::id());
        // exec: the pane's process is kvtwin itself, for signals.
        let mut command = vec!["exec".to_string(), env!("CARGO_BIN_EXE_kvtwin").to_string()];
        command.extend(args.iter().map(|arg| arg.to_string()));
        let tmux = Self { socket };
        tmux.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            &command.join(" "),
            ";",
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (tmux key names, or literal text with `-l`).
    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend(keys);
        self.run(&args);
    }

    /// Types `text` literally.
    fn type_text(&self, text: &str) {
        self.run(&["send-keys", "-t", "0", "-l", text]);
    }

    /// Sends `signal` to the pane's process.
    fn signal(&self, signal: &str) {
        let pid = self.run(&["display-message", "-p", "-t", "0", "#{pane_pid}"]);
        let status = Command::new("kill")
            .args([&format!("-{signal}"), pid.trim()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// The screen as text.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", "0"])
    }

    /// Polls the screen until `ready` holds (`timeout` at most); that screen.
    fn wait_for(&self, what: &str, timeout: Duration, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// The worker table on a screen: worker key → blocks per tier named in its header.
fn table(screen: &str) -> BTreeMap<String, BTreeMap<String, u64>> {
    let mut lines = screen.lines();
    let Some(header) = lines.find(|line| line.contains("worker") && line.contains("status")) else {
        return BTreeMap::new();
    };
    let tiers: Vec<&str> = header
        .split_whitespace()
        .filter(|word| ["device", "host", "disk", "remote"].contains(word))
        .collect();
    let mut rows = BTreeMap::new();
    for line in lines {
        let words: Vec<&str> = line
            .trim_start_matches(['>', ' '])
            .split_whitespace()
            .collect();
        // A row: key, status, then a bar and a count per tier.
        if words.len() < 2 + 2 * tiers.len()
            || !words[0].chars().all(|c| c.is_ascii_digit() || c == ':')
        {
            continue;
        }
        let mut counts = BTreeMap::new();
        for (i, tier) in tiers.iter().enumerate() {
            let Ok(count) = words[3 + 2 * i].parse::<u64>() else {
                break;
            };
            counts.insert(tier.to_string(), count);
        }
        if counts.len() == tiers.len() {
            rows.insert(words[0].to_string(), counts);
        }
    }
    rows
}

/// `GET /v1/workers` as the same map, for the tiers in `like`'s rows.
fn router_table(
    address: &str,
    like: &BTreeMap<String, BTreeMap<String, u64>>,
) -> BTreeMap<String, BTreeMap<String, u64>> {
    let (status, body) = http(address, "GET", "/v1/workers", "");
    assert_eq!(status, 200, "{body}");
    let workers: Value = serde_json::from_str(&body).unwrap();
    let tiers: Vec<String> = like
        .values()
        .next()
        .map(|row| row.keys().cloned().collect())
        .unwrap_or_else(|| vec!["device".into()]);
    workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let key = match entry["dp_rank"].as_u64().unwrap() {
                0 => entry["worker"].to_string(),
                rank => format!("{}:{rank}", entry["worker"]),
            };
            let counts = tiers
                .iter()
                .map(|tier| (tier.clone(), entry["blocks"][tier].as_u64().unwrap()))
                .collect();
            (key, counts)
        })
        .collect()
}

/// Waits until the router has applied `events` events in all.
fn wait_events(address: &str, events: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, body) = http(address, "GET", "/v1/workers", "");
        let workers: Value = serde_json::from_str(&body).unwrap();
        let applied: u64 = workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry["events"].as_u64().unwrap_or(0))
            .sum();
        if applied >= events {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the router applied {applied} of {events} events"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three engines, each with its publisher and synthetic stream.
struct Engines {
    engines: Vec<(ZmqPublisher, SyntheticEngine)>,
    published_events: u64,
}

impl Engines {
    fn new() -> Self {
        let engines = (1..=3)
            .map(|seed| {
                let publisher = ZmqPublisher::bind(&PublisherConfig::new(
                    "tcp://127.0.0.1:*",
                    Some("tcp://127.0.0.1:*"),
                ))
                .unwrap();
                let mut config = SyntheticConfig::small(seed);
                // Different sizes, so that sorting by blocks orders them.
                config.requests_per_batch = seed as usize;
                (publisher, SyntheticEngine::new(config))
            })
            .collect();
        Self {
            engines,
            published_events: 0,
        }
    }

    fn sources(&self) -> Vec<String> {
        self.engines
            .iter()
            .enumerate()
            .map(|(i, (publisher, _))| {
                format!(
                    "{}={},replay={}",
                    i + 1,
                    publisher.endpoint(),
                    publisher.replay_endpoint().unwrap()
                )
            })
            .collect()
    }

    /// Each engine publishes `batches` more batches.
    fn publish(&mut self, batches: usize) {
        let options = EngineFormat::Vllm0_33.options();
        for (publisher, engine) in &mut self.engines {
            for _ in 0..batches {
                let batch = engine.next_batch();
                self.published_events += batch.events.len() as u64;
                publisher.publish(&batch.to_payload(&options)).unwrap();
            }
        }
    }
}

#[test]
fn the_dashboard_in_tmux_sorts_filters_and_freezes_a_live_routers_view() {
    let _serial = serial();
    if !Tmux::available() {
        return;
    }
    let mut engines = Engines::new();
    let mut args = vec!["router", "--listen", "127.0.0.1:0", "--block-size", "16"];
    let sources = engines.sources();
    for source in &sources {
        args.extend(["--zmq", source.as_str()]);
    }
    let router = Process::start(&args);
    let address = listening_on(&router);
    // Subscribers join late on ZMQ; the replay socket fills what they missed.
    engines.publish(10);
    wait_events(&address, engines.published_events);

    let url = format!("http://{address}");
    let tmux = Tmux::start("router", &["dash", "--router", &url], 160, 48);
    let before = router_table(&address, &BTreeMap::new());
    let screen = tmux.wait_for("the three workers", Duration::from_secs(20), |screen| {
        let rows = table(screen);
        rows.len() == 3 && rows == router_table(&address, &rows)
    });
    let rows = table(&screen);
    assert_eq!(rows.keys().collect::<Vec<_>>(), ["1", "2", "3"], "{screen}");
    assert_eq!(rows, router_table(&address, &rows));
    assert_eq!(before.len(), 3);

    // Sort by another column and back; filter to the workers with more than the
    // smallest device count.
    tmux.keys(&["s"]);
    tmux.wait_for("a new sort column", Duration::from_secs(5), |screen| {
        !screen.contains("sort worker")
    });
    let smallest = rows.values().map(|row| row["device"]).min().unwrap();
    tmux.keys(&["/"]);
    tmux.type_text(&format!("device>{smallest}"));
    tmux.keys(&["Enter"]);
    let filtered = tmux.wait_for("the filter", Duration::from_secs(5), |screen| {
        table(screen).len() < 3
    });
    assert!(
        filtered.contains(&format!("device>{smallest}")),
        "{filtered}"
    );
    let kept = table(&filtered);
    assert!(
        kept.values().all(|row| row["device"] > smallest),
        "{filtered}"
    );
    tmux.keys(&["Escape", "/"]);
    tmux.keys(&["BSpace"; 40]);
    tmux.keys(&["Enter"]);
    tmux.wait_for("the filter cleared", Duration::from_secs(5), |screen| {
        table(screen).len() == 3
    });

    // Freeze, publish more, and the screen keeps the freeze's picture.
    let at_freeze = router_table(&address, &rows);
    tmux.keys(&["f"]);
    tmux.wait_for("the freeze", Duration::from_secs(5), |screen| {
        screen.to_lowercase().contains("frozen")
    });
    engines.publish(10);
    wait_events(&address, engines.published_events);
    let after = router_table(&address, &rows);
    assert_ne!(after, at_freeze, "the engines' new batches changed nothing");
    // Long enough for the stream to have delivered the change (100 ms ticks).
    std::thread::sleep(Duration::from_millis(800));
    let frozen = tmux.screen();
    assert_eq!(table(&frozen), at_freeze, "{frozen}");

    // Unfrozen, it follows the router again.
    tmux.keys(&["f"]);
    tmux.wait_for("the live picture", Duration::from_secs(10), |screen| {
        table(screen) == after
    });

    // q quits and gives the terminal back (the dashboard's alternate screen is gone).
    tmux.keys(&["q"]);
    tmux.wait_for("the dashboard to quit", Duration::from_secs(10), |screen| {
        table(screen).is_empty()
    });
    drop(router);
}

#[test]
fn the_dashboard_in_tmux_plays_a_simulation_to_the_report_of_kvtwin_run() {
    let _serial = serial();
    if !Tmux::available() {
        return;
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let scenario = format!("{root}/scenarios/cluster-kv.ron");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let run = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["run", &scenario, "--seed", "11", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();

    let tmux = Tmux::start(
        "sim",
        &[
            "dash", "--sim", &scenario, "--seed", "11", "--speed", "1000000",
        ],
        160,
        48,
    );
    let screen = tmux.wait_for("the end of the run", Duration::from_secs(120), |screen| {
        screen.contains("finished:")
    });
    let completed = report["completed"].as_u64().unwrap();
    let hit = format!("hit {:.1}%", report["hit_ratio"].as_f64().unwrap() * 100.0);
    assert!(
        screen.contains(&format!("{completed} done")),
        "want {completed} done:\n{screen}"
    );
    assert!(screen.contains(&hit), "want {hit}:\n{screen}");
    // SIGTERM stops it and gives the terminal back.
    tmux.signal("TERM");
    tmux.wait_for("the terminal back", Duration::from_secs(10), |screen| {
        !screen.contains("kvtwin dash")
    });
}

#[test]
fn a_recording_played_in_tmux_ends_on_the_frame_of_once() {
    let _serial = serial();
    if !Tmux::available() {
        return;
    }
    let scenario = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scenarios/cluster-faults.ron"
    );
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("run.jsonl");
    let recording = recording.to_str().unwrap();
    kvtwin(&["dash", "--sim", scenario, "--once", "--record", recording]);
    let last = kvtwin(&[
        "dash", "--replay", recording, "--once", "--width", "100", "--height", "30",
    ]);
    // 558 s of recording at 1,000 times: half a second.
    let tmux = Tmux::start(
        "replay",
        &["dash", "--replay", recording, "--speed", "1000"],
        100,
        30,
    );
    let screen = tmux.wait_for("the recording's end", Duration::from_secs(60), |screen| {
        screen.contains(" s done")
    });
    let body = |frame: &str| -> Vec<String> {
        frame
            .lines()
            .skip(1)
            .map(|line| line.trim_end().to_string())
            .collect()
    };
    assert_eq!(
        body(&screen),
        body(&last),
        "tmux:\n{screen}\n--once:\n{last}"
    );
    // Ctrl-C quits (raw mode makes it a key) and gives the terminal back.
    tmux.keys(&["C-c"]);
    tmux.wait_for("the terminal back", Duration::from_secs(10), |screen| {
        !screen.contains("kvtwin dash")
    });
}
