//! `kvtwin store` as a user runs it: started on a free port, spoken to in the Redis
//! protocol over a plain socket, killed with SIGKILL and restarted on the same
//! directories, a token required when one is given, TLS for `redis-cli --tls` when a
//! certificate is given, and flags refused by name.

mod common;

use common::Process;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The store's address from its "listening on redis://ADDR; ..." line.
fn address(store: &Process) -> String {
    address_of_line(&store.wait_line("listening on redis://"))
}

/// Sends each command (arguments framed as RESP arrays) on one connection; the raw
/// replies, read until every one has come.
fn send(address: &str, commands: &[&[&[u8]]]) -> Vec<u8> {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut request = Vec::new();
    for args in commands {
        request.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for arg in *args {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
    }
    stream.write_all(&request).unwrap();
    // QUIT last: the store closes the connection after answering it.
    stream.write_all(b"*1\r\n$4\r\nQUIT\r\n").unwrap();
    let mut replies = Vec::new();
    stream.read_to_end(&mut replies).unwrap();
    replies.truncate(replies.len() - b"+OK\r\n".len());
    replies
}

#[test]
fn values_on_disk_and_in_the_object_tier_outlive_a_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    let object = dir.path().join("object");
    let args = [
        "store",
        "--listen",
        "127.0.0.1:0",
        // No DRAM: every value goes straight to disk, then down to the object tier.
        "--memory",
        "0",
        "--disk-dir",
        disk.to_str().unwrap(),
        "--disk",
        "3KiB",
        "--object-dir",
        object.to_str().unwrap(),
        "--object",
        "1MiB",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let value = vec![7u8; 1000];
    let store = Process::start(&args);
    let at = address(&store);
    let mut commands: Vec<Vec<Vec<u8>>> = Vec::new();
    for n in 0..8 {
        commands.push(vec![
            b"SET".to_vec(),
            format!("block{n}").into_bytes(),
            value.clone(),
        ]);
    }
    let framed: Vec<Vec<&[u8]>> = commands
        .iter()
        .map(|c| c.iter().map(Vec::as_slice).collect())
        .collect();
    let framed: Vec<&[&[u8]]> = framed.iter().map(Vec::as_slice).collect();
    assert_eq!(send(&at, &framed), b"+OK\r\n".repeat(8));
    // SIGKILL: no chance to flush or say goodbye.
    let killed = std::process::Command::new("kill")
        .args(["-9", &store.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    drop(store);

    let store = Process::start(&args);
    let line = store.wait_line("listening on redis://");
    assert!(line.contains("8 keys found"), "{line}");
    let at = address_of_line(&line);
    let mut expected = b"*8\r\n".to_vec();
    for _ in 0..8 {
        expected.extend_from_slice(b"$1000\r\n");
        expected.extend_from_slice(&value);
        expected.extend_from_slice(b"\r\n");
    }
    let keys: Vec<Vec<u8>> = (0..8).map(|n| format!("block{n}").into_bytes()).collect();
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    mget.extend(keys.iter().map(Vec::as_slice));
    assert_eq!(send(&at, &[&mget]), expected);
    let info = send(&at, &[&[b"INFO"]]);
    let info = String::from_utf8_lossy(&info);
    assert!(info.contains("db0:keys=8"), "{info}");
    // Two 1,066-byte records fit the disk's 3 KiB, the other six went to the object
    // tier; the reads were hits there, and nothing moved into a DRAM of 0 bytes.
    let metrics_at = line
        .split("metrics on http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_else(|| panic!("no metrics address in {line}"));
    let (status, text) = common::http(metrics_at, "GET", "/metrics", "");
    assert_eq!(status, 200, "{text}");
    for sample in [
        "kvtwin_store_keys{tier=\"disk\"} 2",
        "kvtwin_store_keys{tier=\"object\"} 6",
        "kvtwin_store_hits_total{tier=\"disk\"} 2",
        "kvtwin_store_hits_total{tier=\"object\"} 6",
        "kvtwin_store_promotions_total 0",
        "kvtwin_store_leased_copies 0",
    ] {
        assert!(
            text.lines().any(|l| l == sample),
            "no {sample:?} in\n{text}"
        );
    }
}

fn address_of_line(line: &str) -> String {
    let start = line.find("redis://").unwrap() + "redis://".len();
    line[start..]
        .split(|c: char| c == ';' || c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn with_a_token_the_store_refuses_until_auth() {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let store = Process::start(&[
        "store",
        "--listen",
        "127.0.0.1:0",
        "--token-file",
        token.to_str().unwrap(),
    ]);
    let line = store.wait_line("listening on redis://");
    assert!(line.contains("AUTH required"), "{line}");
    let at = address_of_line(&line);
    let replies = send(
        &at,
        &[
            &[b"GET", b"k"],
            &[b"AUTH", b"wrong"],
            &[b"AUTH", b"s3cret"],
            &[b"SET", b"k", b"v"],
            &[b"GET", b"k"],
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&replies),
        "-NOAUTH Authentication required.\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n+OK\r\n+OK\r\n$1\r\nv\r\n"
    );
}

#[test]
fn kvtwin_prefix_counts_the_leading_keys_held() {
    let store = Process::start(&["store", "--listen", "127.0.0.1:0"]);
    let at = address(&store);
    let replies = send(
        &at,
        &[
            &[b"MSET", b"b0", b"x", b"b1", b"y", b"b3", b"z"],
            // b0 and b1 held, b2 not: the prefix stops there, whatever follows.
            &[b"KVTWIN.PREFIX", b"b0", b"b1", b"b2", b"b3"],
            &[b"kvtwin.prefix", b"b2", b"b0"],
            &[b"KVTWIN.PREFIX", b"b0", b"b1"],
            &[b"KVTWIN.PREFIX"],
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&replies),
        "+OK\r\n:2\r\n:0\r\n:2\r\n-ERR wrong number of arguments for 'kvtwin.prefix' command\r\n"
    );
}

#[test]
fn bad_sizes_and_flags_are_refused_by_name() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["store", "--memory", "12 parsecs"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--memory") && stderr.contains("unknown unit"),
        "{stderr}"
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args(["store", "--disk", "1GiB"])
        .output()
        .unwrap();
    assert!(!output.status.success(), "--disk without --disk-dir");
}

/// `kvtwin bench store` for 2 s, 4 MiB of DRAM, 64 KiB values, and `more` flags: its
/// JSON report (the run must succeed).
fn bench_store(more: &[&str]) -> serde_json::Value {
    let mut args = vec![
        "bench",
        "store",
        "--seconds",
        "2",
        "--memory",
        "4MiB",
        "--value-bytes",
        "64KiB",
    ];
    args.extend_from_slice(more);
    let (ok, stdout, stderr) = common::kvtwin_outcome(&args);
    assert!(ok, "{stderr}");
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn the_bench_keeps_every_value_whole_under_eight_clients_over_twice_dram() {
    let report = bench_store(&[]);
    assert_eq!(report["torn_reads"], 0, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(
        report["keys"], 128,
        "twice 4 MiB in 64 KiB values: {report}"
    );
    assert!(report["sets"].as_u64().unwrap() > 0 && report["hits"].as_u64().unwrap() > 0);
    // Its memory stays within DRAM's bound and what is in flight (see the bench's docs).
    assert_eq!(report["anon_within_bound"], true, "{report}");
    // The store's own word: values went down to disk, none failed its check.
    let info = report["store_info"].as_str().unwrap();
    assert!(info.contains("corrupt_values:0"), "{info}");
    assert!(!info.contains("disk:keys=0,"), "{info}");
}

#[test]
fn a_small_disk_evicts_under_load_and_reads_below_dram_are_leased() {
    // Twice 4 MiB of values over 4 MiB of DRAM, 2 MiB of disk and 1 MiB of an object
    // tier: values move down and out of the store, and reads below DRAM lease copies.
    let report = bench_store(&["--disk", "2MiB", "--object", "1MiB"]);
    assert_eq!(report["torn_reads"], 0, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    for counter in ["evicted_keys", "leases", "promotions", "demotions"] {
        assert!(report[counter].as_u64().unwrap() > 0, "{counter}: {report}");
    }
    assert_eq!(report["corrupt_values"], 0, "{report}");
}

#[test]
fn sigkill_under_load_loses_nothing_on_disk_or_in_the_object_tier() {
    let report = bench_store(&["--disk", "6MiB", "--object", "8MiB", "--kill"]);
    let kill = &report["kill"];
    // Half the values are DRAM's at most; the rest lie on disk or in the object tier.
    assert!(kill["durable_keys"].as_u64().unwrap() >= 60, "{report}");
    assert_eq!(kill["durable_lost"], 0, "{report}");
    assert_eq!(kill["torn_after_restart"], 0, "{report}");
    assert!(
        kill["held_after_restart"].as_u64().unwrap() >= kill["durable_keys"].as_u64().unwrap(),
        "{report}"
    );
    assert_eq!(report["torn_reads"], 0, "{report}");
}

/// `redis-cli` with `args` (TLS flags, then a command): its stdout, or `None` if it failed.
fn redis_cli(args: &[&str]) -> Option<String> {
    let output = std::process::Command::new("redis-cli")
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

#[test]
fn with_tls_redis_cli_is_served_and_plain_text_is_not() {
    if std::process::Command::new("redis-cli")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "redis-cli is missing and CI=true: .ci/run installs Debian's redis-tools"
        );
        eprintln!("skipped: redis-cli is not installed (Debian: redis-tools)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let certified = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let store = Process::start(&[
        "store",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ]);
    let line = store.wait_line("listening on rediss://");
    let at = address_of_line(&line.replace("rediss://", "redis://"));
    let port = at.rsplit(':').next().unwrap();
    let tls = [
        "--tls",
        "--cacert",
        cert.to_str().unwrap(),
        "-h",
        "127.0.0.1",
        "-p",
        port,
    ];
    let cli = |command: &[&str]| redis_cli(&[&tls[..], command].concat());
    assert_eq!(cli(&["SET", "block", "bytes"]).as_deref(), Some("OK"));
    assert_eq!(cli(&["GET", "block"]).as_deref(), Some("bytes"));
    assert_eq!(cli(&["EXISTS", "block"]).as_deref(), Some("1"));
    // A client without TLS gets no answer: the store waits for a handshake, and the
    // bytes it read were not one.
    let mut plain = TcpStream::connect(&at).unwrap();
    plain
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    plain.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = plain.read_to_end(&mut reply);
    assert!(
        !reply.starts_with(b"+PONG"),
        "a plain-text PING was answered: {reply:?}"
    );
    // A client that trusts another certificate is refused in the handshake.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let other_ca = dir.path().join("other.pem");
    std::fs::write(&other_ca, other.cert.pem()).unwrap();
    let refused = redis_cli(&[
        "--tls",
        "--cacert",
        other_ca.to_str().unwrap(),
        "-h",
        "127.0.0.1",
        "-p",
        port,
        "PING",
    ]);
    assert_ne!(refused.as_deref(), Some("PONG"));
}
