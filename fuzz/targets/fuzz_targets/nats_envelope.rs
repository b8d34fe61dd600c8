//! Fuzz target `nats_envelope`: see `kvtwin_fuzz::nats_envelope`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::nats_envelope(data));
