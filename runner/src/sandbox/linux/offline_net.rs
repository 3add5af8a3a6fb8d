//! Offline network namespaces that runs share instead of each making its own.
//!
//! A run whose network is off needs a network namespace only to be kept apart from the
//! host's network (its interfaces, its sockets in `/proc/net`, its abstract Unix sockets).
//! Making one and tearing it down costs about 0.8 ms of CPU (its sysctl tables are
//! registered at creation, and a kernel worker unregisters them after the last process left),
//! the costliest step of a run's start. Runs that may meet — the same user's, and only
//! where landlock scopes abstract sockets, so that none reaches another's (see
//! `Prepared::give_shared_netns`) — therefore join one empty namespace, `lo` down and nothing
//! in it:
//!
//! - the daemon's runs, one per user and session, which the spawner holds
//!   (`supervisor::spawner`);
//! - root's `sidejob exec` runs, one per caller, run uid and workspace, kept by a bind mount
//!   at `/run/sidejob-exec/net-<caller>-<run uid>-ws.<key>` ([`kept_for_exec`]): `exec` has
//!   no process that outlives it to hold one. The first run that needs it makes it; the
//!   next run to make one lets go of those no run joined for ten minutes (as the spawner
//!   does), and `umount /run/sidejob-exec/net-*` lets go of them all.
//!
//! The same directory keeps the bare mount namespace root's `sidejob exec` runs build their
//! views in copies of ([`kept_bare_for_exec`]), as the spawner keeps one for the daemon's.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, SystemTime};

use nix::fcntl::OFlag;

use crate::sys::{self, dirfd, sandbox as ssys};

/// Where root's `sidejob exec` keeps its offline namespaces: root's alone (mode 0700).
const EXEC_DIR: &str = "/run/sidejob-exec";

/// `NS_GET_NSTYPE` (`linux/nsfs.h`): the `CLONE_NEW*` type of a namespace descriptor.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// Whether this process makes namespaces for runs to share: only as root, and only where
/// landlock scopes abstract sockets (without that no run may join one:
/// `Prepared::give_shared_netns`), so none is made to be left unused.
pub(crate) fn may_share() -> bool {
    nix::unistd::geteuid().is_root()
        && super::Availability::cached()
            .landlock_abi
            .as_ref()
            .is_ok_and(|abi| *abi >= super::landlock::SCOPE_ABI)
}

/// A new, empty network namespace; the calling thread is back in `home` (its own, opened
/// before) afterwards. A thread that cannot return exits the process: every later fork
/// would be in the new namespace.
pub(crate) fn make(home: &OwnedFd) -> io::Result<OwnedFd> {
    sys::unshare(libc::CLONE_NEWNET)?;
    let made = std::fs::File::open("/proc/thread-self/ns/net");
    if let Err(e) = nix::sched::setns(home, nix::sched::CloneFlags::CLONE_NEWNET) {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "sidejob: cannot return to its network namespace: {e}"
        );
        std::process::exit(1);
    }
    Ok(made?.into())
}

/// The offline network namespace root's `sidejob exec` runs of `caller` as `run_uid` in
/// `workspace` share, made now if there is none. `None` when this process is not root, when
/// [`EXEC_DIR`] is not root's alone, or when anything fails: the run then makes its own, as
/// it always could.
pub(crate) fn kept_for_exec(caller: u32, run_uid: u32, workspace: &Path) -> Option<OwnedFd> {
    if !may_share() {
        return None;
    }
    let dir = exec_dir().ok()?;
    let name = format!(
        "net-{caller}-{run_uid}-{}",
        crate::sandbox::caches::workspace_key(workspace)
    );
    match open_ns(&dir, &name, libc::CLONE_NEWNET) {
        Some(ns) => {
            mark_used(&dir, &name);
            Some(ns)
        }
        None => make_kept(&dir, &name, libc::CLONE_NEWNET, || {
            let home: OwnedFd = std::fs::File::open("/proc/thread-self/ns/net")?.into();
            make(&home)
        }),
    }
}

/// The bare mount namespace (`view::bare_namespace`) root's `sidejob exec` runs build their
/// view in a copy of, as a daemon's runs do, kept at `/run/sidejob-exec/mnt-bare` and made
/// now if there is none (it is never let go: `umount` it to). `None` when this process may
/// not use one (`view::may_use_bare`), when [`EXEC_DIR`] is not root's alone, or when
/// anything fails: the run then builds its view in a copy of the host's namespace, as it
/// always could.
pub(crate) fn kept_bare_for_exec() -> Option<OwnedFd> {
    if !super::view::may_use_bare() {
        return None;
    }
    let dir = exec_dir().ok()?;
    let name = "mnt-bare";
    open_ns(&dir, name, libc::CLONE_NEWNS)
        .or_else(|| make_kept(&dir, name, libc::CLONE_NEWNS, super::view::bare_namespace))
}

/// Makes the namespace kept at `name` (unless another run just did), and lets go of those
/// no run has joined for [`KEPT_IDLE`]. The namespace is marked used before the lock is let
/// go: one without a mark is idle to the next maker's `let_go_of_idle`, which would
/// otherwise unmount it before its run marked it (seen: two runs of one workspace, started
/// together beside a run of another, each in a namespace of its own).
fn make_kept(
    dir: &OwnedFd,
    name: &str,
    kind: libc::c_int,
    make: impl FnOnce() -> io::Result<OwnedFd>,
) -> Option<OwnedFd> {
    // One maker at a time: two runs that both found none would each mount one.
    let lock = dirfd::open_at(
        dir.as_fd(),
        Path::new("."),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        0,
    )
    .ok()?;
    sys::flock(lock.as_fd(), libc::LOCK_EX).ok()?;
    if let Some(ns) = open_ns(dir, name, kind) {
        mark_used(dir, name);
        return Some(ns);
    }
    let_go_of_idle(dir);
    // The mount point: the file a previous boot of the host left, or a new one.
    let point = match dirfd::open_at(dir.as_fd(), Path::new(name), OFlag::O_PATH, 0) {
        Ok(fd) => fd,
        Err(_) => {
            drop(dirfd::create_at(dir.as_fd(), name, 0o600).ok()?);
            dirfd::open_at(dir.as_fd(), Path::new(name), OFlag::O_PATH, 0).ok()?
        }
    };
    if !dirfd::is_file(&dirfd::stat_fd(point.as_fd()).ok()?) {
        return None;
    }
    let ns = make().ok()?;
    let tree = ssys::copy_tree(&ns, false).ok()?;
    ssys::move_mount(&tree, &point).ok()?;
    mark_used(dir, name);
    Some(ns)
}

/// Whether the kept namespace `name` is let go once idle, and so marked when joined: the
/// network namespaces are (one per workspace); the bare mount namespace is not (one).
fn let_go_when_idle(name: &str) -> bool {
    name.starts_with("net-")
}

/// A kept namespace no run has joined for this long is let go (the runs still in it keep
/// it alive).
const KEPT_IDLE: Duration = Duration::from_secs(600);

/// When a kept namespace was last joined: the time of a file beside it, `<name>.used`.
const USED: &str = ".used";

fn mark_used(dir: &OwnedFd, name: &str) {
    if !let_go_when_idle(name) {
        return; // never let go, so never read
    }
    let mark = format!("{name}{USED}");
    let now = nix::sys::stat::utimensat(
        dir.as_fd(),
        mark.as_str(),
        &nix::sys::time::TimeSpec::UTIME_NOW,
        &nix::sys::time::TimeSpec::UTIME_NOW,
        nix::sys::stat::UtimensatFlags::NoFollowSymlink,
    );
    if now.is_err() {
        drop(dirfd::create_at(dir.as_fd(), &mark, 0o600));
    }
}

/// Unmounts and removes every kept namespace (and mark) not joined for [`KEPT_IDLE`], and
/// removes the marks left idle without a namespace (one unmounted by hand) and those nothing
/// reads (`mnt-bare.used`, which earlier builds wrote).
fn let_go_of_idle(dir: &OwnedFd) {
    let Ok(entries) = dirfd::entries(dir.as_fd()) else {
        return;
    };
    let now = SystemTime::now();
    let idle = |mark: &str| {
        dirfd::stat_at(dir.as_fd(), mark.as_ref()).map_or(true, |st| {
            let used = SystemTime::UNIX_EPOCH + Duration::from_secs(st.st_mtime.max(0) as u64);
            now.duration_since(used).is_ok_and(|d| d >= KEPT_IDLE)
        })
    };
    for (entry, _) in entries {
        let Some(name) = entry.to_str() else { continue };
        if let Some(marked) = name.strip_suffix(USED) {
            let kept = dirfd::stat_at(dir.as_fd(), marked.as_ref()).is_ok();
            if !let_go_when_idle(marked) || (!kept && idle(name)) {
                let _ = dirfd::unlink_at(dir.as_fd(), name);
            }
            continue;
        }
        if !let_go_when_idle(name) {
            continue;
        }
        let mark = format!("{name}{USED}");
        if idle(&mark) {
            let _ = nix::mount::umount2(
                &Path::new(EXEC_DIR).join(name),
                nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
            );
            let _ = dirfd::unlink_at(dir.as_fd(), name);
            let _ = dirfd::unlink_at(dir.as_fd(), &mark);
        }
    }
}

/// [`EXEC_DIR`], made if missing; only a real directory of root's that no one else may
/// write is taken.
fn exec_dir() -> io::Result<OwnedFd> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let path = Path::new(EXEC_DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let dir = dirfd::open_dir(path)?;
    let st = dirfd::stat_fd(dir.as_fd())?;
    if st.st_uid != 0 {
        return Err(io::Error::other("not root's"));
    }
    if st.st_mode & 0o077 != 0 {
        // Opened up since it was made: root's alone again. What anyone else could have put
        // in it meanwhile is never taken for a namespace ([`open_ns`] checks).
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// The namespace mounted at `name` in `dir`, if that is one of `kind` (`CLONE_NEW*`).
fn open_ns(dir: &OwnedFd, name: &str, kind: libc::c_int) -> Option<OwnedFd> {
    let fd = dirfd::open_at(dir.as_fd(), Path::new(name), OFlag::O_RDONLY, 0).ok()?;
    // SAFETY: an ioctl that takes no argument, on a descriptor this function owns.
    #[allow(unsafe_code)]
    let ns_kind = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE) };
    (ns_kind == kind).then_some(fd)
}
