//! A sweep: every point of a grid of overrides, each under K seeds, as lines of a file.
//!
//! Owns: the grid ([`Grid`], from `--grid PATH=V1,V2,...` flags), the runs it stands for
//! ([`Sweep`]: the cross product in flag order, first axis slowest, seeds innermost, each
//! run numbered), shards of them ([`Shard`], `--shard I/N`), the line format of a sweep
//! file ([`line()`], [`parse_line`]), what a half-written file already holds ([`resume`])
//! and the joining of shards' files ([`merge`]).
//! Invariants: a run's number, overrides and seed depend only on the flags, so every
//! shard and every resumed invocation agrees on them; a line is written from the run and
//! its outcome alone, so a file sorted by run number is the same however many threads,
//! shards or restarts made it.
//! Never: read or write files, print, spawn threads or run simulations: `kvtwin sweep`
//! does that around these functions, passing file contents in as text.

use super::run::configure;
use super::summary::RunSummary;
use crate::scenario::{OverrideError, Scenario};
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Missing run numbers an error lists before it says "...".
const MISSING_LISTED: usize = 8;

/// One `--grid PATH=V1,V2,...`: a field and the values it takes.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The dotted path, as `kvtwin run --set` takes it.
    pub path: String,
    /// The values as given (what `--set PATH=VALUE` would get).
    pub raw: Vec<String>,
    /// The values as the sweep file writes them: JSON, or else the text as a string
    /// (what [`Scenario::with_overrides`] makes of them).
    pub values: Vec<Value>,
}

/// The axes of a sweep, in the order their `--grid` flags came.
#[derive(Clone, Debug, PartialEq)]
pub struct Grid {
    axes: Vec<Axis>,
}

/// A `--grid` flag, or the set of them, is not a grid.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GridError {
    /// No `--grid` at all.
    #[error("an empty grid: give at least one --grid PATH=V1,V2,...")]
    Empty,
    /// Not of the form `PATH=V1,V2,...`.
    #[error("--grid {0:?}: expected PATH=V1,V2,..., a dotted path and comma separated values")]
    Syntax(String),
    /// `PATH=` with nothing after it.
    #[error("--grid {path}=: no values; give PATH=V1,V2,...")]
    NoValues {
        /// The path.
        path: String,
    },
    /// A value between commas is empty (`PATH=1,,2` or `PATH=1,`).
    #[error("--grid {path}: value {position} of {count} is empty")]
    EmptyValue {
        /// The path.
        path: String,
        /// Which value, from 1.
        position: usize,
        /// Values given.
        count: usize,
    },
    /// Two flags for one path.
    #[error("--grid {path} is given twice: give each path once, with all its values")]
    Duplicate {
        /// The path.
        path: String,
    },
}

/// `text` split at commas outside brackets, braces and JSON strings, so that values such
/// as `{"Builtin":"dynosim"}`, `[1,2]` or `"a,b"` stay whole.
pub fn split_values(text: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut in_string, mut escaped, mut start) = (0usize, false, false, 0);
    for (i, c) in text.char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => depth += 1,
            // An unbalanced closer is the value's problem, not the splitter's.
            ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&text[start..]);
    items
}

/// The value `--set PATH=raw` puts in the scenario: JSON, or else `raw` as a string
/// (how a sweep line writes an override, and how `kvtwin plan --from-sweep` matches it).
pub fn value_of(raw: &str) -> Value {
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string()))
}

impl Grid {
    /// The grid of `flags` (each `PATH=V1,V2,...`), axes in the flags' order.
    pub fn parse(flags: &[String]) -> Result<Grid, GridError> {
        if flags.is_empty() {
            return Err(GridError::Empty);
        }
        let mut axes: Vec<Axis> = Vec::with_capacity(flags.len());
        for flag in flags {
            let (path, list) = flag
                .split_once('=')
                .filter(|(path, _)| !path.is_empty())
                .ok_or_else(|| GridError::Syntax(flag.clone()))?;
            if list.is_empty() {
                return Err(GridError::NoValues { path: path.into() });
            }
            if axes.iter().any(|axis| axis.path == path) {
                return Err(GridError::Duplicate { path: path.into() });
            }
            let raw = split_values(list);
            if let Some(position) = raw.iter().position(|v| v.trim().is_empty()) {
                return Err(GridError::EmptyValue {
                    path: path.into(),
                    position: position + 1,
                    count: raw.len(),
                });
            }
            axes.push(Axis {
                path: path.to_string(),
                values: raw.iter().map(|v| value_of(v)).collect(),
                raw: raw.into_iter().map(str::to_string).collect(),
            });
        }
        Ok(Grid { axes })
    }

    /// The axes, first (slowest) first.
    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }
}

/// `--shard I/N`: the runs whose number is I modulo N.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// I, below `count`.
    pub index: usize,
    /// N, at least 1.
    pub count: usize,
}

/// A `--shard` that is not `I/N` with 0 ≤ I < N.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardError {
    /// Not two numbers around a slash.
    #[error("--shard {0:?}: expected I/N, e.g. 0/4 for the first of four shards")]
    Syntax(String),
    /// N is 0.
    #[error("--shard {0}: N must be at least 1")]
    NoShards(String),
    /// I is N or more.
    #[error("--shard {text}: I must be below N (shards are numbered 0 to {last})")]
    IndexTooLarge {
        /// The flag's value.
        text: String,
        /// N - 1.
        last: usize,
    },
}

impl Shard {
    /// The whole sweep: shard 0 of 1.
    pub const ALL: Shard = Shard { index: 0, count: 1 };

    /// The shard of `--shard text`.
    pub fn parse(text: &str) -> Result<Shard, ShardError> {
        let syntax = || ShardError::Syntax(text.to_string());
        let (index, count) = text.split_once('/').ok_or_else(syntax)?;
        let index: usize = index.trim().parse().map_err(|_| syntax())?;
        let count: usize = count.trim().parse().map_err(|_| syntax())?;
        if count == 0 {
            return Err(ShardError::NoShards(text.to_string()));
        }
        if index >= count {
            return Err(ShardError::IndexTooLarge {
                text: text.to_string(),
                last: count - 1,
            });
        }
        Ok(Shard { index, count })
    }

    /// Whether run number `run` is this shard's.
    pub fn holds(&self, run: usize) -> bool {
        run % self.count == self.index
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// The grid does not fit the scenario, or makes no runs.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// The flags are not a grid.
    #[error(transparent)]
    Grid(#[from] GridError),
    /// A `--grid` path names no field of the scenario.
    #[error("--grid {path}: no such field; valid paths: {valid}")]
    UnknownPath {
        /// The path given.
        path: String,
        /// Every path there is, comma separated.
        valid: String,
    },
    /// A value does not fit its field, or leaves the scenario unrunnable.
    #[error("--grid {path}={value}: {source}")]
    Value {
        /// The path.
        path: String,
        /// The value, as given.
        value: String,
        /// What applying it said (boxed: it is large and rare).
        #[source]
        source: Box<OverrideError>,
    },
    /// `--seeds 0`.
    #[error("--seeds must be at least 1")]
    NoSeeds,
    /// The last seed does not fit in a u64.
    #[error("--seeds {seeds}: seeds from {base} on overflow a u64")]
    SeedOverflow {
        /// The scenario's seed, the first.
        base: u64,
        /// Seeds asked for.
        seeds: u64,
    },
    /// More runs than a machine can number.
    #[error("the grid times --seeds makes more runs than fit in a usize")]
    TooManyRuns,
}

/// One run of a sweep: its number, its overrides and its seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The run's number, from 0, in enumeration order.
    pub index: usize,
    /// `PATH=VALUE` for each axis, as [`configure`] takes them.
    pub sets: Vec<String>,
    /// Each axis's path and value, in grid order, as the line writes them.
    pub overrides: Vec<(String, Value)>,
    /// The run's seed.
    pub seed: u64,
}

/// Every run of a grid on a scenario, under `seeds` seeds.
#[derive(Clone, Debug)]
pub struct Sweep {
    grid: Grid,
    base_seed: u64,
    seeds: u64,
    total: usize,
}

impl Sweep {
    /// The sweep of `grid` on `base` with seeds `base.seed ..= base.seed + seeds - 1`;
    /// each value of each axis is applied to `base` alone first, so a bad path or value
    /// stops the sweep before anything runs.
    pub fn new(base: &Scenario, grid: Grid, seeds: u64) -> Result<Sweep, SweepError> {
        if seeds == 0 {
            return Err(SweepError::NoSeeds);
        }
        base.seed
            .checked_add(seeds - 1)
            .ok_or(SweepError::SeedOverflow {
                base: base.seed,
                seeds,
            })?;
        for axis in grid.axes() {
            for raw in &axis.raw {
                let set = format!("{}={raw}", axis.path);
                configure(base, &[set], base.seed).map_err(|source| match source {
                    OverrideError::UnknownPath { path, valid } => {
                        SweepError::UnknownPath { path, valid }
                    }
                    source => SweepError::Value {
                        path: axis.path.clone(),
                        value: raw.clone(),
                        source: Box::new(source),
                    },
                })?;
            }
        }
        let total = grid
            .axes()
            .iter()
            .try_fold(usize::try_from(seeds).ok(), |total, axis| {
                Some(total.and_then(|t| t.checked_mul(axis.raw.len())))
            })
            .flatten()
            .ok_or(SweepError::TooManyRuns)?;
        Ok(Sweep {
            grid,
            base_seed: base.seed,
            seeds,
            total,
        })
    }

    /// The grid.
    pub fn grid(&self) -> &Grid {
        &self.grid
    }

    /// Runs in the whole sweep.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Run number `index` (below [`Sweep::total`]).
    pub fn run(&self, index: usize) -> Run {
        assert!(index < self.total, "run {index} of {}", self.total);
        let seeds = self.seeds as usize;
        let seed = self.base_seed + (index % seeds) as u64;
        let mut rest = index / seeds;
        let mut picks = vec![0; self.grid.axes.len()];
        // The last axis turns fastest, as the innermost of nested loops.
        for (pick, axis) in picks.iter_mut().zip(&self.grid.axes).rev() {
            *pick = rest % axis.raw.len();
            rest /= axis.raw.len();
        }
        let axes = self.grid.axes.iter().zip(picks);
        Run {
            index,
            sets: axes
                .clone()
                .map(|(axis, i)| format!("{}={}", axis.path, axis.raw[i]))
                .collect(),
            overrides: axes
                .map(|(axis, i)| (axis.path.clone(), axis.values[i].clone()))
                .collect(),
            seed,
        }
    }

    /// The runs of `shard`, in order.
    pub fn runs(&self, shard: Shard) -> impl Iterator<Item = Run> + '_ {
        (shard.index..self.total)
            .step_by(shard.count)
            .map(|index| self.run(index))
    }
}

/// The line (without its newline) of `run` in a sweep of `runs` runs: its summary, or
/// the error that stopped it. Keys come in a fixed order: run, runs, overrides (in grid
/// order), seed, then summary or error.
pub fn line(run: &Run, runs: usize, outcome: Result<&RunSummary, &str>) -> String {
    let head = head(run, runs);
    let summary = outcome.map(|summary| {
        // Written from the struct, not a `Value`, to keep its field order. JSON has no NaN
        // or infinity (serde_json writes null): a summary that would not read back is
        // written as the run's error, so every line of a file parses.
        let text = serde_json::to_string(summary).map_err(|e| e.to_string());
        match text.and_then(|t| {
            serde_json::from_str::<RunSummary>(&t)
                .map(|_| t)
                .map_err(|e| e.to_string())
        }) {
            Ok(text) => Ok(text),
            Err(e) => Err(format!("the run's summary has no JSON form: {e}")),
        }
    });
    match summary {
        Ok(Ok(summary)) => format!("{head},\"summary\":{summary}}}"),
        Ok(Err(error)) => format!("{head},\"error\":{}}}", Value::String(error)),
        Err(error) => format!("{head},\"error\":{}}}", Value::String(error.into())),
    }
}

/// What every line of `run` starts with: `{"run":..,"runs":..,"overrides":{..},"seed":..`.
fn head(run: &Run, runs: usize) -> String {
    let overrides: Vec<String> = run
        .overrides
        .iter()
        .map(|(path, value)| format!("{}:{value}", Value::String(path.clone())))
        .collect();
    format!(
        "{{\"run\":{},\"runs\":{runs},\"overrides\":{{{}}},\"seed\":{}",
        run.index,
        overrides.join(","),
        run.seed
    )
}

/// A line of a sweep file, read back.
#[derive(Clone, Debug, PartialEq)]
pub struct SweepLine {
    /// The run's number.
    pub run: usize,
    /// Runs in its sweep.
    pub runs: usize,
    /// Path and value of each override, in the line's (the grid's) order.
    pub overrides: Vec<(String, Value)>,
    /// The run's seed.
    pub seed: u64,
    /// What the run did, when it ran to the end.
    pub summary: Option<RunSummary>,
    /// Why it did not, when it did not.
    pub error: Option<String>,
}

/// A line is not a sweep line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LineError {
    /// Not JSON, or a field is missing, unknown or of the wrong type (serde names it).
    #[error("not a sweep line: {0}")]
    Json(#[from] serde_json::Error),
    /// Neither `summary` nor `error`, or both.
    #[error("a sweep line has exactly one of \"summary\" and \"error\"")]
    Outcome,
    /// `run` is not below `runs`.
    #[error("\"run\":{run} is not below \"runs\":{runs}")]
    RunOutOfRange {
        /// The run's number.
        run: usize,
        /// Runs in its sweep.
        runs: usize,
    },
}

/// Overrides as a JSON object whose key order is kept (serde_json's map sorts keys).
struct Ordered(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs;
        impl<'de> Visitor<'de> for Pairs {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of override paths and values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered, A::Error> {
                let mut pairs: Vec<(String, Value)> = Vec::new();
                while let Some((path, value)) = map.next_entry::<String, Value>()? {
                    if pairs.iter().any(|(p, _)| *p == path) {
                        return Err(serde::de::Error::custom(format!(
                            "override {path:?} appears twice"
                        )));
                    }
                    pairs.push((path, value));
                }
                Ok(Ordered(pairs))
            }
        }
        deserializer.deserialize_map(Pairs)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLine {
    run: usize,
    runs: usize,
    overrides: Ordered,
    seed: u64,
    summary: Option<RunSummary>,
    error: Option<String>,
}

/// The sweep line `text` (without its newline).
pub fn parse_line(text: &str) -> Result<SweepLine, LineError> {
    let raw: RawLine = serde_json::from_str(text)?;
    if raw.summary.is_some() == raw.error.is_some() {
        return Err(LineError::Outcome);
    }
    if raw.run >= raw.runs {
        return Err(LineError::RunOutOfRange {
            run: raw.run,
            runs: raw.runs,
        });
    }
    Ok(SweepLine {
        run: raw.run,
        runs: raw.runs,
        overrides: raw.overrides.0,
        seed: raw.seed,
        summary: raw.summary,
        error: raw.error,
    })
}

/// A line of a sweep file that cannot be kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The line does not parse.
    #[error("{file}:{line}: {source}")]
    Line {
        /// The file, as the caller names it.
        file: String,
        /// The line, from 1.
        line: usize,
        /// Why it does not parse.
        #[source]
        source: LineError,
    },
    /// The line parses but its run is not this sweep's (or this shard's).
    #[error(
        "{file}:{line}: run {run} is not a run of this sweep (different --grid, --seeds or \
         --shard?); {why}"
    )]
    NotThisSweep {
        /// The file.
        file: String,
        /// The line, from 1.
        line: usize,
        /// The line's run number.
        run: usize,
        /// What differs.
        why: String,
    },
    /// Two different lines for one run.
    #[error("{file}:{line}: run {run} differs from its line at {first}")]
    Conflict {
        /// The file of the later line.
        file: String,
        /// The later line, from 1.
        line: usize,
        /// The run.
        run: usize,
        /// `FILE:LINE` of the earlier line.
        first: String,
    },
    /// Merged parts belong to sweeps of different sizes or grids.
    #[error("{file}:{line}: run {run} is from another sweep than {first} ({why})")]
    OtherSweep {
        /// The file.
        file: String,
        /// The line, from 1.
        line: usize,
        /// The line's run number.
        run: usize,
        /// `FILE:LINE` of the first line read.
        first: String,
        /// What differs.
        why: String,
    },
    /// Merged parts lack some runs.
    #[error("{missing} of {runs} runs are in no part, e.g. run {listed}")]
    Missing {
        /// Runs missing.
        missing: usize,
        /// Runs in the sweep.
        runs: usize,
        /// The first few missing run numbers, comma separated.
        listed: String,
    },
    /// No part holds any line.
    #[error("the parts hold no sweep lines")]
    NoLines,
}

/// The lines of `text`, each with its number (from 1) and whether it ended in a newline.
fn lines(text: &str) -> impl Iterator<Item = (usize, &str, bool)> {
    text.split_inclusive('\n').enumerate().map(|(i, l)| {
        let ended = l.ends_with('\n');
        (i + 1, l.strip_suffix('\n').unwrap_or(l), ended)
    })
}

/// What an existing sweep file holds for this sweep.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resumed {
    /// Each finished run's number and its line (without newline), as the file has it.
    pub finished: BTreeMap<usize, String>,
    /// Bytes of the file to keep: all of it, or all but a torn last line.
    pub keep_bytes: usize,
    /// The number of a torn last line (cut mid-write: no newline, or unparsable), which
    /// the caller truncates and warns about.
    pub torn_line: Option<usize>,
}

/// The runs of `shard` of `sweep` already in `text`, the content of the sweep file `file`.
pub fn resume(sweep: &Sweep, shard: Shard, file: &str, text: &str) -> Result<Resumed, FileError> {
    let mut resumed = Resumed {
        keep_bytes: text.len(),
        ..Resumed::default()
    };
    let mut at: BTreeMap<usize, usize> = BTreeMap::new();
    let mut offset = 0;
    let count = text.split_inclusive('\n').count();
    for (number, body, ended) in lines(text) {
        let start = offset;
        offset += body.len() + usize::from(ended);
        let parsed = parse_line(body);
        let last = number == count;
        if last && (!ended || parsed.is_err()) {
            resumed.torn_line = Some(number);
            resumed.keep_bytes = start;
            break;
        }
        let line = parsed.map_err(|source| FileError::Line {
            file: file.into(),
            line: number,
            source,
        })?;
        let not_ours = |why: String| FileError::NotThisSweep {
            file: file.into(),
            line: number,
            run: line.run,
            why,
        };
        if line.runs != sweep.total() {
            return Err(not_ours(format!(
                "it has {} runs, this sweep {}",
                line.runs,
                sweep.total()
            )));
        }
        if !shard.holds(line.run) {
            return Err(not_ours(format!("it is not in shard {shard}")));
        }
        let run = sweep.run(line.run);
        // Bytes, not parsed values: serde_json may read a decimal back an ulp away from
        // what was written, and a run's line is what `line` wrote for it.
        if !body.starts_with(&head(&run, sweep.total())) {
            return Err(not_ours(format!(
                "its overrides and seed are {} seed {}, this sweep's {} seed {}",
                overrides_text(&line.overrides),
                line.seed,
                overrides_text(&run.overrides),
                run.seed
            )));
        }
        match resumed.finished.get(&line.run) {
            Some(first) if first != body => {
                return Err(FileError::Conflict {
                    file: file.into(),
                    line: number,
                    run: line.run,
                    first: format!("{file}:{}", at[&line.run]),
                });
            }
            Some(_) => {}
            None => {
                resumed.finished.insert(line.run, body.to_string());
                at.insert(line.run, number);
            }
        }
    }
    Ok(resumed)
}

/// Overrides as `{"path":value,...}`, for messages.
fn overrides_text(overrides: &[(String, Value)]) -> String {
    let pairs: Vec<String> = overrides
        .iter()
        .map(|(path, value)| format!("{path}={value}"))
        .collect();
    format!("{{{}}}", pairs.join(","))
}

/// The sweep file of parts `(name, text)` (shards, or restarts of one): every line
/// checked, identical lines of a run kept once, sorted by run, each ending in a newline.
/// Every run of the sweep must be in some part.
pub fn merge(parts: &[(String, String)]) -> Result<String, FileError> {
    // Each run's line, and where it was first seen.
    let mut runs: BTreeMap<usize, (&str, String)> = BTreeMap::new();
    // The first line read: its place, run count and override paths, which every line shares.
    let mut first: Option<(String, usize, Vec<String>)> = None;
    for (file, text) in parts {
        for (number, body, _) in lines(text) {
            let here = format!("{file}:{number}");
            let line = parse_line(body).map_err(|source| FileError::Line {
                file: file.clone(),
                line: number,
                source,
            })?;
            let paths: Vec<String> = line.overrides.iter().map(|(p, _)| p.clone()).collect();
            let (place, total, first_paths) =
                first.get_or_insert_with(|| (here.clone(), line.runs, paths.clone()));
            let other = |why: String| FileError::OtherSweep {
                file: file.clone(),
                line: number,
                run: line.run,
                first: place.clone(),
                why,
            };
            if line.runs != *total {
                return Err(other(format!("{} runs, not {total}", line.runs)));
            }
            if paths != *first_paths {
                return Err(other(format!(
                    "its grid is {}, not {}",
                    paths.join(","),
                    first_paths.join(",")
                )));
            }
            match runs.get(&line.run) {
                Some((seen, _)) if *seen != body => {
                    return Err(FileError::Conflict {
                        file: file.clone(),
                        line: number,
                        run: line.run,
                        first: runs[&line.run].1.clone(),
                    });
                }
                Some(_) => {}
                None => {
                    runs.insert(line.run, (body, here));
                }
            }
        }
    }
    let Some((_, total, _)) = first else {
        return Err(FileError::NoLines);
    };
    if runs.len() < total {
        let present: BTreeSet<usize> = runs.keys().copied().collect();
        let missing: Vec<usize> = (0..total).filter(|r| !present.contains(r)).collect();
        let mut listed: Vec<String> = missing
            .iter()
            .take(MISSING_LISTED)
            .map(usize::to_string)
            .collect();
        if missing.len() > MISSING_LISTED {
            listed.push("...".into());
        }
        return Err(FileError::Missing {
            missing: missing.len(),
            runs: total,
            listed: listed.join(", "),
        });
    }
    let mut out = String::new();
    for (body, _) in runs.values() {
        out.push_str(body);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
