//! The view's paths that a caller owns (`{home}`, `{session_dir}`), opened with the caller's
//! authority: a symlink there is the caller's to make, so it is resolved as the caller or
//! recreated in the view, never followed as root.
//!
//! - Every open runs with the caller's filesystem credentials, so each directory on the
//!   way — a symlink's target included — must be searchable by them: `~/.local/lib ->
//!   /root-only/pub` fails as it would for the caller on the host.
//! - Magic links (`/proc/<pid>/root`, `/proc/self/fd/N`) are never followed, and nothing on
//!   a kernel filesystem ([`KERNEL_FILESYSTEMS`]) is bound: `~/.nvm -> /proc` would show the
//!   host's processes, and their roots, to the run.
//! - A caller's path is bound without the mounts below it: `~/.nvm -> /` gives the run the
//!   root filesystem's files the caller may read, not the host's `/proc`, `/run` or `/tmp`.
//! - A symlink whose target is in the view anyway, or that stands for a writable path, is
//!   recreated as a symlink: it resolves inside the view, or dangles.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::statfs::{self, FsType};

use super::view::{Source, Submounts};
use super::LaunchError;
use crate::sandbox::resolve::MountSpec;
use crate::sys::dirfd::{self, Creds};

/// Filesystems whose files are the kernel's view of the host rather than data: a caller's
/// path that lands on one of them is refused.
const KERNEL_FILESYSTEMS: &[(FsType, &str)] = &[
    (
        statfs::PROC_SUPER_MAGIC,
        "the host's processes, their roots and descriptors",
    ),
    (
        statfs::SYSFS_MAGIC,
        "the host's devices and kernel settings",
    ),
    (
        statfs::CGROUP_SUPER_MAGIC,
        "cgroup v1: moving a process out of the run's limits",
    ),
    (
        statfs::CGROUP2_SUPER_MAGIC,
        "cgroup v2: moving a process out of the run's limits",
    ),
    (statfs::DEBUGFS_MAGIC, "kernel internals"),
    (statfs::TRACEFS_MAGIC, "tracing every process of the host"),
    (statfs::SECURITYFS_MAGIC, "the LSMs' policy"),
    (statfs::SELINUX_MAGIC, "SELinux's policy"),
    (statfs::SMACK_MAGIC, "Smack's policy"),
    (statfs::BPF_FS_MAGIC, "pinned BPF programs and maps"),
    (statfs::DEVPTS_SUPER_MAGIC, "the host's terminals"),
    (
        FsType(libc::NSFS_MAGIC as _),
        "namespaces: a way into another process's",
    ),
];

/// What was found at a caller's path, as the caller.
enum Found {
    Missing,
    /// Not a symlink (or reached through symlinks before its last component).
    Path(OwnedFd),
    /// A symlink: its text, and what it leads to for the caller (`None`: it dangles).
    Link {
        text: PathBuf,
        target: Option<OwnedFd>,
    },
}

/// Opens the caller's path `m` (not the workspace, which must hold no symlink at all) for
/// the view; `None` leaves it out (missing, or a symlink that dangles).
pub(super) fn open(
    m: &MountSpec,
    src: &Path,
    mounts: &[MountSpec],
    off_limits: &[PathBuf],
    caller: Option<&Creds>,
) -> Result<Option<Source>, LaunchError> {
    let found = dirfd::with_creds_here(caller, || find(src)).map_err(|e| refusal(src, e))?;
    let fd = match found {
        Found::Missing | Found::Link { target: None, .. } => return Ok(None),
        Found::Path(fd) => fd,
        Found::Link {
            text,
            target: Some(fd),
        } => {
            // The name of our own descriptor: where the caller's symlink led.
            let real = dirfd::fd_path(fd.as_fd()).map_err(|e| refusal(src, e))?;
            let in_view = mounts
                .iter()
                .any(|o| o.source.is_some() && real.starts_with(&o.target));
            // A writable path that is a symlink must not make its target writable.
            if in_view || m.write {
                return Ok(Some(Source::Symlink {
                    target: m.target.clone(),
                    link: text,
                }));
            }
            fd
        }
    };
    refuse_kernel_fs(&fd, src)?;
    refuse_off_limits(&fd, src, off_limits)?;
    let info = crate::sys::sandbox::fstat(&fd).map_err(|e| refusal(src, e))?;
    Ok(Some(Source::Bind {
        fd,
        dir: info.is_dir(),
        target: m.target.clone(),
        exec: m.exec,
        write: m.write,
        submounts: Submounts::Left,
    }))
}

/// How a caller grants a path to one call (`tool.call` `grants`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantAccess {
    Read,
    Write,
}

impl std::fmt::Display for GrantAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            GrantAccess::Read => "read",
            GrantAccess::Write => "write",
        })
    }
}

/// A path a caller may not grant one call: which path, for what, and why not.
#[derive(Debug, thiserror::Error)]
#[error("cannot grant {access} access to {}: {why}", .path.display())]
pub(crate) struct GrantError {
    pub path: PathBuf,
    pub access: GrantAccess,
    pub why: GrantRefusal,
}

/// Why [`check_grant`] refuses a path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GrantRefusal {
    #[error(
        "uid {uid} may not {access} it ({source}); a call may grant only what its caller can {access} on the host"
    )]
    Denied {
        uid: u32,
        access: GrantAccess,
        source: io::Error,
    },
    #[error("no such file or directory")]
    Missing,
    #[error("it leads through a magic link such as /proc/<pid>/root (or too many symlinks)")]
    MagicLink,
    #[error("it is a symlink; name the directory it points to")]
    Symlink,
    #[error("not a regular file or a directory")]
    NotFileOrDir,
    /// On a kernel filesystem, or into, onto or above a directory that is off limits.
    #[error("{}", .0.source)]
    OffLimits(LaunchError),
    #[error("{0}")]
    Io(io::Error),
}

/// Checks a path a caller grants one call, before anything of the call is made, so a path
/// they may not use is refused up front, naming it. The path is the caller's authority:
/// it is resolved as the caller (their filesystem credentials, on a thread of its own),
/// never through a magic link, and the file it leads to must be readable (writable) by
/// them, a directory searchable too. It may not lead to a kernel filesystem nor into,
/// onto or above one of `off_limits` (the daemon's state directory, its sockets'). A
/// writable path may not be a symlink: the view would recreate it, leading nowhere. The
/// run's init resolves the path again as the caller ([`open`]), so what was checked here
/// is what the run gets, or less.
pub(crate) fn check_grant(
    path: &Path,
    access: GrantAccess,
    caller: &Creds,
    off_limits: &[PathBuf],
) -> Result<(), GrantError> {
    let write = access == GrantAccess::Write;
    let refuse = |why: GrantRefusal| GrantError {
        path: path.to_owned(),
        access,
        why,
    };
    let explain = |e: io::Error| {
        refuse(match e.raw_os_error() {
            Some(libc::EACCES) | Some(libc::EPERM) => GrantRefusal::Denied {
                uid: caller.uid,
                access,
                source: e,
            },
            Some(libc::ENOENT) => GrantRefusal::Missing,
            Some(libc::ELOOP) => GrantRefusal::MagicLink,
            _ => GrantRefusal::Io(e),
        })
    };
    // As the caller: where the path leads, and whether they may use what is there (the
    // second answer is given only once the first is known not to be off limits).
    let (fd, access_now) = dirfd::as_caller(Some(caller), || {
        if write {
            let named = dirfd::open_path_no_magiclinks(path, OFlag::O_NOFOLLOW)?;
            if crate::sys::sandbox::fstat(&named)?.is_symlink() {
                return Ok(Err(GrantRefusal::Symlink));
            }
        }
        let fd = dirfd::open_path_no_magiclinks(path, OFlag::empty())?;
        let info = crate::sys::sandbox::fstat(&fd)?;
        if !(info.is_dir() || info.is_file()) {
            return Ok(Err(GrantRefusal::NotFileOrDir));
        }
        let access = crate::sys::access_fd(fd.as_fd(), write, info.is_dir());
        Ok(Ok((fd, access)))
    })
    .map_err(explain)?
    .map_err(refuse)?;
    let reason = |e: LaunchError| refuse(GrantRefusal::OffLimits(e));
    refuse_kernel_fs(&fd, path).map_err(reason)?;
    refuse_off_limits(&fd, path, off_limits).map_err(reason)?;
    access_now.map_err(explain)
}

/// Looks at `src` as the caller sees it (run with their credentials).
fn find(src: &Path) -> io::Result<Found> {
    let named = match dirfd::open_path_no_magiclinks(src, OFlag::O_NOFOLLOW) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::Missing),
        Err(e) => return Err(e),
    };
    if !crate::sys::sandbox::fstat(&named)?.is_symlink() {
        return Ok(Found::Path(named));
    }
    let text = dirfd::read_link(named.as_fd())?;
    let target = match dirfd::open_path_no_magiclinks(src, OFlag::empty()) {
        Ok(fd) => Some(fd),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    Ok(Found::Link { text, target })
}

/// Refuses a descriptor on one of [`KERNEL_FILESYSTEMS`].
pub(super) fn refuse_kernel_fs(fd: &OwnedFd, src: &Path) -> Result<(), LaunchError> {
    let kind = statfs::fstatfs(fd)
        .map_err(|e| refusal(src, e.into()))?
        .filesystem_type();
    match KERNEL_FILESYSTEMS.iter().find(|(k, _)| *k == kind) {
        Some((_, what)) => Err(refusal(
            src,
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("a caller's path may not lead to a kernel filesystem ({what})"),
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses a descriptor on, above or below one of `off_limits` (the control socket's
/// directory, the bridges'): what it leads to is where the caller's path really is.
fn refuse_off_limits(fd: &OwnedFd, src: &Path, off_limits: &[PathBuf]) -> Result<(), LaunchError> {
    if off_limits.is_empty() {
        return Ok(());
    }
    let real = dirfd::fd_path(fd.as_fd()).map_err(|e| refusal(src, e))?;
    // A path above one is bound without the mounts below it: it holds that directory only
    // when both are on one filesystem.
    let dev = dirfd::stat_fd(fd.as_fd())
        .map_err(|e| refusal(src, e))?
        .st_dev;
    let same_fs = |d: &Path| {
        std::fs::metadata(d).is_ok_and(|m| std::os::unix::fs::MetadataExt::dev(&m) == dev)
    };
    match off_limits
        .iter()
        .find(|d| real.starts_with(d) || (d.starts_with(&real) && same_fs(d)))
    {
        Some(d) => Err(refusal(
            src,
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "a caller's path may not lead to sidejob's own sockets or state ({} holds or lies in {})",
                    real.display(),
                    d.display()
                ),
            ),
        )),
        None => Ok(()),
    }
}

fn refusal(src: &Path, source: io::Error) -> LaunchError {
    let source = if source.raw_os_error() == Some(libc::ELOOP) {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a caller's path may not lead through a magic link such as /proc/<pid>/root \
             (or through too many symlinks)",
        )
    } else {
        source
    };
    LaunchError {
        step: "open",
        path: Some(src.to_path_buf()),
        source,
    }
}
