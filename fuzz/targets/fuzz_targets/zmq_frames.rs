//! Fuzz target `zmq_frames`: see `kvtwin_fuzz::zmq_frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::zmq_frames(data));
