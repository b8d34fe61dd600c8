//! Fuzz target `nats_json`: see `kvtwin_fuzz::nats_json`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::nats_json(data));
