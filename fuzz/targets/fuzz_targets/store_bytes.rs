//! Fuzz target `store_bytes`: see `kvtwin_fuzz::store_bytes`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::store_bytes(data));
