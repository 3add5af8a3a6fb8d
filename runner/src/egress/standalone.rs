//! The proxy of one `sidejob exec` run: `exec` has no daemon, so it forks a process that
//! serves the run's socket with a runtime of its own. `exec` forks it while it is still
//! single-threaded (before the run starts) and kills it when the run is over; it also dies
//! with `exec` (parent-death signal).

use std::io;
use std::sync::Arc;

use crate::sys::{self, Fork};

use super::Run;

/// Forks the proxy process serving `listener` for `run`; returns its pid.
pub fn spawn(listener: std::os::unix::net::UnixListener, run: Run) -> io::Result<i32> {
    match sys::fork()? {
        Fork::Parent(pid) => Ok(pid),
        Fork::Child => {
            if sys::set_parent_death_signal(libc::SIGKILL).is_err() {
                sys::exit_now(1);
            }
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
