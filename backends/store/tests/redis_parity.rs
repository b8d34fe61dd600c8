//! The store's Redis front against Redis itself: the same commands through `redis-cli`
//! and through the `redis` Python client, sent to Debian's redis-server and to a
//! kvtwin store, must print the same; and after HELLO 3 (RESP3, which newer clients ask
//! for), the same bytes come back. Needs `redis-server`, `redis-cli` (Debian's
//! redis-server and redis-tools) and Debian's `python3-redis` at /usr/bin/python3; skips
//! with the reason when one is missing, and fails instead when `CI=true`.

use kvtwin_store::resp::Limits;
use kvtwin_store::server::{serve, ServerConfig};
use kvtwin_store::store::{Store, StoreConfig};
use object_store::local::LocalFileSystem;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Debian's interpreter, which python3-redis installs into.
const PYTHON: &str = "/usr/bin/python3";

fn missing(what: &str) -> bool {
    let found = match what {
        "python3-redis" => Command::new(PYTHON)
            .args(["-c", "import redis"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
        tool => Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success()),
    };
    if found {
        return false;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what} is missing and CI=true: .ci/run installs Debian's redis-server, redis-tools and python3-redis"
    );
    eprintln!(
        "skipped: {what} is not installed (Debian: redis-server, redis-tools, python3-redis)"
    );
    true
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's redis-server on a free port, nothing saved; killed when dropped.
struct Redis(Child, u16);

impl Redis {
    fn start(password: Option<&str>) -> Redis {
        let port = free_port();
        let mut command = Command::new("redis-server");
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis(child, port)
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A kvtwin store serving on a free port from a thread of its own; `dir` holds its disk
/// tier.
fn kvtwin_store(dir: &std::path::Path, token: Option<&str>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let disk = dir.join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    let token = token.map(str::to_string);
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let store = Store::open(StoreConfig {
                limits: [1 << 20, 64 << 20, 0],
                disk: Some(Arc::new(LocalFileSystem::new_with_prefix(&disk).unwrap())),
                object: None,
                max_value: 16 << 20,
                promote_on_hit: true,
                events: None,
            })
            .await
            .unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            serve(
                listener,
                Arc::new(store),
                ServerConfig {
                    token,
                    max_clients: 64,
                    limits: Limits::default(),
                    tls: None,
                },
            )
            .await;
        });
    });
    port
}

/// What `redis-cli --no-raw` prints for `script` (one command a line) sent to `port`.
fn cli(port: u16, script: &str) -> String {
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "--no-raw"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("redis-cli runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr)
}

const SCRIPT: &str = r#"PING
PING hello
ECHO "hi there"
SET k1 v1
GET k1
GET missing
SET k1 v2 NX
SET k2 v2 XX
SET k2 v2 NX
GET k2
SET k1 v3 GET
SET k1 v4 XX GET
SET missing2 v XX GET
SET k1 v NX XX
SET k1 v BOGUS
SET k1
MSET a 1 b 2 c 3
MSET a
MGET a b missing c
EXISTS a b missing a
DEL a missing b
EXISTS a b
DBSIZE
UNLINK c
GET
get k1 extra
NOSUCH arg1 arg2
SELECT 0
SELECT x
CLIENT SETNAME me
CLIENT GETNAME
MULTI
SET t1 a
GET t1
NOSUCH
EXEC
EXEC
MULTI
SET t2 b
MGET t1 t2
DISCARD
MULTI
MULTI
SET t3 c
GET t3
EXEC
GET t3
AUTH nopass
FLUSHALL
DBSIZE
GET k1
"#;

#[test]
fn redis_cli_sees_what_redis_server_gives() {
    if missing("redis-server") || missing("redis-cli") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(None);
    let store = kvtwin_store(dir.path(), None);
    let (expected, got) = (cli(redis.1, SCRIPT), cli(store, SCRIPT));
    assert!(
        expected.contains("(error) ERR wrong number of arguments for 'get' command"),
        "{expected}"
    );
    for (line, (e, g)) in expected.lines().zip(got.lines()).enumerate() {
        assert_eq!(
            g,
            e,
            "line {} of the replies differs:\nredis-server:\n{expected}\nkvtwin store:\n{got}",
            line + 1
        );
    }
    assert_eq!(got, expected);
}

/// The raw replies of `port` to `commands` (inline, one a line) sent after HELLO 3,
/// whose own reply (the server's name, version and the connection's id) is read and
/// left out; and that reply.
fn resp3(port: u16, commands: &str) -> (Vec<u8>, String) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    stream.write_all(b"HELLO 3\r\n").unwrap();
    let mut hello = Vec::new();
    let mut chunk = [0u8; 4096];
    // The map comes in one piece or a few; the server says nothing more until asked.
    while let Ok(n @ 1..) = stream.read(&mut chunk) {
        hello.extend_from_slice(&chunk[..n]);
    }
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(commands.as_bytes()).unwrap();
    stream.write_all(b"QUIT\r\n").unwrap();
    let mut replies = Vec::new();
    stream.read_to_end(&mut replies).unwrap();
    (replies, String::from_utf8_lossy(&hello).into_owned())
}

const RESP3_SCRIPT: &str = "SET k1 v1\r\nGET k1\r\nGET missing\r\nMSET a 1 b 2\r\n\
MGET a missing b\r\nSET missing2 v XX GET\r\nSET k1 v2 GET\r\nEXISTS a k1 nope\r\n\
DEL a missing\r\nHELLO 2\r\nGET missing\r\n";

#[test]
fn after_hello_3_both_answer_in_resp3() {
    if missing("redis-server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(None);
    let store = kvtwin_store(dir.path(), None);
    let (expected, redis_hello) = resp3(redis.1, RESP3_SCRIPT);
    let (got, store_hello) = resp3(store, RESP3_SCRIPT);
    for hello in [&redis_hello, &store_hello] {
        assert!(hello.starts_with("%7\r\n"), "{hello:?}");
        assert!(hello.contains("$5\r\nproto\r\n:3\r\n"), "{hello:?}");
    }
    // Nil is `_` after HELLO 3; HELLO 2 goes back to `$-1`. (Its own reply, the version
    // and id, differs; the rest is byte for byte.)
    let tail = |replies: &[u8]| {
        let text = String::from_utf8_lossy(replies).into_owned();
        let hello2 = text.find("*14\r\n").expect("HELLO 2's reply");
        let after = text[hello2..].find("$-1\r\n").expect("nil after HELLO 2") + hello2;
        (text[..hello2].to_string(), text[after..].to_string())
    };
    let (expected_head, expected_tail) = tail(&expected);
    assert!(expected_head.contains("_\r\n"), "{expected_head:?}");
    assert_eq!(tail(&got), (expected_head, expected_tail));
}

#[test]
fn with_a_password_both_refuse_until_auth() {
    if missing("redis-server") || missing("redis-cli") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(Some("secret"));
    let store = kvtwin_store(dir.path(), Some("secret"));
    let script = "GET k\nAUTH wrong\nAUTH default wrong\nAUTH someone secret\nAUTH secret\nSET k v\nGET k\nAUTH default secret\n";
    let expected = cli(redis.1, script);
    assert!(expected.contains("NOAUTH"), "{expected}");
    assert_eq!(cli(store, script), expected);
}

/// Values a client sends as bytes: line ends, zeros, a megabyte; every call of the
/// issue's list.
const PYTHON_SCRIPT: &str = r#"
import sys, redis
r = redis.Redis(host="127.0.0.1", port=int(sys.argv[1]))
big = bytes(range(256)) * 4096
print(r.ping())
print(r.set("bin", b"a\r\nb\x00c"), r.get("bin"))
print(r.set("big", big), r.get("big") == big, r.strlen if False else len(r.get("big")))
print(r.exists("bin", "big", "none"))
print(r.mget(["bin", "none", "big"])[0:2])
print(r.set("k", "v", nx=True), r.set("k", "w", nx=True), r.get("k"))
print(r.delete("bin", "none", "k"), r.exists("bin"))
print(r.get("none"))
p = r.pipeline()
for i in range(100):
    p.set(f"p{i}", str(i) * 100)
p.mget([f"p{i}" for i in range(0, 100, 25)])
print(p.execute()[-1])
try:
    r.execute_command("NOSUCH")
except redis.ResponseError as e:
    print("error:", e)
"#;

#[test]
fn the_python_client_sees_what_redis_server_gives() {
    if missing("redis-server") || missing("python3-redis") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let redis = Redis::start(None);
    let store = kvtwin_store(dir.path(), None);
    let run = |port: u16| {
        let output = Command::new(PYTHON)
            .args(["-c", PYTHON_SCRIPT, &port.to_string()])
            .output()
            .expect("python runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let expected = run(redis.1);
    assert!(expected.contains("True b'a\\r\\nb\\x00c'"), "{expected}");
    assert_eq!(run(store), expected);
}
