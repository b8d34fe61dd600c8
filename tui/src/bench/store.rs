//! `kvtwin bench store`: a `kvtwin store` (this binary, as a child process on a free
//! loopback port, its disk tier in a directory of its own) under concurrent SETs and
//! GETs from `--clients` connections for `--seconds`, over twice as many bytes of values
//! as its DRAM holds, so that values move to disk and back all the time.
//!
//! Every value says which key and which write it is and ends in the BLAKE3 of the rest,
//! so a client checks every value it reads: one that is not whole, or is another key's,
//! is a torn read, counted (the store must never serve one). The store's RSS
//! (`/proc/PID/status`) is sampled every 100 ms, and its allocated part (`RssAnon`, the
//! RSS without the program's own pages) held against its bound: what it had allocated
//! idle before the load, plus DRAM's bound, plus the free pages its value pool keeps
//! (`kvtwin_store::pages::SPARE_PAGES`), plus four values a client (the request in its
//! read buffer, which grows by doubling to two, the reply being written from a copy
//! DRAM may have let go meanwhile, and a value read off a lower tier). The store's own
//! counters (evictions, leases, promotions, demotions, corrupt values) are read from its
//! INFO at the end.
//! `--disk` smaller than the values makes the store evict; `--object` adds an object
//! tier below the disk. One JSON line on stdout, a table on stderr.
//!
//! `--kill` then checks what a crash keeps. The clients stop; every key is read (each
//! value checked) and asked its tier (KVTWIN.TIER): those on disk or in the object tier
//! are the durable set, with their values. The clients run again on the other keys only
//! (DRAM's), and a second into that the store is killed with SIGKILL, under their load,
//! and started again on the same directories. Every durable key must come back with
//! exactly its value; no key may come back torn or another's. DRAM's keys may be lost:
//! the store never promised them.
//!
//! Owns: the flags, the clients, the checks and the report. Never: the store's logic.

use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin_store::resp::Reply;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Args, Debug)]
pub(crate) struct StoreBenchArgs {
    /// How long the clients run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Concurrent connections, each a closed loop of SETs and GETs.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// The store's DRAM tier.
    #[arg(long, value_name = "SIZE", default_value = "64MiB", value_parser = crate::cmd::store::parse_size)]
    memory: u64,
    /// Bytes of each value.
    #[arg(long, value_name = "SIZE", default_value = "256KiB", value_parser = crate::cmd::store::parse_size)]
    value_bytes: u64,
    /// Seeds the clients' choices.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The store's disk tier (default: room for every value, so nothing leaves the
    /// store; smaller, it evicts).
    #[arg(long, value_name = "SIZE", value_parser = crate::cmd::store::parse_size)]
    disk: Option<u64>,
    /// An object tier below the disk, in a directory of the bench's own (default: none).
    #[arg(long, value_name = "SIZE", value_parser = crate::cmd::store::parse_size)]
    object: Option<u64>,
    /// Then kill the store with SIGKILL under load, start it again, and check that every
    /// value on disk or in the object tier came back (see the module docs).
    #[arg(long)]
    kill: bool,
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    sets: AtomicU64,
    gets: AtomicU64,
    hits: AtomicU64,
    torn: AtomicU64,
    errors: AtomicU64,
}

/// A value of `len` bytes for write `version` of key `key`: both ids, bytes drawn from
/// them, then the BLAKE3 of everything before it.
fn value_of(key: u64, version: u64, len: usize) -> Vec<u8> {
    let len = len.max(48);
    let mut value = Vec::with_capacity(len);
    value.extend_from_slice(&key.to_le_bytes());
    value.extend_from_slice(&version.to_le_bytes());
    let mut draw = ChaCha8Rng::seed_from_u64(key.rotate_left(32) ^ version);
    value.resize(len - 32, 0);
    draw.fill(&mut value[16..]);
    let digest = blake3::hash(&value);
    value.extend_from_slice(digest.as_bytes());
    value
}

/// Whether `value` is whole and `key`'s.
fn checks(key: u64, value: &[u8]) -> bool {
    if value.len() < 48 {
        return false;
    }
    let (body, digest) = value.split_at(value.len() - 32);
    blake3::hash(body).as_bytes() == digest && body[..8] == key.to_le_bytes()
}

/// A request as clients frame one: an array of bulk strings (the store's own encoder).
fn command(args: &[&[u8]]) -> bytes::BytesMut {
    let mut out = bytes::BytesMut::new();
    Reply::Array(
        args.iter()
            .map(|arg| Reply::bulk(bytes::Bytes::copy_from_slice(arg)))
            .collect(),
    )
    .encode(&mut out);
    out
}

/// Reads one reply: a bulk string's bytes (`None` for nil), or the line of a simple
/// reply as bytes.
async fn reply(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>> {
    loop {
        if let Some(end) = buf.windows(2).position(|w| w == b"\r\n") {
            let line = buf[..end].to_vec();
            match line.first() {
                Some(b'$') => {
                    let len: i64 = std::str::from_utf8(&line[1..])?.parse()?;
                    if len < 0 {
                        buf.drain(..end + 2);
                        return Ok(None);
                    }
                    let need = end + 2 + len as usize + 2;
                    while buf.len() < need {
                        if stream.read_buf(buf).await? == 0 {
                            bail!("the store closed the connection");
                        }
                    }
                    let value = buf[end + 2..end + 2 + len as usize].to_vec();
                    buf.drain(..need);
                    return Ok(Some(value));
                }
                Some(b'-') => bail!("{}", String::from_utf8_lossy(&line)),
                _ => {
                    buf.drain(..end + 2);
                    return Ok(Some(line));
                }
            }
        }
        if stream.read_buf(buf).await? == 0 {
            bail!("the store closed the connection");
        }
    }
}

async fn client(
    address: String,
    keys: Arc<Vec<u64>>,
    value_bytes: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Result<()> {
    let mut stream = TcpStream::connect(&address).await?;
    let mut draw = ChaCha8Rng::seed_from_u64(seed);
    let mut buf = Vec::new();
    let mut version = 0u64;
    while !stop.load(Ordering::Relaxed) && !keys.is_empty() {
        let key = keys[draw.gen_range(0..keys.len())];
        let name = format!("bench:{key}");
        if draw.gen_bool(0.5) {
            version += 1;
            let value = value_of(key, (seed << 32) | version, value_bytes);
            stream
                .write_all(&command(&[b"SET", name.as_bytes(), &value]))
                .await?;
            match reply(&mut stream, &mut buf).await {
                Ok(_) => tally.sets.fetch_add(1, Ordering::Relaxed),
                Err(_) => tally.errors.fetch_add(1, Ordering::Relaxed),
            };
        } else {
            stream
                .write_all(&command(&[b"GET", name.as_bytes()]))
                .await?;
            tally.gets.fetch_add(1, Ordering::Relaxed);
            match reply(&mut stream, &mut buf).await? {
                None => {}
                Some(value) if checks(key, &value) => {
                    tally.hits.fetch_add(1, Ordering::Relaxed);
                }
                Some(_) => {
                    tally.torn.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
    Ok(())
}

/// Process `pid`'s resident memory, bytes: all of it (`VmRSS`) and its anonymous part
/// (`RssAnon`: what it allocated, without the pages of its program's file).
fn rss_bytes(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |field: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(field))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    Some((kib("VmRSS:")?, kib("RssAnon:")?))
}

/// A `kvtwin store` child on a free port with its tiers in `dir`; its address.
fn start_store(args: &StoreBenchArgs, dir: &Path, disk: u64) -> Result<(Child, String)> {
    let exe = std::env::current_exe().context("this binary's path")?;
    let mut command = Command::new(exe);
    command
        .args(["store", "--listen", "127.0.0.1:0", "--memory"])
        .arg(args.memory.to_string())
        .arg("--disk-dir")
        .arg(dir.join("disk"))
        .args(["--disk", &disk.to_string(), "--max-value"])
        .arg((args.value_bytes + 4096).to_string());
    if let Some(object) = args.object {
        command
            .arg("--object-dir")
            .arg(dir.join("object"))
            .args(["--object", &object.to_string()]);
    }
    let mut store = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting kvtwin store")?;
    let stderr = store.stderr.take().context("the store's stderr")?;
    let mut lines = BufReader::new(stderr).lines();
    let address = loop {
        let Some(line) = lines.next() else {
            let _ = store.kill();
            bail!("kvtwin store exited before it listened");
        };
        let line = line?;
        if let Some(rest) = line.split("listening on redis://").nth(1) {
            break rest
                .split(|c: char| c == ';' || c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_string();
        }
    };
    // Keep draining its log so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((store, address))
}

/// The clients on `keys` until `stop`; the errors of those that stopped early counted.
fn spawn_clients(
    args: &StoreBenchArgs,
    address: &str,
    keys: &Arc<Vec<u64>>,
    round: u64,
    stop: &Arc<AtomicBool>,
    tally: &Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<Result<()>>> {
    (0..args.clients)
        .map(|i| {
            tokio::spawn(client(
                address.to_string(),
                keys.clone(),
                args.value_bytes as usize,
                args.seed.wrapping_mul(1000) + round * 100 + i as u64 + 1,
                stop.clone(),
                tally.clone(),
            ))
        })
        .collect()
}

/// One command on a fresh connection: its reply.
async fn ask(address: &str, args: &[&[u8]]) -> Result<Option<Vec<u8>>> {
    let mut stream = TcpStream::connect(address).await?;
    stream.write_all(&command(args)).await?;
    reply(&mut stream, &mut Vec::new()).await
}

/// What `--kill` found.
#[derive(Default)]
struct Crash {
    /// Keys on disk or in the object tier before the kill.
    durable: usize,
    /// Of those, keys that came back without their value (or with another).
    durable_lost: usize,
    /// Keys in DRAM (or nowhere) before the kill, written to under load as it came.
    volatile: usize,
    /// Keys held after the restart, and those served torn or another key's.
    held_after: usize,
    torn_after: usize,
    /// Requests the kill cut short (in flight when it came), and reads under the load
    /// before it.
    cut_requests: u64,
    reads_before_kill: u64,
}

/// `--kill`: the durable set, the kill under load on the others, the restart and the
/// check (see the module docs). Returns the restarted store and what was found.
async fn crash(
    args: &StoreBenchArgs,
    dir: &Path,
    disk: u64,
    store: &mut Child,
    address: &str,
    keys: u64,
    tally: &Arc<Tally>,
) -> Result<(Child, Crash)> {
    let mut found = Crash::default();
    let mut durable = Vec::new();
    let mut volatile = Vec::new();
    let mut values = Vec::new();
    for key in 0..keys {
        let name = format!("bench:{key}");
        let value = ask(address, &[b"GET", name.as_bytes()]).await?;
        if value.as_ref().is_some_and(|v| !checks(key, v)) {
            tally.torn.fetch_add(1, Ordering::Relaxed);
        }
        values.push(value);
    }
    // After every read: a read moves a value up to DRAM, so tiers are asked last.
    for key in 0..keys {
        let name = format!("bench:{key}");
        let tier = ask(address, &[b"KVTWIN.TIER", name.as_bytes()]).await?;
        match tier.as_deref() {
            Some(b"disk" | b"object") if values[key as usize].is_some() => durable.push(key),
            _ => volatile.push(key),
        }
    }
    found.durable = durable.len();
    found.volatile = volatile.len();
    let stop = Arc::new(AtomicBool::new(false));
    // A tally of its own: the requests the kill cuts short are the crash, not errors of
    // the load; a torn read under it still counts with the others.
    let under_kill = Arc::new(Tally::default());
    let clients = spawn_clients(args, address, &Arc::new(volatile), 1, &stop, &under_kill);
    tokio::time::sleep(Duration::from_secs(1)).await;
    store.kill().context("SIGKILL to the store")?;
    let _ = store.wait();
    stop.store(true, Ordering::Relaxed);
    // The clients lose their connections: that is the crash, not an error of the store.
    let mut cut = under_kill.errors.load(Ordering::Relaxed);
    for client in clients {
        if let Ok(Err(_)) = client.await {
            cut += 1;
        }
    }
    found.cut_requests = cut;
    found.reads_before_kill = under_kill.gets.load(Ordering::Relaxed);
    tally
        .torn
        .fetch_add(under_kill.torn.load(Ordering::Relaxed), Ordering::Relaxed);
    let (restarted, address) = start_store(args, dir, disk)?;
    for key in 0..keys {
        let name = format!("bench:{key}");
        let value = ask(&address, &[b"GET", name.as_bytes()]).await?;
        if let Some(value) = &value {
            found.held_after += 1;
            if !checks(key, value) {
                found.torn_after += 1;
            }
        }
        if durable.binary_search(&key).is_ok() && value != values[key as usize] {
            found.durable_lost += 1;
        }
    }
    Ok((restarted, found))
}

/// `kvtwin bench store`.
pub(crate) fn run(args: &StoreBenchArgs) -> Result<()> {
    if args.clients == 0 || args.value_bytes < 48 {
        bail!("--clients must be at least 1 and --value-bytes at least 48");
    }
    let dir = std::env::temp_dir().join(format!("kvtwin-bench-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // Twice DRAM in values, and by default a disk that holds them all.
    let keys = (2 * args.memory / args.value_bytes).max(1);
    let disk = args.disk.unwrap_or(4 * args.memory + (64 << 20));
    let room = disk + args.object.unwrap_or(0);
    // Records carry a header and the key beside the value.
    if args.kill && room < keys * (args.value_bytes + 4096) {
        bail!(
            "--kill needs a disk and object tier that hold every value ({} keys of {} bytes): \
             what they evicted would count as lost",
            keys,
            args.value_bytes
        );
    }
    let (mut store, address) = start_store(args, &dir, disk)?;
    let pid = store.id();
    let (idle_rss, idle_anon) = rss_bytes(pid).unwrap_or_default();
    let anon_bound = idle_anon
        + args.memory
        + (kvtwin_store::pages::SPARE_PAGES * kvtwin_store::pages::PAGE) as u64
        + 4 * args.clients as u64 * args.value_bytes;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let all_keys = Arc::new((0..keys).collect::<Vec<u64>>());
    let outcome = runtime.block_on(async {
        let clients = spawn_clients(args, &address, &all_keys, 0, &stop, &tally);
        let (mut max_rss, mut max_anon) = (0u64, 0u64);
        while started.elapsed() < Duration::from_secs(args.seconds) {
            let (rss, anon) = rss_bytes(pid).unwrap_or_default();
            (max_rss, max_anon) = (max_rss.max(rss), max_anon.max(anon));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let elapsed = started.elapsed().as_secs_f64();
        for client in clients {
            if let Ok(Err(error)) = client.await {
                eprintln!("kvtwin bench store: a client stopped: {error:#}");
                tally.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        let info = ask(&address, &[b"INFO"]).await?.unwrap_or_default();
        let info = String::from_utf8_lossy(&info).into_owned();
        let crashed = if args.kill {
            let (restarted, found) =
                crash(args, &dir, disk, &mut store, &address, keys, &tally).await?;
            store = restarted;
            Some(found)
        } else {
            None
        };
        anyhow::Ok(((max_rss, max_anon), info, crashed, elapsed))
    });
    let _ = store.kill();
    let _ = store.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let ((max_rss, max_anon), info, crashed, elapsed) = outcome?;
    let field = |name: &str| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}:")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let mut report = json!({
        "seconds": elapsed,
        "clients": args.clients,
        "memory_bytes": args.memory,
        "disk_bytes": disk,
        "object_bytes": args.object.unwrap_or(0),
        "value_bytes": args.value_bytes,
        "keys": keys,
        "sets": load(&tally.sets),
        "gets": load(&tally.gets),
        "hits": load(&tally.hits),
        "torn_reads": load(&tally.torn),
        "errors": load(&tally.errors),
        "ops_per_s": (load(&tally.sets) + load(&tally.gets)) as f64 / elapsed,
        "max_rss_bytes": max_rss,
        "idle_rss_bytes": idle_rss,
        "max_anon_bytes": max_anon,
        "idle_anon_bytes": idle_anon,
        "anon_bound_bytes": anon_bound,
        "anon_within_bound": max_anon <= anon_bound,
        "evicted_keys": field("evicted_keys"),
        "leases": field("leases_total"),
        "promotions": field("promotions"),
        "demotions": field("demotions"),
        "corrupt_values": field("corrupt_values"),
        "store_info": info,
    });
    eprintln!(
        "kvtwin bench store: {} clients for {elapsed:.0} s over {keys} keys of {} bytes ({:.1}x DRAM): {} SETs, {} GETs ({} hits), {:.0} ops/s; torn reads {}, errors {}; max RSS {:.1} MiB (idle {:.1}) against {:.1} MiB of DRAM, of which allocated {:.1} MiB ({} of {:.1} MiB); evicted {}, leases {}, promotions {}, demotions {}, corrupt {}",
        args.clients,
        args.value_bytes,
        (keys * args.value_bytes) as f64 / args.memory as f64,
        load(&tally.sets),
        load(&tally.gets),
        load(&tally.hits),
        report["ops_per_s"].as_f64().unwrap_or(0.0),
        load(&tally.torn),
        load(&tally.errors),
        max_rss as f64 / (1u64 << 20) as f64,
        idle_rss as f64 / (1u64 << 20) as f64,
        args.memory as f64 / (1u64 << 20) as f64,
        max_anon as f64 / (1u64 << 20) as f64,
        if max_anon <= anon_bound { "within its bound" } else { "OVER its bound" },
        anon_bound as f64 / (1u64 << 20) as f64,
        field("evicted_keys"),
        field("leases_total"),
        field("promotions"),
        field("demotions"),
        field("corrupt_values"),
    );
    if let Some(found) = &crashed {
        report["kill"] = json!({
            "durable_keys": found.durable,
            "durable_lost": found.durable_lost,
            "volatile_keys": found.volatile,
            "held_after_restart": found.held_after,
            "torn_after_restart": found.torn_after,
            "requests_cut_by_the_kill": found.cut_requests,
            "reads_under_load_before_it": found.reads_before_kill,
        });
        eprintln!(
            "kvtwin bench store: SIGKILL under load on DRAM's {} keys: of the {} on disk or in the object tier, {} lost; {} keys held after the restart, {} torn",
            found.volatile, found.durable, found.durable_lost, found.held_after, found.torn_after
        );
    }
    println!("{report}");
    if load(&tally.torn) > 0 {
        bail!("the store served {} torn value(s)", load(&tally.torn));
    }
    if let Some(found) = crashed {
        if found.durable_lost > 0 || found.torn_after > 0 {
            bail!(
                "after SIGKILL: {} value(s) on disk or in the object tier lost, {} torn",
                found.durable_lost,
                found.torn_after
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{checks, value_of};

    #[test]
    fn a_value_checks_only_whole_and_under_its_own_key() {
        let value = value_of(7, 3, 1000);
        assert_eq!(value.len(), 1000);
        assert!(checks(7, &value));
        assert!(!checks(8, &value), "another key's value");
        let mut flipped = value.clone();
        flipped[500] ^= 1;
        assert!(!checks(7, &flipped));
        assert!(!checks(7, &value[..999]));
        assert_ne!(value_of(7, 4, 1000), value, "each write its own bytes");
    }
}
