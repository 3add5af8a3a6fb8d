//! The proxy of one `sidejob exec` run: `exec` has no daemon, so it forks a process that
//! serves the run's socket with a runtime of its own. `exec` binds the socket before the run
//! starts and forks the proxy when the run first uses the network (it is single-threaded
//! throughout: it is the run's supervisor); it kills it when the run is over, and it dies with
//! `exec` anyway (parent-death signal). It keeps only its socket of `exec`'s descriptors.

use std::io;
use std::sync::Arc;

use crate::sys::{self, Fork};

use super::Run;

/// Forks the proxy process serving `listener` for `run`; returns its pid.
pub(crate) fn spawn(listener: std::os::unix::net::UnixListener, run: Run) -> io::Result<i32> {
    match sys::fork()? {
        Fork::Parent(pid) => Ok(pid),
        Fork::Child => {
            if sys::set_parent_death_signal(libc::SIGKILL).is_err() {
                sys::exit_now(1);
            }
            // The proxy does the run's network work: not held to `exec`'s CPU.
            sys::cpu::free_to_move();
            close_all_but(&[0, 1, 2, std::os::fd::AsRawFd::as_raw_fd(&listener)]);
            let code = match serve(listener, run) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("sidejob exec: the egress proxy stopped: {e}");
                    1
                }
            };
            sys::exit_now(code)
        }
    }
}

/// Closes every descriptor but `keep` (the supervisor's pipes and files are not the proxy's;
/// this process never uses them and ends with `exit_now`, so nothing closes them again).
fn close_all_but(keep: &[std::os::fd::RawFd]) {
    let open: Vec<std::os::fd::RawFd> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in open {
        if !keep.contains(&fd) {
            let _ = nix::unistd::close(fd);
        }
    }
}

fn serve(listener: std::os::unix::net::UnixListener, run: Run) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        super::serve(listener, Arc::new(run), std::future::pending()).await;
        Ok(())
    })
}
