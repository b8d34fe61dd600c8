//! Unit tests of the profile tables: interpolation on hand-made tables, the files
//! against the keys and shapes Dynamo's planner reads, readers that never panic, and
//! profiles measured on small scenarios.

use super::files::{decode_to_npz, prefill_to_npz};
use super::npy::{parse_header, read_npz};
use super::*;
use std::path::Path;

fn prefill_table() -> PrefillProfile {
    PrefillProfile {
        isl: vec![1000.0, 100.0, 500.0],
        ttft_ms: vec![100.0, 10.0, 50.0],
        thpt_per_gpu: vec![10_000.0, 10_000.0, 10_000.0],
    }
}

/// Two context lengths, 1,000 and 2,000 tokens; ITL rising with usage.
fn decode_table() -> DecodeProfile {
    DecodeProfile {
        max_kv_tokens: 100_000,
        kv_usage: vec![0.1, 0.5, 0.9, 0.1, 0.5],
        context_length: vec![1000.0, 1000.0, 1000.0, 2000.0, 2000.0],
        itl_ms: vec![10.0, 20.0, 40.0, 12.0, 30.0],
        thpt_per_gpu: vec![1000.0, 5000.0, 4500.0, 500.0, 1700.0],
    }
}

#[test]
fn prefill_interpolates_linearly_between_sorted_lengths_and_clamps_beyond() {
    let table = prefill_table();
    assert_eq!(table.ttft_ms_at(100.0), 10.0);
    assert_eq!(table.ttft_ms_at(300.0), 30.0);
    assert_eq!(table.ttft_ms_at(750.0), 75.0);
    assert_eq!(table.ttft_ms_at(1.0), 10.0);
    assert_eq!(table.ttft_ms_at(1e9), 100.0);
    assert_eq!(table.thpt_per_gpu_at(640.0), 10_000.0);
    let empty = PrefillProfile {
        isl: vec![],
        ttft_ms: vec![],
        thpt_per_gpu: vec![],
    };
    assert!(empty.ttft_ms_at(5.0).is_nan());
}

#[test]
fn decode_itl_is_linear_in_usage_per_context_and_blended_between_contexts() {
    let table = decode_table();
    assert_eq!(table.itl_ms_at(0.3, 1000.0), 15.0);
    assert_eq!(table.itl_ms_at(0.9, 2000.0), 30.0); // clamped at that curve's end
    assert_eq!(table.itl_ms_at(0.0, 1000.0), 10.0);
    // Halfway between the contexts, at usage 0.5: (20 + 30) / 2.
    assert_eq!(table.itl_ms_at(0.5, 1500.0), 25.0);
    // Beyond the profiled contexts, the nearest curve alone.
    assert_eq!(table.itl_ms_at(0.5, 100.0), 20.0);
    assert_eq!(table.itl_ms_at(0.5, 9000.0), 30.0);
}

#[test]
fn best_throughput_is_the_highest_within_the_itl_target_including_crossings() {
    let table = decode_table();
    // At 1,000 tokens: 20 ms allows usage 0.5 (5,000 tok/s).
    assert_eq!(table.best_thpt_per_gpu(20.0, 1000.0), 5000.0);
    // 30 ms: the segment 0.5→0.9 crosses it halfway: 4,750, below the point at 0.5.
    assert_eq!(table.best_thpt_per_gpu(30.0, 1000.0), 5000.0);
    // At 2,000 tokens, 21 ms crosses 12→30 halfway: 500 + 0.5 × 1,200.
    assert_eq!(table.best_thpt_per_gpu(21.0, 2000.0), 1100.0);
    // Between the contexts, the two answers blended: (5,000 + 1,100) / 2.
    assert_eq!(table.best_thpt_per_gpu(21.0, 1500.0), 3050.0);
    // Nothing meets 1 ms: the lowest usage's throughput, as Dynamo's planner answers.
    assert_eq!(table.best_thpt_per_gpu(1.0, 1000.0), 1000.0);
    assert!(DecodeProfile {
        max_kv_tokens: 1,
        kv_usage: vec![],
        context_length: vec![],
        itl_ms: vec![],
        thpt_per_gpu: vec![],
    }
    .best_thpt_per_gpu(10.0, 10.0)
    .is_nan());
}

#[test]
fn written_tables_read_back_equal_from_npz_and_from_the_json_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let written = write_profiles(dir.path(), &prefill_table(), &decode_table()).unwrap();
    assert_eq!(written.len(), 4);
    for file in [PREFILL_NPZ, DECODE_NPZ, PREFILL_JSON, DECODE_JSON] {
        assert!(dir.path().join(file).is_file(), "{file}");
    }
    let (prefill, decode) = load_profiles(dir.path()).unwrap();
    assert_eq!((prefill, decode), (prefill_table(), decode_table()));
    // Without the .npz files the planner reads the JSON, and so does this reader.
    std::fs::remove_file(dir.path().join(PREFILL_NPZ)).unwrap();
    std::fs::remove_file(dir.path().join(DECODE_NPZ)).unwrap();
    let (prefill, decode) = load_profiles(dir.path()).unwrap();
    assert_eq!((prefill, decode), (prefill_table(), decode_table()));
    // Neither: the error names the .npz the planner looks for first.
    std::fs::remove_file(dir.path().join(PREFILL_JSON)).unwrap();
    let error = load_profiles(dir.path()).unwrap_err().to_string();
    assert!(error.contains(PREFILL_NPZ), "{error}");
}

/// Every entry of an `.npz` with its parsed header and data length.
fn entries(bytes: &[u8]) -> Vec<(String, String, bool, Vec<usize>, usize)> {
    read_npz(bytes)
        .unwrap()
        .into_iter()
        .map(|(key, npy)| {
            assert_eq!(&npy[..8], b"\x93NUMPY\x01\x00", "{key}: version 1.0");
            let len = usize::from(u16::from_le_bytes([npy[8], npy[9]]));
            assert_eq!((10 + len) % 64, 0, "{key}: data aligned to 64 bytes");
            let header = parse_header(std::str::from_utf8(&npy[10..10 + len]).unwrap()).unwrap();
            let data = npy.len() - 10 - len;
            (key, header.descr, header.fortran_order, header.shape, data)
        })
        .collect()
}

#[test]
fn npz_files_hold_exactly_the_arrays_dynamos_planner_reads_in_its_dtypes_and_shapes() {
    let prefill = entries(&prefill_to_npz(&prefill_table()).unwrap());
    let mut keys: Vec<&str> = prefill.iter().map(|e| e.0.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["prefill_isl", "prefill_thpt_per_gpu", "prefill_ttft"]
    );
    for (key, descr, fortran, shape, data) in &prefill {
        assert_eq!((descr.as_str(), *fortran), ("<f8", false), "{key}");
        assert_eq!((shape.as_slice(), *data), (&[3][..], 24), "{key}");
    }
    let decode = entries(&decode_to_npz(&decode_table()).unwrap());
    let mut keys: Vec<&str> = decode.iter().map(|e| e.0.as_str()).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "max_kv_tokens",
            "x_kv_usage",
            "y_context_length",
            "z_itl",
            "z_thpt_per_gpu"
        ]
    );
    for (key, descr, fortran, shape, data) in &decode {
        assert!(!fortran, "{key}");
        if key == "max_kv_tokens" {
            // np.array([max_kv_tokens]): read by the planner as raw_data[...][0].
            assert_eq!(
                (descr.as_str(), shape.as_slice(), *data),
                ("<i8", &[1][..], 8)
            );
        } else {
            assert_eq!(
                (descr.as_str(), shape.as_slice(), *data),
                ("<f8", &[5][..], 40)
            );
        }
    }
}

#[test]
fn json_files_hold_exactly_the_keys_dynamos_planner_reads() {
    let dir = tempfile::tempdir().unwrap();
    write_profiles(dir.path(), &prefill_table(), &decode_table()).unwrap();
    let read = |file: &str| -> serde_json::Map<String, serde_json::Value> {
        let text = std::fs::read_to_string(dir.path().join(file)).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let prefill = read(PREFILL_JSON);
    let mut keys: Vec<&str> = prefill.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut expected = PREFILL_KEYS.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    assert!(prefill
        .values()
        .all(|v| v.as_array().is_some_and(|a| a.len() == 3)));
    let decode = read(DECODE_JSON);
    let mut keys: Vec<&str> = decode.keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut expected = DECODE_KEYS.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected);
    // The planner reads int(data["max_kv_tokens"]): a plain integer.
    assert_eq!(decode["max_kv_tokens"], serde_json::json!(100_000));
}

#[test]
fn bad_tables_are_errors_naming_the_file_and_the_field() {
    let path = Path::new("d/raw_data.npz");
    let mut decode = decode_table();
    decode.z_shorten();
    let bytes = decode_to_npz(&decode).unwrap();
    let error = decode_from_npz(&bytes, path).unwrap_err();
    assert!(
        matches!(
            &error,
            ProfileError::Length {
                field: "z_itl",
                len: 4,
                expected: 5,
                ..
            }
        ),
        "{error}"
    );
    assert!(
        error.to_string().starts_with("d/raw_data.npz: z_itl"),
        "{error}"
    );

    let mut decode = decode_table();
    decode.thpt_per_gpu[2] = f64::NAN;
    let bytes = decode_to_npz(&decode).unwrap();
    let error = decode_from_npz(&bytes, path).unwrap_err();
    assert!(
        matches!(
            error,
            ProfileError::NotFinite {
                field: "z_thpt_per_gpu",
                index: 2,
                ..
            }
        ),
        "{error}"
    );
    // Nor does the writer write it.
    let dir = tempfile::tempdir().unwrap();
    assert!(write_profiles(dir.path(), &prefill_table(), &decode).is_err());
    assert!(!dir.path().join(PREFILL_NPZ).exists());

    let json = br#"{"prefill_isl": [1, 2], "prefill_ttft": [1, 2]}"#;
    let error = prefill_from_json(json, Path::new("p.json")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "p.json: no prefill_thpt_per_gpu (Dynamo's planner reads it)"
    );
    let json =
        br#"{"prefill_isl": [1, "x"], "prefill_ttft": [1, 2], "prefill_thpt_per_gpu": [1, 2]}"#;
    let error = prefill_from_json(json, Path::new("p.json")).unwrap_err();
    assert!(
        matches!(
            error,
            ProfileError::Shape {
                field: "prefill_isl",
                ..
            }
        ),
        "{error}"
    );
    let json = br#"{"max_kv_tokens": 0.5, "x_kv_usage": [0.1], "y_context_length": [1],
        "z_itl": [1], "z_thpt_per_gpu": [1]}"#;
    let error = decode_from_json(json, Path::new("d.json")).unwrap_err();
    assert!(
        matches!(
            error,
            ProfileError::NotFinite {
                field: "max_kv_tokens",
                ..
            }
        ),
        "{error}"
    );
    // One-element list, as the npz form has it: accepted.
    let json = br#"{"max_kv_tokens": [64], "x_kv_usage": [0.1], "y_context_length": [1],
        "z_itl": [1], "z_thpt_per_gpu": [1]}"#;
    assert_eq!(
        decode_from_json(json, Path::new("d.json"))
            .unwrap()
            .max_kv_tokens,
        64
    );
    let error = prefill_from_npz(&bytes, Path::new("p.npz")).unwrap_err();
    assert!(
        matches!(
            error,
            ProfileError::Missing {
                field: "prefill_isl",
                ..
            }
        ),
        "{error}"
    );
}

impl DecodeProfile {
    /// Drops the last ITL (a table with unequal arrays, for the tests).
    fn z_shorten(&mut self) {
        self.itl_ms.pop();
    }
}

proptest::proptest! {
    #[test]
    fn reading_arbitrary_bytes_as_a_profile_never_panics(bytes in proptest::collection::vec(0u8..=255, 0..400)) {
        let path = Path::new("fuzz");
        let _ = prefill_from_npz(&bytes, path);
        let _ = decode_from_npz(&bytes, path);
        let _ = prefill_from_json(&bytes, path);
        let _ = decode_from_json(&bytes, path);
    }

    #[test]
    fn reading_a_corrupted_npz_never_panics(at in 0usize..4096, byte in 0u8..=255, cut in 0usize..4096) {
        let mut bytes = decode_to_npz(&decode_table()).unwrap();
        let at = at % bytes.len();
        bytes[at] = byte;
        bytes.truncate(cut.max(1));
        let _ = decode_from_npz(&bytes, Path::new("fuzz.npz"));
    }

    #[test]
    fn reading_arbitrary_json_text_never_panics(text in r#"\{("[a-z_]{1,20}": ?(\[[-0-9., e"]{0,20}\]|[-0-9.e]{1,6}), ?){0,6}\}"#) {
        let _ = prefill_from_json(text.as_bytes(), Path::new("fuzz.json"));
        let _ = decode_from_json(text.as_bytes(), Path::new("fuzz.json"));
    }
}

/// One worker on the roofline H100 with Llama-3-8B (or `compute`), 64-token blocks, 2,000
/// device blocks (128,000 KV tokens).
fn roofline_scenario(compute: &str) -> Scenario {
    let text = format!(
        r#"(
        name: "profile", seed: 1,
        hardware: (
            name: "h", pcie_bytes_per_s: 55000000000, pcie_latency_ns: 5000,
            nvme_read_bytes_per_s: 6500000000, nvme_write_bytes_per_s: 3500000000,
            nvme_latency_ns: 80000, nic_bytes_per_s: 50000000000, nic_latency_ns: 10000,
            prefill_ns_per_token: 1, decode_ns_per_token: 1,
            compute: Some(Builtin("{compute}")),
            max_inflight_transfers: 64,
        ),
        worker: (
            block_size_tokens: 64, bytes_per_block: 8388608, onboard: CostAware,
            max_inflight_transfers: 64,
            tiers: [(tier: Device, capacity_blocks: 2000)],
        ),
        cluster: (workers: 3, disaggregation: Some((prefill_workers: 1))),
        faults: [(at_ms: 0, kind: WorkerCrash(worker: 0, down_ms: 100000))],
        workload: MooncakeTrace(path: "unused.jsonl"),
    )"#
    );
    Scenario::parse(&text, Path::new("profile.ron")).unwrap()
}

#[test]
fn prefill_profile_grows_with_input_length_on_one_replica_ignoring_cluster_and_faults() {
    let scenario = roofline_scenario("h100-llama3-8b");
    let profile = profile_prefill(&scenario, &[4096, 256, 1024, 1024, 200_000]).unwrap();
    // Sorted, deduplicated, and the length that does not fit the device left out.
    assert_eq!(profile.isl, [256.0, 1024.0, 4096.0]);
    assert!(
        profile.ttft_ms.windows(2).all(|w| w[0] < w[1]),
        "{profile:?}"
    );
    for i in 0..3 {
        let expected = profile.isl[i] / (profile.ttft_ms[i] / 1e3);
        assert!((profile.thpt_per_gpu[i] - expected).abs() < 1e-6 * expected);
    }
    // Four GPUs in tensor parallel: throughput per GPU is the replica's over four.
    let tp4 = profile_prefill(&roofline_scenario("h100x4-llama3-70b"), &[1024]).unwrap();
    let replica = 1024.0 / (tp4.ttft_ms[0] / 1e3);
    assert!((tp4.thpt_per_gpu[0] - replica / 4.0).abs() < 1e-6 * replica);
    assert!(matches!(
        profile_prefill(&scenario, &[0]),
        Err(ProfileError::BadGrid { grid: "isl", .. })
    ));
    assert!(matches!(
        profile_prefill(&scenario, &[1 << 20]),
        Err(ProfileError::NoPoints { .. })
    ));
}

#[test]
fn decode_profile_itl_grows_with_kv_usage_and_records_the_usage_reached() {
    let scenario = roofline_scenario("h100-llama3-8b");
    let profile = profile_decode(&scenario, &[1024, 200_000], &[0.1, 0.3, 0.9]).unwrap();
    assert_eq!(profile.max_kv_tokens, 128_000);
    // 200,000 tokens do not fit: only the 1,024-token curve.
    assert!(profile.context_length.iter().all(|c| *c == 1024.0));
    // 0.1 × 128,000 / 1,024 = 12.5 → 13 sequences; 0.3 → 38; 0.9 → 113 (under 256
    // sequences, and 113 × 17 blocks fit 2,000).
    let batches: Vec<f64> = profile
        .kv_usage
        .iter()
        .map(|u| (u * 128_000.0 / 1024.0).round())
        .collect();
    assert_eq!(batches, [13.0, 38.0, 113.0]);
    assert!(
        profile.itl_ms.windows(2).all(|w| w[0] < w[1]),
        "{profile:?}"
    );
    assert!(
        profile.thpt_per_gpu.windows(2).all(|w| w[0] < w[1]),
        "{profile:?}"
    );
    for ((batch, itl_ms), thpt) in batches
        .iter()
        .zip(&profile.itl_ms)
        .zip(&profile.thpt_per_gpu)
    {
        let expected = batch / (itl_ms / 1e3);
        assert!((thpt - expected).abs() < 1e-6 * expected);
    }
    // A decode step of the roofline H100 with Llama-3-8B reads 16 GB of weights: some
    // 6 ms, more with a larger batch's KV.
    assert!(
        profile.itl_ms[0] > 5.0 && profile.itl_ms[0] < 10.0,
        "{profile:?}"
    );
    assert!(matches!(
        profile_decode(&scenario, &[1024], &[1.5]),
        Err(ProfileError::BadGrid {
            grid: "kv_usage",
            ..
        })
    ));
    assert!(matches!(
        profile_decode(&scenario, &[200_000], &[0.5]),
        Err(ProfileError::NoPoints { .. })
    ));
}

#[test]
fn decode_batches_are_capped_by_max_seqs_and_each_measured_once() {
    let mut scenario = roofline_scenario("h100-llama3-8b");
    scenario.worker.batching.max_seqs = 8;
    let profile = profile_decode(&scenario, &[1024], &[0.1, 0.5, 0.9]).unwrap();
    // Every target wants more than 8 sequences: one point, at 8.
    assert_eq!(profile.kv_usage, [8.0 * 1024.0 / 128_000.0]);
}

#[test]
fn default_grid_fits_the_device() {
    let scenario = roofline_scenario("h100-llama3-8b");
    let (isls, contexts, usages) = default_grid(&scenario);
    assert_eq!(isls, [128, 256, 512, 1024, 2048, 4096, 8192, 16384]);
    assert_eq!(contexts, [512, 1024, 2048, 4096, 8192, 16384]);
    assert!(usages.iter().all(|u| *u > 0.0 && *u <= 1.0));
    let mut small = scenario;
    small.worker.tiers[0].capacity_blocks = 32; // 2,048 tokens
    let (isls, contexts, _) = default_grid(&small);
    assert_eq!(isls, [128, 256, 512, 1024]);
    assert_eq!(contexts, [512, 1024]);
}

#[test]
fn decode_itl_is_the_models_decode_step_so_the_warm_up_kept_prefill_out() {
    // The mean context over the 64 steps is the point's context, so the mean ITL is one
    // decode step at it: no prefill pass slowed the batch down.
    let scenario = roofline_scenario("h100-llama3-8b");
    let model = scenario.hardware.compute_model().unwrap();
    let profile = profile_decode(&scenario, &[2048], &[0.2, 0.8]).unwrap();
    for (usage, itl_ms) in profile.kv_usage.iter().zip(&profile.itl_ms) {
        let context_tokens = (usage * 128_000.0).round() as u64;
        let batch = context_tokens / 2048;
        let step = model.decode_step(batch, context_tokens, 128_000);
        let step_ms = step.as_nanos() as f64 / 1e6;
        assert!(
            (itl_ms - step_ms).abs() < 0.01 * step_ms,
            "batch {batch}: ITL {itl_ms} ms, a step {step_ms} ms"
        );
    }
}
