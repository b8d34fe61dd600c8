//! What the `kvtwin` process tests share: a `kvtwin` child process with its stderr
//! lines, one-shot HTTP/1.1 requests (with a bearer token when a router wants one), and
//! waiting for a router to catch up; real vLLM engines in [`engines`]. Every `kvtwin`
//! runs without the caller's `KVTWIN_AUTH_TOKEN`, so a developer's own token never
//! changes what a test sees.
#![allow(dead_code)] // Each test file uses its own part.

pub(crate) mod engines;

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A `kvtwin` process, killed if the test ends before it was stopped; its stderr lines.
pub(crate) struct Process {
    child: Child,
    lines: mpsc::Receiver<String>,
}

/// `kvtwin` with `args`, without the caller's token variable.
fn command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvtwin"));
    command.args(args).env_remove("KVTWIN_AUTH_TOKEN");
    command
}

impl Process {
    pub(crate) fn start(args: &[&str]) -> Self {
        Self::start_env(args, &[])
    }

    /// As [`Process::start`], with `env` set for it.
    pub(crate) fn start_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = command(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
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
        Self { child, lines }
    }

    /// The process id.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }

    /// The first stderr line containing `needle` (10 s at most).
    pub(crate) fn wait_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => panic!("no line with {needle:?} from kvtwin"),
            }
        }
    }

    /// The stderr lines that came since the last look, waiting `settle` for more.
    pub(crate) fn lines_now(&self, settle: Duration) -> Vec<String> {
        let mut lines = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(settle) {
            lines.push(line);
        }
        lines
    }

    /// Sends SIGINT (what Ctrl-C sends) and waits for the exit (10 s at most); stdout.
    pub(crate) fn interrupt(self) -> String {
        let (exit, _, stdout) = self.signal("-INT", Duration::from_secs(10));
        assert!(exit.success(), "kvtwin exited with {exit}");
        stdout
    }
}

impl Process {
    /// Sends SIGTERM and waits for the exit (at most `limit`): (exit status, how long it
    /// took, stdout).
    pub(crate) fn terminate(self, limit: Duration) -> (std::process::ExitStatus, Duration, String) {
        self.signal("-TERM", limit)
    }

    /// Sends `signal` (as `kill` names it) and waits for the exit, at most `limit`.
    fn signal(
        mut self,
        signal: &str,
        limit: Duration,
    ) -> (std::process::ExitStatus, Duration, String) {
        let sent = Instant::now();
        let status = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(
                sent.elapsed() < limit,
                "kvtwin did not stop within {limit:?} of kill {signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let took = sent.elapsed();
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        (exit, took, stdout)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The router's address from its "listening on http://ADDR ..." (or https) line.
pub(crate) fn listening_on(router: &Process) -> String {
    listening_line(router).1
}

/// The router's whole "listening on" line and its address.
pub(crate) fn listening_line(router: &Process) -> (String, String) {
    let line = router.wait_line("listening on http");
    let start = line.find("://").unwrap() + "://".len();
    let address = line[start..].split_whitespace().next().unwrap().to_string();
    (line, address)
}

/// One HTTP/1.1 request; the status code and the body.
pub(crate) fn http(address: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    http_token(address, None, method, path, body)
}

/// One HTTP/1.1 request, with `Authorization: Bearer <token>` when given; the status
/// code and the body.
pub(crate) fn http_token(
    address: &str,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    let authorization = token
        .map(|token| format!("Authorization: Bearer {token}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\n{authorization}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// Waits until `/v1/workers` lists `worker` with `last_event_id` (10 s at most); its entry.
pub(crate) fn wait_worker(address: &str, worker: u64, last_event_id: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http(address, "GET", "/v1/workers", "");
        assert_eq!(status, 200, "{body}");
        let workers: Value = serde_json::from_str(&body).unwrap();
        if let Some(entry) = workers["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["worker"] == worker && entry["last_event_id"] == last_event_id)
        {
            return entry.clone();
        }
        assert!(
            Instant::now() < deadline,
            "worker {worker} not caught up: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `kvtwin` with `args`, which may fail: (success, stdout, stderr).
pub(crate) fn kvtwin_outcome(args: &[&str]) -> (bool, String, String) {
    let out = command(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Runs `kvtwin` with `args`; its stdout (it must succeed).
pub(crate) fn kvtwin(args: &[&str]) -> String {
    let out = command(args).output().unwrap();
    assert!(
        out.status.success(),
        "kvtwin {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `kvtwin relay` from `publisher`'s engine (its replay socket too) to the JetStream
/// stream `kv` at `url` as `worker`, with `extra` flags; started when it says so.
pub(crate) fn start_jetstream_relay(
    publisher: &kvtwin_plane::zmq::ZmqPublisher,
    url: &str,
    worker: u64,
    extra: &[&str],
) -> Process {
    let worker = worker.to_string();
    let mut args = vec![
        "relay",
        "--zmq",
        publisher.endpoint(),
        "--replay",
        publisher.replay_endpoint().unwrap(),
        "--nats",
        url,
        "--worker-id",
        &worker,
        "--jetstream",
        "kv",
    ];
    args.extend(extra);
    let relay = Process::start(&args);
    relay.wait_line(&format!("kvtwin relay: worker {worker}"));
    relay
}

/// The Mooncake conversation trace beside the repository, or `None` with a printed
/// reason when `../shared` is absent and the run is not CI (CI always has it, so there
/// its absence fails `test`).
pub(crate) fn mooncake_trace(test: &str) -> Option<std::path::PathBuf> {
    let shared = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared");
    if !shared.is_dir() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but ../shared is missing; {test} needs it"
        );
        eprintln!("skipping {test}: ../shared is not beside the repository");
        return None;
    }
    Some(shared.join("data/mooncake/conversation_trace.jsonl"))
}

/// A small deterministic generator (SplitMix64): a test's workload is the same every run.
pub(crate) struct Draw(pub(crate) u64);

impl Draw {
    /// The next 64 random bits.
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `low..=high`.
    pub(crate) fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }

    /// `n` token ids in 10..=31,000 (the tiny Llama's vocabulary holds them all).
    pub(crate) fn tokens(&mut self, n: u64) -> Vec<u32> {
        (0..n).map(|_| self.between(10, 31_000) as u32).collect()
    }
}
