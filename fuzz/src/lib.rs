//! The bodies of kvtwin's fuzz targets and their seed corpus, one function per decoder
//! that reads bytes from outside the process: vLLM / SGLang ZMQ frames, Dynamo's NATS
//! payloads (JSON events and msgpack envelopes), MRDN frames, scenario RON, Mooncake trace
//! lines, the router's HTTP request bodies, the `/v1/stream` SSE body a client reads, and
//! the OpenAI request bodies and answers the router's front door reads, and the shared
//! store's Redis requests and its records on disk.
//!
//! Owns: [`TARGETS`] (name → body), the frame split every multi-frame target shares
//! ([`split_frames`], [`join_frames`]) and [`seeds`] (a corpus from the project's own
//! encoders, so the fuzzer starts from valid messages and mutates them).
//! Never: accept a panic, or a decoded value that does not re-encode to itself where the
//! format promises a round trip (those are the bugs the targets look for).

use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{LocalBlockHash, SequenceHash, WorkerId};
use kvtwin::phase::Phase;
use kvtwin::tier::Tier;
use kvtwin_plane::service::http::app;
use kvtwin_plane::service::sse::SseParser;
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::service::stream::{StreamCursor, StreamMessage};
use kvtwin_plane::wire::engine::{
    BlockRemoved, BlockStored, EngineBatch, EngineDecoder, EngineEvent, EngineFormat,
};
use kvtwin_plane::wire::extra_keys::ExtraKey;
use kvtwin_plane::wire::frames::{LiveMessage, ReplayReply, ReplayRequest};
use kvtwin_plane::wire::{DecodeLimits, Envelope, RouterEvent};
use kvtwin_sim::mooncake::{MooncakeTraceReader, TraceCheck, TraceMismatch};
use kvtwin_sim::scenario::Scenario;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A target's body: takes one input, panics only on a bug.
pub type Body = fn(&[u8]);

/// Every target: its name (the `fuzz/targets/fuzz_targets/NAME.rs` binary) and its body.
pub const TARGETS: [(&str, Body); 11] = [
    ("engine_zmq", engine_zmq),
    ("zmq_frames", zmq_frames),
    ("nats_json", nats_json),
    ("nats_envelope", nats_envelope),
    ("mrdn_frame", mrdn_frame),
    ("scenario_ron", scenario_ron),
    ("trace_lines", trace_lines),
    ("http_route", http_route),
    ("sse_stream", sse_stream),
    ("openai_request", openai_request),
    ("store_bytes", store_bytes),
];

/// The shared store's bytes from outside: a connection's RESP2 requests, parsed one
/// after another as the server does (each one taken must consume bytes), and a record
/// read off a tier (one that decodes must re-encode to the same bytes, and read in
/// pieces into pages the same as whole).
pub fn store_bytes(data: &[u8]) {
    use kvtwin_store::record;
    use kvtwin_store::resp::{next_request, Limits};
    let limits = Limits {
        max_bulk: 1 << 16,
        max_args: 1 << 10,
        max_inline: 1 << 12,
    };
    let mut buf = bytes::BytesMut::from(data);
    loop {
        let before = buf.len();
        match next_request(&mut buf, &limits) {
            Ok(Some(_)) => assert!(buf.len() < before, "a request taken consumed nothing"),
            _ => break,
        }
    }
    let _ = record::decode_header(data);
    let whole = record::decode(bytes::Bytes::copy_from_slice(data));
    if let Ok((header, value)) = &whole {
        let again = record::encode(header.copy, &header.key, value, &header.digest);
        assert_eq!(
            &again[..],
            data,
            "a record that does not re-encode to itself"
        );
    }
    // The same bytes read as a tier's file is, in pieces into pages: the same verdict.
    let mut reader =
        record::RecordReader::new(kvtwin_store::pages::Pages::new(0), data.len() as u64);
    let piece = usize::from(data.last().copied().unwrap_or(1)).max(1);
    let read = data
        .chunks(piece)
        .try_for_each(|bytes| reader.feed(bytes))
        .and_then(|()| reader.finish());
    match (&whole, read) {
        (Ok((header, value)), Ok((read_header, read_value))) => {
            assert_eq!(
                (header, &value[..]),
                (&read_header, &read_value.to_bytes()[..])
            );
        }
        (Err(_), Err(_)) => {}
        (whole, read) => panic!("decode {whole:?} but read in pieces {read:?}"),
    }
}

/// Splits `data` into frames, each a length byte then that many bytes (the last frame
/// takes what is left): the multi-frame targets' input format.
pub fn split_frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    while let Some((&len, rest)) = data.split_first() {
        let len = usize::from(len).min(rest.len());
        frames.push(&rest[..len]);
        data = &rest[len..];
    }
    frames
}

/// The inverse of [`split_frames`] for frames under 256 bytes; a longer frame is cut.
pub fn join_frames<F: AsRef<[u8]>>(frames: &[F]) -> Vec<u8> {
    let mut out = Vec::new();
    for frame in frames {
        let frame = &frame.as_ref()[..frame.as_ref().len().min(255)];
        out.push(frame.len() as u8);
        out.extend_from_slice(frame);
    }
    out
}

/// vLLM / SGLang: the payload alone, then the three frames of a live message and of a
/// replayed one. A payload that decodes re-encodes (in the decoder's own form) to what
/// decodes the same.
pub fn engine_zmq(data: &[u8]) {
    let decoder = EngineDecoder::default();
    if let Ok(batch) = decoder.decode_payload(0, data) {
        let again = batch.to_payload(&EngineFormat::Vllm0_24.options());
        let reread = decoder.decode_payload(0, &again);
        assert!(
            reread.is_ok(),
            "a decoded batch re-encodes to bytes that decode"
        );
    }
    let frames = split_frames(data);
    let _ = decoder.decode_live(&frames);
    let _ = decoder.decode_replay(&frames);
}

/// The ZMQ frame parsers (live message, replay request, replay reply): what parses
/// re-encodes to itself.
pub fn zmq_frames(data: &[u8]) {
    let frames = split_frames(data);
    if let Ok(message) = LiveMessage::parse(&frames) {
        let again = message.to_frames();
        assert_eq!(LiveMessage::parse(&again).ok(), Some(message));
    }
    if let Ok(request) = ReplayRequest::parse(&frames) {
        assert_eq!(
            ReplayRequest::parse(&request.to_frames()).ok(),
            Some(request)
        );
    }
    if let Ok(reply) = ReplayReply::parse(&frames) {
        let again = reply.to_frames();
        assert_eq!(ReplayReply::parse(&again).ok(), Some(reply));
    }
}

/// Dynamo's NATS JSON event: what decodes re-encodes to itself.
pub fn nats_json(data: &[u8]) {
    let limits = DecodeLimits::default();
    if let Ok(event) = RouterEvent::from_json(data, &limits) {
        assert_eq!(
            RouterEvent::from_json(&event.to_json(), &limits).ok(),
            Some(event)
        );
    }
}

/// kvtwin's msgpack envelope of router events on NATS: what decodes re-encodes to itself.
pub fn nats_envelope(data: &[u8]) {
    let limits = DecodeLimits::default();
    if let Ok(envelope) = Envelope::decode(data, &limits) {
        assert_eq!(
            Envelope::decode(&envelope.to_bytes(), &limits).ok(),
            Some(envelope)
        );
    }
}

/// An MRDN frame (header, then the whole frame).
pub fn mrdn_frame(data: &[u8]) {
    let _ = kvtwin::wire::decode_header(data);
    let _ = kvtwin::wire::decode(data);
}

/// A scenario file's text.
pub fn scenario_ron(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = Scenario::parse(text, Path::new("fuzz.ron"));
    }
}

/// Mooncake trace lines under each mismatch policy: every row reads or is an error, and
/// the rows counted never exceed the rows read.
pub fn trace_lines(data: &[u8]) {
    for mismatch in [
        TraceMismatch::Error,
        TraceMismatch::Clamp,
        TraceMismatch::Extend,
    ] {
        let check = TraceCheck {
            block_tokens: 16,
            mismatch,
        };
        let cursor = std::io::Cursor::new(data.to_vec());
        let mut reader = MooncakeTraceReader::from_reader(Path::new("fuzz.jsonl"), cursor, check);
        for request in reader.by_ref() {
            if request.is_err() {
                break;
            }
        }
        let input = reader.input();
        assert!(input.mismatched_rows() <= input.rows);
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
}

/// `POST /v1/route` with `data` as its body through the router's own handlers: a 200 or
/// a 400, never a server error, and the service keeps answering.
pub fn http_route(data: &[u8]) {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt;
    let state = Arc::new(Mutex::new(RouterState::new(16)));
    RUNTIME.with(|runtime| {
        runtime.block_on(async {
            let request = Request::post("/v1/route")
                .header("content-type", "application/json")
                .body(Body::from(data.to_vec()))
                .expect("a request");
            let response = app(state.clone())
                .oneshot(request)
                .await
                .expect("infallible");
            let status = response.status();
            assert!(
                status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
                "{status}"
            );
            let workers = Request::get("/v1/workers")
                .body(Body::empty())
                .expect("a request");
            let response = app(state).oneshot(workers).await.expect("infallible");
            assert_eq!(response.status(), StatusCode::OK);
        });
    });
}

/// What the front door reads from outside: a client's OpenAI request body (for both
/// endpoints; one it accepts is forwarded as a JSON object with the client's fields but
/// the router's own `nvext`, a stream asking for its usage), and an engine's answer or stream chunk (usage, tokens).
pub fn openai_request(data: &[u8]) {
    use kvtwin_plane::service::frontend::openai::{chunk_tokens, parse, usage_of, Endpoint};
    for endpoint in [Endpoint::Completions, Endpoint::ChatCompletions] {
        let Ok(request) = parse(endpoint, data) else {
            continue;
        };
        let forwarded: serde_json::Value =
            serde_json::from_slice(&request.forward_body()).expect("the forwarded body is JSON");
        let original: serde_json::Value = serde_json::from_slice(data).expect("it parsed");
        let (Some(forwarded), Some(original)) = (forwarded.as_object(), original.as_object())
        else {
            panic!("a request body is an object");
        };
        assert!(!forwarded.contains_key("nvext"), "nvext reached the engine");
        for (field, value) in original {
            if field != "stream_options" && field != "nvext" {
                assert_eq!(forwarded.get(field), Some(value), "{field} changed");
            }
        }
        if request.stream {
            assert_eq!(
                forwarded["stream_options"]["include_usage"],
                serde_json::Value::Bool(true)
            );
        }
    }
    if let Ok(answer) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = usage_of(&answer);
        let _ = chunk_tokens(&answer);
    }
}

/// The `/v1/stream` body a client reads: the SSE parser over chunks as they might arrive
/// (split where the frame format says), and each `delta` event's data as a stream message.
pub fn sse_stream(data: &[u8]) {
    let mut parser = SseParser::new(4096);
    let mut events = Vec::new();
    for chunk in split_frames(data) {
        let _ = parser.push(chunk, &mut events);
    }
    for event in &events {
        assert!(event.data.len() <= 4096 * 2 + 1 || event.data.is_empty());
        if event.event == "delta" {
            let _ = serde_json::from_str::<StreamMessage>(&event.data);
        }
    }
}

/// The seed corpus: `(target, bytes)` pairs from the project's own encoders and files
/// (`repo` is the repository root, for the shipped scenarios).
pub fn seeds(repo: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    let stored = EngineEvent::BlockStored(BlockStored {
        block_hashes: vec![11, 12, 13],
        parent_block_hash: Some(10),
        token_ids: (0..48).collect(),
        block_size: 16,
        lora_id: None,
        medium: Some(Tier::Host),
        lora_name: Some("adapter".into()),
        extra_keys: Some(vec![
            Some(vec![
                ExtraKey::Str("adapter".into()),
                ExtraKey::Item {
                    id: "image-0".into(),
                    offset: -4,
                },
            ]),
            None,
            Some(vec![ExtraKey::Raw(vec![0xc4, 2, 0xab, 0xcd])]),
        ]),
        cache_salt: None,
        group_idx: Some(0),
        kv_cache_spec_kind: Some("full_attention".into()),
    });
    // A request's first block, salted (vLLM sends the salt in its extra keys).
    let salted = EngineEvent::BlockStored(BlockStored {
        block_hashes: vec![21],
        token_ids: (0..16).collect(),
        block_size: 16,
        extra_keys: Some(vec![Some(vec![ExtraKey::Str(
            "dynamo-cache-salt:tenant-a".into(),
        )])]),
        cache_salt: Some("tenant-a".into()),
        ..BlockStored::default()
    });
    let removed = EngineEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![12, 13],
        medium: None,
        group_idx: Some(1),
        kv_cache_spec_kind: Some("sliding_window".into()),
    });
    let batch = EngineBatch::new(
        7,
        1.5,
        vec![stored, salted, removed, EngineEvent::AllBlocksCleared],
        Some(1),
    );
    for format in EngineFormat::ALL {
        let options = format.options();
        let payload = batch.to_payload(&options);
        out.push(("engine_zmq", payload.clone()));
        let frames = batch.to_live_frames(b"kv-events", &options);
        out.push(("engine_zmq", join_frames(&frames)));
        out.push(("zmq_frames", join_frames(&frames)));
    }
    let events = [
        KvCacheEventData::Stored {
            parent_hash: Some(SequenceHash::new(5)),
            blocks: vec![
                StoredBlock {
                    block_hash: SequenceHash::new(6),
                    tokens_hash: LocalBlockHash::new(60),
                },
                StoredBlock {
                    block_hash: SequenceHash::new(7),
                    tokens_hash: LocalBlockHash::new(70),
                },
            ],
            tier: Tier::Disk,
        },
        KvCacheEventData::Removed {
            block_hashes: vec![SequenceHash::new(7)],
            tier: Tier::Device,
        },
        KvCacheEventData::Cleared,
    ];
    let router_events: Vec<RouterEvent> = events
        .into_iter()
        .enumerate()
        .map(|(i, data)| RouterEvent {
            worker_id: WorkerId::new(3),
            event: KvCacheEvent {
                event_id: i as u64,
                dp_rank: 1,
                data,
            },
        })
        .collect();
    for event in &router_events {
        out.push(("nats_json", event.to_json()));
    }
    let envelope = Envelope {
        publisher_id: 9,
        sequence: 4,
        published_at_ms: 1_700_000_000_000,
        topic: Envelope::TOPIC.to_string(),
        events: router_events,
    };
    out.push(("nats_envelope", envelope.to_bytes()));
    for (phase, body) in [
        (Phase::ThinkComplete, &b""[..]),
        (Phase::ThinkActive, b"reasoning"),
        (Phase::OutputCritical, b"answer blocks"),
    ] {
        if let Ok(frame) = kvtwin::wire::encode(phase, body) {
            out.push(("mrdn_frame", frame));
        }
    }
    if let Ok(dir) = std::fs::read_dir(repo.join("scenarios")) {
        let mut paths: Vec<_> = dir.filter_map(|e| e.ok().map(|e| e.path())).collect();
        paths.sort();
        for path in paths {
            if let Ok(text) = std::fs::read(&path) {
                out.push(("scenario_ron", text));
            }
        }
    }
    let rows = "{\"timestamp\":0,\"input_length\":40,\"output_length\":5,\"hash_ids\":[1,2,3]}\n\
                {\"timestamp\":10,\"input_length\":70,\"output_length\":9,\"hash_ids\":[1,2,3,4,5]}\n\
                \n{\"timestamp\":20,\"input_length\":64,\"output_length\":1,\"hash_ids\":[1,2]}\n";
    out.push(("trace_lines", rows.as_bytes().to_vec()));
    out.push((
        "http_route",
        br#"{"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}"#.to_vec(),
    ));
    out.push(("http_route", br#"{"local_hashes":[1,2,3]}"#.to_vec()));
    out.push((
        "http_route",
        br#"{"tokens":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],"lora_name":"a","cache_salt":"t"}"#
            .to_vec(),
    ));
    for body in [
        &br#"{"model":"tiny-llama","prompt":[1,2,3,4],"max_tokens":8,"stream":true}"#[..],
        br#"{"model":"tiny-llama","prompt":"Hello","cache_salt":"tenant-a","add_special_tokens":false}"#,
        br#"{"model":"m","prompt":[[5,6]],"stream":true,"stream_options":{"include_usage":true}}"#,
        br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":false}"#,
        br#"{"choices":[],"usage":{"prompt_tokens":256,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":224}}}"#,
        br#"{"choices":[{"index":0,"text":"x","token_ids":[5,6]},{"delta":{"content":"y"}}]}"#,
    ] {
        out.push(("openai_request", body.to_vec()));
    }
    // The first message a stream client gets from an empty router: its snapshot.
    let message = StreamCursor::new().next(&RouterState::new(16));
    if let Some(Ok(json)) = message.map(|m| serde_json::to_string(&m)) {
        let body = format!("event: delta\ndata: {json}\nid: 1\n\n: keep-alive\n\n");
        let bytes = body.as_bytes();
        let (head, tail) = bytes.split_at(bytes.len() / 2);
        out.push(("sse_stream", join_frames(&[head, tail])));
    }
    // The store: a pipelined SET and GET with a binary value, an inline PING, a record.
    out.push((
        "store_bytes",
        b"*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$4\r\na\r\nb\r\n*2\r\n$3\r\nGET\r\n$2\r\nk1\r\nPING\r\n"
            .to_vec(),
    ));
    let value = b"a value".as_slice();
    out.push((
        "store_bytes",
        kvtwin_store::record::encode(7, b"key", value, blake3::hash(value).as_bytes()).to_vec(),
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_has_seeds_and_takes_them_and_their_truncations() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let seeds = seeds(&repo);
        for (name, body) in TARGETS {
            let mine: Vec<&Vec<u8>> = seeds
                .iter()
                .filter(|(target, _)| *target == name)
                .map(|(_, bytes)| bytes)
                .collect();
            assert!(!mine.is_empty(), "{name} has no seeds");
            for seed in mine {
                body(seed);
                for cut in [
                    0,
                    1,
                    seed.len() / 3,
                    seed.len() / 2,
                    seed.len().saturating_sub(1),
                ] {
                    body(&seed[..cut.min(seed.len())]);
                }
            }
        }
    }

    #[test]
    fn frames_split_as_they_were_joined() {
        let frames: [&[u8]; 3] = [b"topic", b"", &[7u8; 9]];
        assert_eq!(split_frames(&join_frames(&frames)), frames.to_vec());
        // A length past the end takes what is left.
        assert_eq!(split_frames(&[5, 1, 2]), vec![&[1u8, 2][..]]);
    }
}
