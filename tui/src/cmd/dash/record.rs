//! Recordings: what `--record FILE` writes and `--replay FILE` reads.
//!
//! A recording is JSON lines: a header `{"kvtwin_dash_recording":1,"source":"..."}`,
//! then one [`TimedUpdate`] per line in the order the dashboard received them. Updates
//! carry the rows' event ids, dp ranks and the source's clock, so gaps, restarts and
//! rates replay as they were seen. Append-only: a recorder killed mid-line leaves a torn
//! last line, which the reader counts and skips, keeping every whole line before it.
//!
//! Owns: [`Recorder`], [`Recording`] and [`RecordingError`].
//! Never: interpret an update (the app does), or read a clock.

use super::model::TimedUpdate;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The format's version, in the header.
const FORMAT_VERSION: u32 = 1;

/// The most a recording may hold in memory (a replay loads it whole to seek).
const MAX_RECORDING_BYTES: u64 = 4 << 30;

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    kvtwin_dash_recording: u32,
    source: String,
}

/// Why a recording cannot be written or read; names the file, and the line where one
/// is at fault.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordingError {
    /// The file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The recording.
        path: PathBuf,
        /// What failed.
        source: std::io::Error,
    },
    /// The first line is not a recording header of a version this build reads.
    #[error("{path}:1: not a kvtwin dash recording ({message})")]
    Header {
        /// The recording.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A whole line (not the last) is not an update, or goes back in time.
    #[error("{path}:{line}: {message}")]
    Line {
        /// The recording.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The file is larger than a replay holds.
    #[error("{path}: {bytes} bytes is more than the {limit} a replay loads")]
    TooLarge {
        /// The recording.
        path: PathBuf,
        /// Its size.
        bytes: u64,
        /// The limit.
        limit: u64,
    },
}

/// Appends updates to a recording.
pub(crate) struct Recorder {
    path: PathBuf,
    out: BufWriter<File>,
    written: u64,
}

impl Recorder {
    /// Creates (or truncates) `path` and writes the header naming `source`.
    pub(crate) fn create(path: &Path, source: &str) -> Result<Self, RecordingError> {
        let io = |source| RecordingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut out = BufWriter::new(File::create(path).map_err(io)?);
        let header = Header {
            kvtwin_dash_recording: FORMAT_VERSION,
            source: source.to_string(),
        };
        serde_json::to_writer(&mut out, &header).map_err(|e| io(e.into()))?;
        out.write_all(b"\n").map_err(io)?;
        Ok(Self {
            path: path.to_path_buf(),
            out,
            written: 0,
        })
    }

    /// Appends one update (buffered; see [`Self::flush`]).
    pub(crate) fn append(&mut self, update: &TimedUpdate) -> Result<(), RecordingError> {
        let io = |source| RecordingError::Io {
            path: self.path.clone(),
            source,
        };
        serde_json::to_writer(&mut self.out, update).map_err(|e| io(e.into()))?;
        self.out.write_all(b"\n").map_err(io)?;
        self.written += 1;
        Ok(())
    }

    /// Writes what is buffered, so a killed dashboard loses at most the last tick.
    pub(crate) fn flush(&mut self) -> Result<(), RecordingError> {
        self.out.flush().map_err(|source| RecordingError::Io {
            path: self.path.clone(),
            source,
        })
    }

    /// Updates appended so far.
    pub(crate) fn written(&self) -> u64 {
        self.written
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

/// A recording read whole.
#[derive(Debug)]
pub(crate) struct Recording {
    /// The source it was recorded from.
    pub(crate) source: String,
    /// Its updates, in order (times never decrease).
    pub(crate) updates: Vec<TimedUpdate>,
    /// Whether the last line was torn (cut mid-write) and skipped.
    pub(crate) torn_tail: bool,
}

impl Recording {
    /// Reads `path`.
    pub(crate) fn open(path: &Path) -> Result<Self, RecordingError> {
        let io = |source| RecordingError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let bytes = file.metadata().map_err(io)?.len();
        if bytes > MAX_RECORDING_BYTES {
            return Err(RecordingError::TooLarge {
                path: path.to_path_buf(),
                bytes,
                limit: MAX_RECORDING_BYTES,
            });
        }
        Self::read(path, BufReader::new(file))
    }

    /// Reads a recording from `reader`; `path` names it in errors.
    pub(crate) fn read(path: &Path, reader: impl BufRead) -> Result<Self, RecordingError> {
        let mut lines = reader.split(b'\n').enumerate().peekable();
        let header_error = |message: String| RecordingError::Header {
            path: path.to_path_buf(),
            message,
        };
        let header = match lines.next() {
            None => return Err(header_error("the file is empty".into())),
            Some((_, line)) => line.map_err(|source| RecordingError::Io {
                path: path.to_path_buf(),
                source,
            })?,
        };
        let header: Header =
            serde_json::from_slice(&header).map_err(|e| header_error(e.to_string()))?;
        if header.kvtwin_dash_recording != FORMAT_VERSION {
            return Err(header_error(format!(
                "format version {}, this build reads {FORMAT_VERSION}",
                header.kvtwin_dash_recording
            )));
        }
        let mut updates: Vec<TimedUpdate> = Vec::new();
        let mut torn_tail = false;
        while let Some((index, line)) = lines.next() {
            let line = line.map_err(|source| RecordingError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let is_last = lines.peek().is_none();
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let update: TimedUpdate = match serde_json::from_slice(&line) {
                Ok(update) => update,
                // The last line of a file that does not end in a newline was being
                // written when the recorder stopped.
                Err(_) if is_last => {
                    torn_tail = true;
                    break;
                }
                Err(error) => {
                    return Err(RecordingError::Line {
                        path: path.to_path_buf(),
                        line: index + 1,
                        message: format!("not an update: {error}"),
                    })
                }
            };
            if let Some(previous) = updates.last() {
                if update.at_ms < previous.at_ms {
                    return Err(RecordingError::Line {
                        path: path.to_path_buf(),
                        line: index + 1,
                        message: format!(
                            "time goes back from {} ms to {} ms",
                            previous.at_ms, update.at_ms
                        ),
                    });
                }
            }
            updates.push(update);
        }
        Ok(Self {
            source: header.source,
            updates,
            torn_tail,
        })
    }

    /// The time of the last update, milliseconds.
    pub(crate) fn end_ms(&self) -> u64 {
        self.updates.last().map_or(0, |update| update.at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::dash::model::{Counters, Delta, SourceStatus, Update, WorkerKey, WorkerRow};

    fn updates() -> Vec<TimedUpdate> {
        vec![
            TimedUpdate {
                at_ms: 0,
                update: Update::Status(SourceStatus {
                    connected: true,
                    text: "connected".into(),
                }),
            },
            TimedUpdate {
                at_ms: 100,
                update: Update::Delta(Delta {
                    full: true,
                    workers: vec![WorkerRow {
                        key: WorkerKey {
                            worker: 3,
                            dp_rank: 1,
                        },
                        blocks: [5, 1, 0, 0],
                        events: 9,
                        last_event_id: Some(12),
                        gaps: 2,
                        ..WorkerRow::default()
                    }],
                    counters: Some(Counters {
                        events_applied: 9,
                        ..Counters::default()
                    }),
                    ..Delta::default()
                }),
            },
        ]
    }

    #[test]
    fn a_recording_reads_back_what_was_written_ids_ranks_and_times_included() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let mut recorder = Recorder::create(&path, "router http://127.0.0.1:1").unwrap();
        for update in updates() {
            recorder.append(&update).unwrap();
        }
        assert_eq!(recorder.written(), 2);
        drop(recorder);
        let recording = Recording::open(&path).unwrap();
        assert_eq!(recording.source, "router http://127.0.0.1:1");
        assert_eq!(recording.updates, updates());
        assert!(!recording.torn_tail);
        assert_eq!(recording.end_ms(), 100);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_what_came_before_kept() {
        let text = "{\"kvtwin_dash_recording\":1,\"source\":\"s\"}\n\
                    {\"at_ms\":5,\"status\":{\"connected\":true,\"text\":\"x\"}}\n\
                    {\"at_ms\":7,\"delta\":{\"wor";
        let recording = Recording::read(Path::new("r"), text.as_bytes()).unwrap();
        assert_eq!(recording.updates.len(), 1);
        assert!(recording.torn_tail);
    }

    #[test]
    fn bad_lines_and_headers_are_named() {
        let cases = [
            ("", "r:1: not a kvtwin dash recording (the file is empty)"),
            ("{\"x\":1}\n", "r:1: not a kvtwin dash recording"),
            (
                "{\"kvtwin_dash_recording\":2,\"source\":\"s\"}\n",
                "format version 2",
            ),
            (
                "{\"kvtwin_dash_recording\":1,\"source\":\"s\"}\nnope\n{\"at_ms\":1,\"status\":{\"connected\":true,\"text\":\"\"}}\n",
                "r:2: not an update",
            ),
            (
                "{\"kvtwin_dash_recording\":1,\"source\":\"s\"}\n{\"at_ms\":9,\"status\":{\"connected\":true,\"text\":\"\"}}\n{\"at_ms\":3,\"status\":{\"connected\":true,\"text\":\"\"}}\n",
                "r:3: time goes back from 9 ms to 3 ms",
            ),
        ];
        for (text, says) in cases {
            let error = Recording::read(Path::new("r"), text.as_bytes()).unwrap_err();
            assert!(error.to_string().contains(says), "{text:?}: {error}");
        }
    }
}
