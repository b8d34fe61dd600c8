//! A `nats-server` child process with JetStream, for tests and benches.
//!
//! Owns: [`NatsServer`]: the binary's path, a loopback port chosen once, a temporary store
//! directory (JetStream data and the server's log) and the child process. The port and
//! the store survive [`NatsServer::restart`], so JetStream data does too, and clients
//! reconnect to the same URL.
//! Never: be used in production (a real deployment runs its own server), outlive its
//! owner (dropping it stops the process), or wait without a bound (readiness and shutdown
//! are both bounded, and a miss is a typed error).

use super::NatsError;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Environment variable naming the `nats-server` binary, tried before `PATH`.
pub const NATS_SERVER_ENV: &str = "KVTWIN_NATS_SERVER";

/// Where Debian installs the server (not on every user's `PATH`).
const DEBIAN_PATH: &str = "/usr/sbin/nats-server";

/// The line nats-server logs once JetStream is up and it accepts clients.
const READY_LINE: &str = "Server is ready";

/// How long a start may take before it is [`NatsError::ServerNotReady`].
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a graceful stop may take before the process is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Ports tried on the first start: another process can take a free port between our
/// probe and the server's bind.
const PORT_TRIES: usize = 3;

/// A `nats-server -js` on a loopback port, stopped on drop. For tests and benches only.
///
/// `start` and `restart` block the calling thread until the server is ready (at most
/// 10 s); from async code that is fine in a multi-threaded runtime, where the clients'
/// tasks keep running meanwhile.
#[derive(Debug)]
pub struct NatsServer {
    binary: PathBuf,
    port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
    /// A configuration file (`-c`), for servers that require credentials or TLS.
    config: Option<PathBuf>,
}

impl NatsServer {
    /// The `nats-server` binary: `$KVTWIN_NATS_SERVER` when set (and only it: a wrong
    /// explicit path is an error, not a reason to run another binary), otherwise the first
    /// on `PATH`, then `/usr/sbin/nats-server`.
    pub fn find_binary() -> Result<PathBuf, NatsError> {
        let candidates = match std::env::var_os(NATS_SERVER_ENV) {
            Some(path) => vec![PathBuf::from(path)],
            None => std::env::var_os("PATH")
                .map(|path| {
                    std::env::split_paths(&path)
                        .map(|dir| dir.join("nats-server"))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default()
                .into_iter()
                .chain([PathBuf::from(DEBIAN_PATH)])
                .collect(),
        };
        first_executable(candidates)
    }

    /// For tests: a started server, or `None` with the reason printed when there is no
    /// `nats-server` binary, unless `KVTWIN_REQUIRE_NATS=1` or `CI=true` (CI installs
    /// one), which make that a panic. A binary that is there but does not start is always
    /// a panic.
    pub fn start_or_skip(test: &str) -> Option<Self> {
        Self::or_skip(test, Self::start())
    }

    /// [`NatsServer::start_secured`], or `None` as [`NatsServer::start_or_skip`] says.
    pub fn start_secured_or_skip(test: &str, config: &str) -> Option<Self> {
        Self::or_skip(test, Self::start_secured(config))
    }

    fn or_skip(test: &str, started: Result<Self, NatsError>) -> Option<Self> {
        match started {
            Ok(server) => Some(server),
            Err(error @ NatsError::ServerNotFound { .. }) => {
                let required = std::env::var("KVTWIN_REQUIRE_NATS").as_deref() == Ok("1")
                    || std::env::var("CI").as_deref() == Ok("true");
                assert!(
                    !required,
                    "{test}: nats-server is required (KVTWIN_REQUIRE_NATS=1 or CI=true): {error}"
                );
                eprintln!("skipping {test}: {error}");
                None
            }
            Err(error) => panic!("{test}: nats-server did not start: {error}"),
        }
    }

    /// Starts a server on a free loopback port with a new store directory, and waits
    /// until it accepts clients.
    pub fn start() -> Result<Self, NatsError> {
        Self::start_with_config(None)
    }

    /// [`NatsServer::start`] with `config` (nats-server's configuration syntax, e.g. an
    /// `authorization { token: ... }` or `tls { ... }` block) as its configuration file;
    /// the port, store and JetStream flags still come from the command line.
    pub fn start_secured(config: &str) -> Result<Self, NatsError> {
        Self::start_with_config(Some(config))
    }

    fn start_with_config(config: Option<&str>) -> Result<Self, NatsError> {
        let binary = Self::find_binary()?;
        let store = tempfile::Builder::new()
            .prefix("kvtwin-nats-")
            .tempdir()
            .map_err(|source| NatsError::ServerSetup {
                what: "store directory",
                source,
            })?;
        let config = match config {
            Some(text) => {
                let path = store.path().join("server.conf");
                std::fs::write(&path, text).map_err(|source| NatsError::ServerSetup {
                    what: "configuration file",
                    source,
                })?;
                Some(path)
            }
            None => None,
        };
        let mut server = Self {
            binary,
            port: free_port()?,
            store,
            child: None,
            config,
        };
        let mut tries = 1;
        loop {
            match server.spawn() {
                Ok(()) => return Ok(server),
                // Most likely the port was taken meanwhile: try another one.
                Err(NatsError::ServerExited { .. }) if tries < PORT_TRIES => {
                    tries += 1;
                    server.port = free_port()?;
                }
                Err(error) => return Err(error),
            }
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The loopback port, the same across restarts.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The running process's id, or `None` when stopped.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The store directory (`-sd`): JetStream data lives in its `jetstream/`.
    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// The server's log (all runs, appended).
    pub fn log_path(&self) -> PathBuf {
        self.store.path().join("nats-server.log")
    }

    /// Stops the server gracefully (SIGTERM, so JetStream flushes its files), killing it
    /// if it has not exited within 5 s, and reaps it. Stopping a stopped server does
    /// nothing.
    pub fn stop(&mut self) -> Result<(), NatsError> {
        self.terminate(libc::SIGTERM)
    }

    /// Kills the server at once (SIGKILL), as a crash would, and reaps it. JetStream data
    /// acknowledged just before may not have reached its files.
    pub fn kill(&mut self) -> Result<(), NatsError> {
        self.terminate(libc::SIGKILL)
    }

    /// Stops the server (if running) and starts it again on the same port with the same
    /// store, waiting until it accepts clients.
    pub fn restart(&mut self) -> Result<(), NatsError> {
        self.stop()?;
        self.spawn()
    }

    /// Starts the process and waits for its ready line (JetStream recovered, listening)
    /// and for the port to accept a connection.
    fn spawn(&mut self) -> Result<(), NatsError> {
        let log_path = self.log_path();
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(&log_path)
            .map_err(|source| NatsError::ServerSetup {
                what: "log file",
                source,
            })?;
        // Only this run's lines count when looking for the ready line.
        let log_start = log
            .seek(SeekFrom::End(0))
            .map_err(|source| NatsError::ServerSetup {
                what: "log file",
                source,
            })?;
        let stderr = log.try_clone().map_err(|source| NatsError::ServerSetup {
            what: "log file",
            source,
        })?;
        let mut command = Command::new(&self.binary);
        if let Some(config) = &self.config {
            command.arg("-c").arg(config);
        }
        let child = command
            .args(["-a", "127.0.0.1", "-p"])
            .arg(self.port.to_string())
            .arg("-js")
            .arg("-sd")
            .arg(self.store.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|source| NatsError::ServerProcess {
                op: "spawn",
                source,
            })?;
        self.child = Some(child);
        let started = Instant::now();
        loop {
            if let Some(status) = self.try_wait()? {
                self.child = None;
                return Err(NatsError::ServerExited {
                    status,
                    log: log_tail(&log_path, 8),
                });
            }
            if log_contains(&log_path, log_start, READY_LINE)
                && TcpStream::connect_timeout(
                    &(Ipv4Addr::LOCALHOST, self.port).into(),
                    Duration::from_millis(200),
                )
                .is_ok()
            {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                // Leave nothing running behind the error.
                let _ = self.kill();
                return Err(NatsError::ServerNotReady {
                    port: self.port,
                    waited: READY_TIMEOUT,
                    log: log_tail(&log_path, 8),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The child's exit status if it has exited.
    fn try_wait(&mut self) -> Result<Option<std::process::ExitStatus>, NatsError> {
        match self.child.as_mut() {
            Some(child) => child
                .try_wait()
                .map_err(|source| NatsError::ServerProcess { op: "wait", source }),
            None => Ok(None),
        }
    }

    /// Sends `signal`, waits (bounded) for the exit, escalating to SIGKILL, and reaps.
    fn terminate(&mut self, signal: libc::c_int) -> Result<(), NatsError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        if child
            .try_wait()
            .map_err(|source| NatsError::ServerProcess { op: "wait", source })?
            .is_some()
        {
            return Ok(());
        }
        let pid = libc::pid_t::try_from(child.id()).map_err(|_| NatsError::ServerProcess {
            op: "signal",
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
        // SAFETY: kill(2) on our own child, which is not reaped yet (we hold its `Child`
        // and only reap below), so the pid cannot have been reused.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(NatsError::ServerProcess {
                op: "signal",
                source: std::io::Error::last_os_error(),
            });
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return Ok(()),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => {
                    // It ignored SIGTERM for too long: kill and reap it.
                    child.kill().map_err(|source| NatsError::ServerProcess {
                        op: "signal",
                        source,
                    })?;
                    child
                        .wait()
                        .map_err(|source| NatsError::ServerProcess { op: "wait", source })?;
                    return Ok(());
                }
                Err(source) => return Err(NatsError::ServerProcess { op: "wait", source }),
            }
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        // A test that panicked must not leave a server running; a graceful stop is not
        // needed, the store is deleted next.
        let _ = self.kill();
    }
}

/// A port that was free on 127.0.0.1 a moment ago.
fn free_port() -> Result<u16, NatsError> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|source| NatsError::ServerSetup {
            what: "free port",
            source,
        })?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|source| NatsError::ServerSetup {
            what: "free port",
            source,
        })
}

/// The first of `candidates` that is an executable file.
fn first_executable(candidates: Vec<PathBuf>) -> Result<PathBuf, NatsError> {
    match candidates.iter().position(|path| is_executable(path)) {
        Some(index) => Ok(candidates[index].clone()),
        None => Err(NatsError::ServerNotFound {
            searched: candidates,
        }),
    }
}

/// Whether `path` is a regular file someone may execute.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

/// Whether the log from byte `start` on contains `needle`.
fn log_contains(path: &Path, start: u64, needle: &str) -> bool {
    let Ok(mut file) = File::open(path) else {
        return false;
    };
    let mut text = String::new();
    file.seek(SeekFrom::Start(start))
        .and_then(|_| file.read_to_string(&mut text))
        .is_ok()
        && text.contains(needle)
}

/// The last `count` lines of a log file, for error messages (empty if unreadable).
pub(crate) fn log_tail(path: &Path, count: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_is_a_typed_error_naming_where_it_looked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let not_executable = dir.path().join("nats-server");
        std::fs::write(&not_executable, b"#!/bin/sh\n").expect("write");
        let candidates = vec![dir.path().join("absent/nats-server"), not_executable];
        match first_executable(candidates.clone()) {
            Err(NatsError::ServerNotFound { searched }) => assert_eq!(searched, candidates),
            other => panic!("expected ServerNotFound, got {other:?}"),
        }
    }

    #[test]
    fn the_first_executable_candidate_wins() {
        let candidates = vec![
            PathBuf::from("/nonexistent/nats-server"),
            PathBuf::from("/bin/sh"),
        ];
        assert_eq!(
            first_executable(candidates).ok(),
            Some(PathBuf::from("/bin/sh"))
        );
    }
}
