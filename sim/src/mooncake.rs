//! Mooncake-format traces: JSON lines of `timestamp` (ms), `input_length`,
//! `output_length` and `hash_ids`, each hash id one block's tokens. Blocks are chained
//! into sequence hashes, so equal hashes mean equal prefixes.
//!
//! Owns: [`MooncakeTraceReader`] (a request at a time, so a run holds only the requests
//! in flight), [`read_mooncake_trace`] (whole), the row check ([`TraceCheck`],
//! [`TraceMismatch`]) and what it found ([`TraceInput`]), and [`TraceError`].
//!
//! A row is consistent when its hash ids cover its tokens at the run's block size and
//! no hash id lies wholly past them: `block_tokens × (n − 1) < input_length ≤
//! block_tokens × n` for `n` hash ids (`n = 0` only with no tokens). Another tool given
//! an inconsistent row simulates a different workload (DynoSim rejects it), so the
//! default is an error naming the file, line and field; `Clamp` and `Extend` accept
//! such rows, each in a stated way, and every row they change is counted.
//! Never: read a clock, or skip a row silently (blank lines are not rows).

use crate::workload::Request;
use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
use row::Row;
use serde::{Deserialize, Serialize};
use std::io::BufRead;
use std::path::{Path, PathBuf};

/// Tokens per hash id in Mooncake's own traces (FAST '25): a run at a smaller block size
/// reads their rows as too long, which the error says.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;

/// Tokens a row may ask for at most, in or out: past any model's context (the largest
/// today are around 10^7). A larger figure is an error under every policy, since
/// `Extend` would make up a block per 512 tokens of it and a run would decode forever;
/// the fuzzer found the first (`fuzz/`, trace_lines).
pub const MAX_ROW_TOKENS: u64 = 1 << 24;

/// What to do with a row whose `input_length` and `hash_ids` disagree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TraceMismatch {
    /// Stop at the first such row with an error naming it (the default: what DynoSim
    /// does, so two tools given one file simulate one workload or neither does).
    #[default]
    Error,
    /// Shrink what is long: tokens past the last hash id's block are dropped
    /// (`input_length = block_tokens × n`), hash ids wholly past the tokens are dropped.
    Clamp,
    /// Grow what is short: tokens past the hash ids get hash ids of their own (unique to
    /// the row, so never shared), hash ids past the tokens get their tokens
    /// (`input_length = block_tokens × n`).
    Extend,
}

impl TraceMismatch {
    /// The policy's name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            TraceMismatch::Error => "error",
            TraceMismatch::Clamp => "clamp",
            TraceMismatch::Extend => "extend",
        }
    }
}

/// How rows are checked: against the run's block size, with a policy for the rows that
/// fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceCheck {
    /// Tokens per block, what one hash id covers.
    pub block_tokens: u64,
    /// What to do with an inconsistent row.
    pub mismatch: TraceMismatch,
}

impl TraceCheck {
    /// The default check at `block_tokens` a block: an inconsistent row is an error.
    pub fn strict(block_tokens: u64) -> Self {
        Self {
            block_tokens,
            mismatch: TraceMismatch::Error,
        }
    }
}

/// What the check found in the rows read so far; the report's `trace` section.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TraceInput {
    /// Rows read (blank lines are not rows).
    pub rows: u64,
    /// Rows whose `input_length` exceeds `block_tokens` × their hash ids.
    pub tokens_past_hash_ids: u64,
    /// Rows with hash ids wholly past their tokens.
    pub hash_ids_past_tokens: u64,
    /// The policy applied to them.
    pub mismatch: TraceMismatch,
    /// The block size the rows were checked at.
    pub block_tokens: u64,
}

impl TraceInput {
    /// Rows the policy changed (or, under `Error`, the one that stopped the read).
    pub fn mismatched_rows(&self) -> u64 {
        self.tokens_past_hash_ids + self.hash_ids_past_tokens
    }
}

/// A trace could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a trace record.
    #[error("{path}:{line}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Why.
        source: serde_json::Error,
    },
    /// A row's token count is past what any model takes ([`MAX_ROW_TOKENS`]).
    #[error("{path}:{line}: field `{field}`: {value} tokens, more than the {max} any model's context holds")]
    OutOfRange {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// `input_length` or `output_length`.
        field: &'static str,
        /// The figure.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// A row's `input_length` and `hash_ids` disagree at the run's block size.
    #[error(
        "{path}:{line}: field `{field}`: input_length {input_length} with {hash_ids} hash_ids \
         of {block_tokens} tokens ({detail}); --trace-mismatch clamp or extend accepts such rows"
    )]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The field at fault: `input_length` (tokens past the hash ids) or `hash_ids`
        /// (hash ids past the tokens).
        field: &'static str,
        /// The row's tokens.
        input_length: u64,
        /// The row's hash ids.
        hash_ids: usize,
        /// Tokens per hash id.
        block_tokens: u64,
        /// What is wrong, in words.
        detail: String,
    },
}

/// A whole trace and what its check found.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRead {
    /// The requests, in file order.
    pub requests: Vec<Request>,
    /// What the check found.
    pub input: TraceInput,
}

/// Reads a Mooncake-format trace whole, every row checked by `check`. Blank lines are
/// skipped; any other bad line is an error naming it. [`MooncakeTraceReader`] reads one
/// request at a time.
pub fn read_mooncake_trace(path: &Path, check: TraceCheck) -> Result<TraceRead, TraceError> {
    let mut reader = MooncakeTraceReader::open(path, check)?;
    let requests = reader.by_ref().collect::<Result<Vec<_>, _>>()?;
    Ok(TraceRead {
        requests,
        input: reader.input(),
    })
}

/// A Mooncake-format trace read one line at a time, so that a run holds only the requests
/// in flight however long the trace is.
pub struct MooncakeTraceReader {
    path: PathBuf,
    reader: Box<dyn std::io::BufRead + Send>,
    line: usize,
    /// The line being read, its row's hash ids and their token hashes: buffers kept
    /// from row to row.
    text: String,
    hash_ids: Vec<u64>,
    locals: Vec<LocalBlockHash>,
    next_id: u64,
    check: TraceCheck,
    input: TraceInput,
}

impl MooncakeTraceReader {
    /// Opens the trace at `path`, to check every row with `check`.
    pub fn open(path: &Path, check: TraceCheck) -> Result<Self, TraceError> {
        let file = std::fs::File::open(path).map_err(|source| TraceError::Io {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::from_reader(
            path,
            std::io::BufReader::new(file),
            check,
        ))
    }

    /// Reads the trace from `reader` (a pipe, bytes in memory), naming it `path` in
    /// errors.
    pub fn from_reader(
        path: &Path,
        reader: impl std::io::BufRead + Send + 'static,
        check: TraceCheck,
    ) -> Self {
        Self {
            path: path.to_owned(),
            reader: Box::new(reader),
            line: 0,
            text: String::new(),
            hash_ids: Vec::new(),
            locals: Vec::new(),
            next_id: 0,
            check,
            input: TraceInput {
                mismatch: check.mismatch,
                block_tokens: check.block_tokens,
                ..TraceInput::default()
            },
        }
    }

    /// What the check found in the rows read so far.
    pub fn input(&self) -> TraceInput {
        self.input
    }

    /// `record` and its hash ids `ids` made consistent under the check's policy,
    /// counted; an error under `Error`.
    fn check(&mut self, record: &mut Row, ids: &mut Vec<u64>) -> Result<(), TraceError> {
        for (field, value) in [
            ("input_length", record.input_length),
            ("output_length", record.output_length),
        ] {
            if value > MAX_ROW_TOKENS {
                return Err(TraceError::OutOfRange {
                    path: self.path.clone(),
                    line: self.line,
                    field,
                    value,
                    max: MAX_ROW_TOKENS,
                });
            }
        }
        let block = self.check.block_tokens.max(1);
        let id_count = ids.len() as u64;
        let covered = block.saturating_mul(id_count);
        let needed = record.input_length.div_ceil(block);
        let (field, detail) = if record.input_length > covered {
            self.input.tokens_past_hash_ids += 1;
            let mut detail = format!(
                "{} tokens past the {covered} the hash_ids cover",
                record.input_length - covered
            );
            if block < MOONCAKE_BLOCK_TOKENS
                && record.input_length <= MOONCAKE_BLOCK_TOKENS.saturating_mul(id_count)
            {
                detail.push_str(&format!(
                    "; the row fits at Mooncake's {MOONCAKE_BLOCK_TOKENS} tokens a block: \
                     is the scenario's block_size_tokens the trace's?"
                ));
            }
            ("input_length", detail)
        } else if id_count > needed {
            self.input.hash_ids_past_tokens += 1;
            (
                "hash_ids",
                format!(
                    "{} hash_ids past the {needed} the tokens need",
                    id_count - needed
                ),
            )
        } else {
            return Ok(());
        };
        match self.check.mismatch {
            TraceMismatch::Error => Err(TraceError::Mismatch {
                path: self.path.clone(),
                line: self.line,
                field,
                input_length: record.input_length,
                hash_ids: ids.len(),
                block_tokens: block,
                detail,
            }),
            TraceMismatch::Clamp => {
                if field == "input_length" {
                    record.input_length = covered;
                } else {
                    ids.truncate(needed as usize);
                }
                Ok(())
            }
            TraceMismatch::Extend => {
                if field == "input_length" {
                    let line = self.line as u64;
                    let extra = (id_count..needed).map(|k| fresh_hash_id(line, k));
                    ids.extend(extra);
                } else {
                    record.input_length = covered;
                }
                Ok(())
            }
        }
    }
}

/// A hash id for block `k` of the row on `line` that no other row has: SplitMix64 of the
/// pair, with the top bit set (trace ids are counters, far below it).
fn fresh_hash_id(line: u64, k: u64) -> u64 {
    let mut z = (line << 24 ^ k).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1 << 63
}

impl Iterator for MooncakeTraceReader {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.text.clear();
            match self.reader.read_line(&mut self.text) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(source) => {
                    return Some(Err(TraceError::Io {
                        path: self.path.clone(),
                        source,
                    }))
                }
            }
            self.line += 1;
            if self.text.trim().is_empty() {
                continue;
            }
            let mut ids = std::mem::take(&mut self.hash_ids);
            let parsed = Row::parse(&self.text, &mut ids);
            let checked = parsed
                .map_err(|source| TraceError::Parse {
                    path: self.path.clone(),
                    line: self.line,
                    source,
                })
                .and_then(|mut row| {
                    self.input.rows += 1;
                    self.check(&mut row, &mut ids).map(|()| row)
                });
            let row = match checked {
                Ok(row) => row,
                Err(error) => {
                    self.hash_ids = ids;
                    return Some(Err(error));
                }
            };
            // A hash id names a block's tokens; the sequence hash chains it to its
            // prefix as an engine's would, so that the router's chain check accepts the
            // events and a block is shared only under the same prefix.
            self.locals.clear();
            self.locals
                .extend(ids.iter().map(|&id| LocalBlockHash::new(id)));
            self.hash_ids = ids;
            let id = RequestId::new(self.next_id);
            self.next_id += 1;
            return Some(Ok(Request {
                id,
                arrival: Timestamp::from_nanos(row.timestamp.saturating_mul(1_000_000)),
                blocks: BlockIdentity::chain(&self.locals),
                input_tokens: row.input_length,
                output_tokens: row.output_length,
                think_tokens: 0,
            }));
        }
    }
}

mod row;
#[cfg(test)]
mod tests;
