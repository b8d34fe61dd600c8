//! The profile tables on disk, in the layout and with the keys Dynamo's planner reads
//! from its `--profile-results-dir`.
//!
//! Owns: the file names ([`PREFILL_NPZ`], [`DECODE_NPZ`], [`PREFILL_JSON`],
//! [`DECODE_JSON`]), the keys ([`PREFILL_KEYS`], [`DECODE_KEYS`]), writing both formats
//! and reading either, with the planner's order of preference. Facts checked in
//! ai-dynamo/dynamo's `perf_interpolation.py` / `core/throughput/interpolation.py` and
//! the profiler's `profile_prefill.py` / `profile_decode.py`:
//! - the planner first opens `<dir>/selected_prefill_interpolation/raw_data.npz` and
//!   `<dir>/selected_decode_interpolation/raw_data.npz`, and only when one is missing
//!   falls back to `<dir>/prefill_raw_data.json` or `<dir>/decode_raw_data.json` (the
//!   ConfigMap form the Kubernetes profiler mounts);
//! - the `.npz` arrays are 1-D, of equal length within a table; the profiler saves
//!   `max_kv_tokens` as a one-element integer array (`np.array([n])`, read as
//!   `raw_data["max_kv_tokens"][0]`), and in JSON it is a plain integer (read as
//!   `int(data["max_kv_tokens"])`);
//! - ISLs and TTFTs as the profiler saves them: TTFT and ITL in milliseconds, throughput
//!   in tokens per second per GPU.
//!
//! Every array is written as `<f8` (the planner interpolates in floats), `max_kv_tokens`
//! as `<i8` of shape `(1,)` like the profiler's. Reading accepts `<f8` or `<i8` anywhere
//! and `max_kv_tokens` as a scalar or a one-element array.
//! Never: panic on a file's bytes; write a table that fails the checks reading applies.

use super::npy::{read_npz, write_npz, NpyArray, NpyData};
use super::{DecodeProfile, PrefillProfile, ProfileError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The prefill table's `.npz`, relative to the profile directory.
pub const PREFILL_NPZ: &str = "selected_prefill_interpolation/raw_data.npz";
/// The decode table's `.npz`, relative to the profile directory.
pub const DECODE_NPZ: &str = "selected_decode_interpolation/raw_data.npz";
/// The prefill table as JSON (the planner's fallback), relative to the directory.
pub const PREFILL_JSON: &str = "prefill_raw_data.json";
/// The decode table as JSON (the planner's fallback), relative to the directory.
pub const DECODE_JSON: &str = "decode_raw_data.json";
/// The prefill keys the planner reads, in [`PrefillProfile`]'s field order.
pub const PREFILL_KEYS: [&str; 3] = ["prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"];
/// The decode keys the planner reads, in [`DecodeProfile`]'s field order.
pub const DECODE_KEYS: [&str; 5] = [
    "max_kv_tokens",
    "x_kv_usage",
    "y_context_length",
    "z_itl",
    "z_thpt_per_gpu",
];

/// Checks a table's arrays: none empty, all as long as the first, every value finite.
fn check_arrays(path: &Path, arrays: &[(&'static str, &[f64])]) -> Result<(), ProfileError> {
    let Some(&(first, values)) = arrays.first() else {
        return Ok(());
    };
    if values.is_empty() {
        return Err(ProfileError::Shape {
            path: path.to_owned(),
            field: first,
            expected: "at least one point",
        });
    }
    for &(field, array) in arrays {
        if array.len() != values.len() {
            return Err(ProfileError::Length {
                path: path.to_owned(),
                field,
                len: array.len(),
                first,
                expected: values.len(),
            });
        }
        if let Some((index, &value)) = array.iter().enumerate().find(|(_, v)| !v.is_finite()) {
            return Err(ProfileError::NotFinite {
                path: path.to_owned(),
                field,
                index,
                value,
            });
        }
    }
    Ok(())
}

fn check_prefill(profile: &PrefillProfile, path: &Path) -> Result<(), ProfileError> {
    let [isl, ttft, thpt] = PREFILL_KEYS;
    check_arrays(
        path,
        &[
            (isl, &profile.isl),
            (ttft, &profile.ttft_ms),
            (thpt, &profile.thpt_per_gpu),
        ],
    )
}

fn check_decode(profile: &DecodeProfile, path: &Path) -> Result<(), ProfileError> {
    let [max, usage, context, itl, thpt] = DECODE_KEYS;
    if profile.max_kv_tokens == 0 {
        return Err(ProfileError::NotFinite {
            path: path.to_owned(),
            field: max,
            index: 0,
            value: 0.0,
        });
    }
    check_arrays(
        path,
        &[
            (usage, &profile.kv_usage),
            (context, &profile.context_length),
            (itl, &profile.itl_ms),
            (thpt, &profile.thpt_per_gpu),
        ],
    )
}

/// The prefill table as `.npz` bytes.
pub(super) fn prefill_to_npz(profile: &PrefillProfile) -> Result<Vec<u8>, zip::result::ZipError> {
    let [isl, ttft, thpt] = PREFILL_KEYS;
    write_npz(&[
        (isl, NpyArray::f64s(&profile.isl)),
        (ttft, NpyArray::f64s(&profile.ttft_ms)),
        (thpt, NpyArray::f64s(&profile.thpt_per_gpu)),
    ])
}

/// The decode table as `.npz` bytes.
pub(super) fn decode_to_npz(profile: &DecodeProfile) -> Result<Vec<u8>, zip::result::ZipError> {
    let [max, usage, context, itl, thpt] = DECODE_KEYS;
    // The profiler saves np.array([max_kv_tokens]): a one-element int64 array.
    let max_kv = i64::try_from(profile.max_kv_tokens).unwrap_or(i64::MAX);
    write_npz(&[
        (usage, NpyArray::f64s(&profile.kv_usage)),
        (context, NpyArray::f64s(&profile.context_length)),
        (itl, NpyArray::f64s(&profile.itl_ms)),
        (thpt, NpyArray::f64s(&profile.thpt_per_gpu)),
        (max, NpyArray::i64s(&[max_kv])),
    ])
}

/// The prefill table as the planner's JSON object.
pub(super) fn prefill_to_json(profile: &PrefillProfile) -> serde_json::Value {
    let [isl, ttft, thpt] = PREFILL_KEYS;
    serde_json::json!({
        isl: profile.isl,
        ttft: profile.ttft_ms,
        thpt: profile.thpt_per_gpu,
    })
}

/// The decode table as the planner's JSON object.
pub(super) fn decode_to_json(profile: &DecodeProfile) -> serde_json::Value {
    let [max, usage, context, itl, thpt] = DECODE_KEYS;
    serde_json::json!({
        usage: profile.kv_usage,
        context: profile.context_length,
        itl: profile.itl_ms,
        thpt: profile.thpt_per_gpu,
        max: profile.max_kv_tokens,
    })
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ProfileError> {
    let io = |source| ProfileError::Io {
        path: path.to_owned(),
        source,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    std::fs::write(path, bytes).map_err(io)
}

/// Writes both tables into `dir` in Dynamo's layout, as `.npz` (what the planner opens
/// first) and as JSON (its fallback): [`PREFILL_NPZ`], [`DECODE_NPZ`], [`PREFILL_JSON`],
/// [`DECODE_JSON`]. Returns the files written. A table that reading would refuse (empty,
/// unequal lengths, a non-finite value, no KV tokens) is an error, and nothing is written.
pub fn write_profiles(
    dir: &Path,
    prefill: &PrefillProfile,
    decode: &DecodeProfile,
) -> Result<Vec<PathBuf>, ProfileError> {
    let paths = [PREFILL_NPZ, DECODE_NPZ, PREFILL_JSON, DECODE_JSON].map(|p| dir.join(p));
    check_prefill(prefill, &paths[0])?;
    check_decode(decode, &paths[1])?;
    let zip = |path: &Path| {
        let path = path.to_owned();
        move |source| ProfileError::Zip { path, source }
    };
    let json = |value: &serde_json::Value| {
        // Serialising a Value of numbers and strings cannot fail.
        let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
        text.push('\n');
        text
    };
    write_file(&paths[0], &prefill_to_npz(prefill).map_err(zip(&paths[0]))?)?;
    write_file(&paths[1], &decode_to_npz(decode).map_err(zip(&paths[1]))?)?;
    write_file(&paths[2], json(&prefill_to_json(prefill)).as_bytes())?;
    write_file(&paths[3], json(&decode_to_json(decode)).as_bytes())?;
    Ok(paths.to_vec())
}

/// The arrays of an `.npz` file, by key.
struct Npz<'a> {
    path: &'a Path,
    entries: BTreeMap<String, Vec<u8>>,
}

impl<'a> Npz<'a> {
    fn open(bytes: &[u8], path: &'a Path) -> Result<Self, ProfileError> {
        let entries = read_npz(bytes).map_err(|source| ProfileError::Zip {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self { path, entries })
    }

    fn array(&self, field: &'static str) -> Result<NpyArray, ProfileError> {
        let bytes = self.entries.get(field).ok_or(ProfileError::Missing {
            path: self.path.to_owned(),
            field,
        })?;
        NpyArray::decode(bytes).map_err(|source| ProfileError::Npy {
            path: self.path.to_owned(),
            field,
            source,
        })
    }

    /// A 1-D array's values.
    fn values(&self, field: &'static str) -> Result<Vec<f64>, ProfileError> {
        let array = self.array(field)?;
        if array.shape.len() != 1 {
            return Err(ProfileError::Shape {
                path: self.path.to_owned(),
                field,
                expected: "a 1-D array",
            });
        }
        Ok(array.to_f64s())
    }

    /// A positive integer, as a scalar or a one-element array.
    fn count(&self, field: &'static str) -> Result<u64, ProfileError> {
        let array = self.array(field)?;
        let value = match (array.shape.as_slice(), &array.data) {
            ([] | [1], NpyData::I64(values)) => values.first().map(|v| *v as f64),
            ([] | [1], NpyData::F64(values)) => values.first().copied(),
            _ => None,
        };
        let value = value.ok_or(ProfileError::Shape {
            path: self.path.to_owned(),
            field,
            expected: "one value (a scalar or a one-element array)",
        })?;
        positive_integer(self.path, field, value)
    }
}

fn positive_integer(path: &Path, field: &'static str, value: f64) -> Result<u64, ProfileError> {
    // Below 2^53 every integer is exact in a double; no device holds more KV tokens.
    if value >= 1.0 && value.fract() == 0.0 && value < 9.0e15 {
        Ok(value as u64)
    } else {
        Err(ProfileError::NotFinite {
            path: path.to_owned(),
            field,
            index: 0,
            value,
        })
    }
}

/// A JSON object's fields.
struct JsonTable<'a> {
    path: &'a Path,
    object: serde_json::Map<String, serde_json::Value>,
}

impl<'a> JsonTable<'a> {
    fn open(bytes: &[u8], path: &'a Path) -> Result<Self, ProfileError> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|source| ProfileError::Json {
                path: path.to_owned(),
                source,
            })?;
        match value {
            serde_json::Value::Object(object) => Ok(Self { path, object }),
            _ => Err(ProfileError::Shape {
                path: path.to_owned(),
                field: "(top level)",
                expected: "a JSON object",
            }),
        }
    }

    fn field(&self, field: &'static str) -> Result<&serde_json::Value, ProfileError> {
        self.object.get(field).ok_or(ProfileError::Missing {
            path: self.path.to_owned(),
            field,
        })
    }

    fn values(&self, field: &'static str) -> Result<Vec<f64>, ProfileError> {
        let not_numbers = || ProfileError::Shape {
            path: self.path.to_owned(),
            field,
            expected: "an array of numbers",
        };
        self.field(field)?
            .as_array()
            .ok_or_else(not_numbers)?
            .iter()
            .map(|v| v.as_f64().ok_or_else(not_numbers))
            .collect()
    }

    /// A positive integer, plain or as a one-element array.
    fn count(&self, field: &'static str) -> Result<u64, ProfileError> {
        let value = match self.field(field)? {
            serde_json::Value::Array(items) if items.len() == 1 => items[0].as_f64(),
            value => value.as_f64(),
        };
        let value = value.ok_or(ProfileError::Shape {
            path: self.path.to_owned(),
            field,
            expected: "an integer",
        })?;
        positive_integer(self.path, field, value)
    }
}

/// A table's named columns, as one file format stores them.
trait Columns {
    /// The named column's numbers.
    fn values(&self, field: &'static str) -> Result<Vec<f64>, ProfileError>;
    /// The named one-number column as a positive whole number.
    fn count(&self, field: &'static str) -> Result<u64, ProfileError>;
}

impl Columns for Npz<'_> {
    fn values(&self, field: &'static str) -> Result<Vec<f64>, ProfileError> {
        Npz::values(self, field)
    }
    fn count(&self, field: &'static str) -> Result<u64, ProfileError> {
        Npz::count(self, field)
    }
}

impl Columns for JsonTable<'_> {
    fn values(&self, field: &'static str) -> Result<Vec<f64>, ProfileError> {
        JsonTable::values(self, field)
    }
    fn count(&self, field: &'static str) -> Result<u64, ProfileError> {
        JsonTable::count(self, field)
    }
}

/// The prefill table in `columns`, checked; `path` names the file in errors.
fn prefill_from(columns: &impl Columns, path: &Path) -> Result<PrefillProfile, ProfileError> {
    let [isl, ttft, thpt] = PREFILL_KEYS;
    let profile = PrefillProfile {
        isl: columns.values(isl)?,
        ttft_ms: columns.values(ttft)?,
        thpt_per_gpu: columns.values(thpt)?,
    };
    check_prefill(&profile, path)?;
    Ok(profile)
}

/// The decode table in `columns`, checked; `path` names the file in errors.
fn decode_from(columns: &impl Columns, path: &Path) -> Result<DecodeProfile, ProfileError> {
    let [max, usage, context, itl, thpt] = DECODE_KEYS;
    let profile = DecodeProfile {
        max_kv_tokens: columns.count(max)?,
        kv_usage: columns.values(usage)?,
        context_length: columns.values(context)?,
        itl_ms: columns.values(itl)?,
        thpt_per_gpu: columns.values(thpt)?,
    };
    check_decode(&profile, path)?;
    Ok(profile)
}

/// Reads a prefill table from `.npz` bytes; `path` names the file in errors.
pub fn prefill_from_npz(bytes: &[u8], path: &Path) -> Result<PrefillProfile, ProfileError> {
    prefill_from(&Npz::open(bytes, path)?, path)
}

/// Reads a decode table from `.npz` bytes; `path` names the file in errors.
pub fn decode_from_npz(bytes: &[u8], path: &Path) -> Result<DecodeProfile, ProfileError> {
    decode_from(&Npz::open(bytes, path)?, path)
}

/// Reads a prefill table from JSON bytes; `path` names the file in errors.
pub fn prefill_from_json(bytes: &[u8], path: &Path) -> Result<PrefillProfile, ProfileError> {
    prefill_from(&JsonTable::open(bytes, path)?, path)
}

/// Reads a decode table from JSON bytes; `path` names the file in errors.
pub fn decode_from_json(bytes: &[u8], path: &Path) -> Result<DecodeProfile, ProfileError> {
    decode_from(&JsonTable::open(bytes, path)?, path)
}

/// Reads the `.npz` at `dir/npz` if there is one, else the JSON at `dir/json`, as the
/// planner does; neither there is the `.npz`'s not-found error.
fn load_one<T>(
    dir: &Path,
    npz: &str,
    json: &str,
    from_npz: fn(&[u8], &Path) -> Result<T, ProfileError>,
    from_json: fn(&[u8], &Path) -> Result<T, ProfileError>,
) -> Result<T, ProfileError> {
    let npz = dir.join(npz);
    match std::fs::read(&npz) {
        Ok(bytes) => from_npz(&bytes, &npz),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            let json = dir.join(json);
            match std::fs::read(&json) {
                Ok(bytes) => from_json(&bytes, &json),
                Err(json_error) if json_error.kind() == std::io::ErrorKind::NotFound => {
                    Err(ProfileError::Io {
                        path: npz,
                        source: error,
                    })
                }
                Err(source) => Err(ProfileError::Io { path: json, source }),
            }
        }
        Err(source) => Err(ProfileError::Io { path: npz, source }),
    }
}

/// Reads both tables from a profile directory as Dynamo's planner does: each table's
/// `.npz` if present, else its JSON ([`write_profiles`] writes both).
pub fn load_profiles(dir: &Path) -> Result<(PrefillProfile, DecodeProfile), ProfileError> {
    let prefill = load_one(
        dir,
        PREFILL_NPZ,
        PREFILL_JSON,
        prefill_from_npz,
        prefill_from_json,
    )?;
    let decode = load_one(
        dir,
        DECODE_NPZ,
        DECODE_JSON,
        decode_from_npz,
        decode_from_json,
    )?;
    Ok((prefill, decode))
}
