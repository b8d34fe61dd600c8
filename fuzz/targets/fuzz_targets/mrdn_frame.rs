//! Fuzz target `mrdn_frame`: see `kvtwin_fuzz::mrdn_frame`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::mrdn_frame(data));
