//! The `kvtwin` command line (thin until the front-end issue lands).

fn main() {}
