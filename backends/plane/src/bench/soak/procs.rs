//! The soak's child processes: `kvtwin relay` and `kvtwin router` started from the
//! soak's own executable, killed with `SIGKILL` and reaped, and what they report.
//!
//! Owns: `Child` (one process: its log file, its start, the relay's latest stats line
//! read from its stdout by a thread), `rss_kib` (`VmRSS` from `/proc/PID/status`) and
//! `log_tail`.
//! Invariant: a `Child` that is dropped kills and reaps its process; each runs in a
//! process group of its own and gets `SIGKILL` if the thread that started it ends
//! (`PR_SET_PDEATHSIG`, Linux).
//! Never: signal a process it did not start, or by name.

use super::SoakError;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// One child process.
pub(super) struct Child {
    /// What it is, for messages ("router", "relay-2").
    pub(super) name: String,
    child: std::process::Child,
    log: PathBuf,
    /// The last JSON line it printed on stdout (a relay's stats), if any.
    last_line: Arc<Mutex<Option<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Child {
    /// Starts `exe args`, stderr appended to `log`, stdout read line by line (the last
    /// JSON object kept).
    pub(super) fn spawn(
        name: &str,
        exe: &Path,
        args: &[String],
        log: PathBuf,
    ) -> Result<Self, SoakError> {
        let io = |what: &str| {
            let what = format!("{what} for {name}");
            move |source| SoakError::Io { what, source }
        };
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io("open the log"))?;
        let mut command = Command::new(exe);
        command
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            // The user's token must not change what the soak's router wants.
            .env_remove("KVTWIN_AUTH_TOKEN")
            // The soak reads the router's address from its `info` start-up line, whatever
            // the user's RUST_LOG says for the soak itself.
            .env("RUST_LOG", "info")
            // An error's message, not a backtrace, ends the log the soak quotes.
            .env("RUST_LIB_BACKTRACE", "0")
            // A Ctrl-C at the terminal reaches the soak alone; it stops the children.
            .process_group(0);
        // SAFETY: prctl(2) with constant arguments is async-signal-safe, which is all a
        // pre_exec closure may do between fork and exec.
        unsafe {
            command.pre_exec(|| {
                #[cfg(target_os = "linux")]
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().map_err(io("start"))?;
        let last_line = Arc::new(Mutex::new(None));
        let reader = child.stdout.take().map(|stdout| {
            let last_line = last_line.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Ok(value) = serde_json::from_str::<Value>(&line) {
                        *last_line.lock().unwrap_or_else(PoisonError::into_inner) = Some(value);
                    }
                }
            })
        });
        Ok(Self {
            name: name.to_string(),
            child,
            log,
            last_line,
            reader,
        })
    }

    /// Its process id.
    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log file.
    pub(super) fn log(&self) -> &Path {
        &self.log
    }

    /// `Err` if it has exited on its own.
    pub(super) fn check_alive(&mut self) -> Result<(), SoakError> {
        match self.child.try_wait() {
            Ok(Some(status)) => Err(SoakError::Exited {
                process: self.name.clone(),
                status,
                log: log_tail(&self.log),
            }),
            Ok(None) => Ok(()),
            Err(source) => Err(SoakError::Io {
                what: format!("wait for {}", self.name),
                source,
            }),
        }
    }

    /// The last JSON line it printed, once its stdout is closed (after an exit) or as of
    /// now.
    pub(super) fn last_line(&self) -> Option<Value> {
        self.last_line
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `kill -9`, reaped; the stdout reader drained. What it printed last.
    pub(super) fn kill(mut self) -> Option<Value> {
        self.signal_and_reap(libc::SIGKILL, Duration::ZERO);
        self.finish()
    }

    /// SIGTERM, waiting up to `grace` for a clean exit (then SIGKILL), reaped; what it
    /// printed last (a relay's final stats).
    pub(super) fn stop(mut self, grace: Duration) -> Option<Value> {
        self.signal_and_reap(libc::SIGTERM, grace);
        self.finish()
    }

    fn finish(mut self) -> Option<Value> {
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        self.last_line()
    }

    fn signal_and_reap(&mut self, signal: libc::c_int, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, not yet reaped (we hold its `Child` and
            // reap it only below), so the pid cannot have been reused.
            unsafe {
                libc::kill(pid, signal);
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.signal_and_reap(libc::SIGKILL, Duration::ZERO);
    }
}

/// A process's resident set in KiB (`VmRSS`), or `None` if it cannot be read (gone, or
/// not Linux).
pub(super) fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

/// The last lines of a child's log file, for error messages.
pub(super) fn log_tail(path: &Path) -> String {
    crate::nats::log_tail(path, 12)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_from_proc_and_a_missing_process_is_none() {
        if cfg!(target_os = "linux") {
            assert!(rss_kib(std::process::id()).is_some_and(|kib| kib > 0));
        }
        assert_eq!(rss_kib(u32::MAX), None);
    }

    #[test]
    fn a_child_is_killed_and_reaped_and_its_last_json_line_kept() {
        let dir = tempfile::tempdir().unwrap();
        let script = "echo '{\"events\": 1}'; echo '{\"events\": 2}'; echo not-json; exec sleep 30";
        let child = Child::spawn(
            "sleeper",
            Path::new("/bin/sh"),
            &["-c".to_string(), script.to_string()],
            dir.path().join("sleeper.log"),
        )
        .unwrap();
        let pid = child.pid();
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.last_line() != Some(serde_json::json!({"events": 2}))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let last = child.kill();
        assert_eq!(last, Some(serde_json::json!({"events": 2})));
        assert_eq!(rss_kib(pid), None, "reaped");
    }
}
