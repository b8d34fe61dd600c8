//! `kvtwin validate --engine`'s home ([`engine`]); the script mode is still
//! `cmd::calibrate`'s.

pub(crate) mod engine;
