//! The spawner: a small, single-threaded process the daemon starts once, which forks a
//! supervisor per run (`sidejob spawner <runs_dir>`).
//!
//! Starting `sidejob supervise` afresh for every run costs an `exec` of the whole binary:
//! loading and relocating it, and a private copy of every page the relocations touch. The
//! spawner has paid that once; each supervisor is a fork of it, sharing its pages. The fork
//! is a [`sys::spawn::fork_sibling`]: the supervisor is the *daemon's* child, exactly as if
//! the daemon had started it with `posix_spawn` — the daemon reaps it, watches its pidfd,
//! records its pid and start time, and a supervisor outlives a daemon that dies. The
//! spawner itself holds nothing of any run and exits when the daemon's end of its socket
//! closes.
//!
//! One request, one reply, on a `SOCK_SEQPACKET` socket pair (descriptor 3): the request is
//! the run's private directory, with [`FDS`] descriptors attached (the supervisor's 0 to 4,
//! see `executor::spawn`), and for a run whose network is off the key of the network
//! namespace it may share; the reply is the supervisor's pid, or a negated `errno`.
//! Encoded and decoded here only. A supervisor forked this way keeps the spawner's command
//! line; its name (`comm`) is [`SUPERVISOR_NAME`].
//!
//! **Shared offline network namespaces** (`sandbox::linux::offline_net`). The spawner keeps
//! one empty namespace per key the daemon gives — the run's uid and session — and hands it to
//! the supervisor as descriptor [`SHARED_NETNS_FD`]; the run's init joins it instead of making
//! its own (`sandbox::linux::launch`). Runs of other sessions or other users never meet in
//! one. A namespace unused for [`SHARED_NETNS_IDLE`] is let go (the runs still in it keep it
//! alive), and at most [`SHARED_NETNS_MAX`] are kept. Where none may be shared
//! (`offline_net::may_share`), or making one fails, the run makes its own.
//!
//! **The bare mount namespace** (`sandbox::linux::view::bare_namespace`). A spawner that may
//! (`view::may_use_bare`: root, with `CAP_SYS_CHROOT`) makes one when it starts: an empty
//! read-only tmpfs and nothing of the host's tree. Every supervisor gets it after the
//! descriptors above, and the run's init builds the view in a copy of it instead of a copy
//! of the host's (`sandbox::linux::launch`). Where it cannot be made, runs copy the host's,
//! as they always could.

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::run::fds::{self, Request};
use crate::sys::{self, fdpass, Fork};

/// The name (`comm`) of a supervisor the spawner forked.
pub(crate) const SUPERVISOR_NAME: &std::ffi::CStr = c"sidejob-run";

/// A shared network namespace no run has asked for in this long is let go.
const SHARED_NETNS_IDLE: Duration = Duration::from_secs(600);

/// The most shared network namespaces kept at once (the least recently used goes first).
const SHARED_NETNS_MAX: usize = 256;

/// The shared offline network namespaces (see the module's documentation).
struct SharedNets {
    /// The spawner's own network namespace, to return to after making one.
    home: OwnedFd,
    nets: HashMap<Vec<u8>, (OwnedFd, Instant)>,
    /// [`SHARED_NETNS_IDLE`] and [`SHARED_NETNS_MAX`], but for tests.
    idle: Duration,
    max: usize,
}

impl SharedNets {
    /// `None` when this spawner cannot make them (it is not root) or runs must not share
    /// them (landlock cannot scope their abstract sockets).
    fn new() -> Option<SharedNets> {
        SharedNets::with_limits(SHARED_NETNS_IDLE, SHARED_NETNS_MAX)
    }

    fn with_limits(idle: Duration, max: usize) -> Option<SharedNets> {
        if !crate::sandbox::linux::offline_net::may_share() {
            return None;
        }
        let home = std::fs::File::open("/proc/thread-self/ns/net").ok()?;
        Some(SharedNets {
            home: home.into(),
            nets: HashMap::new(),
            idle,
            max,
        })
    }

    /// The namespace for `key`, made now if there is none; `None` if it cannot be made.
    fn get(&mut self, key: &[u8], now: Instant) -> Option<&OwnedFd> {
        let idle = self.idle;
        self.nets
            .retain(|_, (_, used)| now.saturating_duration_since(*used) < idle);
        if !self.nets.contains_key(key) {
            if self.nets.len() >= self.max {
                let oldest = self
                    .nets
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.nets.remove(&k);
                }
            }
            match crate::sandbox::linux::offline_net::make(&self.home) {
                Ok(fd) => {
                    self.nets.insert(key.to_vec(), (fd, now));
                }
                Err(e) => {
                    say(format_args!("cannot make a shared network namespace: {e}"));
                    return None;
                }
            }
        }
        let entry = self.nets.get_mut(key)?;
        entry.1 = now;
        Some(&entry.0)
    }
}

/// A line to the spawner's stderr, which the daemon reads into its own log (see
/// `executor::spawn`). Never panics, unlike `eprintln`.
fn say(msg: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{msg}");
}

/// Entry point of `sidejob spawner <runs_dir>`; returns the process exit code.
pub fn main(runs_dir: &Path) -> i32 {
    // Every supervisor is born with the stop signals blocked (it reads them from a signalfd):
    // one the daemon sends as soon as it knows the pid — which this process writes down
    // before the child has run a single instruction — stays pending instead of killing the
    // supervisor before it could settle the run. (This process itself stops when the daemon
    // closes its socket.)
    if let Err(e) = super::stop_signals().block() {
        say(format_args!("cannot block the stop signals: {e}"));
        return 2;
    }
    let _ = sys::close_from(fds::SPAWNER_SOCKET_FD as u32 + 1);
    // Moved out of the way: a supervisor's descriptors (0 to 6) are placed where it was.
    let sock = match sys::take_inherited_fd(fds::SPAWNER_SOCKET_FD)
        .and_then(|fd| sys::spawn::dup_at_least(fd.as_fd(), 16))
    {
        Ok(fd) => fd,
        Err(e) => {
            say(format_args!("the daemon's socket (descriptor 3): {e}"));
            return 2;
        }
    };
    let mut buf = vec![0u8; fds::MAX_REQUEST];
    let mut nets = SharedNets::new();
    let bare = crate::sandbox::linux::view::may_use_bare()
        .then(|| {
            crate::sandbox::linux::view::bare_namespace()
                .map_err(|e| say(format_args!("cannot make the bare mount namespace: {e}")))
                .ok()
        })
        .flatten();
    loop {
        match sys::poll_readable(&[Some(sock.as_fd())], -1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        }
        let (n, fds) = match fdpass::recv_with_fds(sock.as_fd(), &mut buf) {
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        };
        if n == 0 && fds.is_empty() {
            return 0; // the daemon is gone
        }
        let result = fork_supervisor(runs_dir, &buf[..n], fds, nets.as_mut(), bare.as_ref());
        if fdpass::send(sock.as_fd(), &fds::encode_reply(&result)).is_err() {
            return 1;
        }
    }
}

/// Forks a supervisor for the run a request names, with the descriptors it came with (and
/// after the go-ahead pipe, the shared network namespace it may join and the bare mount
/// namespace, each when there is one: see [`fds::SHARED_NETNS_FD`]).
///
/// The supervisor does nothing of the run until it has the spawner's go-ahead (a byte on a
/// pipe at [`GO_FD`]; the end of the pipe instead means no), given once its pid file is
/// written, before the reply. So a spawner that dies between the fork and its reply leaves
/// either a supervisor the daemon finds by that file, or one that runs nothing and exits:
/// never a run the daemon does not know of (`executor::spawn`).
fn fork_supervisor(
    runs_dir: &Path,
    request: &[u8],
    mut fds: Vec<OwnedFd>,
    nets: Option<&mut SharedNets>,
    bare: Option<&OwnedFd>,
) -> io::Result<i32> {
    let Request {
        private_dir,
        netns_key,
    } = fds::decode_request(runs_dir, request)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    if fds.len() != fds::FDS {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    let netns = match (netns_key, nets) {
        (Some(key), Some(nets)) => nets.get(&key, Instant::now()),
        _ => None,
    };
    let (go_read, go) = sys::pipe()?;
    fds.push(go_read);
    let shared_netns = match netns {
        Some(fd) => {
            fds.push(fd.try_clone()?);
            true
        }
        None => false,
    };
    if let Some(fd) = bare {
        fds.push(fd.try_clone()?);
    }
    match sys::spawn::fork_sibling()? {
        Fork::Parent(pid) => {
            // Before the daemon hears of it: a daemon that dies before it records the pid
            // finds it here after its restart. Written by the spawner, not the supervisor,
            // so the run does not wait for it. (The descriptors are closed as they drop.)
            // Without the file, no go-ahead: the supervisor exits, having run nothing, and
            // the daemon settles the run failed with its message.
            match super::write_pid_file(&crate::run::dir::PrivateDir::at(private_dir), pid) {
                Ok(()) => sys::write_all_fd(&go, b"g"),
                Err(e) => say(format_args!("cannot record supervisor {pid}: {e}")),
            }
            Ok(pid)
        }
        Fork::Child => {
            // Only the spawner may give the go-ahead (or, gone, refuse it).
            drop(go);
            // What `executor::spawn` asks of posix_spawn, done here: the descriptors at
            // their numbers, a process group of its own. The signal mask and dispositions
            // are the spawner's, which posix_spawn reset. The spawner's socket is closed by
            // the supervisor's first step (it keeps only the descriptors placed here).
            let code =
                match sys::spawn::place_fds(fds).and_then(|()| sys::spawn::own_process_group()) {
                    Ok(()) => {
                        // Its command line stays the spawner's; its name says what it is.
                        let _ = sys::spawn::set_name(SUPERVISOR_NAME);
                        super::forked_main(&private_dir, shared_netns, bare.is_some())
                    }
                    Err(e) => {
                        say(format_args!("cannot set up a supervisor: {e}"));
                        2
                    }
                };
            std::process::exit(code)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The namespace's identity (its nsfs inode).
    fn inode(fd: &OwnedFd) -> u64 {
        crate::sys::dirfd::stat_fd(fd.as_fd()).unwrap().st_ino
    }

    #[test]
    fn shared_namespaces_are_one_per_key_let_go_when_idle_or_past_the_cap() {
        let Some(mut nets) = SharedNets::with_limits(Duration::from_secs(60), 2) else {
            eprintln!("skipped: shared network namespaces need root and landlock ABI 6");
            return;
        };
        let here = || std::fs::metadata("/proc/thread-self/ns/net").unwrap();
        let home = std::os::unix::fs::MetadataExt::ino(&here());
        let t0 = Instant::now();
        // Each namespace is held here too, so that none is freed and its inode number
        // given to a later one.
        let mut held = Vec::new();
        let mut hold = |fd: &OwnedFd| {
            held.push(fd.try_clone().unwrap());
            inode(fd)
        };
        let a = hold(nets.get(b"1000/a", t0).unwrap());
        assert_ne!(a, home, "a new namespace");
        assert_eq!(
            std::os::unix::fs::MetadataExt::ino(&here()),
            home,
            "the spawner is back in its own namespace"
        );
        assert_eq!(
            inode(nets.get(b"1000/a", t0).unwrap()),
            a,
            "the same key, the same one"
        );
        let b = hold(nets.get(b"1000/b", t0 + Duration::from_secs(1)).unwrap());
        assert_ne!(b, a);
        // A third key passes the cap of two: the least recently used (a) goes.
        let c = hold(nets.get(b"1001/a", t0 + Duration::from_secs(2)).unwrap());
        assert!(![a, b].contains(&c));
        assert_eq!(nets.nets.len(), 2);
        assert!(!nets.nets.contains_key(&b"1000/a"[..]));
        // Unused for the idle time, b is let go and made anew; c, used since, stays.
        let c_again = inode(nets.get(b"1001/a", t0 + Duration::from_secs(50)).unwrap());
        assert_eq!(c_again, c);
        let b_again = hold(nets.get(b"1000/b", t0 + Duration::from_secs(62)).unwrap());
        assert_ne!(b_again, b);
        assert_eq!(
            inode(nets.get(b"1001/a", t0 + Duration::from_secs(62)).unwrap()),
            c
        );
    }
}
