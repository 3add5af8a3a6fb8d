//! The run contract: what passes between the daemon (or `sidejob exec`) and a run's
//! supervisor, and between the supervisor and the run's init — the second wire of the
//! system, beside [`crate::protocol`] (the hosts' wire).
//!
//! - [`dir`]: the run's two directories, `private_dir` (the daemon's) and `public_dir` (the
//!   session owner's), and every file name in them;
//! - [`plan`]: `plan.json`, the launch plan, and its one builder;
//! - [`result`]: `result.json`, its writer and its reader, and the report line that carries
//!   it to the daemon;
//! - [`cancel`]: `cancel.json`, why the daemon asked a run to stop;
//! - [`report`]: init's report and the command's start failure, on their pipes;
//! - [`fds`]: every inherited descriptor number, and the spawner's request and reply;
//! - [`streams`]: `output.streams`, which ranges of `output.log` a separate stderr wrote.
//!
//! It imports nothing above it (`layers.rs` checks): the supervisor, the sandbox's
//! launcher, the executor and the registry depend on it.

pub(crate) mod cancel;
pub(crate) mod dir;
pub(crate) mod fds;
pub(crate) mod plan;
pub(crate) mod report;
pub(crate) mod result;
pub(crate) mod streams;
