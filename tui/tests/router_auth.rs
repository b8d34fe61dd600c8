//! `kvtwin router`'s access flags as a process: over HTTPS (a certificate made in the
//! test) with `--auth-token-file`, every endpoint but the probes and `/metrics` answers
//! 401 without the token or with a wrong one and 200 with it, and `kvtwin dash --router`
//! reads it with `--router-token-file` and `--router-ca`; over HTTP with the token in
//! `KVTWIN_AUTH_TOKEN` and `--metrics-auth`, `/metrics` is closed too. The token never
//! appears on stderr. Refused starts: a non-loopback address without a token (unless
//! `--insecure`), an empty token file, `--metrics-auth` without a token, half a TLS pair.

mod common;

use bytes::Bytes;
use common::{http, http_token, kvtwin, kvtwin_outcome, listening_line, Process};
use kvtwin_plane::service::auth::AuthToken;
use kvtwin_plane::service::client::{self, ClientAccess, RouterUrl};
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::service::tls::client_config;
use kvtwin_plane::wire::EngineFormat;
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

const TOKEN: &str = "router-auth-test-6d1c9e";

/// An engine that has published 20 batches: its publisher, the `--zmq` argument for
/// `worker`, and the events it published.
fn engine(worker: u64) -> (ZmqPublisher, String, u64) {
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let mut engine = SyntheticEngine::new(SyntheticConfig::small(worker));
    let options = EngineFormat::Vllm0_33.options();
    let mut events = 0;
    for _ in 0..20 {
        let batch = engine.next_batch();
        events += batch.events.len() as u64;
        publisher.publish(&batch.to_payload(&options)).unwrap();
    }
    let source = format!(
        "{worker}={},replay={}",
        publisher.endpoint(),
        publisher.replay_endpoint().unwrap()
    );
    (publisher, source, events)
}

/// A self-signed certificate for `localhost` and `127.0.0.1` in `dir`: (cert, key) paths.
fn self_signed(dir: &Path) -> (String, String) {
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let certified = rcgen::generate_simple_self_signed(names).unwrap();
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (
        cert.to_str().unwrap().to_string(),
        key.to_str().unwrap().to_string(),
    )
}

/// One HTTPS request through the plane's client: (status, body).
fn https(
    address: &str,
    access: &ClientAccess,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    let url = RouterUrl::parse(&format!("https://{address}{path}"), "/").unwrap();
    let method = method.parse().unwrap();
    let body = Bytes::from(body.to_string());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let response = runtime
        .block_on(client::request(&url, access, method, body))
        .unwrap();
    (
        response.status().as_u16(),
        String::from_utf8_lossy(response.body()).into_owned(),
    )
}

/// Asserts none of `lines` shows the token.
fn assert_no_token(lines: &[String]) {
    for line in lines {
        assert!(!line.contains(TOKEN), "the token on stderr: {line}");
    }
}

#[test]
fn an_https_router_with_a_token_file_admits_only_the_token_and_the_dash_reads_it() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{TOKEN}\n")).unwrap();
    let token_file = token_file.to_str().unwrap();
    let (_publisher, source, events) = engine(5);
    let router = Process::start(&[
        "router",
        "--zmq",
        &source,
        "--listen",
        "127.0.0.1:0",
        "--auth-token-file",
        token_file,
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
    ]);
    let (line, address) = listening_line(&router);
    assert!(line.contains("listening on https://"), "{line}");
    assert!(line.contains(token_file), "{line}");
    assert_no_token(&[line]);

    let tls = client_config(Some(Path::new(&cert))).unwrap();
    let access = |token: Option<&str>| ClientAccess {
        token: token.map(|text| AuthToken::from_text(text).unwrap().unwrap()),
        tls: Some(tls.clone()),
    };
    let (with, without, wrong) = (access(Some(TOKEN)), access(None), access(Some("wrong")));
    // The events arrive (replayed) while we look.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = https(&address, &with, "GET", "/v1/workers", "");
        assert_eq!(status, 200, "{body}");
        let workers: Value = serde_json::from_str(&body).unwrap();
        if workers["workers"][0]["last_event_id"] == events - 1 {
            break;
        }
        assert!(Instant::now() < deadline, "not caught up: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let route = "{\"tokens\":[1,2,3,4]}";
    for (method, path, body) in [("GET", "/v1/workers", ""), ("POST", "/v1/route", route)] {
        assert_eq!(
            https(&address, &without, method, path, body).0,
            401,
            "{path}"
        );
        assert_eq!(https(&address, &wrong, method, path, body).0, 401, "{path}");
        let (status, text) = https(&address, &with, method, path, body);
        assert_eq!(status, 200, "{path}: {text}");
    }
    for open in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(https(&address, &without, "GET", open, "").0, 200, "{open}");
    }

    let url = format!("https://{address}");
    let frame = kvtwin(&[
        "dash",
        "--router",
        &url,
        "--router-token-file",
        token_file,
        "--router-ca",
        &cert,
        "--once",
    ]);
    assert!(frame.contains(&format!("connected to {url}")), "{frame}");
    assert!(
        frame
            .lines()
            .any(|line| line.trim_start_matches(['>', ' ']).starts_with("5 ")),
        "no row for worker 5:\n{frame}"
    );
    // Without the token the dashboard says why it keeps retrying.
    let frame = kvtwin(&[
        "dash",
        "--router",
        &url,
        "--router-ca",
        &cert,
        "--once",
        "--timeout",
        "1",
        "--width",
        "200",
    ]);
    assert!(frame.contains("HTTP 401 (unauthorized"), "{frame}");
    assert_no_token(&router.lines_now(Duration::from_millis(200)));
    router.interrupt();
}

#[test]
fn a_token_from_the_environment_closes_metrics_when_asked() {
    let (_publisher, source, _) = engine(6);
    let router = Process::start_env(
        &[
            "router",
            "--zmq",
            &source,
            "--listen",
            "127.0.0.1:0",
            "--metrics-auth",
        ],
        &[("KVTWIN_AUTH_TOKEN", TOKEN)],
    );
    let (line, address) = listening_line(&router);
    assert!(line.contains("listening on http://"), "{line}");
    assert!(line.contains("KVTWIN_AUTH_TOKEN"), "{line}");
    for path in ["/v1/workers", "/metrics", "/v1/stream"] {
        assert_eq!(http(&address, "GET", path, "").0, 401, "{path}");
        assert_eq!(
            http_token(&address, Some("nope"), "GET", path, "").0,
            401,
            "{path}"
        );
    }
    for path in ["/v1/workers", "/metrics"] {
        let (status, body) = http_token(&address, Some(TOKEN), "GET", path, "");
        assert_eq!(status, 200, "{path}: {body}");
    }
    assert_eq!(http(&address, "GET", "/healthz", "").0, 200);
    // Open without the token; 503 until the engine's replay has been read, then 200.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = http(&address, "GET", "/readyz", "");
        if status == 200 {
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(Instant::now() < deadline, "never ready: {body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The dashboard takes the same variable.
    let frame = common_dash_with_env(&address);
    assert!(
        frame.contains(&format!("connected to http://{address}")),
        "{frame}"
    );
    assert_no_token(&router.lines_now(Duration::from_millis(200)));
    router.interrupt();
}

/// `kvtwin dash --router http://ADDRESS --once` with the token in the environment.
fn common_dash_with_env(address: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["dash", "--router", &format!("http://{address}"), "--once"])
        .env("KVTWIN_AUTH_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn starts_that_would_be_unsafe_or_cannot_work_are_refused_with_the_reason() {
    let zmq = "1=tcp://127.0.0.1:1";
    let (ok, _, stderr) = kvtwin_outcome(&["router", "--zmq", zmq, "--listen", "0.0.0.0:0"]);
    assert!(!ok);
    for says in [
        "0.0.0.0:0",
        "--auth-token-file",
        "KVTWIN_AUTH_TOKEN",
        "--insecure",
    ] {
        assert!(stderr.contains(says), "{says}: {stderr}");
    }

    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-token");
    std::fs::write(&empty, "\n").unwrap();
    let empty = empty.to_str().unwrap();
    let (ok, _, stderr) = kvtwin_outcome(&["router", "--zmq", zmq, "--auth-token-file", empty]);
    assert!(!ok);
    assert!(
        stderr.contains(empty) && stderr.contains("empty"),
        "{stderr}"
    );
    let missing = dir.path().join("missing").to_str().unwrap().to_string();
    let (ok, _, stderr) = kvtwin_outcome(&["router", "--zmq", zmq, "--auth-token-file", &missing]);
    assert!(!ok);
    assert!(stderr.contains(&missing), "{stderr}");

    let (ok, _, stderr) = kvtwin_outcome(&["router", "--zmq", zmq, "--metrics-auth"]);
    assert!(!ok);
    assert!(stderr.contains("--metrics-auth needs a token"), "{stderr}");

    let (ok, _, stderr) = kvtwin_outcome(&["router", "--zmq", zmq, "--tls-cert", "c.pem"]);
    assert!(!ok);
    assert!(stderr.contains("--tls-key"), "{stderr}");
}

#[test]
fn insecure_serves_a_non_loopback_address_without_a_token_and_says_so() {
    let (_publisher, source, _) = engine(7);
    let router = Process::start(&[
        "router",
        "--zmq",
        &source,
        "--listen",
        "0.0.0.0:0",
        "--insecure",
    ]);
    let (line, address) = listening_line(&router);
    assert!(line.contains("WARNING: no token"), "{line}");
    let port = address.rsplit_once(':').unwrap().1;
    let (status, _) = http(&format!("127.0.0.1:{port}"), "GET", "/v1/workers", "");
    assert_eq!(status, 200);
    router.interrupt();
}
