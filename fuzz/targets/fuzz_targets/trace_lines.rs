//! Fuzz target `trace_lines`: see `kvtwin_fuzz::trace_lines`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::trace_lines(data));
