//! Where the relay bench's CPU goes: per thread of this process and per child process,
//! from `/proc` (Linux; empty elsewhere), and the runtimes whose threads are told apart.
//!
//! Owns: `CpuSnapshot`, `thread_cpu_time`, `RuntimeThreads` and `runtime`.
//! Never: decide what a thread group is called (the runner labels them).

use super::RelayBenchError;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// CPU time of the calling thread (zero where the clock is not available).
pub(super) fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The kernel's id of the calling thread (what `/proc/self/task` lists).
fn thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// CPU time per thread of this process (by id, with its name) and of `pid`s.
#[derive(Clone, Debug, Default)]
pub(super) struct CpuSnapshot {
    pub(super) threads: BTreeMap<u64, (String, Duration)>,
    processes: BTreeMap<u32, Duration>,
}

/// utime + stime of a `/proc/.../stat` line, and the name in parentheses.
fn parse_stat(text: &str, tick: Duration) -> Option<(String, Duration)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    // After ")": state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, tick * u32::try_from(utime + stime).ok()?))
}

impl CpuSnapshot {
    pub(super) fn take(pids: &[u32]) -> Self {
        // SAFETY: sysconf only reads a configuration value.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let tick = Duration::from_secs(1) / u32::try_from(ticks.max(1)).unwrap_or(100);
        let mut snapshot = Self::default();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                if let Some(entry) = std::fs::read_to_string(task.path().join("stat"))
                    .ok()
                    .and_then(|text| parse_stat(&text, tick))
                {
                    snapshot.threads.insert(tid, entry);
                }
            }
        }
        for &pid in pids {
            if let Some((_, time)) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|text| parse_stat(&text, tick))
            {
                snapshot.processes.insert(pid, time);
            }
        }
        snapshot
    }

    /// CPU used since `before` by thread group (`label` of a thread's id and name) and
    /// process, with `extra` added, largest first.
    pub(super) fn since(
        &self,
        before: &CpuSnapshot,
        label: impl Fn(u64, &str) -> String,
        process_names: &[(u32, &str)],
        extra: &[(&str, Duration)],
    ) -> Vec<(String, Duration)> {
        let mut groups: BTreeMap<String, Duration> = BTreeMap::new();
        for (tid, (name, time)) in &self.threads {
            let earlier = before.threads.get(tid).map_or(Duration::ZERO, |(_, t)| *t);
            *groups.entry(label(*tid, name)).or_default() += time.saturating_sub(earlier);
        }
        for &(pid, name) in process_names {
            if let (Some(now), Some(earlier)) =
                (self.processes.get(&pid), before.processes.get(&pid))
            {
                *groups.entry(name.to_string()).or_default() += now.saturating_sub(*earlier);
            }
        }
        for &(name, time) in extra {
            *groups.entry(name.to_string()).or_default() += time;
        }
        let mut groups: Vec<(String, Duration)> = groups
            .into_iter()
            .filter(|(_, time)| !time.is_zero())
            .collect();
        groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        groups
    }
}

/// The runtime worker threads by kernel id, so that the CPU of a runtime's own threads
/// is told from that of the ZMQ I/O threads its tasks started (which inherit its name).
pub(super) type RuntimeThreads = Arc<Mutex<BTreeMap<u64, &'static str>>>;

/// A runtime of one worker thread named `name`.
pub(super) fn runtime(
    name: &'static str,
    threads: &RuntimeThreads,
) -> Result<tokio::runtime::Runtime, RelayBenchError> {
    let threads = threads.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .on_thread_start(move || {
            threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(thread_id(), name);
        })
        .enable_all()
        .build()
        .map_err(|source| RelayBenchError::Spawn { what: name, source })
}

/// Sleeps until `deadline` (a no-op once it has passed).
pub(super) fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_lines_give_the_name_and_cpu_time() {
        let line = "4242 (relay (rt) 1) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(
            parse_stat(line, Duration::from_millis(10)),
            Some(("relay (rt) 1".to_string(), Duration::from_secs(2)))
        );
        assert_eq!(parse_stat("garbage", Duration::from_millis(10)), None);
    }
}
