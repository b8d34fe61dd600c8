//! Server-sent events framing, parsed incrementally: bytes in (split anywhere), events out.
//!
//! Owns: [`SseParser`], [`SseEvent`] and [`SseError`]. Follows the WHATWG
//! `text/event-stream` rules: lines end in `\n`, `\r\n` or `\r` (a `\r\n` split across
//! two chunks is still one line end); `:` starts a comment; `field: value` with one
//! leading space of the value dropped; `data` lines accumulate, joined by `\n`; a blank
//! line dispatches the event (none when it had no data); `id` persists across events;
//! `retry` and unknown fields are ignored. Bytes that are not UTF-8 are replaced (U+FFFD),
//! as the standard says.
//!
//! Invariants: memory is bounded by the line limit (one partial line, one event's data);
//! the events produced do not depend on how the input was split into chunks.
//! Never: panic on any input, or do I/O.

/// The default bound on one line and on one event's data: 16 MiB.
pub const MAX_LINE_BYTES_DEFAULT: usize = 16 << 20;

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// Its type: the last `event` field, `message` when none.
    pub event: String,
    /// Its `data` lines joined by `\n`.
    pub data: String,
    /// The last event id set (by this event or an earlier one), if any.
    pub id: Option<String>,
}

/// Input the parser refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SseError {
    /// A line, or an event's data, exceeded the limit. The rest of that line is skipped
    /// (the event being built is dropped); parsing goes on after it.
    #[error("server-sent events line or event data longer than {limit} bytes")]
    TooLong {
        /// The limit, bytes.
        limit: usize,
    },
}

/// The incremental parser; see the module documentation.
#[derive(Clone, Debug)]
pub struct SseParser {
    limit: usize,
    /// The current line's bytes so far.
    line: Vec<u8>,
    /// The current line went over the limit: skip to its end.
    skipping: bool,
    /// The last byte seen was a `\r`: a `\n` right after it ends nothing.
    after_cr: bool,
    event: Option<String>,
    data: String,
    has_data: bool,
    id: Option<String>,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new(MAX_LINE_BYTES_DEFAULT)
    }
}

impl SseParser {
    /// A parser refusing lines (and event data) longer than `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            line: Vec::new(),
            skipping: false,
            after_cr: false,
            event: None,
            data: String::new(),
            has_data: false,
            id: None,
        }
    }

    /// Parses `bytes`, pushing every event they complete onto `out`. On `Err`, the
    /// events before and after the offending line are still pushed; the error is the
    /// first of this call.
    pub fn push(&mut self, mut bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        let mut result = Ok(());
        while !bytes.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if bytes[0] == b'\n' {
                    bytes = &bytes[1..];
                    continue;
                }
            }
            let end = bytes.iter().position(|&b| b == b'\n' || b == b'\r');
            let (segment, rest) = match end {
                Some(at) => (&bytes[..at], Some(&bytes[at..])),
                None => (bytes, None),
            };
            if !self.skipping {
                if self.line.len() + segment.len() > self.limit {
                    self.skipping = true;
                    self.line = Vec::new();
                    self.reset_event();
                    if result.is_ok() {
                        result = Err(SseError::TooLong { limit: self.limit });
                    }
                } else {
                    self.line.extend_from_slice(segment);
                }
            }
            match rest {
                Some(rest) => {
                    self.after_cr = rest[0] == b'\r';
                    bytes = &rest[1..];
                    if self.skipping {
                        self.skipping = false;
                    } else {
                        let line = std::mem::take(&mut self.line);
                        if let Err(error) = self.line_done(&line, out) {
                            if result.is_ok() {
                                result = Err(error);
                            }
                        }
                        // Keep the allocation for the next line.
                        self.line = line;
                        self.line.clear();
                    }
                }
                None => bytes = &[],
            }
        }
        result
    }

    fn reset_event(&mut self) {
        self.event = None;
        self.data.clear();
        self.has_data = false;
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            if self.has_data {
                out.push(SseEvent {
                    event: self.event.take().unwrap_or_else(|| "message".to_string()),
                    data: std::mem::take(&mut self.data),
                    id: self.id.clone(),
                });
            }
            self.reset_event();
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let (field, value) = match line.iter().position(|&b| b == b':') {
            Some(at) => {
                let value = &line[at + 1..];
                (&line[..at], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"event" => self.event = Some(value.into_owned()),
            b"data" => {
                let grown = self.data.len() + usize::from(self.has_data) + value.len();
                if grown > self.limit {
                    self.reset_event();
                    return Err(SseError::TooLong { limit: self.limit });
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(&value);
                self.has_data = true;
            }
            b"id" if !value.contains('\0') => self.id = Some(value.into_owned()),
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(chunks: &[&[u8]]) -> (Vec<SseEvent>, Vec<SseError>) {
        let mut parser = SseParser::new(64);
        let mut events = Vec::new();
        let mut errors = Vec::new();
        for chunk in chunks {
            if let Err(error) = parser.push(chunk, &mut events) {
                errors.push(error);
            }
        }
        (events, errors)
    }

    fn event(event: &str, data: &str, id: Option<&str>) -> SseEvent {
        SseEvent {
            event: event.to_string(),
            data: data.to_string(),
            id: id.map(str::to_string),
        }
    }

    #[test]
    fn fields_comments_and_line_ends_follow_the_standard() {
        let (events, errors) = parse(&[
            b": keep-alive\n\nevent: delta\ndata: {\"a\":\r\ndata:1}\r\rid: 7\ndata: x\n\n",
            b"data\n\nretry: 10\nunknown: y\n\n",
        ]);
        assert!(errors.is_empty());
        assert_eq!(
            events,
            [
                event("delta", "{\"a\":\n1}", None),
                event("message", "x", Some("7")),
                event("message", "", Some("7")),
            ]
        );
    }

    #[test]
    fn a_crlf_split_between_chunks_is_one_line_end() {
        let (events, _) = parse(&[b"data: a\r", b"\n", b"\r", b"\ndata: b\n\n"]);
        assert_eq!(
            events,
            [event("message", "a", None), event("message", "b", None)]
        );
    }

    #[test]
    fn an_overlong_line_is_an_error_and_parsing_goes_on_after_it() {
        let long = vec![b'x'; 100];
        let (events, errors) = parse(&[b"data: ", &long, &long, b"\n\ndata: ok\n\n"]);
        assert_eq!(errors, [SseError::TooLong { limit: 64 }]);
        assert_eq!(events, [event("message", "ok", None)]);
        // Data lines adding up past the limit, too.
        let line = [b"data: ".as_slice(), &[b'y'; 40], b"\n"].concat();
        let (events, errors) = parse(&[&line, &line, b"\n"]);
        assert_eq!(errors, [SseError::TooLong { limit: 64 }]);
        assert!(events.is_empty());
    }

    /// A well-formed stream of `events` with `ending` after every line.
    fn encode(events: &[(Option<String>, Vec<String>, bool)], ending: &str) -> Vec<u8> {
        let mut out = String::new();
        for (name, lines, comment) in events {
            if *comment {
                out.push_str(": comment");
                out.push_str(ending);
            }
            if let Some(name) = name {
                out.push_str("event: ");
                out.push_str(name);
                out.push_str(ending);
            }
            for line in lines {
                out.push_str("data: ");
                out.push_str(line);
                out.push_str(ending);
            }
            out.push_str(ending);
        }
        out.into_bytes()
    }

    proptest! {
        #[test]
        fn any_split_of_a_stream_gives_the_same_events(
            events in prop::collection::vec(
                (
                    prop::option::of("[a-z]{1,8}"),
                    prop::collection::vec("[ -~é]{0,20}", 1..4),
                    any::<bool>(),
                ),
                0..8,
            ),
            ending in prop::sample::select(vec!["\n", "\r\n", "\r"]),
            cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
        ) {
            let bytes = encode(&events, ending);
            let mut whole = Vec::new();
            SseParser::new(1 << 10).push(&bytes, &mut whole).unwrap();
            let expected: Vec<SseEvent> = events
                .iter()
                .map(|(name, lines, _)| SseEvent {
                    event: name.clone().unwrap_or_else(|| "message".to_string()),
                    data: lines.join("\n"),
                    id: None,
                })
                .collect();
            prop_assert_eq!(&whole, &expected);
            let mut points: Vec<usize> = cuts.iter().map(|cut| cut.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let mut parser = SseParser::new(1 << 10);
            let mut split = Vec::new();
            let mut start = 0;
            for point in points.into_iter().chain([bytes.len()]) {
                parser.push(&bytes[start..point], &mut split).unwrap();
                start = point;
            }
            prop_assert_eq!(split, whole);
        }

        #[test]
        fn arbitrary_bytes_never_panic(
            chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..64), 0..8),
        ) {
            let mut parser = SseParser::new(32);
            let mut events = Vec::new();
            for chunk in &chunks {
                let _ = parser.push(chunk, &mut events);
            }
        }
    }
}
