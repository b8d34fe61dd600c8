//! Fuzz target `scenario_ron`: see `kvtwin_fuzz::scenario_ron`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kvtwin_fuzz::scenario_ron(data));
