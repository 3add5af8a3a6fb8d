//! What one daemon image hands the next across an in-place re-exec: the listening socket and
//! the state directory's lock, as descriptors left open (close-on-exec cleared on those two
//! alone), named in `SIDEJOB_UPGRADE=<pid>:<socket fd>:<lock fd>:<bound|activated>`.
//!
//! The pid is the daemon's own: an exec keeps it, so a variable that names another pid was
//! inherited from somewhere else (a shell that kept it) and is ignored, its numbers unused.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd, RawFd};
use std::path::Path;

use tokio::net::UnixListener;
use tracing::warn;

use crate::server::ServeError;
use crate::sys;

/// The variable the next image reads.
pub(crate) const ENV: &str = "SIDEJOB_UPGRADE";

/// The descriptors passed, by number, and how the socket came to the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Handover {
    pub pid: i32,
    pub socket: RawFd,
    pub lock: RawFd,
    /// A service manager bound the socket (it keeps it; the daemon never removes it).
    pub activated: bool,
}

impl Handover {
    pub(super) fn encode(&self) -> String {
        let how = if self.activated { "activated" } else { "bound" };
        format!("{}:{}:{}:{how}", self.pid, self.socket, self.lock)
    }

    pub(super) fn parse(text: &str) -> Option<Handover> {
        let mut it = text.split(':');
        let pid = it.next()?.parse().ok()?;
        let socket = it.next()?.parse().ok().filter(|fd| *fd > 2)?;
        let lock = it
            .next()?
            .parse()
            .ok()
            .filter(|fd| *fd > 2 && *fd != socket)?;
        let activated = match it.next()? {
            "activated" => true,
            "bound" => false,
            _ => return None,
        };
        it.next().is_none().then_some(Handover {
            pid,
            socket,
            lock,
            activated,
        })
    }
}

/// What the previous image of this daemon left to this one.
pub(crate) struct Inherited {
    pub listener: UnixListener,
    pub lock: File,
    pub activated: bool,
}

/// Takes over what the previous image handed over, if this start is an in-place upgrade.
pub(crate) fn take(state_dir: &Path) -> Result<Option<Inherited>, ServeError> {
    let Ok(text) = std::env::var(ENV) else {
        return Ok(None);
    };
    let io = |step: &'static str, source| ServeError::Io {
        step,
        path: format!("the descriptors {ENV}={text} names").into(),
        source,
    };
    let Some(h) = Handover::parse(&text) else {
        return Err(io(
            "take over",
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{ENV} is not <pid>:<socket fd>:<lock fd>:<bound|activated>"),
            ),
        ));
    };
    if h.pid != sys::getpid() {
        warn!(
            variable = ENV,
            value = %text,
            "ignoring an upgrade handover meant for another process"
        );
        return Ok(None);
    }
    let std_listener =
        sys::activation::inherited_unix_listener(h.socket).map_err(|e| io("take over", e))?;
    sys::reexec::close_on_exec(std_listener.as_fd()).map_err(|e| io("take over", e))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| io("take over", e))?;
    let listener = UnixListener::from_std(std_listener).map_err(|e| io("take over", e))?;
    let lock = File::from(lock_fd(h.lock, state_dir).map_err(|e| io("take over", e))?);
    // The same open file: the lock it holds is this process's already.
    lock.try_lock().map_err(|e| {
        io(
            "lock",
            match e {
                std::fs::TryLockError::Error(e) => e,
                std::fs::TryLockError::WouldBlock => {
                    std::io::Error::other("the handed-over lock is held by another process")
                }
            },
        )
    })?;
    Ok(Some(Inherited {
        listener,
        lock,
        activated: h.activated,
    }))
}

/// The inherited lock descriptor, if it is this state directory's `daemon.lock`.
fn lock_fd(fd: RawFd, state_dir: &Path) -> std::io::Result<OwnedFd> {
    let owned = sys::take_inherited_fd(fd)?;
    let expected = File::open(state_dir.join("daemon.lock"))?;
    if sys::reexec::file_id(owned.as_fd())? != sys::reexec::file_id(expected.as_fd())? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!(
                "descriptor {fd} is not {}",
                state_dir.join("daemon.lock").display()
            ),
        ));
    }
    Ok(owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handover_reads_back_as_written() {
        for activated in [true, false] {
            let h = Handover {
                pid: 4321,
                socket: 7,
                lock: 9,
                activated,
            };
            assert_eq!(Handover::parse(&h.encode()), Some(h));
        }
    }

    #[test]
    fn a_malformed_handover_is_refused() {
        for bad in [
            "",
            "12",
            "12:7:9",
            "12:7:9:maybe",
            "12:7:7:bound",
            "12:1:9:bound",
            "12:7:9:bound:extra",
            "x:7:9:bound",
        ] {
            assert_eq!(Handover::parse(bad), None, "{bad:?}");
        }
    }
}
