//! sidejob: a privileged process-runner sidecar. See `ARCHITECTURE.md` for the map.
//!
//! The library exists for the `sidejob` binary (and its benches): it exposes the command
//! line ([`cli::main`], [`cli::Client`]) and the supervisor's entry points; everything else is
//! the crate's own, so the compiler reports what nothing uses.
#![warn(unreachable_pub)]

mod bridge;
pub mod cli;
mod config;
mod dirwatch;
mod egress;
mod executor;
mod ids;
mod metrics;
mod names;
mod plugin_host;
mod protocol;
mod registry;
mod run;
mod sandbox;
mod schedule;
mod server;
mod session;
pub mod supervisor;
mod sys;
mod wake;

/// What a process of the `sidejob` binary does first, in place of the Rust runtime's set-up
/// (the binary has its own C `main`): descriptors 0, 1 and 2 are made to exist (`/dev/null`
/// where one is closed), so no file sidejob opens lands on one of them, and `SIGPIPE` is
/// ignored, so a write to a closed pipe is an error, not the end of the process.
pub fn start() {
    sys::process_start();
}

/// `sidejob check-schemas`: the helper the daemon checks plugins' input schemas in.
pub use plugin_host::{check_schemas_main, CHECK_SCHEMAS};

#[cfg(test)]
mod layers;
#[cfg(test)]
mod scratch;
