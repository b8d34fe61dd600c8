//! Fuzz target `sse_stream`: see `kvtwin_fuzz::sse_stream`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::sse_stream(data));
