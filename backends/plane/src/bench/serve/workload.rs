//! What `kvtwin bench serve` sends and when: synthetic prompts over shared prefixes, or
//! a Mooncake-format trace turned into token ids, one request at a time.
//!
//! Owns: [`Workload`] ([`Synthetic`] with its [`Arrivals`], or [`TraceReplay`]),
//! [`RequestSource`] (the requests in order, each a [`PlannedRequest`] with its
//! arrival offset), [`trace_prompt`] / [`block_tokens`] (a trace row's hash ids as
//! tokens) and [`WorkloadError`].
//!
//! Invariants: a seed determines every prompt and every arrival offset (child ChaCha
//! streams: prefixes, requests, arrivals; changing the rate changes no prompt). Token ids
//! lie in [[`TOKEN_ID_MIN`], [`TOKEN_ID_END`]), so a small vocabulary takes them. In a
//! trace the same hash id always gives the same tokens (for one seed), so rows sharing a
//! prefix of ids share a prefix of tokens, and different ids give different tokens but
//! for hash collisions. Memory is bounded by the flags: the synthetic prefixes, and one
//! trace row at a time.
//! Never: read a clock (offsets are spans from the run's start), send anything, or skip a
//! row silently: a row whose lengths and hash ids disagree at the block size is an error
//! naming the file, line and field, as `kvtwin run` refuses it.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The smallest token id sent (0 is often a special token).
pub const TOKEN_ID_MIN: u32 = 1;
/// One past the largest token id sent (below the tiny test model's 32,000).
pub const TOKEN_ID_END: u32 = 30_000;
/// Tokens a trace row may ask for, in or out, at most (as `kvtwin run` bounds them).
pub const MAX_ROW_TOKENS: u64 = 1 << 24;
/// Tokens of all synthetic prefixes together, at most (what the source holds).
pub const MAX_PREFIX_TOKENS_TOTAL: u64 = 1 << 26;

/// Shared-prefix prompts: `prefixes` prefixes of `prefix_tokens` tokens, each request one
/// of them (drawn uniformly) and `suffix_tokens` fresh tokens of its own.
#[derive(Clone, Debug, PartialEq)]
pub struct Synthetic {
    /// Requests sent.
    pub requests: u64,
    /// Distinct shared prefixes.
    pub prefixes: u32,
    /// Tokens of each prefix (0: no shared prefix).
    pub prefix_tokens: u32,
    /// Tokens each request adds after its prefix.
    pub suffix_tokens: u32,
    /// Output tokens each request asks for.
    pub max_tokens: u32,
    /// When requests arrive.
    pub arrivals: Arrivals,
}

/// When synthetic requests arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arrivals {
    /// All at once, held back by the concurrency cap: a closed loop.
    Closed,
    /// A Poisson process of this many requests per second (seeded), the concurrency
    /// cap still holding: an open loop.
    Poisson {
        /// Mean arrivals per second.
        rate_per_s: f64,
    },
}

/// A Mooncake-format trace replayed: each hash id `block_size` tokens, the last block
/// cut to `input_length`, `output_length` as max_tokens, arrivals at `timestamp`
/// (ms from the first row) divided by `speedup`.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceReplay {
    /// The trace.
    pub path: PathBuf,
    /// Tokens per hash id.
    pub block_size: u32,
    /// Arrivals this many times faster than the trace's.
    pub speedup: f64,
    /// Rows replayed at most (`None`: all).
    pub limit: Option<u64>,
}

/// What to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// Synthetic shared prefixes.
    Synthetic(Synthetic),
    /// A trace.
    Trace(TraceReplay),
}

/// Why a workload cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkloadError {
    /// A flag is out of its range.
    #[error("{flag}: {reason}")]
    BadFlag {
        /// The flag, as the command line spells it.
        flag: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// The trace could not be opened or read.
    #[error("trace {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A trace row is not a Mooncake row.
    #[error("trace {}, line {line}: {source}", path.display())]
    BadRow {
        /// The file.
        path: PathBuf,
        /// 1-based.
        line: u64,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A trace row's figures cannot be sent as they are.
    #[error("trace {}, line {line}, `{field}`: {reason}", path.display())]
    BadField {
        /// The file.
        path: PathBuf,
        /// 1-based.
        line: u64,
        /// The field.
        field: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// One request to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRequest {
    /// Its place in the workload, from 0.
    pub index: u64,
    /// When it arrives, from the run's start; `None`: as soon as the concurrency cap lets
    /// it (a closed loop).
    pub at: Option<Duration>,
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Output tokens asked for.
    pub max_tokens: u32,
    /// The synthetic prefix it starts with.
    pub prefix: Option<u32>,
    /// The trace line it comes from (1-based).
    pub line: Option<u64>,
}

/// A token id from 64 random bits, in [`TOKEN_ID_MIN`], [`TOKEN_ID_END`].
fn token_of(bits: u64) -> u32 {
    TOKEN_ID_MIN + (bits % u64::from(TOKEN_ID_END - TOKEN_ID_MIN)) as u32
}

/// Appends the `block_size` tokens of trace hash id `hash_id` under `seed`: the same
/// (id, seed) always gives the same tokens.
pub fn block_tokens(hash_id: u64, block_size: u32, seed: u64, out: &mut Vec<u32>) {
    let mut bytes = [0u8; 12];
    bytes[..8].copy_from_slice(&hash_id.to_le_bytes());
    out.extend((0..block_size).map(|position| {
        bytes[8..].copy_from_slice(&position.to_le_bytes());
        token_of(xxh3_64_with_seed(&bytes, seed))
    }));
}

/// The prompt of a trace row: each of `hash_ids` as its block's tokens, cut to
/// `input_length` (which the caller has checked lies in the last block).
pub fn trace_prompt(hash_ids: &[u64], input_length: u64, block_size: u32, seed: u64) -> Vec<u32> {
    let mut prompt = Vec::with_capacity(hash_ids.len() * block_size as usize);
    for &hash_id in hash_ids {
        block_tokens(hash_id, block_size, seed, &mut prompt);
    }
    prompt.truncate(input_length as usize);
    prompt
}

/// A Mooncake row; other fields (a recorded trace's worker, latencies) are ignored.
#[derive(Deserialize)]
struct Row {
    timestamp: u64,
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

/// The requests of a workload, in order, made one at a time.
#[derive(Debug)]
pub struct RequestSource {
    seed: u64,
    next_index: u64,
    kind: SourceKind,
}

#[derive(Debug)]
enum SourceKind {
    Synthetic {
        spec: Synthetic,
        prefixes: Vec<Vec<u32>>,
        requests: Box<ChaCha8Rng>,
        arrivals: Box<ChaCha8Rng>,
        clock: Duration,
    },
    Trace {
        spec: TraceReplay,
        reader: Lines,
        line: u64,
        first_timestamp: Option<u64>,
        text: String,
    },
}

/// A trace's lines.
struct Lines(Box<dyn BufRead + Send>);

impl std::fmt::Debug for Lines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Lines")
    }
}

/// A child stream of `seed`: the same seed and stream always give the same numbers, and
/// streams are independent.
fn child_rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

impl RequestSource {
    /// The requests of `workload` under `seed`; a trace is opened here.
    pub fn new(workload: &Workload, seed: u64) -> Result<Self, WorkloadError> {
        let kind = match workload {
            Workload::Synthetic(spec) => Self::synthetic(spec, seed)?,
            Workload::Trace(spec) => {
                let file = std::fs::File::open(&spec.path).map_err(|source| WorkloadError::Io {
                    path: spec.path.clone(),
                    source,
                })?;
                Self::trace(spec, Box::new(std::io::BufReader::new(file)))?
            }
        };
        Ok(Self {
            seed,
            next_index: 0,
            kind,
        })
    }

    /// The rows of a trace read from `reader` (tests; `spec.path` names it in errors).
    pub fn from_reader(
        spec: &TraceReplay,
        reader: Box<dyn BufRead + Send>,
        seed: u64,
    ) -> Result<Self, WorkloadError> {
        Ok(Self {
            seed,
            next_index: 0,
            kind: Self::trace(spec, reader)?,
        })
    }

    fn synthetic(spec: &Synthetic, seed: u64) -> Result<SourceKind, WorkloadError> {
        let bad = |flag, reason| Err(WorkloadError::BadFlag { flag, reason });
        if spec.prefix_tokens > 0 && spec.prefixes == 0 {
            return bad("--prefixes", "must be at least 1 with --prefix-tokens");
        }
        if spec.prefix_tokens == 0 && spec.suffix_tokens == 0 {
            return bad(
                "--suffix-tokens",
                "a prompt needs tokens: give --prefix-tokens or --suffix-tokens",
            );
        }
        if u64::from(spec.prefixes) * u64::from(spec.prefix_tokens) > MAX_PREFIX_TOKENS_TOTAL {
            return bad(
                "--prefixes",
                "--prefixes × --prefix-tokens must be at most 2^26 tokens",
            );
        }
        if spec.max_tokens == 0 {
            return bad("--max-tokens", "must be at least 1");
        }
        if let Arrivals::Poisson { rate_per_s } = spec.arrivals {
            if !(rate_per_s > 0.0 && rate_per_s.is_finite()) {
                return bad("--rate", "must be a positive number of requests per second");
            }
        }
        let mut prefix_rng = child_rng(seed, 0);
        let prefixes = if spec.prefix_tokens == 0 {
            Vec::new()
        } else {
            (0..spec.prefixes)
                .map(|_| {
                    (0..spec.prefix_tokens)
                        .map(|_| token_of(prefix_rng.gen()))
                        .collect()
                })
                .collect()
        };
        Ok(SourceKind::Synthetic {
            spec: spec.clone(),
            prefixes,
            requests: Box::new(child_rng(seed, 1)),
            arrivals: Box::new(child_rng(seed, 2)),
            clock: Duration::ZERO,
        })
    }

    fn trace(
        spec: &TraceReplay,
        reader: Box<dyn BufRead + Send>,
    ) -> Result<SourceKind, WorkloadError> {
        if spec.block_size == 0 {
            return Err(WorkloadError::BadFlag {
                flag: "--trace-block-size",
                reason: "must be at least 1",
            });
        }
        if !(spec.speedup > 0.0 && spec.speedup.is_finite()) {
            return Err(WorkloadError::BadFlag {
                flag: "--speedup",
                reason: "must be a positive number",
            });
        }
        Ok(SourceKind::Trace {
            spec: spec.clone(),
            reader: Lines(reader),
            line: 0,
            first_timestamp: None,
            text: String::new(),
        })
    }

    /// Requests in all, when known before sending (synthetic; a trace is read as it goes).
    pub fn len_hint(&self) -> Option<u64> {
        match &self.kind {
            SourceKind::Synthetic { spec, .. } => Some(spec.requests),
            SourceKind::Trace { spec, .. } => spec.limit,
        }
    }

    /// The next request; `None` after the last.
    pub fn next_request(&mut self) -> Result<Option<PlannedRequest>, WorkloadError> {
        let index = self.next_index;
        let planned = match &mut self.kind {
            SourceKind::Synthetic {
                spec,
                prefixes,
                requests,
                arrivals,
                clock,
            } => {
                if index >= spec.requests {
                    return Ok(None);
                }
                let prefix =
                    (!prefixes.is_empty()).then(|| requests.gen_range(0..prefixes.len() as u32));
                let mut prompt = prefix
                    .map(|k| prefixes[k as usize].clone())
                    .unwrap_or_default();
                prompt.extend((0..spec.suffix_tokens).map(|_| token_of(requests.gen())));
                let at = match spec.arrivals {
                    Arrivals::Closed => None,
                    Arrivals::Poisson { rate_per_s } => {
                        // Exponential gaps by inversion; 1 - u lies in (0, 1].
                        let u: f64 = arrivals.gen();
                        let gap = -(1.0 - u).ln() / rate_per_s;
                        *clock += Duration::from_secs_f64(gap.min(1e9));
                        Some(*clock)
                    }
                };
                PlannedRequest {
                    index,
                    at,
                    prompt,
                    max_tokens: spec.max_tokens,
                    prefix,
                    line: None,
                }
            }
            SourceKind::Trace {
                spec,
                reader,
                line,
                first_timestamp,
                text,
            } => {
                if spec.limit.is_some_and(|limit| index >= limit) {
                    return Ok(None);
                }
                let Some(row) = next_row(spec, reader.0.as_mut(), line, text)? else {
                    return Ok(None);
                };
                let first = *first_timestamp.get_or_insert(row.timestamp);
                let offset_ms = row.timestamp.saturating_sub(first) as f64 / spec.speedup;
                PlannedRequest {
                    index,
                    at: Some(Duration::from_secs_f64(offset_ms / 1e3)),
                    prompt: trace_prompt(
                        &row.hash_ids,
                        row.input_length,
                        spec.block_size,
                        self.seed,
                    ),
                    max_tokens: row.output_length as u32,
                    prefix: None,
                    line: Some(*line),
                }
            }
        };
        self.next_index += 1;
        Ok(Some(planned))
    }
}

/// The next non-blank row of a trace, checked.
fn next_row(
    spec: &TraceReplay,
    reader: &mut (dyn BufRead + Send),
    line: &mut u64,
    text: &mut String,
) -> Result<Option<Row>, WorkloadError> {
    loop {
        text.clear();
        let read = reader.read_line(text).map_err(|source| WorkloadError::Io {
            path: spec.path.clone(),
            source,
        })?;
        if read == 0 {
            return Ok(None);
        }
        *line += 1;
        if text.trim().is_empty() {
            continue;
        }
        let row: Row = serde_json::from_str(text).map_err(|source| WorkloadError::BadRow {
            path: spec.path.clone(),
            line: *line,
            source,
        })?;
        check_row(&row, spec.block_size).map_err(|(field, reason)| WorkloadError::BadField {
            path: spec.path.clone(),
            line: *line,
            field,
            reason,
        })?;
        return Ok(Some(row));
    }
}

/// Whether a row can be sent as it is: tokens in and out, and hash ids covering exactly
/// its tokens at `block_size` (`block_size × (n − 1) < input_length ≤ block_size × n`).
fn check_row(row: &Row, block_size: u32) -> Result<(), (&'static str, String)> {
    if row.input_length == 0 {
        return Err(("input_length", "0: a request needs a prompt".into()));
    }
    if row.output_length == 0 {
        return Err(("output_length", "0: a request must ask for a token".into()));
    }
    for (field, value) in [
        ("input_length", row.input_length),
        ("output_length", row.output_length),
    ] {
        if value > MAX_ROW_TOKENS {
            return Err((field, format!("{value} is over {MAX_ROW_TOKENS} tokens")));
        }
    }
    let block = u64::from(block_size);
    let blocks = row.hash_ids.len() as u64;
    if row.input_length > block * blocks {
        return Err((
            "input_length",
            format!(
                "{} tokens run past its {blocks} hash ids of {block} tokens \
                 (is --trace-block-size the trace's?)",
                row.input_length
            ),
        ));
    }
    if block * (blocks - 1) >= row.input_length {
        return Err((
            "hash_ids",
            format!(
                "{blocks} hash ids of {block} tokens run past its {} tokens \
                 (is --trace-block-size the trace's?)",
                row.input_length
            ),
        ));
    }
    Ok(())
}

/// Non-blank lines of a trace, at most `limit`: the number of requests it replays (for a
/// progress bar; the replay itself reads one row at a time).
pub fn count_trace_rows(path: &Path, limit: Option<u64>) -> Result<u64, WorkloadError> {
    let io = |source| WorkloadError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut rows = 0;
    for line in std::io::BufReader::new(file).lines() {
        if !line.map_err(io)?.trim().is_empty() {
            rows += 1;
            if limit.is_some_and(|limit| rows >= limit) {
                break;
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_source(text: &str, block_size: u32, seed: u64) -> RequestSource {
        let spec = TraceReplay {
            path: PathBuf::from("t.jsonl"),
            block_size,
            speedup: 2.0,
            limit: None,
        };
        RequestSource::from_reader(
            &spec,
            Box::new(std::io::Cursor::new(text.to_string())),
            seed,
        )
        .unwrap()
    }

    fn drain(source: &mut RequestSource) -> Vec<PlannedRequest> {
        std::iter::from_fn(|| source.next_request().unwrap()).collect()
    }

    #[test]
    fn equal_hash_ids_give_equal_tokens_and_the_last_block_is_cut() {
        let text = "{\"timestamp\":1000,\"input_length\":10,\"output_length\":3,\"hash_ids\":[7,8,9]}\n\
                    \n\
                    {\"timestamp\":1500,\"input_length\":8,\"output_length\":2,\"hash_ids\":[7,8],\"worker_id\":3}\n\
                    {\"timestamp\":1200,\"input_length\":4,\"output_length\":1,\"hash_ids\":[5]}\n";
        let requests = drain(&mut trace_source(text, 4, 11));
        assert_eq!(requests.len(), 3);
        let [a, b, c] = [&requests[0], &requests[1], &requests[2]];
        assert_eq!(a.prompt.len(), 10);
        assert_eq!(b.prompt.len(), 8);
        assert_eq!(
            a.prompt[..8],
            b.prompt[..],
            "ids 7, 8 shared: tokens shared"
        );
        assert_ne!(a.prompt[..4], c.prompt[..], "id 5 is not id 7");
        assert_ne!(a.prompt[..4], a.prompt[4..8], "id 8 is not id 7");
        assert!(requests
            .iter()
            .flat_map(|r| &r.prompt)
            .all(|t| (TOKEN_ID_MIN..TOKEN_ID_END).contains(t)));
        assert_eq!((a.max_tokens, b.max_tokens, c.max_tokens), (3, 2, 1));
        // Offsets from the first row, halved by the speedup; earlier than the first is 0.
        assert_eq!(a.at, Some(Duration::ZERO));
        assert_eq!(b.at, Some(Duration::from_millis(250)));
        assert_eq!(c.at, Some(Duration::from_millis(100)));
        assert_eq!(
            (a.line, b.line, c.line),
            (Some(1), Some(3), Some(4)),
            "blank lines are not rows but count as lines"
        );
        // One id, its tokens: the same whatever row it is in; another seed, others.
        let mut tokens = Vec::new();
        block_tokens(8, 4, 11, &mut tokens);
        assert_eq!(tokens[..], a.prompt[4..8]);
        let other = drain(&mut trace_source(text, 4, 12));
        assert_ne!(other[0].prompt, a.prompt);
        assert_eq!(drain(&mut trace_source(text, 4, 11)), requests);
    }

    #[test]
    fn rows_that_disagree_with_the_block_size_are_errors_naming_line_and_field() {
        let cases = [
            (
                "{\"timestamp\":0,\"input_length\":9,\"output_length\":1,\"hash_ids\":[1,2]}",
                "input_length",
            ),
            (
                "{\"timestamp\":0,\"input_length\":4,\"output_length\":1,\"hash_ids\":[1,2]}",
                "hash_ids",
            ),
            (
                "{\"timestamp\":0,\"input_length\":0,\"output_length\":1,\"hash_ids\":[]}",
                "input_length",
            ),
            (
                "{\"timestamp\":0,\"input_length\":3,\"output_length\":0,\"hash_ids\":[1]}",
                "output_length",
            ),
        ];
        for (row, field) in cases {
            let text = format!("\n{row}\n");
            let error = trace_source(&text, 4, 1).next_request().unwrap_err();
            match &error {
                WorkloadError::BadField {
                    line, field: named, ..
                } => assert_eq!((*line, *named), (2, field), "{error}"),
                other => panic!("{row}: {other}"),
            }
            assert!(error.to_string().contains("t.jsonl, line 2"), "{error}");
        }
        let error = trace_source("{\"timestamp\":0}\n", 4, 1)
            .next_request()
            .unwrap_err();
        assert!(
            matches!(error, WorkloadError::BadRow { line: 1, .. }),
            "{error}"
        );
    }

    fn synthetic(arrivals: Arrivals) -> Synthetic {
        Synthetic {
            requests: 40,
            prefixes: 3,
            prefix_tokens: 64,
            suffix_tokens: 10,
            max_tokens: 4,
            arrivals,
        }
    }

    #[test]
    fn synthetic_prompts_share_their_prefixes_and_a_seed_fixes_everything() {
        let workload = Workload::Synthetic(synthetic(Arrivals::Closed));
        let requests = drain(&mut RequestSource::new(&workload, 5).unwrap());
        assert_eq!(requests.len(), 40);
        assert!(requests
            .iter()
            .all(|r| r.prompt.len() == 74 && r.at.is_none()));
        let mut seen = std::collections::BTreeMap::new();
        for request in &requests {
            let prefix = request.prefix.unwrap();
            let head = seen
                .entry(prefix)
                .or_insert_with(|| request.prompt[..64].to_vec());
            assert_eq!(head[..], request.prompt[..64]);
        }
        assert_eq!(seen.len(), 3, "40 draws of 3 cover all");
        let suffixes: std::collections::BTreeSet<_> =
            requests.iter().map(|r| r.prompt[64..].to_vec()).collect();
        assert_eq!(suffixes.len(), 40);
        let again = drain(&mut RequestSource::new(&workload, 5).unwrap());
        assert_eq!(again, requests);
        let other = drain(&mut RequestSource::new(&workload, 6).unwrap());
        assert_ne!(other[0].prompt, requests[0].prompt);

        // A rate draws arrivals from its own stream: the prompts are the same.
        let paced = Workload::Synthetic(synthetic(Arrivals::Poisson { rate_per_s: 100.0 }));
        let paced = drain(&mut RequestSource::new(&paced, 5).unwrap());
        assert!(paced
            .iter()
            .zip(&requests)
            .all(|(p, r)| p.prompt == r.prompt));
        let times: Vec<Duration> = paced.iter().map(|r| r.at.unwrap()).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        // 40 gaps of mean 10 ms: the last arrival near 400 ms.
        let last = times.last().unwrap().as_secs_f64();
        assert!((0.2..0.8).contains(&last), "{last}");
    }

    #[test]
    fn bad_flags_are_named() {
        let mut spec = synthetic(Arrivals::Poisson { rate_per_s: 0.0 });
        let flag =
            |spec: &Synthetic| match RequestSource::new(&Workload::Synthetic(spec.clone()), 1) {
                Err(WorkloadError::BadFlag { flag, .. }) => flag,
                other => panic!("{other:?}"),
            };
        assert_eq!(flag(&spec), "--rate");
        spec.arrivals = Arrivals::Closed;
        spec.prefixes = 0;
        assert_eq!(flag(&spec), "--prefixes");
        spec.prefix_tokens = 0;
        spec.suffix_tokens = 0;
        assert_eq!(flag(&spec), "--suffix-tokens");
        let missing = Workload::Trace(TraceReplay {
            path: PathBuf::from("/nonexistent/trace.jsonl"),
            block_size: 16,
            speedup: 1.0,
            limit: None,
        });
        let error = RequestSource::new(&missing, 1).unwrap_err();
        assert!(
            error.to_string().contains("/nonexistent/trace.jsonl"),
            "{error}"
        );
    }
}
