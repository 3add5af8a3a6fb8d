//! sidejob: a privileged process-runner sidecar. See `ARCHITECTURE.md` for the map.

pub mod bridge;
pub mod cli;
pub mod config;
pub mod dirwatch;
pub mod egress;
pub mod executor;
pub mod ids;
pub mod metrics;
pub mod plugin_host;
pub mod protocol;
pub mod registry;
pub mod run_dir;
pub mod sandbox;
pub mod schedule;
pub mod server;
pub mod session;
pub mod supervisor;
pub mod sys;
pub mod wake;

#[cfg(test)]
mod layers;
