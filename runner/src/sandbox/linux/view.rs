//! The pieces of the minimal root view. [`super::launch`] calls them in order; each works in
//! the run's own mount namespace, on a tmpfs staged either at [`VIEW`] in a copy of the bare
//! namespace (see [`bare_root`]), which `chroot` then makes `/`, or at the run directory in a
//! copy of the host's, which `pivot_root` makes `/`. Their `staging` is where that tmpfs is:
//! `launch` passes `.`, having entered it, so each path is walked from there.

use std::ffi::CStr;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::LaunchError;
use crate::sandbox::resolve::MountSpec;
use crate::sys::dirfd::{self, Creds};
use crate::sys::sandbox::{
    self as sys, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY,
};

/// The device nodes of the minimal `/dev`, bound from the host's.
pub(crate) const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

const NOSUID: libc::c_ulong = libc::MS_NOSUID;
const NODEV: libc::c_ulong = libc::MS_NODEV;
const NOEXEC: libc::c_ulong = libc::MS_NOEXEC;

/// A failed step; a path in the view (relative to its root, see the module's documentation)
/// is named as the run would see it.
pub(super) fn err<'a>(
    step: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> LaunchError + 'a {
    move |source| LaunchError {
        step,
        path: Some(match path.strip_prefix(".") {
            Ok(rest) => Path::new("/").join(rest),
            Err(_) => path.to_path_buf(),
        }),
        source,
    }
}

/// A profile path, opened before anything is mounted over the host's tree.
pub(crate) enum Source {
    Bind {
        /// The path opened, and once [`copy_sources`] has run, a detached copy of it (with
        /// the mounts below it or without, as `submounts` says), to be attached in the view.
        fd: OwnedFd,
        dir: bool,
        target: PathBuf,
        exec: bool,
        write: bool,
        submounts: Submounts,
    },
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
    Tmpfs {
        target: PathBuf,
        exec: bool,
    },
}

/// Whether the mounts below a bound path come with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Submounts {
    /// The profile's own paths and the workspace, as the host has them.
    Kept,
    /// A caller's own path (`{home}`, `{session_dir}`, see `caller_path`): only the files of
    /// the mount it is on, so a symlink to `/` brings no `/proc` or `/run` with it.
    Left,
}

/// Opens every source. A symlink is recreated in the view rather than followed (its target
/// is in the view or it dangles); a missing optional path is left out. The workspace is
/// opened with `caller`'s filesystem credentials and with no symlink on the way, so the view
/// never holds what the caller could not open themselves — a parent directory they may not
/// search included; the caller's other paths (`{home}`, `{session_dir}`) are resolved as the
/// caller (see `caller_path`).
pub(crate) fn open_sources(
    mounts: &[MountSpec],
    off_limits: &[PathBuf],
    caller: Option<&Creds>,
) -> Result<Vec<Source>, LaunchError> {
    let mut out = Vec::with_capacity(mounts.len());
    for m in mounts {
        let Some(src) = &m.source else {
            out.push(Source::Tmpfs {
                target: m.target.clone(),
                exec: m.exec,
            });
            continue;
        };
        let source = if m.as_caller && !m.required {
            super::caller_path::open(m, src, mounts, off_limits, caller)?
        } else {
            open_listed(m, src, mounts, caller)?
        };
        out.extend(source);
    }
    Ok(out)
}

/// Opens the workspace (as the caller, no symlink on the way) or a path the profile lists
/// itself (the administrator's: a symlink there is theirs); `None` leaves it out.
fn open_listed(
    m: &MountSpec,
    src: &Path,
    mounts: &[MountSpec],
    caller: Option<&Creds>,
) -> Result<Option<Source>, LaunchError> {
    let opened = match (m.as_caller, caller) {
        (true, Some(c)) => dirfd::with_creds_here(Some(c), || dirfd::open_path_no_symlinks(src)),
        _ => sys::open_path(src, true),
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound && !m.required => return Ok(None),
        Err(e) => return Err(err("open", src)(e)),
    };
    let mut info = sys::fstat(&fd).map_err(err("stat", src))?;
    let mut fd = fd;
    if info.is_symlink() && m.required {
        // The workspace was swapped for a symlink after it was checked.
        return Err(LaunchError {
            step: "open",
            path: Some(src.to_path_buf()),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "the workspace is now a symlink",
            ),
        });
    }
    if m.as_caller {
        super::caller_path::refuse_kernel_fs(&fd, src)?;
    }
    if info.is_symlink() {
        // A symlink into the view is recreated as it is (/bin -> usr/bin); a read-only one
        // that leads out of it (/etc/resolv.conf -> /run/...) is replaced by what it points
        // to, since the profile named the path to make its content visible.
        let real = std::fs::canonicalize(src).ok();
        let in_view = real.as_ref().is_some_and(|r| {
            mounts
                .iter()
                .any(|o| o.source.is_some() && r.starts_with(&o.target))
        });
        match real {
            // Only for read-only entries: a writable path swapped for a symlink must not
            // make its target writable (it stays a dangling symlink in the view).
            Some(real) if !in_view && !m.write => {
                fd = sys::open_path(&real, true).map_err(err("open", &real))?;
                info = sys::fstat(&fd).map_err(err("stat", &real))?;
            }
            // Dangling: leave it out unless required.
            None if !m.required => return Ok(None),
            _ => {
                let link = std::fs::read_link(src).map_err(err("readlink", src))?;
                return Ok(Some(Source::Symlink {
                    target: m.target.clone(),
                    link,
                }));
            }
        }
    }
    // Bind the real path: no symlink on the way is followed while the view is built.
    Ok(Some(Source::Bind {
        fd,
        dir: info.is_dir(),
        target: m.target.clone(),
        exec: m.exec,
        write: m.write,
        submounts: Submounts::Kept,
    }))
}

/// `staging` + an absolute `target`.
pub(crate) fn in_view(staging: &Path, target: &Path) -> PathBuf {
    staging.join(target.strip_prefix("/").unwrap_or(target))
}

/// Creates the empty file a file is bound onto.
fn make_file(path: &Path) -> Result<(), LaunchError> {
    create_in_view(path, "create mount point", || {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map(drop)
    })
}

/// Makes `path` in the view with `create`, and its parents first if they are missing (most
/// are there already: a view puts many files into the same few directories).
fn create_in_view(
    path: &Path,
    step: &'static str,
    create: impl Fn() -> io::Result<()>,
) -> Result<(), LaunchError> {
    match create() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(err("mkdir", parent))?;
            }
            create()
        }
        done => done,
    }
    .map_err(err(step, path))
}

/// A tmpfs at `target` in the view, made first if it is missing.
fn tmpfs(target: &Path, flags: libc::c_ulong, data: &CStr) -> Result<(), LaunchError> {
    std::fs::create_dir_all(target).map_err(err("mkdir", target))?;
    mount_tmpfs(target, flags, data)
}

fn mount_tmpfs(target: &Path, flags: libc::c_ulong, data: &CStr) -> Result<(), LaunchError> {
    sys::mount(
        Some(Path::new("tmpfs")),
        target,
        Some(c"tmpfs"),
        flags,
        Some(data),
    )
    .map_err(err("mount tmpfs", target))
}

/// A bind mount of `src` at `dst` with the given attributes on it and every mount below.
fn bind(src: &Path, dst: &Path, set: u64) -> Result<(), LaunchError> {
    sys::mount(Some(src), dst, None, libc::MS_BIND | libc::MS_REC, None)
        .map_err(err("bind", dst))?;
    sys::mount_setattr_path(dst, set, 0).map_err(err("set mount attributes", dst))
}

/// Replaces each bound source's descriptor by a detached copy of it (see [`Source::Bind`]),
/// made while the host's tree is in this mount namespace: from another one it could not be
/// copied.
pub(crate) fn copy_sources(sources: &mut [Source]) -> Result<(), LaunchError> {
    for s in sources {
        if let Source::Bind {
            fd,
            target,
            submounts,
            ..
        } = s
        {
            *fd = sys::copy_tree(fd, *submounts == Submounts::Kept)
                .map_err(err("copy mount", target))?;
        }
    }
    Ok(())
}

/// Where the host's tree is while the view is built.
pub(crate) enum HostTree {
    /// In this mount namespace, a copy of the host's (until [`pivot`] detaches it).
    Here,
    /// In the host's mount namespace (`host`), which this thread is out of, for a copy of the
    /// bare one: it goes there and back (to this namespace, `task`'s, and the view at
    /// [`VIEW`]) only to open again a listed file renamed over since it was copied.
    Away { host: OwnedFd, task: OwnedFd },
}

impl HostTree {
    /// Before this thread leaves the host's mount namespace for the bare one's copy: what it
    /// needs to come back.
    pub(crate) fn leaving() -> io::Result<HostTree> {
        Ok(HostTree::Away {
            host: std::fs::File::open("/proc/thread-self/ns/mnt")?.into(),
            task: sys::open_path(Path::new("/proc/thread-self"), false)?,
        })
    }

    /// A detached copy of the file the host has at `target` now, or `None` when it cannot be
    /// copied (gone, or a symlink now). An error only when this thread cannot come back.
    fn copy_again(&self, target: &Path) -> Result<Option<OwnedFd>, LaunchError> {
        let copy = || -> Option<OwnedFd> {
            let fresh = sys::open_path(target, true).ok()?;
            if sys::fstat(&fresh).ok()?.is_symlink() {
                return None;
            }
            sys::copy_tree(&fresh, true).ok()
        };
        let HostTree::Away { host, task } = self else {
            return Ok(copy());
        };
        let mount_ns = nix::sched::CloneFlags::CLONE_NEWNS;
        let here = mount_ns_of(task).map_err(err("open the run's mount namespace", target))?;
        if nix::sched::setns(host, mount_ns).is_err() {
            return Ok(None);
        }
        let copied = copy();
        // Back in the view, or the launch fails here (init only reports then).
        nix::sched::setns(&here, mount_ns)
            .map_err(io::Error::from)
            .and_then(|()| std::env::set_current_dir(VIEW))
            .map_err(err("return to the run's mount namespace", target))?;
        Ok(copied)
    }
}

/// Attaches a bound source's copy at `dst`. A file the profile lists that was replaced after
/// it was opened (renamed over, as `useradd` replaces `/etc/passwd`) cannot be mounted any
/// more (`ENOENT`: the copied file is unlinked), so the file now at that path is copied and
/// attached instead (a few times, should it be replaced again meanwhile). Only the files a
/// profile lists itself: a caller's path, the workspace and directories are never opened
/// again as the daemon.
fn bind_listed(
    host: &HostTree,
    fd: &OwnedFd,
    target: &Path,
    dst: &Path,
    again: bool,
) -> Result<(), LaunchError> {
    let mut bound = sys::attach(fd, dst);
    for _ in 0..REBIND_TRIES {
        match bound {
            Err(e) if again && e.kind() == io::ErrorKind::NotFound => {
                let Some(fresh) = host.copy_again(target)? else {
                    return Err(err("bind", dst)(e));
                };
                bound = sys::attach(&fresh, dst);
            }
            done => return done.map_err(err("bind", dst)),
        }
    }
    bound.map_err(err("bind", dst))
}

/// How often [`bind_listed`] opens a replaced file again.
const REBIND_TRIES: usize = 3;

/// The new root: an empty tmpfs (made read-only with the read-only binds, below), mounted
/// over the run's private directory, which must exist: it is the daemon's (or `sidejob
/// exec`'s) to make, and nothing is made on the way to it (in `/dev/shm`, a directory made
/// there by someone else in the meantime would be theirs).
pub(crate) fn mount_root(staging: &Path) -> Result<(), LaunchError> {
    mount_tmpfs(staging, NOSUID | NODEV, c"mode=0755,size=1m,nr_inodes=4096")
}

fn mount_point(dst: &Path, dir: bool) -> Result<(), LaunchError> {
    if dir {
        std::fs::create_dir_all(dst).map_err(err("mkdir", dst))
    } else {
        make_file(dst)
    }
}

/// The directories every view makes anew instead of taking them from the host.
pub(crate) const MADE_ANEW: [&str; 2] = ["proc", "dev"];

/// Every profile path. To keep the number of mount calls down, the read-only ones are bound
/// first and made read-only (with the root tmpfs itself) by one recursive `mount_setattr`;
/// the writable ones (private tmpfs, workspace), `/proc` and `/dev` are mounted after it,
/// so their mount points are made now, while the root is still writable.
pub(crate) fn mount_sources(
    staging: &Path,
    sources: &[Source],
    host: &HostTree,
    tmp_options: &CStr,
) -> Result<(), LaunchError> {
    let tmpfs_targets: Vec<&Path> = sources
        .iter()
        .filter_map(|s| match s {
            Source::Tmpfs { target, .. } => Some(target.as_path()),
            _ => None,
        })
        .collect();
    // Inside a private tmpfs, a mount point can only be made once that tmpfs is mounted.
    let under_tmpfs = |t: &Path| tmpfs_targets.iter().any(|d| t != *d && t.starts_with(d));
    for s in sources {
        match s {
            Source::Bind { dir, target, .. } if !under_tmpfs(target) => {
                mount_point(&in_view(staging, target), *dir)?;
            }
            Source::Tmpfs { target, .. } => mount_point(&in_view(staging, target), true)?,
            Source::Bind { .. } | Source::Symlink { .. } => {}
        }
    }
    for d in MADE_ANEW {
        mount_point(&staging.join(d), true)?;
    }
    for s in sources {
        if let Source::Symlink { target, link } = s {
            let dst = in_view(staging, target);
            // A real path already mounted there wins (e.g. /lib64 listed as a dir elsewhere).
            if dst.symlink_metadata().is_ok() {
                continue;
            }
            create_in_view(&dst, "symlink", || std::os::unix::fs::symlink(link, &dst))?;
        }
    }
    // Read-only binds, then one call makes them and the root read-only, nosuid and nodev.
    for s in sources {
        if let Source::Bind {
            fd,
            target,
            dir,
            write: false,
            submounts,
            ..
        } = s
        {
            if under_tmpfs(target) {
                continue;
            }
            let dst = in_view(staging, target);
            let again = !*dir && *submounts == Submounts::Kept;
            bind_listed(host, fd, target, &dst, again)?;
        }
    }
    sys::mount_setattr_path(
        staging,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        0,
    )
    .map_err(err("make the view read-only", staging))?;
    // The writable ones and whatever lies inside a private tmpfs, parents first.
    for s in sources {
        match s {
            Source::Bind {
                fd,
                dir,
                target,
                exec,
                write,
                submounts,
            } if *write || under_tmpfs(target) => {
                let dst = in_view(staging, target);
                if under_tmpfs(target) {
                    mount_point(&dst, *dir)?;
                }
                let mut set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
                if !exec {
                    set |= MOUNT_ATTR_NOEXEC;
                }
                if !write {
                    set |= MOUNT_ATTR_RDONLY;
                }
                let again = !*dir && !*write && *submounts == Submounts::Kept;
                bind_listed(host, fd, target, &dst, again)?;
                sys::mount_setattr_path(&dst, set, 0).map_err(err("set mount attributes", &dst))?;
            }
            Source::Tmpfs { target, exec } => {
                let mut flags = NOSUID | NODEV;
                if !exec {
                    flags |= NOEXEC;
                }
                tmpfs(&in_view(staging, target), flags, tmp_options)?;
            }
            Source::Bind { .. } | Source::Symlink { .. } => {}
        }
    }
    Ok(())
}

/// A fresh `/proc` for the run's PID namespace (it shows only the run's processes), with
/// `/proc/sys` and `/proc/sysrq-trigger` read-only. Before `/proc/sys` is locked,
/// `vm.memfd_noexec = 2` makes this PID namespace refuse executable memfds (fileless exec).
pub(crate) fn mount_proc(staging: &Path, root_run: bool) -> Result<bool, LaunchError> {
    let proc_dir = staging.join("proc");
    std::fs::create_dir_all(&proc_dir).map_err(err("mkdir", &proc_dir))?;
    sys::mount(
        Some(Path::new("proc")),
        &proc_dir,
        Some(c"proc"),
        NOSUID | NODEV | NOEXEC,
        None,
    )
    .map_err(err("mount proc", &proc_dir))?;
    let memfd_noexec = std::fs::write(proc_dir.join("sys/vm/memfd_noexec"), "2").is_ok();
    // What this kernel's /proc has (one directory read: a fresh PID namespace's /proc lists
    // few processes), so that each entry below costs a mount only where it exists.
    let present: Vec<String> = std::fs::read_dir(&proc_dir)
        .map_err(err("read", &proc_dir))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let has = |name: &str| present.iter().any(|p| p == name);
    let read_only: &[&str] = if root_run {
        PROC_READ_ONLY
    } else {
        &PROC_READ_ONLY[..2]
    };
    for p in read_only.iter().filter(|p| has(p)) {
        let path = proc_dir.join(p);
        bind(
            &path,
            &path,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        )?;
    }
    let masked: Vec<&str> = PROC_MASKED.iter().copied().filter(|p| has(p)).collect();
    mask(&proc_dir, &masked, &staging.join(DEV_NULL))?;
    Ok(memfd_noexec)
}

/// `/proc` entries that stay readable but never writable (what container runtimes lock). The
/// first two always; the rest only for a run whose uid is 0, the one uid their owner-write
/// permission lets through (runs hold no capability).
pub(crate) const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "bus", "fs", "irq"];

/// `/proc` entries the run does not see at all (what container runtimes mask): the keyrings'
/// descriptions, timers and scheduler internals that leak other processes' activity, and
/// hardware information. A file reads as empty (`/dev/null` over it), a directory as empty
/// (a read-only tmpfs over it). Entries only a capability opens (`kcore`, `kpageflags`, …)
/// need no mask: runs hold none.
pub(crate) const PROC_MASKED: &[&str] = &[
    "keys",
    "key-users",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "acpi",
    "asound",
    "scsi",
];

/// Hides each of `names` under `dir` (see [`PROC_MASKED`]): one mount each. A file is hidden
/// by the view's `/dev/null` (`null`), so [`mount_dev`] comes first.
fn mask(dir: &Path, names: &[&str], null: &Path) -> Result<(), LaunchError> {
    for name in names {
        let path = dir.join(name);
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if meta.is_dir() {
            sys::mount(
                Some(Path::new("tmpfs")),
                &path,
                Some(c"tmpfs"),
                libc::MS_RDONLY | NOSUID | NODEV | NOEXEC,
                Some(c"size=0,mode=0555"),
            )
            .map_err(err("mask", &path))?;
        } else {
            // A plain bind of /dev/null: writing to it is harmless, so it needs no read-only
            // flag (and no second call to set one).
            sys::mount(Some(null), &path, None, libc::MS_BIND, None).map_err(err("mask", &path))?;
        }
    }
    Ok(())
}

/// `/sys` entries masked the same way, when a profile puts `/sys` in the view.
pub(crate) const SYS_MASKED: &[&str] = &["firmware", "devices/virtual/powercap", "kernel/security"];

/// Masks [`SYS_MASKED`] if the view holds `/sys` (no shipped profile does).
pub(crate) fn mask_sys(staging: &Path) -> Result<(), LaunchError> {
    let sys_dir = staging.join("sys");
    if sys_dir.join("kernel").exists() {
        mask(&sys_dir, SYS_MASKED, &staging.join(DEV_NULL))?;
    }
    Ok(())
}

/// The copies [`copy_devices`] makes: each device's name and its detached mount.
pub(crate) type Devices = Vec<(&'static str, OwnedFd)>;

/// The view's `/dev/null`, relative to its root.
const DEV_NULL: &str = "dev/null";

/// Detached copies of the host's [`DEVICES`] (those it has), nosuid and noexec, for
/// [`mount_dev`]: made while the host's tree is in this mount namespace, as
/// [`copy_sources`] makes the sources'.
pub(crate) fn copy_devices() -> Result<Devices, LaunchError> {
    let mut out = Vec::with_capacity(DEVICES.len());
    for d in DEVICES {
        let host = Path::new("/dev").join(d);
        let fd = match sys::open_path(&host, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(err("open", &host)(e)),
        };
        let tree = sys::copy_tree(&fd, false).map_err(err("copy mount", &host))?;
        sys::mount_setattr(&tree, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, 0)
            .map_err(err("set mount attributes", &host))?;
        out.push((*d, tree));
    }
    Ok(out)
}

/// A minimal `/dev`: the harmless character devices (copied by [`copy_devices`]), a private
/// devpts instance and a private shm.
pub(crate) fn mount_dev(staging: &Path, devices: &Devices) -> Result<(), LaunchError> {
    let dev = staging.join("dev");
    tmpfs(&dev, NOSUID | NOEXEC, c"mode=0755,size=64k,nr_inodes=64")?;
    for (d, tree) in devices {
        let dst = dev.join(d);
        make_file(&dst)?;
        sys::attach(tree, &dst).map_err(err("bind", &dst))?;
    }
    let pts = dev.join("pts");
    std::fs::create_dir_all(&pts).map_err(err("mkdir", &pts))?;
    sys::mount(
        Some(Path::new("devpts")),
        &pts,
        Some(c"devpts"),
        NOSUID | NOEXEC,
        Some(c"newinstance,ptmxmode=0666,mode=0620"),
    )
    .map_err(err("mount devpts", &pts))?;
    tmpfs(
        &dev.join("shm"),
        NOSUID | NODEV | NOEXEC,
        c"mode=1777,size=64m",
    )?;
    for (name, link) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let dst = dev.join(name);
        std::os::unix::fs::symlink(link, &dst).map_err(err("symlink", &dst))?;
    }
    Ok(())
}

fn refuse(path: &Path, why: &str) -> LaunchError {
    err("protect", path)(io::Error::new(
        io::ErrorKind::PermissionDenied,
        why.to_owned(),
    ))
}

/// Checks a protected directory's contents: a hard-linked file could be written through its
/// other name, and a symlink could point at a writable file.
fn check_tree(dir: &Path, depth: u32) -> Result<(), LaunchError> {
    let entries = std::fs::read_dir(dir).map_err(err("read", dir))?;
    for e in entries.flatten() {
        let path = e.path();
        let meta = path.symlink_metadata().map_err(err("stat", &path))?;
        if meta.file_type().is_symlink() {
            return Err(refuse(
                &path,
                "a protected directory holds a symlink; remove it or replace it with the file",
            ));
        }
        if meta.is_file() && std::os::unix::fs::MetadataExt::nlink(&meta) > 1 {
            return Err(refuse(
                &path,
                "a protected file has other hard links that would stay writable",
            ));
        }
        if meta.is_dir() && depth < 4 {
            check_tree(&path, depth + 1)?;
        }
    }
    Ok(())
}

/// Keeps `protected` read-only inside the writable workspace, and makes each `pinned`
/// directory (e.g. `.git`) a mount point so it cannot be renamed or replaced as a whole.
/// Works on descriptors opened without following symlinks, so what is checked is what is
/// mounted over: a symlink or hard link swapped in before launch is refused, and a rename
/// or link during the run fails (a mount point cannot be renamed, and links do not cross
/// mounts).
pub(crate) fn protect(
    staging: &Path,
    pinned: &[PathBuf],
    protected: &[PathBuf],
) -> Result<(), LaunchError> {
    for p in pinned {
        let path = in_view(staging, p);
        let fd = match sys::open_path(&path, true) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(err("open", &path)(e)),
        };
        let info = sys::fstat(&fd).map_err(err("stat", &path))?;
        if info.is_symlink() {
            return Err(refuse(
                &path,
                "the directory holding protected paths is a symlink",
            ));
        }
        if info.is_file() && info.nlink > 1 {
            return Err(refuse(
                &path,
                "a protected file has other hard links that would stay writable",
            ));
        }
        let tree = sys::copy_tree(&fd, false).map_err(err("clone mount", &path))?;
        // A file here (a git worktree's `.git`, naming the real git directory) would let the
        // run point git elsewhere: it stays read-only too.
        if info.is_file() {
            sys::mount_setattr(
                &tree,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                0,
            )
            .map_err(err("make read-only", &path))?;
        }
        sys::move_mount(&tree, &fd).map_err(err("pin", &path))?;
    }
    for p in protected {
        let path = in_view(staging, p);
        // No symlink on the way (the kernel refuses one with ELOOP); one as the last
        // component is opened as itself, and refused below.
        let fd = match dirfd::open_path_no_symlinks(&path) {
            Ok(fd) => fd,
            // Missing, or below a file (`.git/hooks` when `.git` is a worktree's file).
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(libc::ENOTDIR) =>
            {
                continue
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(refuse(&path, "a protected path passes through a symlink"))
            }
            Err(e) => return Err(err("open", &path)(e)),
        };
        let info = sys::fstat(&fd).map_err(err("stat", &path))?;
        if info.is_symlink() {
            return Err(refuse(&path, "a protected path is a symlink"));
        }
        if info.is_file() && info.nlink > 1 {
            return Err(refuse(
                &path,
                "a protected file has other hard links that would stay writable",
            ));
        }
        if info.is_dir() {
            check_tree(&path, 0)?;
        }
        let tree = sys::copy_tree(&fd, false).map_err(err("clone mount", &path))?;
        sys::mount_setattr(
            &tree,
            MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            0,
        )
        .map_err(err("make read-only", &path))?;
        sys::move_mount(&tree, &fd).map_err(err("mount read-only", &path))?;
    }
    Ok(())
}

/// A private tmpfs on the empty `.git` stand-in at the workspace root (see `git`): a
/// repository the run makes there lives and dies with the run, and never reaches the host.
pub(crate) fn shadow_git(staging: &Path, shadow: &Path, options: &CStr) -> Result<(), LaunchError> {
    let path = in_view(staging, shadow);
    sys::mount(
        Some(Path::new("tmpfs")),
        &path,
        Some(c"tmpfs"),
        NOSUID | NODEV | NOEXEC,
        Some(options),
    )
    .map_err(err("mount tmpfs", &path))
}

/// Makes the staged tmpfs (already read-only) the root and detaches the host's tree from
/// this namespace.
pub(crate) fn pivot(staging: &Path) -> Result<(), LaunchError> {
    std::env::set_current_dir(staging).map_err(err("chdir", staging))?;
    // pivot_root(".", ".") stacks the old root on top of the new one; detaching "." then
    // removes the old root and leaves the new one.
    sys::pivot_root(Path::new("."), Path::new(".")).map_err(err("pivot_root", staging))?;
    sys::umount_detach(Path::new(".")).map_err(err("detach the host root", staging))?;
    std::env::set_current_dir("/").map_err(err("chdir", Path::new("/")))?;
    Ok(())
}

/// Makes every mount of this mount namespace, a copy of the host's, private: nothing mounted
/// in it propagates back to the host.
pub(crate) fn make_private() -> io::Result<()> {
    sys::mount(
        None,
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_PRIVATE,
        None,
    )
}

/// Where the view is staged in a copy of the bare namespace (see [`bare_root`]).
pub(crate) const VIEW: &str = "/view";

/// Makes the view at [`VIEW`], which the working directory is, the root, in a copy of the
/// bare namespace: nothing of the host's tree is in that namespace to detach, so a `chroot`
/// does what [`pivot`] does, without `pivot_root`'s walk of every process on the host. What
/// lies outside the view is the bare root's empty, read-only tmpfs, and the run can reach
/// no more than that even if it could leave the view: it can neither `chroot` nor make a
/// namespace (seccomp) and holds no capability.
pub(crate) fn enter_view() -> Result<(), LaunchError> {
    let view = Path::new(VIEW);
    sys::chroot(Path::new(".")).map_err(err("chroot", view))?;
    std::env::set_current_dir("/").map_err(err("chdir", Path::new("/")))?;
    Ok(())
}

/// Turns this thread's mount namespace, just copied from the host's, into a bare one: an
/// empty, read-only tmpfs as its root, with one directory ([`VIEW`]), and nothing of the
/// host's tree. Runs start from copies of it (see [`bare_namespace`]): copying it costs a
/// mount, where copying the host's costs one per host mount, and a view built in it needs
/// neither `pivot_root` nor the host's tree detached from it.
pub(crate) fn bare_root() -> io::Result<()> {
    make_private()?;
    // Any directory serves as the tmpfs's mount point: the tree it is in goes below.
    let at = Path::new("/proc");
    sys::mount(
        Some(Path::new("tmpfs")),
        at,
        Some(c"tmpfs"),
        NOSUID | NODEV | NOEXEC,
        Some(c"mode=0755,size=4k,nr_inodes=4"),
    )?;
    std::fs::create_dir(at.join(VIEW.trim_start_matches('/')))?;
    std::env::set_current_dir(at)?;
    sys::pivot_root(Path::new("."), Path::new("."))?;
    sys::umount_detach(Path::new("."))?;
    std::env::set_current_dir("/")?;
    sys::mount_setattr_path(
        Path::new("/"),
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
        0,
    )
}

/// Whether this process's runs may build their views in copies of a bare mount namespace:
/// as root (a run's init joins it with `setns`, which a run in a user namespace of its own
/// may not) with `CAP_SYS_CHROOT` (which joining a mount namespace and `chroot` need; a
/// deployment that bounds the daemon's capabilities may leave it out, and its runs copy the
/// host's namespace instead).
pub(crate) fn may_use_bare() -> bool {
    const CAP_SYS_CHROOT: u32 = 18;
    nix::unistd::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/status").is_ok_and(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
                .is_some_and(|caps| caps & (1 << CAP_SYS_CHROOT) != 0)
        })
}

/// A new bare mount namespace (see [`bare_root`]), for runs to start from (see
/// [`may_use_bare`]). Made on a thread of its own, which ends with it: the rest of the
/// process never leaves its namespace (the spawner is single-threaded again when it forks).
pub(crate) fn bare_namespace() -> io::Result<OwnedFd> {
    let (tid, made) = std::thread::scope(|s| {
        s.spawn(|| (nix::unistd::gettid(), make_this_threads_bare()))
            .join()
    })
    .map_err(|_| io::Error::other("the thread making it panicked"))?;
    // Joined is not yet gone: the kernel wakes the joiner before the thread's exit is
    // complete, and until it is, the process counts two threads. The spawner and `sidejob
    // exec` fork next, which they refuse to do with two (`sys::fork`): a run right after the
    // spawner started failed so ("cannot start the supervisor").
    crate::sys::wait_for_thread_exit(tid);
    made
}

/// [`bare_namespace`]'s thread: a mount namespace of its own, made bare, and opened.
fn make_this_threads_bare() -> io::Result<OwnedFd> {
    let task = sys::open_path(Path::new("/proc/thread-self"), false)?;
    // The thread's working directory and root are its own from here on, too.
    crate::sys::unshare(libc::CLONE_NEWNS)?;
    bare_root()?;
    mount_ns_of(&task)
}

/// The mount namespace of the thread whose `/proc` directory `task` is, as it is now (it can
/// be opened after the thread has left the tree that `/proc` is in).
fn mount_ns_of(task: &OwnedFd) -> io::Result<OwnedFd> {
    Ok(nix::fcntl::openat(
        task,
        "ns/mnt",
        OFlag::O_RDONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}
