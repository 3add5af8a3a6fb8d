//! Git in a writable workspace: nothing a run writes may make the host's git run code or read
//! configuration the run chose.
//!
//! Git runs code from hooks and from configuration (`core.fsmonitor`, `core.hooksPath`, filter
//! and diff drivers, aliases, …), and it finds its configuration through the git directory:
//! `config`, `config.worktree`, `commondir` (which names where `config` is), `info/`, and the
//! same files of every submodule (`modules/…`) and linked worktree (`worktrees/…`). All of these
//! are mounted read-only over themselves in the run's view. Those that a run could *create*
//! to the same effect get a harmless stand-in first:
//!
//! - `hooks/` and `info/` are made empty if missing (as `git init` would have made them), and
//!   stay;
//! - `commondir` is made holding `.` if missing — git then takes the git directory itself as
//!   the common directory, exactly as without the file — and removed again when the last run
//!   that holds it ends (each run holds a shared `flock` on it);
//! - a workspace that lies inside a host repository but is not one itself gets an empty `.git`
//!   directory (git skips an empty one and goes on to the parent repository, as before). The
//!   view mounts a private tmpfs on it, so a `git init` in the run works for the run and never
//!   reaches the host; the run's init reports it (`git_repository` in `violations`).
//!
//! Everything git needs to commit (objects, refs, logs, the index, lock files in the git
//! directory) stays writable. What is left — a repository made deeper in the tree, build
//! scripts, editor settings — is described in `docs/security.md`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use crate::sys::dirfd::{self, Creds};
use crate::sys::flock;

/// What `commondir` holds when sidejob made it: the git directory itself.
const COMMONDIR_STAND_IN: &[u8] = b".\n";

/// Files of a git directory that git reads configuration or code from.
const PROTECTED_FILES: &[&str] = &["config", "config.worktree", "commondir"];
/// Directories of a git directory that git reads configuration or code from.
const PROTECTED_DIRS: &[&str] = &["hooks", "info"];

/// The part of a run's view that protects git, worked out before the run starts.
#[derive(Debug, Default)]
pub struct Guard {
    /// Mounted read-only over themselves (host paths, the same in the view).
    pub read_only: Vec<PathBuf>,
    /// Made mount points so they cannot be renamed or replaced as a whole (the git directory).
    pub pinned: Vec<PathBuf>,
    /// An empty `.git` at the workspace root: the view mounts a private tmpfs on it.
    pub shadow: Option<PathBuf>,
    /// Stand-ins this run holds (a shared lock for the run's life).
    held: Vec<Held>,
}

#[derive(Debug)]
struct Held {
    parent: OwnedFd,
    name: &'static str,
    fd: OwnedFd,
    dir: bool,
}

/// Works out (and makes the stand-ins for) the protection of the writable `workspace`, with
/// `caller`'s credentials: nothing is made that the caller could not make.
pub fn prepare(workspace: &Path, caller: Option<&Creds>) -> io::Result<Guard> {
    dirfd::with_creds_here(caller, || {
        let mut g = Guard::default();
        let ws = dirfd::open_dir(workspace)?;
        match dirfd::open_at(ws.as_fd(), Path::new(".git"), OFlag::O_PATH, 0) {
            Ok(fd) => {
                let st = dirfd::stat_fd(fd.as_fd())?;
                let gitdir = workspace.join(".git");
                g.pinned.push(gitdir.clone());
                if dirfd::is_dir(&st) {
                    let gd = dirfd::open_subdir(ws.as_fd(), Path::new(".git"))?;
                    g.git_dir(&gitdir, &gd, 0)?;
                    g.worktrees(&gitdir, &gd)?;
                }
                // A `.git` file (a linked worktree or a submodule checkout) names the real
                // git directory, outside the view: it stays read-only (see `view::protect`).
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if inside_repository(workspace) {
                    let held = hold(&ws, ".git", true)?;
                    g.shadow = Some(workspace.join(".git"));
                    g.held.push(held);
                }
            }
            Err(e) => return Err(e),
        }
        Ok(g)
    })
}

impl Guard {
    /// A git directory (the workspace's, or a submodule's under `modules/`, `depth` deep).
    fn git_dir(&mut self, path: &Path, fd: &OwnedFd, depth: u32) -> io::Result<()> {
        for name in PROTECTED_DIRS {
            match dirfd::ensure_subdir(fd.as_fd(), name, 0o755, None) {
                Ok(_) => self.read_only.push(path.join(name)),
                Err(e) => return Err(e),
            }
        }
        for name in PROTECTED_FILES {
            if *name == "commondir" && !exists_as_own(fd, name)? {
                // Missing (or a stand-in an earlier run left): held for this run.
                self.held.push(hold(fd, "commondir", false)?);
                self.read_only.push(path.join(name));
            } else if exists(fd, name)? {
                self.read_only.push(path.join(name));
            }
        }
        // Submodules' git directories, which can nest (`modules/a/modules/b`).
        if depth < 4 {
            for (name, sub) in subdirs(fd, "modules")? {
                let sub_path = path.join("modules").join(&name);
                // A directory under modules/ may group others (`modules/lib/x`): a git
                // directory is the one with a HEAD.
                if exists(&sub, "HEAD")? {
                    self.git_dir(&sub_path, &sub, depth + 1)?;
                }
            }
        }
        Ok(())
    }

    /// Linked worktrees' administrative directories: their config and commondir.
    fn worktrees(&mut self, gitdir: &Path, fd: &OwnedFd) -> io::Result<()> {
        for (name, sub) in subdirs(fd, "worktrees")? {
            for file in PROTECTED_FILES {
                if exists(&sub, file)? {
                    self.read_only
                        .push(gitdir.join("worktrees").join(&name).join(file));
                }
            }
        }
        Ok(())
    }

    /// After the run: drops this run's hold on its stand-ins, removing each one no other run
    /// holds any more (and that still is the stand-in). With `caller`'s credentials.
    pub fn release(mut self, caller: Option<&Creds>) {
        let held = std::mem::take(&mut self.held);
        let _ = dirfd::with_creds_here(caller, || {
            for h in held {
                h.release();
            }
            Ok(())
        });
    }
}

impl Held {
    fn release(self) {
        // Exclusive only when no other run holds it shared.
        if flock(self.fd.as_fd(), libc::LOCK_EX | libc::LOCK_NB).is_err() {
            return;
        }
        if !same_entry(&self.parent, self.name, &self.fd) || !is_stand_in(&self.fd, self.dir) {
            return;
        }
        let _ = if self.dir {
            dirfd::rmdir_at(self.parent.as_fd(), self.name)
        } else {
            dirfd::unlink_at(self.parent.as_fd(), self.name)
        };
    }
}

/// Takes a shared hold on the stand-in `name` in `parent`, making it first if it is missing.
/// Another run may remove a stand-in it holds last just as this one opens it: then the entry
/// at `name` is no longer the one held, and this tries again.
fn hold(parent: &OwnedFd, name: &'static str, dir: bool) -> io::Result<Held> {
    for _ in 0..8 {
        let flags = if dir {
            OFlag::O_RDONLY | OFlag::O_DIRECTORY
        } else {
            OFlag::O_RDONLY
        };
        let fd = match dirfd::open_at(parent.as_fd(), Path::new(name), flags, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let made = if dir {
                    dirfd::mkdir_at(parent.as_fd(), name, 0o755)
                } else {
                    dirfd::create_at(parent.as_fd(), name, 0o644).and_then(|fd| {
                        use std::io::Write;
                        std::fs::File::from(fd).write_all(COMMONDIR_STAND_IN)
                    })
                };
                match made {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        flock(fd.as_fd(), libc::LOCK_SH)?;
        if same_entry(parent, name, &fd) {
            return Ok(Held {
                parent: parent.try_clone()?,
                name,
                fd,
                dir,
            });
        }
    }
    Err(io::Error::other(format!(
        "{name} keeps changing under the run; cannot protect it"
    )))
}

/// Is the entry `name` in `parent` still the file `fd` was opened on?
fn same_entry(parent: &OwnedFd, name: &str, fd: &OwnedFd) -> bool {
    let now = nix::sys::stat::fstatat(
        parent.as_fd(),
        name,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    );
    match (now, dirfd::stat_fd(fd.as_fd())) {
        (Ok(a), Ok(b)) => a.st_dev == b.st_dev && a.st_ino == b.st_ino,
        _ => false,
    }
}

/// Is this still what sidejob made: `commondir` holding `.`, or an empty directory?
fn is_stand_in(fd: &OwnedFd, dir: bool) -> bool {
    if dir {
        return std::fs::read_dir(dirfd::proc_fd_path(fd.as_fd()))
            .map(|mut d| d.next().is_none())
            .unwrap_or(false);
    }
    let mut buf = [0u8; 8];
    match nix::sys::uio::pread(fd.as_fd(), &mut buf, 0) {
        Ok(n) => &buf[..n] == COMMONDIR_STAND_IN,
        Err(_) => false,
    }
}

/// Does `name` exist as something other than a stand-in sidejob made?
fn exists_as_own(dir: &OwnedFd, name: &str) -> io::Result<bool> {
    match dirfd::open_at(dir.as_fd(), Path::new(name), OFlag::O_RDONLY, 0) {
        Ok(fd) => Ok(!is_stand_in(&fd, false)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        // Not a file we can read as a stand-in (a symlink, a directory…): the view refuses it.
        Err(_) => Ok(true),
    }
}

fn exists(dir: &OwnedFd, name: &str) -> io::Result<bool> {
    match nix::sys::stat::fstatat(dir.as_fd(), name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(_) => Ok(true),
        Err(nix::errno::Errno::ENOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The subdirectories of `dir/name` (none if it does not exist), opened without following
/// symlinks.
fn subdirs(dir: &OwnedFd, name: &str) -> io::Result<Vec<(String, OwnedFd)>> {
    let sub = match dirfd::open_at(
        dir.as_fd(),
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        0,
    ) {
        Ok(fd) => fd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for e in std::fs::read_dir(dirfd::proc_fd_path(sub.as_fd()))? {
        let e = e?;
        if !e.file_type()?.is_dir() {
            continue;
        }
        let n = e.file_name().to_string_lossy().into_owned();
        if let Ok(fd) = dirfd::open_subdir(sub.as_fd(), Path::new(&n)) {
            out.push((n, fd));
        }
    }
    Ok(out)
}

/// Does a directory above `workspace` hold a `.git` (a host repository the workspace lies in)?
fn inside_repository(workspace: &Path) -> bool {
    workspace
        .ancestors()
        .skip(1)
        .any(|dir| std::fs::symlink_metadata(dir.join(".git")).is_ok())
}
