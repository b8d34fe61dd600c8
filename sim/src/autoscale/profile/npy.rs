//! NumPy's `.npy` array format (version 1.0 written; 1.0, 2.0 and 3.0 read) and `.npz`
//! archives of them, as far as Dynamo's planner tables need: 1-D little-endian `float64`
//! (`<f8`) and `int64` (`<i8`) arrays in C order.
//!
//! Owns: [`NpyArray`], its encoding and decoding, and the zip container of `.npz`
//! (entries stored uncompressed, as `np.savez` stores them, named `<key>.npy`). The
//! layout follows NumPy's format spec (`numpy/lib/format.py`, NEP 1): the magic
//! `\x93NUMPY`, two version bytes, the header length (u16 in 1.0, u32 in 2.0 and 3.0),
//! then a Python dict literal with `descr`, `fortran_order` and `shape`, padded with
//! spaces and ended by a newline so that the data starts at a multiple of 64 bytes.
//! Never: panic on bytes from outside (every length is checked before it is trusted),
//! or interpret a dtype other than `<f8` and `<i8`.

use std::collections::BTreeMap;
use std::io::{Cursor, Read, Write};

/// The magic string every `.npy` file starts with.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// The bytes of one `.npz` entry read at most: planner tables are a few kilobytes, and a
/// forged size must not make the reader allocate gigabytes.
const MAX_ENTRY_BYTES: u64 = 64 << 20;

/// The values of an array, in its dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum NpyData {
    /// `<f8`: little-endian IEEE 754 doubles.
    F64(Vec<f64>),
    /// `<i8`: little-endian 64-bit signed integers.
    I64(Vec<i64>),
}

/// One array: its shape and its values in C order.
#[derive(Clone, Debug, PartialEq)]
pub struct NpyArray {
    /// Dimensions; `[]` for a 0-d scalar, `[n]` for a 1-D array.
    pub shape: Vec<usize>,
    /// Values, as many as the shape's product.
    pub data: NpyData,
}

/// Bytes that are not a `.npy` array this reader understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NpyError {
    /// The bytes do not start with `\x93NUMPY`.
    #[error("not a .npy array (no \\x93NUMPY magic)")]
    NotNpy,
    /// A format version this reader does not know.
    #[error("unsupported .npy format version {major}.{minor}")]
    Version {
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The bytes end before the header or the data does.
    #[error("truncated: {needed} bytes needed, {have} present")]
    Truncated {
        /// Bytes the header says there are.
        needed: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The header dict is malformed.
    #[error("malformed header: {reason}")]
    Header {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A dtype other than `<f8` or `<i8`.
    #[error("unsupported dtype {descr:?} (only '<f8' and '<i8')")]
    Dtype {
        /// The `descr` the header gives.
        descr: String,
    },
    /// The array is stored in Fortran order (never the case for 1-D arrays NumPy
    /// writes; refused rather than guessed).
    #[error("fortran_order True is not supported")]
    FortranOrder,
    /// The data is longer or shorter than the shape says.
    #[error("{found} data bytes, the shape needs {expected}")]
    DataLength {
        /// Bytes the shape and dtype need.
        expected: usize,
        /// Bytes after the header.
        found: usize,
    },
}

impl NpyArray {
    /// A 1-D `<f8` array.
    pub fn f64s(values: &[f64]) -> Self {
        Self {
            shape: vec![values.len()],
            data: NpyData::F64(values.to_vec()),
        }
    }

    /// A 1-D `<i8` array.
    pub fn i64s(values: &[i64]) -> Self {
        Self {
            shape: vec![values.len()],
            data: NpyData::I64(values.to_vec()),
        }
    }

    /// The `descr` of the dtype, as NumPy writes it.
    pub fn descr(&self) -> &'static str {
        match self.data {
            NpyData::F64(_) => "<f8",
            NpyData::I64(_) => "<i8",
        }
    }

    /// The values as doubles (integers above 2^53 lose their last bits, which no
    /// planner table holds).
    pub fn to_f64s(&self) -> Vec<f64> {
        match &self.data {
            NpyData::F64(values) => values.clone(),
            NpyData::I64(values) => values.iter().map(|v| *v as f64).collect(),
        }
    }

    /// The array in `.npy` format version 1.0.
    pub fn encode(&self) -> Vec<u8> {
        let shape = match self.shape.as_slice() {
            [] => "()".to_string(),
            [n] => format!("({n},)"),
            dims => format!(
                "({})",
                dims.iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut header = format!(
            "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
            self.descr()
        );
        // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64, so
        // the data is aligned (the spec's rule since NumPy 1.x; older readers used 16).
        let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
        header.extend(std::iter::repeat_n(
            ' ',
            unpadded.next_multiple_of(64) - unpadded,
        ));
        header.push('\n');
        let mut out = Vec::with_capacity(10 + header.len() + 8 * self.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&[1, 0]);
        // A header of a few dimensions is far below 65,535 bytes.
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        out.extend_from_slice(header.as_bytes());
        match &self.data {
            NpyData::F64(values) => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
            NpyData::I64(values) => values
                .iter()
                .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        }
        out
    }

    fn len(&self) -> usize {
        match &self.data {
            NpyData::F64(values) => values.len(),
            NpyData::I64(values) => values.len(),
        }
    }

    /// Parses a `.npy` array.
    pub fn decode(bytes: &[u8]) -> Result<Self, NpyError> {
        if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
            return Err(NpyError::NotNpy);
        }
        let truncated = |needed: usize| NpyError::Truncated {
            needed,
            have: bytes.len(),
        };
        let version = bytes.get(6..8).ok_or(truncated(8))?;
        let (header_start, header_len): (usize, usize) = match (version[0], version[1]) {
            (1, 0) => {
                let len = bytes.get(8..10).ok_or(truncated(10))?;
                (10, usize::from(u16::from_le_bytes([len[0], len[1]])))
            }
            (2 | 3, 0) => {
                let len = bytes.get(8..12).ok_or(truncated(12))?;
                let len = u32::from_le_bytes([len[0], len[1], len[2], len[3]]);
                (12, usize::try_from(len).map_err(|_| truncated(usize::MAX))?)
            }
            (major, minor) => return Err(NpyError::Version { major, minor }),
        };
        let data_start = header_start
            .checked_add(header_len)
            .ok_or(truncated(usize::MAX))?;
        let header = bytes
            .get(header_start..data_start)
            .ok_or(truncated(data_start))?;
        // Version 3.0 allows UTF-8 in the header; the keys and values read are ASCII.
        let header = std::str::from_utf8(header).map_err(|_| NpyError::Header {
            reason: "not UTF-8",
        })?;
        let parsed = parse_header(header)?;
        if parsed.fortran_order {
            return Err(NpyError::FortranOrder);
        }
        let count = parsed
            .shape
            .iter()
            .try_fold(1usize, |n, d| n.checked_mul(*d))
            .ok_or(NpyError::Header {
                reason: "shape overflows",
            })?;
        let data = &bytes[data_start..];
        let expected = count.checked_mul(8).ok_or(NpyError::Header {
            reason: "shape overflows",
        })?;
        if data.len() != expected {
            return Err(NpyError::DataLength {
                expected,
                found: data.len(),
            });
        }
        let words = data.chunks_exact(8).map(|w| {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            word
        });
        let data = match parsed.descr.as_str() {
            "<f8" => NpyData::F64(words.map(f64::from_le_bytes).collect()),
            "<i8" => NpyData::I64(words.map(i64::from_le_bytes).collect()),
            _ => {
                return Err(NpyError::Dtype {
                    descr: parsed.descr,
                })
            }
        };
        Ok(Self {
            shape: parsed.shape,
            data,
        })
    }
}

/// What a header dict says.
#[derive(Debug, PartialEq)]
pub(super) struct Header {
    /// The dtype, e.g. `<f8`.
    pub(super) descr: String,
    /// Whether the data is in Fortran (column-major) order.
    pub(super) fortran_order: bool,
    /// The dimensions.
    pub(super) shape: Vec<usize>,
}

/// Parses the header dict (`{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }`):
/// a small subset of Python literal syntax, quoted keys, strings in either quote,
/// `True`/`False` and tuples of integers.
pub(super) fn parse_header(text: &str) -> Result<Header, NpyError> {
    let bad = |reason| NpyError::Header { reason };
    let body = text
        .trim()
        .strip_prefix('{')
        .and_then(|t| t.strip_suffix('}'))
        .ok_or(bad("not a {...} dict"))?;
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let (key, after) = quoted(rest).ok_or(bad("a key is not a quoted string"))?;
        let after = after
            .trim_start()
            .strip_prefix(':')
            .ok_or(bad("a key is not followed by ':'"))?
            .trim_start();
        let after = match key {
            "descr" => {
                let (value, after) = quoted(after).ok_or(bad("descr is not a string"))?;
                descr = Some(value.to_string());
                after
            }
            "fortran_order" => {
                if let Some(after) = after.strip_prefix("False") {
                    fortran_order = Some(false);
                    after
                } else if let Some(after) = after.strip_prefix("True") {
                    fortran_order = Some(true);
                    after
                } else {
                    return Err(bad("fortran_order is not True or False"));
                }
            }
            "shape" => {
                let inner = after.strip_prefix('(').ok_or(bad("shape is not a tuple"))?;
                let close = inner.find(')').ok_or(bad("shape tuple is not closed"))?;
                let dims = inner[..close]
                    .split(',')
                    .map(str::trim)
                    .filter(|d| !d.is_empty())
                    .map(|d| d.trim_end_matches('L').parse::<usize>())
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| bad("shape holds something other than integers"))?;
                shape = Some(dims);
                &inner[close + 1..]
            }
            _ => return Err(bad("an unknown key")),
        };
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(after) => after.trim_start(),
            None if after.is_empty() => after,
            None => return Err(bad("entries are not separated by ','")),
        };
    }
    Ok(Header {
        descr: descr.ok_or(bad("no descr"))?,
        fortran_order: fortran_order.ok_or(bad("no fortran_order"))?,
        shape: shape.ok_or(bad("no shape"))?,
    })
}

/// A string in single or double quotes at the start of `text` (no escapes: none of the
/// keys or dtypes has one), and what follows it.
fn quoted(text: &str) -> Option<(&str, &str)> {
    let quote = text.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = &text[1..];
    let end = inner.find(quote)?;
    Some((&inner[..end], &inner[end + 1..]))
}

/// An `.npz` archive of `arrays` (key, array), each stored as `<key>.npy`, uncompressed
/// like `np.savez`, with the zip format's fixed 1980 timestamp, so that equal tables
/// give equal bytes.
pub(super) fn write_npz(arrays: &[(&str, NpyArray)]) -> Result<Vec<u8>, zip::result::ZipError> {
    let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (key, array) in arrays {
        zip.start_file(format!("{key}.npy"), options)?;
        zip.write_all(&array.encode())?;
    }
    Ok(zip.finish()?.into_inner())
}

/// The entries of an `.npz` archive as raw bytes, by key (the entry name less `.npy`;
/// entries named otherwise are left out, as `np.load` leaves them unparsed).
pub(super) fn read_npz(bytes: &[u8]) -> Result<BTreeMap<String, Vec<u8>>, zip::result::ZipError> {
    let mut archive = zip::ZipArchive::new(Cursor::new(bytes))?;
    let mut entries = BTreeMap::new();
    for i in 0..archive.len() {
        let file = archive.by_index(i)?;
        let Some(key) = file.name()?.strip_suffix(".npy").map(str::to_string) else {
            continue;
        };
        let mut data = Vec::new();
        file.take(MAX_ENTRY_BYTES).read_to_end(&mut data)?;
        entries.insert(key, data);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_a_version_1_header_padded_to_64_bytes() {
        let bytes = NpyArray::f64s(&[1.0, 2.5]).encode();
        assert_eq!(&bytes[..8], b"\x93NUMPY\x01\x00");
        let header_len = usize::from(u16::from_le_bytes([bytes[8], bytes[9]]));
        assert_eq!((10 + header_len) % 64, 0);
        let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
        assert!(header.ends_with('\n'), "{header:?}");
        assert!(header.starts_with("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }"));
        assert_eq!(bytes.len(), 10 + header_len + 16);
        assert_eq!(&bytes[10 + header_len..][..8], &1.0f64.to_le_bytes());
    }

    #[test]
    fn decodes_what_it_encodes_in_either_dtype_and_any_shape() {
        for array in [
            NpyArray::f64s(&[]),
            NpyArray::f64s(&[0.5, -3.0, 1e300]),
            NpyArray::i64s(&[32768]),
            NpyArray {
                shape: vec![],
                data: NpyData::I64(vec![7]),
            },
            NpyArray {
                shape: vec![2, 2],
                data: NpyData::F64(vec![1.0, 2.0, 3.0, 4.0]),
            },
        ] {
            assert_eq!(NpyArray::decode(&array.encode()).unwrap(), array);
        }
    }

    #[test]
    fn reads_headers_as_numpy_writes_them_in_other_versions_and_spellings() {
        let header = "{\"descr\": \"<i8\", \"fortran_order\": False, \"shape\": (1, ), }";
        let mut bytes = b"\x93NUMPY\x02\x00".to_vec();
        bytes.extend_from_slice(&(header.len() as u32).to_le_bytes());
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&5i64.to_le_bytes());
        assert_eq!(NpyArray::decode(&bytes).unwrap(), NpyArray::i64s(&[5]));
    }

    #[test]
    fn refuses_other_dtypes_fortran_order_and_short_data_by_name() {
        let with_header = |header: &str, data: &[u8]| {
            let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
            bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
            bytes.extend_from_slice(header.as_bytes());
            bytes.extend_from_slice(data);
            NpyArray::decode(&bytes)
        };
        assert_eq!(
            with_header(
                "{'descr': '>f8', 'fortran_order': False, 'shape': (0,), }",
                &[]
            ),
            Err(NpyError::Dtype {
                descr: ">f8".into()
            })
        );
        assert_eq!(
            with_header(
                "{'descr': '<f8', 'fortran_order': True, 'shape': (0,), }",
                &[]
            ),
            Err(NpyError::FortranOrder)
        );
        assert_eq!(
            with_header(
                "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                &[0; 8]
            ),
            Err(NpyError::DataLength {
                expected: 16,
                found: 8
            })
        );
        assert!(matches!(
            with_header("{'descr': '<f8', 'shape': (2,), }", &[0; 16]),
            Err(NpyError::Header { .. })
        ));
        assert_eq!(NpyArray::decode(b"PK\x03\x04"), Err(NpyError::NotNpy));
    }

    #[test]
    fn npz_round_trips_its_entries_by_key() {
        let bytes =
            write_npz(&[("a", NpyArray::f64s(&[1.0])), ("b", NpyArray::i64s(&[2]))]).unwrap();
        // A zip archive, as np.load recognises it.
        assert_eq!(&bytes[..4], b"PK\x03\x04");
        let entries = read_npz(&bytes).unwrap();
        assert_eq!(entries.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(
            NpyArray::decode(&entries["b"]).unwrap(),
            NpyArray::i64s(&[2])
        );
    }

    proptest::proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(0u8..=255, 0..200)) {
            let _ = NpyArray::decode(&bytes);
            let mut npy = b"\x93NUMPY\x01\x00".to_vec();
            npy.extend_from_slice(&bytes);
            let _ = NpyArray::decode(&npy);
            let _ = read_npz(&bytes);
        }

        #[test]
        fn decoding_arbitrary_headers_never_panics(header in ".{0,120}", data in proptest::collection::vec(0u8..=255, 0..40)) {
            let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
            bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
            bytes.extend_from_slice(header.as_bytes());
            bytes.extend_from_slice(&data);
            let _ = NpyArray::decode(&bytes);
        }
    }
}
