//! Fuzz target `openai_request`: see `kvtwin_fuzz::openai_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::openai_request(data));
