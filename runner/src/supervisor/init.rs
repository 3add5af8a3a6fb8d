//! PID 1 of the run's PID namespace, and the command it starts.
//!
//! Runs in a child forked from the (single-threaded) supervisor, so allocation is safe here.
//! Nothing in this file returns: each path ends in `exec` or `_exit`.

use std::os::fd::{AsFd, OwnedFd};

use crate::run::report::InitReport;
use crate::sandbox::linux::{self, Command, Prepared};
use crate::sys::{self, SigSet, Signal};

/// Descriptors the init and the command inherit from the supervisor.
pub(super) struct Pipes {
    /// Write end of the output pipe: the command's stdout, and its stderr unless it has a
    /// pipe of its own.
    pub output: OwnedFd,
    /// Write end of the command's own stderr pipe (a plan's `Stderr::Separate`).
    pub stderr: Option<OwnedFd>,
    /// Write end of the exec-error pipe (close-on-exec: closes silently when exec works).
    pub exec_error: OwnedFd,
    /// Write end of the status pipe: init reports how the command ended.
    pub status: OwnedFd,
    /// Read end of a pipe whose only writer is the supervisor: it hangs up when the supervisor
    /// is gone.
    pub lifeline: OwnedFd,
    /// An allow-list run: where init sends the relay's listening sockets (see
    /// `sandbox::linux::netns`).
    pub relay: Option<OwnedFd>,
}

/// The run's init: builds the sandbox and starts the command in it ([`linux::launch`]),
/// reaps everything, forwards SIGTERM to the whole namespace, and when the command exits,
/// kills what it left behind and reports.
pub(super) fn run(cmd: &Command, sandbox: &Prepared, pipes: Pipes) -> ! {
    // If the supervisor dies, so does the run: init's death takes the namespace with it. The
    // parent is outside this namespace (getppid() says 0), so the lifeline tells whether the
    // supervisor died before the death signal was armed.
    if sys::set_parent_death_signal(libc::SIGKILL).is_err()
        || sys::poll_readable(&[Some(pipes.lifeline.as_fd())], 0).map_or(true, |r| r[0])
    {
        sys::exit_now(1);
    }
    // kill(-1) below must only ever reach this namespace: refuse to go on unless we are its init.
    if sys::getpid() != 1 {
        let report = InitReport::Failed("init is not pid 1 of a new pid namespace".into());
        sys::write_all_fd(&pipes.status, &report.encode());
        sys::exit_now(1);
    }
    // The kernel drops signals to a namespace init that has no handler, even blocked ones
    // from the parent namespace on some paths; give them handlers, then wait synchronously.
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD] {
        let _ = sys::install_noop_handler(sig);
    }

    let child = match linux::launch(
        sandbox,
        cmd,
        &pipes.output,
        pipes.stderr.as_ref(),
        &pipes.exec_error,
        pipes.relay.as_ref(),
    ) {
        Ok(pid) => pid,
        Err(e) => {
            let report = InitReport::Failed(format!("sandbox: {e}"));
            sys::write_all_fd(&pipes.status, &report.encode());
            sys::exit_now(1);
        }
    };
    let Pipes {
        output,
        stderr,
        exec_error,
        status,
        lifeline,
        relay,
    } = pipes;
    drop((output, stderr, exec_error, lifeline, relay));

    let waitset = SigSet::of(&[
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ]);
    // Reaps what has exited; says whether any child is left. Every process of the namespace
    // descends from init (orphans are handed to it), so none left means the namespace holds
    // init alone.
    let reap = |ended: &mut Option<sys::Exit>| loop {
        match sys::waitpid(-1, true) {
            Ok(Some((pid, exit))) if pid == child => *ended = Some(exit),
            Ok(Some(_)) => {}
            Ok(None) => return true,
            Err(_) => return false, // ECHILD
        }
    };
    let (ended, others_left) = loop {
        let mut ended = None;
        let left = reap(&mut ended);
        if let Some(exit) = ended {
            break (exit, left);
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
    // processes included: they are all in this namespace) and count them. kill(-1) looks at
    // every process of the machine, not only this namespace's, so it is skipped when there
    // is nothing to stop.
    let mut leftovers = 0u32;
    if others_left {
        let _ = sys::kill(-1, libc::SIGKILL);
        loop {
            match sys::waitpid(-1, false) {
                Ok(Some(_)) => leftovers += 1,
                Ok(None) => continue,
                Err(_) => break, // ECHILD: nobody left
            }
        }
    }
    // A repository the run made on the `.git` stand-in (it stays in the run's tmpfs).
    let git_repository = sandbox
        .git_shadow
        .as_ref()
        .is_some_and(|(shadow, _)| std::fs::read_dir(shadow).is_ok_and(|mut d| d.next().is_some()));
    let report = InitReport::Ended {
        exit: ended,
        leftovers,
        git_repository,
    };
    sys::write_all_fd(&status, &report.encode());
    // Closing the pipe now tells the supervisor the run is over; left to exit, the close
    // would wait for the teardown of this process's memory and namespaces.
    drop(status);
    // That teardown (about 0.15 ms: the view's mounts, the namespaces) must not delay the
    // supervisor's last steps, nor whoever waits for `sidejob exec`, which keeps the
    // supervisor and init on one CPU (see `sys::cpu`): init moves to another CPU and tears
    // down there. Left on that CPU it would run ahead of the process the supervisor's exit
    // wakes. Where it cannot move, it lets the supervisor, just woken, go first.
    if !sys::cpu::leave_this_cpu() {
        std::thread::yield_now();
    }
    sys::exit_now(0)
}
