//! In-place upgrade (docs/protocol.md, "Upgrading in place"): on SIGHUP the daemon
//! re-executes a binary in its own process, keeping the listening socket and its runs.
//!
//! - `binary.rs`: which binary (the staged one, else the one it was started from) and the
//!   checks it must pass (trusted, runs, is sidejob, has its plugins);
//! - `handover.rs`: the descriptors passed to the next image and how it takes them.
//!
//! Why nothing is lost: an exec keeps the pid, so every supervisor is still this process's
//! child (the spawner forks them as its siblings, `CLONE_PARENT`) and none of them is
//! signalled; the listening socket stays open, so clients that connect meanwhile wait in its
//! backlog; the new image recovers the runs as after a crash (`executor/recover.rs`), and
//! each settles from its supervisor's `result.json`, with its own exit code. What does end:
//! every open connection (clients reconnect; `sidejob wait` and `call` do), a run's stdin
//! pipe (the run reads end-of-file), and the spawner (stopped first; the next run starts a
//! new one).

pub(crate) mod binary;
pub(crate) mod handover;

use std::ffi::{CString, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::OsStringExt;

use tokio::net::UnixListener;
use tracing::{info, warn};

use binary::{Candidate, Origin, Plugins, UpgradeError};

use crate::config::Config;
use handover::Handover;

/// Picks and checks the binary to re-execute (a blocking step: it runs `--version`).
pub(super) async fn prepare(cfg: &Config) -> Result<(Candidate, String), UpgradeError> {
    let state_dir = cfg.state_dir.clone();
    let plugins = if cfg.shipped_plugins {
        Plugins::Required
    } else {
        Plugins::NotLoaded
    };
    tokio::task::spawn_blocking(move || {
        let candidate = binary::choose(&state_dir)?;
        if let Some(why) = &candidate.passed_over {
            warn!(
                "re-executing the running image: the file it was started from is not used ({why})"
            );
        }
        let version = binary::verify(&candidate, plugins)?;
        Ok((candidate, version))
    })
    .await
    .unwrap_or_else(|e| {
        Err(UpgradeError::Io {
            step: "check",
            path: "the binary to upgrade to".into(),
            source: io::Error::other(e.to_string()),
        })
    })
}

/// What the next image is handed.
pub(super) struct Kept<'a> {
    pub listener: &'a UnixListener,
    pub lock: &'a File,
    /// The service manager bound the socket.
    pub activated: bool,
}

/// Runs `candidate` in this process with the listening socket and the lock handed over.
/// Returns only if the exec failed, with the descriptors as they were.
pub(super) fn reexec(candidate: &Candidate, kept: Kept<'_>) -> io::Error {
    let Kept {
        listener,
        lock,
        activated,
    } = kept;
    let h = Handover {
        pid: crate::sys::getpid(),
        socket: listener.as_raw_fd(),
        lock: lock.as_raw_fd(),
        activated,
    };
    let (argv, envp) = match (argv(), envp(&h)) {
        (Ok(a), Ok(e)) => (a, e),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    info!(
        binary = %candidate.path.display(),
        staged = candidate.origin == Origin::Staged,
        handover = %h.encode(),
        "re-executing in place; runs keep going under their supervisors"
    );
    let kept = [listener.as_fd(), lock.as_fd()]
        .into_iter()
        .map(crate::sys::reexec::keep_across_exec)
        .collect::<io::Result<Vec<()>>>();
    let err = match kept {
        Ok(_) => crate::sys::reexec::exec_file(candidate.file.as_fd(), &argv, &envp),
        Err(e) => e,
    };
    for fd in [listener.as_fd(), lock.as_fd()] {
        let _ = crate::sys::reexec::close_on_exec(fd);
    }
    err
}

fn cstring(s: OsString) -> io::Result<CString> {
    CString::new(s.into_vec())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in an argument"))
}

/// The same command line: the new image reads the same options and configuration.
fn argv() -> io::Result<Vec<CString>> {
    std::env::args_os().map(cstring).collect()
}

/// The same environment, but the handover for this exec in place of any earlier one and
/// without the socket-activation variables (the socket is named in the handover; systemd's
/// `LISTEN_PID` would still name this pid).
fn envp(h: &Handover) -> io::Result<Vec<CString>> {
    let dropped = [handover::ENV, "LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"];
    let mut out = Vec::new();
    for (k, v) in std::env::vars_os() {
        if dropped.iter().any(|d| k == *d) {
            continue;
        }
        let mut kv = k;
        kv.push("=");
        kv.push(v);
        out.push(cstring(kv)?);
    }
    out.push(cstring(format!("{}={}", handover::ENV, h.encode()).into())?);
    Ok(out)
}
