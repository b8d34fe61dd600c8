//! Reading RON input files: the one loader behind scenarios, validation scripts and
//! hardware profiles.
//!
//! Owns: [`load`] ([`read`] a file, then [`parse`] it), [`parse`] (RON text into a type) and
//! [`RonFileError`], which every file-level error of those inputs goes through, so that
//! they all name the file and, for a parse error, the 1-based line and column.
//!
//! The types loaded here are `#[serde(deny_unknown_fields)]` (a misspelt field is an
//! error at its position, not a silent default); checks that parsing cannot make
//! (ranges, consistency) are the caller's, after this returns.
//! Never: validate what it parsed, or read anything but the one file it is given.

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};

/// A RON input file could not be read or parsed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RonFileError {
    /// The file could not be read.
    #[error("{path}: {source}", path = path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The RON is malformed or does not fit the type.
    #[error("{path}:{line}:{column}: {source}", path = path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What was wrong (names the field for unknown or missing fields).
        source: ron::error::Error,
    },
}

/// Reads the file at `path` and parses it as a `T`.
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<T, RonFileError> {
    parse(&read(path)?, path)
}

/// The text of the file at `path`.
pub fn read(path: &Path) -> Result<String, RonFileError> {
    std::fs::read_to_string(path).map_err(|source| RonFileError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Parses RON `text` as a `T`; `path` is for error messages.
pub fn parse<T: DeserializeOwned>(text: &str, path: &Path) -> Result<T, RonFileError> {
    ron::from_str(text).map_err(|error| RonFileError::Parse {
        path: path.to_owned(),
        line: error.position.line,
        column: error.position.col,
        source: error.code,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // Only parsed.
    struct Point {
        x: u32,
        y: u32,
    }

    #[test]
    fn a_parse_error_names_file_line_and_column() {
        let error = parse::<Point>("(\n  x: 1,\n  z: 2,\n)", Path::new("p.ron")).unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("p.ron:3:"), "{message}");
        assert!(message.contains('z'), "{message}");
        assert!(matches!(error, RonFileError::Parse { line: 3, .. }));
    }

    #[test]
    fn a_missing_file_is_an_io_error_naming_it() {
        let error = load::<Point>(Path::new("/nonexistent/missing.ron")).unwrap_err();
        assert!(matches!(error, RonFileError::Io { .. }));
        assert!(error.to_string().starts_with("/nonexistent/missing.ron: "));
    }
}
