//! PID 1 of the run's PID namespace, and the command it starts.
//!
//! Runs in a child forked from the (single-threaded) supervisor, so allocation is safe here.
//! Nothing in this file returns: each path ends in `exec` or `_exit`.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::sys::{self, Exit, Fork, SigSet};

/// The command, ready to exec (strings converted before forking).
pub struct Command {
    pub program: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: std::path::PathBuf,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// Descriptors the init and the command inherit from the supervisor.
pub struct Pipes {
    /// Write end of the output pipe: the command's stdout and stderr.
    pub output: OwnedFd,
    /// Write end of the exec-error pipe (close-on-exec: closes silently when exec works).
    pub exec_error: OwnedFd,
    /// Write end of the status pipe: init reports how the command ended.
    pub status: OwnedFd,
    /// Read end of a pipe whose only writer is the supervisor: it hangs up when the supervisor
    /// is gone.
    pub lifeline: OwnedFd,
}

/// The run's init: starts the command, reaps everything, forwards SIGTERM to the whole
/// namespace, and when the command exits, kills what it left behind and reports.
pub fn run(cmd: &Command, pipes: Pipes) -> ! {
    // If the supervisor dies, so does the run: init's death takes the namespace with it. The
    // parent is outside this namespace (getppid() says 0), so the lifeline tells whether the
    // supervisor died before the death signal was armed.
    if sys::set_parent_death_signal(libc::SIGKILL).is_err()
        || sys::poll_readable(&[pipes.lifeline.as_raw_fd()], 0).map_or(true, |r| r[0])
    {
        sys::exit_now(1);
    }
    // kill(-1) below must only ever reach this namespace: refuse to go on unless we are its init.
    if sys::getpid() != 1 {
        sys::write_all_fd(
            &pipes.status,
            b"error init is not pid 1 of a new pid namespace",
        );
        sys::exit_now(1);
    }
    // The kernel drops signals to a namespace init that has no handler, even blocked ones
    // from the parent namespace on some paths; give them handlers, then wait synchronously.
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
        let _ = sys::install_noop_handler(sig);
    }

    // SAFETY: this process is a fork of the single-threaded supervisor and is itself
    // single-threaded.
    let child = match unsafe { sys::fork() } {
        Ok(Fork::Child) => exec_command(cmd, &pipes),
        Ok(Fork::Parent(pid)) => pid,
        Err(e) => {
            sys::write_all_fd(&pipes.exec_error, format!("fork: {e}").as_bytes());
            sys::exit_now(1);
        }
    };
    let Pipes {
        output,
        exec_error,
        status,
        lifeline,
    } = pipes;
    drop((output, exec_error, lifeline));

    let waitset = SigSet::of(&[libc::SIGCHLD, libc::SIGTERM, libc::SIGINT, libc::SIGHUP]);
    let ended = loop {
        let mut ended = None;
        while let Ok(Some((pid, exit))) = sys::waitpid(-1, true) {
            if pid == child {
                ended = Some(exit);
            }
        }
        if let Some(exit) = ended {
            break exit;
        }
        match waitset.wait() {
            Ok(libc::SIGTERM) | Ok(libc::SIGINT) => {
                let _ = sys::kill(-1, libc::SIGTERM);
            }
            Ok(_) => {}
            Err(_) => sys::exit_now(1),
        }
    };

    // The command is gone: stop whatever it left behind (setsid and double-forked
    // processes included: they are all in this namespace) and count them.
    let mut leftovers = 0u32;
    let _ = sys::kill(-1, libc::SIGKILL);
    loop {
        match sys::waitpid(-1, false) {
            Ok(Some(_)) => leftovers += 1,
            Ok(None) => continue,
            Err(_) => break, // ECHILD: nobody left
        }
    }
    let report = match ended {
        Exit::Code(c) => format!("exit {c} {leftovers}"),
        Exit::Signal(s) => format!("signal {s} {leftovers}"),
    };
    sys::write_all_fd(&status, report.as_bytes());
    sys::exit_now(0)
}

/// The command's side of the fork: its own session, output to the pipe, the plan's uid, exec.
fn exec_command(cmd: &Command, pipes: &Pipes) -> ! {
    let fail = |step: &str, e: std::io::Error| -> ! {
        sys::write_all_fd(&pipes.exec_error, format!("{step}: {e}").as_bytes());
        sys::exit_now(127)
    };
    let _ = SigSet::all().unblock();
    sys::reset_signal_dispositions();
    if let Err(e) = sys::setsid() {
        fail("setsid", e);
    }
    let out = pipes.output.as_raw_fd();
    if let Err(e) = sys::dup2(out, 1).and_then(|_| sys::dup2(out, 2)) {
        fail("redirect output", e);
    }
    if let Err(e) = std::env::set_current_dir(&cmd.cwd) {
        fail(&format!("chdir {}", cmd.cwd.display()), e);
    }
    if let (Some(uid), Some(gid)) = (cmd.uid, cmd.gid) {
        if let Err(e) = sys::drop_to(uid, gid) {
            fail(&format!("switch to uid {uid} gid {gid}"), e);
        }
    }
    // Nothing beyond stdio crosses into the command.
    if let Err(e) = sys::cloexec_from(3) {
        fail("close inherited descriptors", e);
    }
    let err = sys::execve(&cmd.program, &cmd.argv, &cmd.envp);
    fail(&format!("exec {}", cmd.program.to_string_lossy()), err)
}
