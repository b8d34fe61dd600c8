//! Fuzz target `engine_zmq`: see `kvtwin_fuzz::engine_zmq`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::engine_zmq(data));
