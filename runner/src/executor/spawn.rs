//! The one function that starts processes: the supervisor of a run.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// Starts `sidejob supervise <run_dir>`.
///
/// - its own process group, so a terminal's signals to the daemon never reach the run;
/// - no parent-death signal: the supervisor must outlive a daemon that dies;
/// - a cleared environment (the plan carries the command's environment);
/// - every descriptor but stdio is close-on-exec (std and tokio open everything with
///   `O_CLOEXEC`, and the supervisor closes 3.. again first thing);
/// - stdin is the read end of the run's stdin pipe, or /dev/null; stdout is /dev/null; stderr
///   goes to `supervisor.log` in the run directory.
pub fn spawn_supervisor(
    exe: &Path,
    run_dir: &Path,
    stdin: Option<OwnedFd>,
) -> std::io::Result<Child> {
    let log = File::create(run_dir.join("supervisor.log"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("supervise")
        .arg(run_dir)
        .env_clear()
        .stdin(stdin.map(Stdio::from).unwrap_or_else(Stdio::null))
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd.spawn()
}
