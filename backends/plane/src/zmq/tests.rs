//! Frame checks of live messages and replay replies.

use super::*;
use crate::wire::frames::END_OF_REPLAY;

fn frames(parts: &[&[u8]]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.to_vec()).collect()
}

#[test]
fn a_live_message_is_topic_sequence_payload() {
    let batch = decode_live(frames(&[b"kv", &7u64.to_be_bytes(), b"\x93"])).unwrap();
    assert_eq!(batch.topic, b"kv");
    assert_eq!(batch.seq, 7);
    assert_eq!(batch.payload, b"\x93");
    assert!(!batch.replayed);
}

#[test]
fn live_messages_with_other_shapes_are_typed_errors() {
    assert!(matches!(
        decode_live(frames(&[b"", b"\x93"])),
        Err(FrameError::FrameCount { frames: 2, .. })
    ));
    assert!(matches!(
        decode_live(frames(&[b"", b"", b"", b""])),
        Err(FrameError::FrameCount { frames: 4, .. })
    ));
    assert_eq!(
        decode_live(frames(&[b"", &[0; 4], b"\x93"])),
        Err(FrameError::SequenceWidth(4))
    );
    assert_eq!(
        decode_live(frames(&[b"", &[0; 4], b"\x93"]))
            .unwrap_err()
            .reason(),
        "sequence_width"
    );
}

#[test]
fn replay_replies_come_with_or_without_the_topic() {
    let with = decode_replay(frames(&[b"", b"kv", &3u64.to_be_bytes(), b"p"])).unwrap();
    assert_eq!(
        (with.topic.as_slice(), with.seq, with.payload.as_slice()),
        (&b"kv"[..], 3, &b"p"[..])
    );
    assert!(with.replayed);
    let legacy = decode_replay(frames(&[b"", &3u64.to_be_bytes(), b"p"])).unwrap();
    assert_eq!((legacy.topic.len(), legacy.seq), (0, 3));
    let end = decode_replay(frames(&[b"", &END_OF_REPLAY.to_be_bytes(), b""])).unwrap();
    assert_eq!(end.seq, END_OF_REPLAY);
    assert_eq!(
        decode_replay(frames(&[b"x", &3u64.to_be_bytes(), b"p"])),
        Err(FrameError::Delimiter)
    );
    assert!(matches!(
        decode_replay(frames(&[b""])),
        Err(FrameError::FrameCount { frames: 1, .. })
    ));
}

mod properties {
    //! The frame decoders are total: any frames give a batch or a typed error.
    use super::super::*;
    use proptest::prelude::*;

    fn frames() -> impl Strategy<Value = Vec<Vec<u8>>> {
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..24), 0..6)
    }

    proptest! {
        #[test]
        fn live_and_replay_decoders_never_panic(frames in frames()) {
            if let Ok(batch) = decode_live(frames.clone()) {
                prop_assert_eq!(frames.len(), 3);
                prop_assert_eq!(batch.seq.to_be_bytes().to_vec(), frames[1].clone());
            }
            if let Ok(batch) = decode_replay(frames.clone()) {
                prop_assert!(frames[0].is_empty());
                prop_assert!(batch.replayed);
            }
        }

        #[test]
        fn a_live_message_round_trips(topic in prop::collection::vec(any::<u8>(), 0..16),
                                      seq in any::<u64>(),
                                      payload in prop::collection::vec(any::<u8>(), 0..64)) {
            let batch = decode_live(vec![topic.clone(), seq.to_be_bytes().to_vec(), payload.clone()]).unwrap();
            prop_assert_eq!((batch.topic, batch.seq, batch.payload), (topic, seq, payload));
        }
    }
}
