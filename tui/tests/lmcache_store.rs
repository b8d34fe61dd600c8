//! LMCache's Redis remote connectors against `kvtwin store` (issue 32): LMCache 0.5.6,
//! installed beside the engines' venv (`scripts/engines/cluster.py lmcache`: CPU-only,
//! its CUDA requirements left out, which its Redis connectors do not import), stores a
//! chunk of a tiny model's KV (256 KiB) through the store and reads it back whole,
//! through each of its two connectors: `resp://` (RESPConnector, its native client) and
//! `redis://` (RedisConnector, redis-py 8's asyncio client, which asks for RESP3 with
//! HELLO 3). The same script against Debian's redis-server, when it is installed, says
//! the same.
//!
//! Needs the engines' venv (torch) and PyPI once; skips with the reason without them,
//! fails instead with `CI=true`.

mod common;

use common::Process;
use std::path::Path;
use std::process::{Command, Stdio};

/// The script's exit code for "this machine lacks what the engines need".
const EXIT_UNAVAILABLE: i32 = 3;

fn scripts() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/engines"))
}

/// The engines' interpreter and LMCache's path, installing LMCache if missing; `None`
/// (after saying why) when this machine cannot have them.
fn lmcache() -> Option<(String, String)> {
    let output = Command::new("python3")
        .arg(scripts().join("cluster.py"))
        .arg("lmcache")
        .stdin(Stdio::null())
        .output()
        .expect("python3 runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprint!("{stderr}");
    match output.status.code() {
        Some(0) => {}
        Some(EXIT_UNAVAILABLE) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "LMCache is required with CI=true: {stderr}"
            );
            eprintln!("skipping the LMCache check: {stderr}");
            return None;
        }
        code => panic!("cluster.py lmcache: exit {code:?}: {stderr}"),
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let field = |name: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("cluster.py lmcache printed no {name}: {stdout}"))
            .to_string()
    };
    Some((field("python"), field("pythonpath")))
}

/// The script's JSON lines against the server on `port`, and whether it passed.
fn check(python: &str, pythonpath: &str, port: u16) -> (Vec<serde_json::Value>, bool) {
    let output = Command::new(python)
        .arg(scripts().join("lmcache_store.py"))
        .args(["127.0.0.1", &port.to_string()])
        .env("PYTHONPATH", pythonpath)
        .stdin(Stdio::null())
        .output()
        .expect("the engines' python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    (lines, output.status.success())
}

fn port_of(store: &Process) -> u16 {
    let line = store.wait_line("listening on redis://");
    let start = line.find("redis://").unwrap() + "redis://".len();
    let address = line[start..]
        .split(|c: char| c == ';' || c.is_whitespace())
        .next()
        .unwrap();
    address.rsplit(':').next().unwrap().parse().unwrap()
}

#[test]
fn lmcache_stores_and_reads_back_a_chunk_through_kvtwin_store() {
    let Some((python, pythonpath)) = lmcache() else {
        return;
    };
    let store = Process::start(&["store", "--listen", "127.0.0.1:0", "--memory", "64MiB"]);
    let (lines, passed) = check(&python, &pythonpath, port_of(&store));
    eprintln!("kvtwin store: {lines:?}");
    let connectors: Vec<&str> = lines
        .iter()
        .map(|l| l["connector"].as_str().unwrap())
        .collect();
    assert_eq!(connectors, ["resp", "redis"]);
    for line in &lines {
        assert_eq!(line["ok"], true, "{line}");
        assert_eq!(line["chunk_bytes"], 262_144, "{line}");
    }
    assert!(passed);

    // The script itself, against Redis.
    let redis_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Ok(mut redis) = Command::new("redis-server")
        .args([
            "--port",
            &redis_port.to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
    else {
        eprintln!("no redis-server here: the script's check against Redis is left out");
        return;
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (against_redis, _) = check(&python, &pythonpath, redis_port);
    let _ = redis.kill();
    let _ = redis.wait();
    assert_eq!(
        against_redis, lines,
        "redis-server and kvtwin store answered apart"
    );
}
