//! Logs of the long-running commands (`kvtwin router`, `kvtwin relay`): `tracing` events on
//! stderr, filtered by `RUST_LOG` (default `info`; the soak's own process keeps
//! async-nats's per-connection lines out), as text or as one JSON object a line
//! for a log pipeline (`--log-format json`).
//!
//! Owns: [`LogFormat`] and [`init`].
//! Never: log a secret (tokens and passwords are never passed to a log call), or install
//! itself for the commands whose stderr is a report or a terminal UI.

use anyhow::{anyhow, Result};
use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// One human-readable line per event.
    #[default]
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`).
    Json,
}

/// The filter of the router and the relay when `RUST_LOG` is not set.
pub(crate) const SERVICE_DEFAULT: &str = "info";

/// Installs the process's subscriber: `RUST_LOG` when set and valid (an invalid one is an
/// error naming it), `default_directives` otherwise.
pub(crate) fn init(format: LogFormat, default_directives: &str) -> Result<()> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => EnvFilter::try_new(&directives)
            .map_err(|error| anyhow!("RUST_LOG={directives}: {error}"))?,
        _ => EnvFilter::new(default_directives),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    installed.map_err(|error| anyhow!("installing the log subscriber: {error}"))
}
