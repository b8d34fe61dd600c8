//! `kvtwin bench soak` end to end, short: 20 seconds of two engines with chaos on must
//! kill and restart the nats-server, a relay and the router, and still end with the
//! router holding exactly the engines' caches and every acknowledged event received;
//! the JSON line carries the counts, kills, restarts and RSS per process, and the exit
//! status agrees with the verdicts.
//!
//! Skips with the reason when there is no nats-server, unless `KVTWIN_REQUIRE_NATS=1` or
//! `CI=true`.

use kvtwin_plane::nats::NatsServer;
use serde_json::Value;
use std::process::Command;

#[test]
fn a_short_soak_with_chaos_recovers_from_every_kill_and_matches_the_engines() {
    // Only to learn whether a server can run here: the soak starts its own.
    if NatsServer::start_or_skip("a_short_soak_with_chaos").is_none() {
        return;
    }
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["bench", "soak", "--seconds", "20", "--seed", "3"])
        .env_remove("KVTWIN_AUTH_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("no JSON line ({error}); stderr:\n{stderr}"));
    let verdicts = &report["verdicts"];
    for name in ["state", "acknowledged"] {
        assert_eq!(verdicts[name]["passed"], true, "{name}: {report}\n{stderr}");
    }
    // The exit status is the verdicts' (RSS windows of seconds are judged too, but
    // a 20 s run is too short for this test to insist on them).
    assert_eq!(
        output.status.success(),
        report["passed"] == true,
        "{report}\n{stderr}"
    );
    assert!(stderr.contains("PASS state"), "{stderr}");

    let targets: Vec<&str> = report["kills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kill| kill["target"].as_str().unwrap())
        .collect();
    assert!(targets.contains(&"nats-server"), "{report}");
    assert!(targets.contains(&"router"), "{report}");
    assert!(targets.iter().any(|t| t.starts_with("relay-")), "{report}");
    for process in ["nats-server", "relays", "router"] {
        assert!(report["restarts"][process].as_u64() >= Some(1), "{report}");
    }

    let events = &report["events"];
    let sent = events["sent"].as_u64().unwrap();
    assert!(sent > 100, "{report}");
    // A restarted relay republishes what the engine's replay socket still holds.
    assert!(events["acked"].as_u64() >= Some(sent), "{report}");
    assert_eq!(events["received"], events["in_stream"], "{report}");
    assert!(
        report["replayed"]["zmq_batches"].as_u64() > Some(0),
        "{report}"
    );
    assert!(
        report["replayed"]["jetstream_messages"].as_u64() > Some(0),
        "{report}"
    );

    let rss = report["rss"].as_array().unwrap();
    for process in ["nats-server", "relay-1", "relay-2", "router", "soak"] {
        let row = rss
            .iter()
            .find(|row| row["process"] == process)
            .unwrap_or_else(|| panic!("no RSS of {process}: {report}"));
        assert!(row["after_warm_up_kib"].as_u64() > Some(0), "{report}");
        assert!(row["last_window_kib"].as_u64() > Some(0), "{report}");
    }
}
