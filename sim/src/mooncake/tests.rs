//! The trace reader: parse errors by line, chaining, and the row check under each policy.

use super::*;

/// A trace file of `lines` in a fresh folder, removed on drop.
struct TraceFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TraceFile {
    fn new(name: &str, lines: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("kvtwin-trace-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("trace.jsonl");
        std::fs::write(&path, lines).unwrap();
        Self { dir, path }
    }
}

impl Drop for TraceFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn row(timestamp: u64, input_length: u64, hash_ids: &[u64]) -> String {
    format!(
        "{{\"timestamp\":{timestamp},\"input_length\":{input_length},\"output_length\":5,\"hash_ids\":{hash_ids:?}}}\n"
    )
}

fn policy(mismatch: TraceMismatch) -> TraceCheck {
    TraceCheck {
        block_tokens: 512,
        mismatch,
    }
}

#[test]
fn a_bad_trace_line_is_an_error_naming_the_line() {
    let file = TraceFile::new("bad", &format!("{}\nnot json\n", row(0, 600, &[1, 2])));
    let error = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap_err();
    assert!(
        matches!(error, TraceError::Parse { line: 3, .. }),
        "{error}"
    );
    let file = TraceFile::new("good", &row(2, 600, &[1, 2]));
    let read = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap();
    let requests = read.requests;
    assert_eq!(
        requests[0].blocks[1].parent,
        Some(requests[0].blocks[0].sequence_hash)
    );
    assert_eq!(requests[0].blocks[1].local_hash, LocalBlockHash::new(2));
    assert_eq!(requests[0].arrival, Timestamp::from_nanos(2_000_000));
    assert_eq!(read.input.rows, 1);
    assert_eq!(read.input.mismatched_rows(), 0);
}

#[test]
fn consistent_rows_pass_at_the_edges_of_their_last_block() {
    // 1 token in one block, 512 in one, 513 in two, nothing in none.
    let lines = [
        row(0, 1, &[1]),
        row(1, 512, &[1]),
        row(2, 513, &[1, 2]),
        row(3, 0, &[]),
    ]
    .concat();
    let file = TraceFile::new("edges", &lines);
    let read = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap();
    assert_eq!(read.requests.len(), 4);
    assert_eq!(
        read.input,
        TraceInput {
            rows: 4,
            block_tokens: 512,
            ..TraceInput::default()
        }
    );
}

#[test]
fn tokens_past_the_hash_ids_are_an_error_naming_file_line_and_field() {
    let lines = [row(0, 600, &[1, 2]), "\n".into(), row(1, 1200, &[1, 2])].concat();
    let file = TraceFile::new("long", &lines);
    let error = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap_err();
    let TraceError::Mismatch {
        line,
        field,
        input_length,
        hash_ids,
        ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(
        (*line, *field, *input_length, *hash_ids),
        (3, "input_length", 1200, 2)
    );
    let message = error.to_string();
    for needle in [
        "trace.jsonl:3",
        "input_length",
        "176 tokens past",
        "--trace-mismatch",
    ] {
        assert!(message.contains(needle), "{needle}: {message}");
    }
}

#[test]
fn hash_ids_past_the_tokens_are_an_error_naming_the_field() {
    let file = TraceFile::new("ids", &row(0, 512, &[1, 2]));
    let error = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap_err();
    assert!(
        matches!(
            error,
            TraceError::Mismatch {
                line: 1,
                field: "hash_ids",
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().contains("1 hash_ids past the 1"),
        "{error}"
    );
}

#[test]
fn clamp_shrinks_what_is_long_and_counts_each_kind() {
    let lines = [
        row(0, 1200, &[1, 2]),
        row(1, 100, &[1, 2, 3]),
        row(2, 600, &[1, 2]),
    ]
    .concat();
    let file = TraceFile::new("clamp", &lines);
    let read = read_mooncake_trace(&file.path, policy(TraceMismatch::Clamp)).unwrap();
    let r = &read.requests;
    assert_eq!((r[0].input_tokens, r[0].blocks.len()), (1024, 2));
    assert_eq!((r[1].input_tokens, r[1].blocks.len()), (100, 1));
    assert_eq!((r[2].input_tokens, r[2].blocks.len()), (600, 2));
    assert_eq!(
        (
            read.input.rows,
            read.input.tokens_past_hash_ids,
            read.input.hash_ids_past_tokens
        ),
        (3, 1, 1)
    );
    assert_eq!(read.input.mismatched_rows(), 2);
}

#[test]
fn extend_grows_what_is_short_with_blocks_no_other_row_shares() {
    // Two rows with the same two hash ids and too many tokens: their made-up third and
    // fourth blocks must differ (a row's own tokens), while the first two stay shared.
    let lines = [
        row(0, 2000, &[1, 2]),
        row(1, 2000, &[1, 2]),
        row(2, 100, &[7, 8]),
    ]
    .concat();
    let file = TraceFile::new("extend", &lines);
    let read = read_mooncake_trace(&file.path, policy(TraceMismatch::Extend)).unwrap();
    let r = &read.requests;
    assert_eq!((r[0].input_tokens, r[0].blocks.len()), (2000, 4));
    assert_eq!(r[0].blocks[..2], r[1].blocks[..2]);
    assert_ne!(r[0].blocks[2], r[1].blocks[2]);
    assert_ne!(r[0].blocks[3].local_hash, r[1].blocks[3].local_hash);
    assert_eq!((r[2].input_tokens, r[2].blocks.len()), (1024, 2));
    assert_eq!(read.input.tokens_past_hash_ids, 2);
    assert_eq!(read.input.hash_ids_past_tokens, 1);
}

#[test]
fn the_streaming_reader_counts_as_it_goes() {
    let lines = [row(0, 600, &[1, 2]), row(1, 1200, &[1, 2])].concat();
    let file = TraceFile::new("stream", &lines);
    let mut reader = MooncakeTraceReader::open(&file.path, policy(TraceMismatch::Clamp)).unwrap();
    assert!(reader.next().unwrap().is_ok());
    assert_eq!(reader.input().rows, 1);
    assert!(reader.next().unwrap().is_ok());
    assert_eq!(
        (reader.input().rows, reader.input().mismatched_rows()),
        (2, 1)
    );
    assert!(reader.next().is_none());
}

#[test]
fn a_row_past_any_models_context_is_an_error_under_every_policy() {
    // The fuzzer's find: 4 x 10^16 tokens with five hash ids made `Extend` allocate a
    // block for every 512 of them.
    let lines = [
        row(0, 600, &[1, 2]),
        row(1, 40_111_111_111_111_110, &[1, 2, 3, 4, 5]),
    ]
    .concat();
    let file = TraceFile::new("huge", &lines);
    for mismatch in [
        TraceMismatch::Error,
        TraceMismatch::Clamp,
        TraceMismatch::Extend,
    ] {
        let error = read_mooncake_trace(&file.path, policy(mismatch)).unwrap_err();
        assert!(
            matches!(
                error,
                TraceError::OutOfRange {
                    line: 2,
                    field: "input_length",
                    ..
                }
            ),
            "{error}"
        );
    }
    let output = format!(
        "{{\"timestamp\":0,\"input_length\":10,\"output_length\":{},\"hash_ids\":[1]}}\n",
        MAX_ROW_TOKENS + 1
    );
    let file = TraceFile::new("long-output", &output);
    let error = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap_err();
    assert!(
        error.to_string().contains("field `output_length`"),
        "{error}"
    );
}
