//! The `greet` test tool, version 2 (see `greet.rs`).

const VERSION: &str = "2";
include!("../../greet.rs");
