//! The ZMQ frames of an engine's KV event stream and of its replay protocol (WIRE.md),
//! borrowed from the received frames, never copied.
//!
//! Owns: [`LiveMessage`] (`[topic, seq, payload]` from the engine's PUB socket),
//! [`ReplayRequest`] (`[b"", start_seq]`, what a DEALER sends the engine's ROUTER) and
//! [`ReplayReply`] (`[b"", topic, seq, payload]`, or `[b"", seq, payload]` from vLLM 0.25
//! and older, and the end marker whose seq is [`END_OF_REPLAY`]), each with its parser
//! and its frames; [`parse_sequence`] and [`sequence_frame`]; what the transport carries
//! and how its frames can fail: [`RawBatch`] (an owned batch off a socket), [`FrameError`]
//! (it converts into `WireError` with the same reasons) and [`ReplayLayout`].
//! Never: look inside a payload (`super::engine` does) or touch a socket (`crate::zmq`
//! does; its `decode_live` / `decode_replay` check the same frames on owned messages).

use super::WireError;

/// The sequence number of the replay stream's end marker.
pub const END_OF_REPLAY: u64 = u64::MAX;

/// The frames of a replay reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReplayLayout {
    /// `[b"", topic, seq, payload]` (vLLM 0.26 and later).
    #[default]
    WithTopic,
    /// `[b"", seq, payload]` (vLLM 0.25 and earlier).
    Legacy,
}

/// One batch as it travels: topic, sequence number and the msgpack payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawBatch {
    /// The topic frame (may be empty).
    pub topic: Vec<u8>,
    /// The publisher's sequence number: from 0, +1 per batch, back to 0 on a restart.
    pub seq: u64,
    /// The msgpack batch.
    pub payload: Vec<u8>,
    /// Whether it came through the replay socket rather than the live stream.
    pub replayed: bool,
}

/// A message whose frames are not a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// Not the three frames (topic, sequence, payload) of a live message, or the three or
    /// four of a replay reply.
    #[error("{frames} frames, expected {expected}")]
    FrameCount {
        /// Frames received.
        frames: usize,
        /// What was expected.
        expected: &'static str,
    },
    /// The sequence frame is not 8 bytes.
    #[error("sequence frame of {0} bytes, expected 8")]
    SequenceWidth(usize),
    /// A replay reply without its empty delimiter frame.
    #[error("replay reply without the empty delimiter frame")]
    Delimiter,
}

impl FrameError {
    /// A stable label for counters and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::FrameCount { .. } => "frame_count",
            FrameError::SequenceWidth(_) => "sequence_width",
            FrameError::Delimiter => "replay_delimiter",
        }
    }
}

/// The 8-byte big-endian sequence frame of `seq`.
pub const fn sequence_frame(seq: u64) -> [u8; 8] {
    seq.to_be_bytes()
}

/// The sequence number in an 8-byte big-endian frame.
pub fn parse_sequence(frame: &[u8]) -> Result<u64, FrameError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| FrameError::SequenceWidth(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// One message of the live stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveMessage<'a> {
    /// The topic (may be empty).
    pub topic: &'a [u8],
    /// The publisher's sequence number.
    pub seq: u64,
    /// The msgpack batch.
    pub payload: &'a [u8],
}

impl<'a> LiveMessage<'a> {
    /// Parses exactly three frames: topic, 8-byte sequence, payload.
    pub fn parse<F: AsRef<[u8]>>(frames: &'a [F]) -> Result<Self, WireError> {
        let [topic, seq, payload] = frames else {
            return Err(WireError::FrameCount {
                frames: frames.len(),
                expected: "3 (topic, sequence, payload)",
            });
        };
        Ok(Self {
            topic: topic.as_ref(),
            seq: parse_sequence(seq.as_ref())?,
            payload: payload.as_ref(),
        })
    }

    /// The message's frames.
    pub fn to_frames(&self) -> [Vec<u8>; 3] {
        [
            self.topic.to_vec(),
            sequence_frame(self.seq).to_vec(),
            self.payload.to_vec(),
        ]
    }
}

/// A request for the batches from `start_seq` on, as a DEALER sends it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayRequest {
    /// The first sequence number wanted.
    pub start_seq: u64,
}

impl ReplayRequest {
    /// Parses `[b"", start_seq]`: the frames a DEALER sends, which is also what a ROUTER
    /// receives after the peer's identity frame (the caller strips that first).
    pub fn parse<F: AsRef<[u8]>>(frames: &[F]) -> Result<Self, WireError> {
        let [delimiter, seq] = frames else {
            return Err(WireError::FrameCount {
                frames: frames.len(),
                expected: "2 (delimiter, start sequence)",
            });
        };
        if !delimiter.as_ref().is_empty() {
            return Err(WireError::ReplayDelimiter);
        }
        Ok(Self {
            start_seq: parse_sequence(seq.as_ref())?,
        })
    }

    /// The request's frames.
    pub fn to_frames(&self) -> [Vec<u8>; 2] {
        [Vec::new(), sequence_frame(self.start_seq).to_vec()]
    }
}

/// One reply of the replay protocol: a buffered batch, or the end marker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayReply<'a> {
    /// The topic; none in the legacy layout (vLLM 0.25 and older), which has no topic
    /// frame.
    pub topic: Option<&'a [u8]>,
    /// The batch's sequence number; [`END_OF_REPLAY`] for the end marker.
    pub seq: u64,
    /// The msgpack batch; empty in the end marker.
    pub payload: &'a [u8],
}

impl<'a> ReplayReply<'a> {
    /// Parses a reply as a DEALER receives it: `[b"", topic, seq, payload]` or
    /// `[b"", seq, payload]`.
    pub fn parse<F: AsRef<[u8]>>(frames: &'a [F]) -> Result<Self, WireError> {
        let (delimiter, topic, seq, payload) = match frames {
            [delimiter, topic, seq, payload] => (delimiter, Some(topic.as_ref()), seq, payload),
            [delimiter, seq, payload] => (delimiter, None, seq, payload),
            _ => {
                return Err(WireError::FrameCount {
                    frames: frames.len(),
                    expected: "3 or 4 (delimiter, [topic,] sequence, payload)",
                })
            }
        };
        if !delimiter.as_ref().is_empty() {
            return Err(WireError::ReplayDelimiter);
        }
        Ok(Self {
            topic,
            seq: parse_sequence(seq.as_ref())?,
            payload: payload.as_ref(),
        })
    }

    /// The end marker in `layout` (empty topic, empty payload).
    pub const fn end_marker(layout: ReplayLayout) -> ReplayReply<'static> {
        ReplayReply {
            topic: match layout {
                ReplayLayout::WithTopic => Some(b""),
                ReplayLayout::Legacy => None,
            },
            seq: END_OF_REPLAY,
            payload: b"",
        }
    }

    /// Whether this is the end marker.
    pub const fn is_end(&self) -> bool {
        self.seq == END_OF_REPLAY
    }

    /// The layout the reply came in.
    pub const fn layout(&self) -> ReplayLayout {
        match self.topic {
            Some(_) => ReplayLayout::WithTopic,
            None => ReplayLayout::Legacy,
        }
    }

    /// The reply's frames, in its layout.
    pub fn to_frames(&self) -> Vec<Vec<u8>> {
        let mut frames = Vec::with_capacity(4);
        frames.push(Vec::new());
        if let Some(topic) = self.topic {
            frames.push(topic.to_vec());
        }
        frames.push(sequence_frame(self.seq).to_vec());
        frames.push(self.payload.to_vec());
        frames
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_messages_are_three_frames_with_a_big_endian_sequence() {
        let frames: [&[u8]; 3] = [b"kv", &[0, 0, 0, 0, 0, 0, 1, 2], b"\x92"];
        let message = LiveMessage::parse(&frames).unwrap();
        assert_eq!(
            message,
            LiveMessage {
                topic: b"kv",
                seq: 258,
                payload: b"\x92"
            }
        );
        assert_eq!(LiveMessage::parse(&message.to_frames()).unwrap(), message);
        assert_eq!(
            LiveMessage::parse(&frames[..2]).unwrap_err().reason(),
            "frame_count"
        );
        let short: [&[u8]; 3] = [b"", &[1, 2, 3], b""];
        assert_eq!(
            LiveMessage::parse(&short),
            Err(WireError::BadSequenceFrame { len: 3 })
        );
    }

    #[test]
    fn replay_requests_and_replies_round_trip_in_both_layouts() {
        let request = ReplayRequest { start_seq: 41 };
        let frames = request.to_frames();
        assert_eq!(frames[0], b"");
        assert_eq!(frames[1], 41u64.to_be_bytes());
        assert_eq!(ReplayRequest::parse(&frames).unwrap(), request);
        let bad: [&[u8]; 2] = [b"x", &[0; 8]];
        assert_eq!(ReplayRequest::parse(&bad), Err(WireError::ReplayDelimiter));
        let with_topic = ReplayReply {
            topic: Some(b"kv"),
            seq: 7,
            payload: b"p",
        };
        let legacy = ReplayReply {
            topic: None,
            ..with_topic
        };
        for reply in [with_topic, legacy] {
            let frames = reply.to_frames();
            assert_eq!(ReplayReply::parse(&frames).unwrap(), reply);
            assert!(!reply.is_end());
        }
        assert_eq!(with_topic.to_frames().len(), 4);
        assert_eq!(legacy.layout(), ReplayLayout::Legacy);
        for layout in [ReplayLayout::WithTopic, ReplayLayout::Legacy] {
            let end = ReplayReply::end_marker(layout);
            let frames = end.to_frames();
            let parsed = ReplayReply::parse(&frames).unwrap();
            assert!(parsed.is_end() && parsed.payload.is_empty());
            assert_eq!(parsed.layout(), layout);
        }
        let five: [&[u8]; 5] = [b"", b"", b"", b"", b""];
        assert!(matches!(
            ReplayReply::parse(&five),
            Err(WireError::FrameCount { frames: 5, .. })
        ));
    }
}
