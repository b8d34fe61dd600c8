//! `--trace-mismatch`: what a command does with a Mooncake trace row whose `input_length`
//! and `hash_ids` disagree, on the command line (the scenario's `mismatch` otherwise).
//!
//! Owns: [`MismatchArg`], the check a command reads its trace with, and [`read_trace`]:
//! a trace read whole with it, what the check changed said on stderr.
//! Never: parse a trace (the reader in `kvtwin_sim::mooncake` does).

use anyhow::{Context, Result};
use clap::ValueEnum;
use kvtwin_sim::mooncake::{TraceCheck, TraceMismatch};
use kvtwin_sim::scenario::Scenario;
use kvtwin_sim::workload::read_mooncake_trace;
use std::path::Path;

/// What to do with a trace row whose tokens and hash ids disagree at the block size.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum MismatchArg {
    /// Stop with an error naming the file, line and field (the default).
    Error,
    /// Drop what is long: tokens past the hash ids, hash ids past the tokens.
    Clamp,
    /// Fill what is short: hash ids of the row's own for tokens past the hash ids,
    /// tokens for hash ids past the tokens.
    Extend,
}

impl From<MismatchArg> for TraceMismatch {
    fn from(arg: MismatchArg) -> Self {
        match arg {
            MismatchArg::Error => TraceMismatch::Error,
            MismatchArg::Clamp => TraceMismatch::Clamp,
            MismatchArg::Extend => TraceMismatch::Extend,
        }
    }
}

/// The check for `scenario`'s trace (or a trace given in place of its workload) at its
/// block size: the flag's policy when given, the scenario's otherwise.
pub(crate) fn trace_check(scenario: &Scenario, flag: Option<MismatchArg>) -> TraceCheck {
    let mut check = scenario
        .workload
        .trace_check(scenario.worker.block_size_tokens);
    if let Some(flag) = flag {
        check.mismatch = flag.into();
    }
    check
}

/// Reads `trace` whole with `check`, saying on stderr what the check changed.
pub(crate) fn read_trace(
    trace: &Path,
    check: TraceCheck,
) -> Result<kvtwin_sim::workload::TraceRead> {
    let read = read_mooncake_trace(trace, check)
        .with_context(|| format!("reading trace {}", trace.display()))?;
    if read.input.mismatched_rows() > 0 {
        eprintln!(
            "kvtwin: {}: {} of {} rows {} (--trace-mismatch {}): {} with tokens past their \
             hash_ids, {} with hash_ids past their tokens at {} tokens a block",
            trace.display(),
            read.input.mismatched_rows(),
            read.input.rows,
            if read.input.mismatch == TraceMismatch::Clamp {
                "clamped"
            } else {
                "extended"
            },
            read.input.mismatch.name(),
            read.input.tokens_past_hash_ids,
            read.input.hash_ids_past_tokens,
            read.input.block_tokens,
        );
    }
    Ok(read)
}
