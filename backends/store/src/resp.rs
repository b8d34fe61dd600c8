//! RESP2, the Redis protocol's second version, as far as a key-value server needs it:
//! requests in (arrays of bulk strings, or inline commands as `redis-cli` and telnet
//! send them), replies out (simple strings, errors, integers, bulk strings, arrays).
//!
//! Requests come from outside: every length is bounded ([`Limits`]), a partial request
//! waits for more bytes, and a malformed one is a [`ProtocolError`] with Redis's own
//! words (after which Redis, and this server, close the connection), never a panic.
//!
//! Owns: framing. Never: what a command means (`server`).

use crate::pages::Value;
use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Bounds on one request.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// The longest bulk string (a value), bytes.
    pub max_bulk: usize,
    /// The most arguments in one request.
    pub max_args: usize,
    /// The longest inline command, bytes.
    pub max_inline: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bulk: 512 << 20,
            max_args: 1 << 20,
            max_inline: 64 << 10,
        }
    }
}

/// A malformed request, in Redis's words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A count that is not a number in range.
    #[error("Protocol error: invalid multibulk length")]
    MultibulkLength,
    /// A bulk length that is not a number in range.
    #[error("Protocol error: invalid bulk length")]
    BulkLength,
    /// Something other than `$` where a bulk string must start.
    #[error("Protocol error: expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// An inline command with no line end in sight.
    #[error("Protocol error: too big inline request")]
    InlineTooBig,
    /// A bulk string without its line end.
    #[error("Protocol error: bulk string not terminated by CRLF")]
    BulkUnterminated,
}

/// A reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(&'static str),
    /// `-ERR ...` (the text after the dash).
    Error(String),
    /// `:n`.
    Integer(i64),
    /// `$n` and the bytes, or `$-1` (nil).
    Bulk(Option<Value>),
    /// `*n` and the elements.
    Array(Vec<Reply>),
    /// Keys and values, alternating: RESP3's `%n` (n pairs); in RESP2 an array of them.
    Map(Vec<Reply>),
}

impl Reply {
    /// `$n` and `bytes`.
    pub fn bulk(bytes: impl Into<Bytes>) -> Reply {
        Reply::Bulk(Some(Value::from(bytes.into())))
    }

    /// `-ERR text`.
    pub fn err(text: impl std::fmt::Display) -> Reply {
        Reply::Error(format!("ERR {text}"))
    }

    /// Appends the reply's bytes to `out`, in RESP2.
    pub fn encode(&self, out: &mut BytesMut) {
        self.encode_in(out, false);
    }

    /// Appends the reply's bytes to `out`, in RESP3 when `resp3` (a client that sent
    /// HELLO 3): nil is `_`, a map `%n`; everything else is written as in RESP2.
    pub fn encode_in(&self, out: &mut BytesMut, resp3: bool) {
        self.encode_to(out, resp3);
    }

    /// [`Self::encode_in`] into any [`Sink`] ([`Output`] keeps large values uncopied).
    pub fn encode_to(&self, out: &mut impl Sink, resp3: bool) {
        match self {
            Reply::Simple(text) => {
                out.push_byte(b'+');
                out.push_slice(text.as_bytes());
            }
            Reply::Error(text) => {
                out.push_byte(b'-');
                // A line end inside would end the reply early.
                out.push_slice(text.replace(['\r', '\n'], " ").as_bytes());
            }
            Reply::Integer(n) => {
                out.push_byte(b':');
                out.push_slice(n.to_string().as_bytes());
            }
            Reply::Bulk(None) if resp3 => out.push_byte(b'_'),
            Reply::Bulk(None) => out.push_slice(b"$-1"),
            Reply::Bulk(Some(value)) => {
                out.push_byte(b'$');
                out.push_slice(value.len().to_string().as_bytes());
                out.push_slice(b"\r\n");
                for part in value.parts() {
                    out.push_value(part);
                }
            }
            Reply::Array(items) => {
                out.push_byte(b'*');
                out.push_slice(items.len().to_string().as_bytes());
                out.push_slice(b"\r\n");
                for item in items {
                    item.encode_to(out, resp3);
                }
                return;
            }
            Reply::Map(items) => {
                let (kind, count) = if resp3 {
                    (b'%', items.len() / 2)
                } else {
                    (b'*', items.len())
                };
                out.push_byte(kind);
                out.push_slice(count.to_string().as_bytes());
                out.push_slice(b"\r\n");
                for item in items {
                    item.encode_to(out, resp3);
                }
                return;
            }
        }
        out.push_slice(b"\r\n");
    }
}

/// Where replies are encoded.
pub trait Sink {
    /// Appends one byte.
    fn push_byte(&mut self, byte: u8);
    /// Appends `bytes`.
    fn push_slice(&mut self, bytes: &[u8]);
    /// Appends a value's bytes (which a sink may keep rather than copy).
    fn push_value(&mut self, bytes: &Bytes) {
        self.push_slice(bytes);
    }
}

impl Sink for BytesMut {
    fn push_byte(&mut self, byte: u8) {
        BufMut::put_u8(self, byte);
    }

    fn push_slice(&mut self, bytes: &[u8]) {
        BufMut::put_slice(self, bytes);
    }
}

/// Values from this size on go out as the store holds them, not copied into the
/// connection's buffer: a GET of a block then costs no allocation of its size, and a
/// connection's buffer stays small.
pub const UNCOPIED_VALUE: usize = 16 << 10;

/// A connection's replies waiting to be written: the small parts encoded in one buffer,
/// large values kept as they are, in order.
#[derive(Debug, Default)]
pub struct Output {
    small: BytesMut,
    parts: Vec<Bytes>,
}

impl Output {
    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.small.is_empty() && self.parts.is_empty()
    }

    /// What waits, in order (the buffer's part and the values), leaving it empty.
    pub fn take(&mut self) -> Vec<Bytes> {
        if !self.small.is_empty() {
            let small = self.small.split().freeze();
            self.parts.push(small);
        }
        std::mem::take(&mut self.parts)
    }
}

impl Sink for Output {
    fn push_byte(&mut self, byte: u8) {
        BufMut::put_u8(&mut self.small, byte);
    }

    fn push_slice(&mut self, bytes: &[u8]) {
        BufMut::put_slice(&mut self.small, bytes);
    }

    fn push_value(&mut self, bytes: &Bytes) {
        if bytes.len() < UNCOPIED_VALUE {
            return self.push_slice(bytes);
        }
        if !self.small.is_empty() {
            let small = self.small.split().freeze();
            self.parts.push(small);
        }
        self.parts.push(bytes.clone());
    }
}

/// The next whole request at the start of `buf`, taken out of it: its arguments
/// (an empty inline line gives none); `None` until the bytes of one whole request are
/// there.
pub fn next_request(
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    if buf.is_empty() {
        return Ok(None);
    }
    if buf[0] != b'*' {
        return inline(buf, limits);
    }
    let Some((count, mut at)) = line_number(buf, 1)? else {
        return Ok(None);
    };
    let count = count.map_err(|_| ProtocolError::MultibulkLength)?;
    if count > limits.max_args as i64 {
        return Err(ProtocolError::MultibulkLength);
    }
    if count <= 0 {
        buf.advance(at);
        return Ok(Some(Vec::new()));
    }
    // Where each argument lies, found before anything is taken.
    let mut spans = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        let Some(&first) = buf.get(at) else {
            return Ok(None);
        };
        if first != b'$' {
            return Err(ProtocolError::ExpectedBulk(first as char));
        }
        let Some((len, after)) = line_number(buf, at + 1)? else {
            return Ok(None);
        };
        let len = len.map_err(|_| ProtocolError::BulkLength)?;
        if len < 0 || len as usize > limits.max_bulk {
            return Err(ProtocolError::BulkLength);
        }
        let end = after + len as usize;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError::BulkUnterminated);
        }
        spans.push((after, end));
        at = end + 2;
    }
    let request = buf.split_to(at).freeze();
    Ok(Some(
        spans
            .into_iter()
            .map(|(start, end)| request.slice(start..end))
            .collect(),
    ))
}

/// The number on the line starting at `from` (after its type byte) and where the next
/// line starts; `None` until the line end is there. The number is `Err` when the line
/// is not one.
#[allow(clippy::type_complexity)]
fn line_number(buf: &[u8], from: usize) -> Result<Option<(Result<i64, ()>, usize)>, ProtocolError> {
    let Some(end) = buf[from.min(buf.len())..]
        .windows(2)
        .position(|w| w == b"\r\n")
    else {
        // A number line is short: a long one without its end is not a number.
        if buf.len() - from.min(buf.len()) > 32 {
            return Err(ProtocolError::MultibulkLength);
        }
        return Ok(None);
    };
    let text = &buf[from..from + end];
    let number = std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or(());
    Ok(Some((number, from + end + 2)))
}

/// An inline command: one line, arguments split by spaces.
fn inline(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(end) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > limits.max_inline {
            return Err(ProtocolError::InlineTooBig);
        }
        return Ok(None);
    };
    let line = buf.split_to(end + 1).freeze();
    let text = line.slice(..end);
    let text = text.strip_suffix(b"\r").unwrap_or(&text);
    Ok(Some(
        text.split(|b| *b == b' ' || *b == b'\t')
            .filter(|word| !word.is_empty())
            .map(Bytes::copy_from_slice)
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(bytes: &[u8]) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        next_request(&mut BytesMut::from(bytes), &Limits::default())
    }

    #[test]
    fn requests_split_into_their_arguments_and_wait_for_their_last_byte() {
        let whole = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n";
        let mut buf = BytesMut::from(&whole[..]);
        buf.put_slice(b"PING\r\n");
        let limits = Limits::default();
        assert_eq!(
            next_request(&mut buf, &limits).unwrap().unwrap(),
            vec![Bytes::from("SET"), Bytes::from("k"), Bytes::from("value")]
        );
        assert_eq!(
            next_request(&mut buf, &limits).unwrap().unwrap(),
            vec![Bytes::from("PING")]
        );
        assert!(buf.is_empty());
        for cut in 1..whole.len() {
            assert_eq!(parse(&whole[..cut]), Ok(None), "cut at {cut}");
        }
        // A binary value with line ends inside is taken by its length.
        assert_eq!(
            parse(b"*1\r\n$4\r\na\r\nb\r\n").unwrap().unwrap(),
            vec![Bytes::from("a\r\nb")]
        );
    }

    #[test]
    fn malformed_requests_are_refused_in_redis_words() {
        assert_eq!(parse(b"*x\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(parse(b"*1\r\n$x\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(
            parse(b"*1\r\n:1\r\n"),
            Err(ProtocolError::ExpectedBulk(':'))
        );
        assert_eq!(
            parse(b"*1\r\n$1\r\nabc\r\n"),
            Err(ProtocolError::BulkUnterminated)
        );
        let small = Limits {
            max_bulk: 4,
            max_args: 2,
            max_inline: 8,
        };
        let refused = |bytes: &[u8]| next_request(&mut BytesMut::from(bytes), &small);
        assert_eq!(refused(b"*3\r\n"), Err(ProtocolError::MultibulkLength));
        assert_eq!(refused(b"*1\r\n$5\r\n"), Err(ProtocolError::BulkLength));
        assert_eq!(refused(b"PINGPINGPING"), Err(ProtocolError::InlineTooBig));
        assert_eq!(
            ProtocolError::MultibulkLength.to_string(),
            "Protocol error: invalid multibulk length"
        );
    }

    #[test]
    fn replies_are_redis_bytes() {
        let mut out = BytesMut::new();
        Reply::Array(vec![
            Reply::Simple("OK"),
            Reply::err("no\r\nline"),
            Reply::Integer(-3),
            Reply::Bulk(None),
            Reply::bulk("v"),
        ])
        .encode(&mut out);
        assert_eq!(
            &out[..],
            b"*5\r\n+OK\r\n-ERR no  line\r\n:-3\r\n$-1\r\n$1\r\nv\r\n"
        );
    }

    #[test]
    fn output_sends_large_values_uncopied_and_the_same_bytes() {
        let large = Bytes::from(vec![7u8; UNCOPIED_VALUE]);
        let replies = [
            Reply::Simple("OK"),
            Reply::Array(vec![
                Reply::bulk(large.clone()),
                Reply::bulk("small"),
                Reply::bulk(large.clone()),
            ]),
            Reply::Integer(1),
        ];
        let (mut copied, mut output) = (BytesMut::new(), Output::default());
        for reply in &replies {
            reply.encode_in(&mut copied, false);
            reply.encode_to(&mut output, false);
        }
        let parts = output.take();
        assert!(output.is_empty());
        assert_eq!(parts.concat(), copied.to_vec());
        // The large value twice, each its own part and the very same bytes.
        let uncopied = parts
            .iter()
            .filter(|p| p.as_ptr() == large.as_ptr())
            .count();
        assert_eq!((parts.len(), uncopied), (5, 2));
    }

    proptest! {
        /// Any bytes: a request, a wait, or a protocol error; never a panic, and a
        /// request taken leaves the rest of the buffer.
        #[test]
        fn any_bytes_parse_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut buf = BytesMut::from(&bytes[..]);
            let before = buf.len();
            if let Ok(Some(_)) = next_request(&mut buf, &Limits::default()) {
                prop_assert!(buf.len() < before);
            }
        }

        /// Any arguments, framed as clients frame them, come back as they were.
        #[test]
        fn framed_arguments_round_trip(args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 1..8)) {
            let mut buf = BytesMut::new();
            Reply::Array(args.iter().map(|a| Reply::bulk(a.clone())).collect()).encode(&mut buf);
            let parsed = next_request(&mut buf, &Limits::default()).unwrap().unwrap();
            prop_assert_eq!(parsed.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), args);
        }
    }
}
