//! The `greet` test tool, version 1 (see `greet.rs`).

const VERSION: &str = "1";
include!("../../greet.rs");
