//! Fuzz target `http_route`: see `kvtwin_fuzz::http_route`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::http_route(data));
