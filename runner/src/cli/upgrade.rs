//! `sidejob upgrade-check` and `sidejob upgrade`: the in-place upgrade (SIGHUP) from the
//! operator's side.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::json;

use super::commands::state_dir_or_default;
use super::format::format_ms;
use super::Client;
use crate::protocol::DaemonStatusResult;

/// `sidejob upgrade-check`: what the daemon would run on SIGHUP, and whether it would.
pub(super) fn upgrade_check(binary: Option<PathBuf>, state_dir: Option<PathBuf>) -> Result<i32> {
    use crate::server::upgrade::binary::{self, Candidate, Origin, Plugins, UpgradeError};
    let state_dir = state_dir_or_default(state_dir);
    let named = binary.is_some();
    let checked = match binary {
        Some(path) => binary::open_trusted(&path).and_then(|file| match file {
            Some(file) => Ok(Candidate {
                file,
                path,
                origin: Origin::Installed,
                passed_over: None,
            }),
            None => Err(UpgradeError::Missing { path }),
        }),
        None => binary::choose(&state_dir),
    }
    .and_then(|c| binary::verify(&c, Plugins::Required).map(|version| (c, version)));
    match checked {
        Ok((c, version)) => {
            let what = match c.origin {
                Origin::Staged => "the staged binary",
                Origin::Installed => "the binary",
                Origin::Running => "this command's own image",
            };
            println!(
                "{}: {what}, trusted, runs ({version}), its plugins beside it; a SIGHUP to the daemon re-executes it in place",
                c.path.display()
            );
            if let Some(why) = c.passed_over {
                println!("  (not the file it was started from: {why})");
            }
            if !named && c.origin != Origin::Staged {
                println!(
                    "  nothing is staged at {}, so the daemon runs the file it was started from",
                    state_dir.join(binary::STAGED).display()
                );
            }
            Ok(0)
        }
        Err(e) => {
            eprintln!("sidejob: {e}\n  hint: {}", e.hint());
            Ok(1)
        }
    }
}

/// `sidejob upgrade`: checks what the daemon would run (as `upgrade-check`), sends it SIGHUP
/// and returns once it serves again from the new image: the same pid, a new start. This is
/// what `ExecReload=` runs, so that `systemctl reload sidejob` ends when the upgrade has
/// happened and fails when it has not (systemd before 253 ends a reload when its command
/// exits, whatever the service says with `RELOADING=1`).
pub(super) fn upgrade(socket: &Path, state_dir: Option<PathBuf>, timeout: Duration) -> Result<i32> {
    if upgrade_check(None, state_dir)? != 0 {
        eprintln!("sidejob upgrade: not signalled: the daemon would refuse this binary");
        return Ok(1);
    }
    let before = daemon_status(socket, timeout)?;
    crate::sys::kill(before.pid as i32, libc::SIGHUP)
        .with_context(|| format!("cannot signal the daemon (pid {})", before.pid))?;
    let deadline = Instant::now() + timeout;
    loop {
        // A connection the old image accepted closes at the exec; one left in the socket's
        // backlog is answered by the new image, once it serves.
        let left = deadline.saturating_duration_since(Instant::now());
        if let Ok(now) = daemon_status(socket, left) {
            if now.pid != before.pid {
                eprintln!(
                    "sidejob upgrade: another daemon (pid {}, not {}) answers on {}",
                    now.pid,
                    before.pid,
                    socket.display()
                );
                return Ok(1);
            }
            if now.started_at != before.started_at {
                println!(
                    "sidejob upgrade: {} (pid {}) serves again, upgraded in place",
                    now.version, now.pid
                );
                return Ok(0);
            }
        }
        if left.is_zero() {
            eprintln!(
                "sidejob upgrade: the daemon (pid {}) is not back from the upgrade after {}\n  \
                 hint: its log says why (a binary it refused, or one that does not start)",
                before.pid,
                format_ms(timeout.as_millis() as u64)
            );
            return Ok(1);
        }
        std::thread::sleep(Duration::from_millis(50).min(left));
    }
}

/// `daemon.status`, waiting for the answer no longer than `timeout`.
fn daemon_status(socket: &Path, timeout: Duration) -> Result<DaemonStatusResult> {
    let mut client = Client::connect(socket)?;
    client.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))?;
    let v = client.call("daemon.status", json!({}))?;
    serde_json::from_value(v).context("unexpected daemon.status result")
}
