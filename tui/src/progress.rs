//! Progress bars for the long commands (`sweep`, `validate`).
//!
//! Owns: [`bar`], a bar on stderr when it is a terminal and a hidden one otherwise.
//! Never: prints anything itself when hidden: callers that want a line per step in logs
//! and pipes check [`ProgressBar::is_hidden`].

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// A bar of `len` steps drawn with `template` (indicatif's) on stderr when it is a
/// terminal; hidden otherwise, so logs and pipes stay clean.
pub(crate) fn bar(len: usize, template: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
