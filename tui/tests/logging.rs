//! `kvtwin router`'s logs: text by default, one JSON object a line with `--log-format
//! json` (level, message, timestamp), filtered by `RUST_LOG`; an invalid `RUST_LOG` stops
//! the start with an error naming it.

mod common;

use common::{kvtwin_outcome, Process};
use serde_json::Value;

#[test]
fn the_router_logs_json_lines_and_rust_log_filters_them() {
    let router = Process::start_env(
        &[
            "router",
            "--listen",
            "127.0.0.1:0",
            "--zmq",
            "1=tcp://127.0.0.1:1",
            "--log-format",
            "json",
        ],
        &[("RUST_LOG", "info")],
    );
    let line = router.wait_line("listening on");
    let record: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(record["level"], "INFO", "{record}");
    let message = record["fields"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("kvtwin router: listening on http://127.0.0.1:"),
        "{message}"
    );
    assert!(record["timestamp"].is_string(), "{record}");
    router.interrupt();

    // The only test of this file: setting the variable races with no other.
    std::env::set_var("RUST_LOG", "kvtwin=[[[");
    let (ok, _, stderr) = kvtwin_outcome(&[
        "router",
        "--listen",
        "127.0.0.1:0",
        "--zmq",
        "1=tcp://127.0.0.1:1",
    ]);
    std::env::remove_var("RUST_LOG");
    assert!(!ok);
    assert!(stderr.contains("RUST_LOG=kvtwin=[[["), "{stderr}");
}
