//! The trace reader: parse errors by line, chaining, and the row check under each policy.

use super::*;
use proptest::strategy::{Just, Strategy};

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

/// The scan's reading of `text`: the row and its hash ids, `None` where it gives up.
fn scanned(text: &str) -> Option<(row::Row, Vec<u64>)> {
    let mut ids = Vec::new();
    row::scan_row(text, &mut ids).map(|row| (row, ids))
}

#[test]
fn the_row_scan_reads_the_usual_form_and_leaves_the_rest_to_serde() {
    let usual = [
        "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1, 2]}",
        "{\"timestamp\":3,\"input_length\":10,\"output_length\":5,\"hash_ids\":[]}\n",
        " { \"hash_ids\" : [ 7 ,\t8 ] ,\r\n \"output_length\":5, \"input_length\":600, \"timestamp\":2 } \r\n",
        "{\"timestamp\":1,\"input_length\":1,\"output_length\":1,\"hash_ids\":[9999999999999999999]}",
    ];
    for text in usual {
        let read = scanned(text);
        assert!(read.is_some(), "{text:?}");
        assert_eq!(read, row::serde_row(text).ok(), "{text:?}");
    }
    // Left to serde, which reads some (20 digits, an unknown field, an escaped key) and
    // refuses the rest (past u64, signs, fractions, exponents, leading zeros, a field
    // twice or missing, other types, malformed text).
    let fields = "\"input_length\":1,\"output_length\":1";
    let read_by_serde = [
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[18446744073709551615]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[1],\"extra\":2}}"),
        format!("{{\"time\\u0073tamp\":1,{fields},\"hash_ids\":[1]}}"),
    ];
    let refused = [
        format!("{{\"timestamp\":-0,{fields},\"hash_ids\":[1]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[18446744073709551616]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[-1]}}"),
        format!("{{\"timestamp\":1.0,{fields},\"hash_ids\":[1]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[1e3]}}"),
        format!("{{\"timestamp\":01,{fields},\"hash_ids\":[1]}}"),
        format!("{{\"timestamp\":1,\"timestamp\":1,{fields},\"hash_ids\":[1]}}"),
        format!("{{{fields},\"hash_ids\":[1]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[\"1\"]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[1,]}}"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[1]}} x"),
        format!("{{\"timestamp\":1,{fields},\"hash_ids\":[1]"),
    ];
    let mut ids = Vec::new();
    for text in &read_by_serde {
        assert_eq!(scanned(text), None, "{text}");
        let read = row::Row::parse(text, &mut ids).map(|row| (row, ids.clone()));
        assert_eq!(read.ok(), row::serde_row(text).ok(), "{text}");
        assert!(row::serde_row(text).is_ok(), "{text}");
    }
    assert_eq!(ids, [1]);
    for text in &refused {
        assert_eq!(scanned(text), None, "{text}");
        assert!(row::Row::parse(text, &mut ids).is_err(), "{text}");
    }
}

#[test]
fn a_row_the_scan_leaves_is_read_as_serde_reads_it() {
    // An exponent is no hash id: serde refuses the row with its own error, on its line.
    let lines = format!(
        "{}{}",
        row(0, 10, &[1]),
        "{\"timestamp\":1,\"input_length\":10,\"output_length\":5,\"hash_ids\":[1e0]}\n"
    );
    let file = TraceFile::new("exponent", &lines);
    let error = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap_err();
    assert!(
        matches!(error, TraceError::Parse { line: 2, .. }),
        "{error}"
    );
    // With a field the trace format does not have, the row is serde's and reads the same.
    let extra =
        "{\"hash_ids\":[3,4],\"output_length\":5,\"input_length\":600,\"timestamp\":2,\"x\":1}\n";
    let file = TraceFile::new("extra", extra);
    let read = read_mooncake_trace(&file.path, TraceCheck::strict(512)).unwrap();
    let plain = TraceFile::new("plain", &row(2, 600, &[3, 4]));
    let expected = read_mooncake_trace(&plain.path, TraceCheck::strict(512)).unwrap();
    assert_eq!(read, expected);
}

proptest::proptest! {
    /// Wherever the scan reads a line, serde reads the same row from it: lines made of
    /// the format's own pieces, spaced, ordered, repeated and broken at random.
    #[test]
    fn the_row_scan_agrees_with_serde(
        pieces in proptest::collection::vec(
            proptest::prop_oneof![
                Just("{".to_string()),
                Just("}".to_string()),
                Just(",".to_string()),
                Just(":".to_string()),
                Just("[".to_string()),
                Just("]".to_string()),
                Just("\"timestamp\"".to_string()),
                Just("\"input_length\"".to_string()),
                Just("\"output_length\"".to_string()),
                Just("\"hash_ids\"".to_string()),
                Just("\"x\"".to_string()),
                "[ \t\r\n]{1,2}",
                "-?[0-9]{1,21}(\\.[0-9])?(e[0-9])?",
            ],
            0..24,
        )
    ) {
        let text = pieces.concat();
        if let Some(read) = scanned(&text) {
            proptest::prop_assert_eq!(row::serde_row(&text).ok(), Some(read), "{:?}", text);
        }
    }

    /// Rows as a writer would write them, in any field order and spacing, some with a
    /// number no writer of the format writes: the plain ones are the scan's, and
    /// wherever it reads one it reads what serde reads.
    #[test]
    fn the_scan_reads_rows_however_written(
        numbers in proptest::collection::vec(
            proptest::prop_oneof![
                12 => (0u64..=9_999_999_999_999_999_999).prop_map(|n| n.to_string()),
                1 => "-?0[0-9]{1,3}|[0-9]{20,21}|-?[0-9]{1,3}(\\.[0-9]|e[0-9]|E-1)",
            ],
            3..23,
        ),
        order in proptest::sample::subsequence(vec![0usize, 1, 2, 3], 4).prop_shuffle(),
        space in "[ \t\r\n]{0,2}",
    ) {
        let names = ["timestamp", "input_length", "output_length"];
        let list = numbers[3..].join(&format!(",{space}"));
        let fields: Vec<String> = order
            .iter()
            .map(|&k| match k {
                3 => format!("\"hash_ids\"{space}:{space}[{space}{list}{space}]"),
                k => format!("\"{}\":{space}{}", names[k], numbers[k]),
            })
            .collect();
        let text = format!("{space}{{{space}{}{space}}}{space}\n", fields.join(&format!("{space},{space}")));
        let plain = numbers.iter().all(|n| {
            n.bytes().all(|b| b.is_ascii_digit()) && n.len() <= 19 && (n.len() == 1 || !n.starts_with('0'))
        });
        let read = scanned(&text);
        proptest::prop_assert_eq!(read.is_some(), plain, "{:?}", text);
        if read.is_some() {
            proptest::prop_assert_eq!(read, row::serde_row(&text).ok());
        }
    }
}
