//! `kvtwin bench serve`, the binary, against `kvtwin router --engine` (the binary) in
//! front of two mock engines (`kvtwin_plane::service::frontend::mock`): shared prefixes
//! in a closed loop with `--out`, a trace replayed, and a server that answers nothing.

mod common;

use common::{http, kvtwin_outcome, listening_on, Process};
use kvtwin_plane::service::frontend::mock::{MockConfig, MockEngine};
use serde_json::Value;
use std::io::Write;
use std::time::{Duration, Instant};

/// `kvtwin router` fronting `engines` with their events, block size 32; ready.
fn router(engines: &[&MockEngine]) -> (Process, String) {
    let mut args: Vec<String> = vec!["router".into()];
    for (k, engine) in engines.iter().enumerate() {
        let (live, replay) = engine.events().unwrap();
        args.push("--engine".into());
        args.push(format!("{}={}", k + 1, engine.url()));
        args.push("--zmq".into());
        args.push(format!("{}={live},replay={replay}", k + 1));
    }
    args.extend(
        [
            "--block-size",
            "32",
            "--listen",
            "127.0.0.1:0",
            "--health-period-ms",
            "200",
        ]
        .map(String::from),
    );
    let router = Process::start(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let address = listening_on(&router);
    let start = Instant::now();
    while http(&address, "GET", "/readyz", "").0 != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "router never ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (router, address)
}

fn serve(args: &[&str]) -> (bool, Value, String) {
    let mut all = vec!["bench", "serve"];
    all.extend(args);
    let (ok, stdout, stderr) = kvtwin_outcome(&all);
    let report = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|error| panic!("{error}: {stdout:?} {stderr}"));
    (ok, report, stderr)
}

#[test]
fn bench_serve_loads_the_router_and_reports_what_its_engines_served() {
    let (one, two) = (
        MockEngine::start(MockConfig::default()).unwrap(),
        MockEngine::start(MockConfig::default()).unwrap(),
    );
    let (_router, address) = router(&[&one, &two]);
    let url = format!("http://{address}");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("requests.jsonl");
    let (ok, report, stderr) = serve(&[
        "--url",
        &url,
        "--requests",
        "12",
        "--prefixes",
        "2",
        "--prefix-tokens",
        "64",
        "--suffix-tokens",
        "40",
        "--max-tokens",
        "3",
        "--concurrency",
        "3",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(report["bench"], "serve");
    assert_eq!(report["model"], "tiny");
    assert_eq!(report["requests"], 12, "{report}");
    assert_eq!(report["succeeded"], 12, "{report}");
    assert_eq!(report["failed"], 0);
    assert_eq!(report["output_tokens"], 36);
    assert_eq!(report["prompt_tokens"], 12 * 104);
    let per_worker = report["requests_per_worker"].as_object().unwrap();
    for (worker, engine) in [("1", &one), ("2", &two)] {
        let received = engine.requests().len() as u64;
        assert_eq!(
            per_worker.get(worker).and_then(Value::as_u64).unwrap_or(0),
            received,
            "{report}"
        );
    }
    assert!(
        report["cached_tokens"].as_u64().unwrap() >= 64 * 4,
        "{report}"
    );
    assert!(report["hit_ratio"].as_f64().unwrap() > 0.0);
    assert!(report["ttft_ms"]["p50"].as_f64().unwrap() > 0.0);
    assert_eq!(report["itl_ms"]["samples"], 24);
    assert!(stderr.contains("requests per worker"), "{stderr}");
    assert!(stderr.contains("hit ratio"), "{stderr}");
    let lines: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    assert!(lines.iter().all(|line| line["outcome"] == "ok"));
    let cached: u64 = lines
        .iter()
        .map(|line| line["cached_tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(Some(cached), report["cached_tokens"].as_u64());

    // A trace of four rows, two sharing their first two blocks, ten times faster.
    let trace = dir.path().join("trace.jsonl");
    let mut file = std::fs::File::create(&trace).unwrap();
    for (timestamp, input_length, ids) in [
        (0, 80, "[1,2,3]"),
        (2000, 96, "[1,2,4]"),
        (4000, 64, "[7,8]"),
        (6000, 40, "[9,10]"),
    ] {
        writeln!(
            file,
            "{{\"timestamp\":{timestamp},\"input_length\":{input_length},\"output_length\":2,\"hash_ids\":{ids}}}"
        )
        .unwrap();
    }
    drop(file);
    let (ok, report, stderr) = serve(&[
        "--url",
        &url,
        "--trace",
        trace.to_str().unwrap(),
        "--trace-block-size",
        "32",
        "--speedup",
        "10",
        "--seed",
        "9",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(report["workload"], "trace");
    assert_eq!(report["requests"], 4, "{report}");
    assert_eq!(report["succeeded"], 4, "{report}");
    assert_eq!(report["prompt_tokens"], 80 + 96 + 64 + 40);
    assert_eq!(
        report["cached_tokens"], 64,
        "row 2 shares row 1's two blocks: {report}"
    );
    assert!(report["wall_s"].as_f64().unwrap() >= 0.6, "{report}");
}

#[test]
fn bench_serve_counts_a_server_that_answers_nothing_and_exits_non_zero() {
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let (ok, report, stderr) = serve(&[
        "--url",
        &format!("http://{closed}"),
        "--model",
        "tiny",
        "--requests",
        "3",
        "--timeout-s",
        "2",
    ]);
    assert!(!ok);
    assert_eq!(report["failed_by_reason"]["connect_error"], 3, "{report}");
    assert!(
        stderr.contains("none of the 3 requests succeeded"),
        "{stderr}"
    );
    let (ok, _, stderr) = kvtwin_outcome(&["bench", "serve", "--url", "localhost:1"]);
    assert!(!ok);
    assert!(stderr.contains("--url"), "{stderr}");
}
