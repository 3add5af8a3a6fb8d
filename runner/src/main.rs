//! The `sidejob` binary.
//!
//! `main` is the C entry point (`no_main`), so a process starts without the Rust runtime's
//! set-up: about 80 µs of every start, most of it reading `/proc/self/maps` to find the main
//! thread's stack guard. That counts for `sidejob exec`, whose start is part of every command
//! it runs. [`sidejob::start`] does the parts of that set-up sidejob relies on. What is left
//! out: the message on a stack overflow (the process still dies, of `SIGSEGV`) and the main
//! thread's name in a panic message.
#![no_main]

use std::ffi::{c_char, c_int};

// A `no_mangle` function is `unsafe_code` to the lint: this one only stands in for the
// `main` the Rust runtime would have generated, with the C signature it expects.
#[allow(unsafe_code)]
#[no_mangle]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    sidejob::start();
    // The internal commands the daemon starts (a supervisor once per run, the spawner once,
    // the schema checker per plugin): go straight to them, before any argument parser or
    // runtime is set up (a supervisor must stay single-threaded and start fast).
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match args.as_slice() {
        [cmd] if cmd == sidejob::CHECK_SCHEMAS => std::process::exit(sidejob::check_schemas_main()),
        [cmd, run_dir] if cmd == "supervise" => {
            std::process::exit(sidejob::supervisor::main(std::path::Path::new(run_dir)))
        }
        [cmd, runs_dir] if cmd == "spawner" => std::process::exit(
            sidejob::supervisor::spawner::main(std::path::Path::new(runs_dir)),
        ),
        _ => std::process::exit(sidejob::cli::main()),
    }
}
