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
//!   the common directory, exactly as without the file — and `config.worktree` empty (git
//!   reads it only with `extensions.worktreeConfig`, and an empty one says nothing); both are
//!   removed again when the last run that holds them ends (each run holds a shared `flock`);
//! - a workspace that lies inside a host repository but is not one itself gets an empty `.git`
//!   directory (git skips an empty one and goes on to the parent repository, as before). The
//!   view mounts a private tmpfs on it, so a `git init` in the run works for the run and never
//!   reaches the host; the run's init reports it (`git_repository` in `violations`).
//!
//! A `.git` *file* naming a git directory inside the workspace (`git init --separate-git-dir`)
//! gets the same protection for that directory.
//!
//! Everything git needs to commit (objects, refs, logs, the index, lock files in the git
//! directory) stays writable, so a run can also stage a repository it made deeper in the tree
//! (a gitlink), which host git at the top would then enter on `git status`, running that
//! repository's configuration. So after the run, every gitlink in the index whose `.git`
//! (or its `config` or `hooks`) changed during the run is set aside as
//! `.git.quarantined-by-sidejob` and recorded (`git_repository`). What is left — a repository
//! made deeper in the tree and not staged, build scripts, editor settings — is described in
//! `docs/security.md`.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use crate::sys::dirfd::{self, Creds};
use crate::sys::flock;

/// What `commondir` holds when sidejob made it: the git directory itself.
const COMMONDIR_STAND_IN: &[u8] = b".\n";

/// What sidejob puts in place of a missing file of a git directory, for a run's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StandIn {
    /// An empty directory (the workspace's `.git` below a host repository).
    Dir,
    /// A file with this content.
    File(&'static [u8]),
}

/// The files of a git directory that get a stand-in when missing.
const FILE_STAND_INS: &[(&str, &[u8])] =
    &[("commondir", COMMONDIR_STAND_IN), ("config.worktree", b"")];

/// The name a repository a run made (or changed) is set aside under.
const QUARANTINE: &str = ".git.quarantined-by-sidejob";

/// Files of a git directory that git reads configuration or code from.
const PROTECTED_FILES: &[&str] = &["config", "config.worktree", "commondir"];
/// Directories of a git directory that git reads configuration or code from.
const PROTECTED_DIRS: &[&str] = &["hooks", "info"];

/// The part of a run's view that protects git, worked out before the run starts.
#[derive(Debug, Default)]
pub(crate) struct Guard {
    /// Mounted read-only over themselves (host paths, the same in the view).
    pub read_only: Vec<PathBuf>,
    /// Made mount points so they cannot be renamed or replaced as a whole (the git directory).
    pub pinned: Vec<PathBuf>,
    /// An empty `.git` at the workspace root: the view mounts a private tmpfs on it.
    pub shadow: Option<PathBuf>,
    /// Stand-ins this run holds (a shared lock for the run's life).
    held: Vec<Held>,
    /// For the check after the run: the git directory, relative to the workspace.
    gitdir: Option<PathBuf>,
    workspace: PathBuf,
    /// When the run began (a little before, for the kernel's coarse file clock).
    since: (i64, i64),
}

#[derive(Debug)]
struct Held {
    parent: OwnedFd,
    name: &'static str,
    fd: OwnedFd,
    kind: StandIn,
}

/// Works out (and makes the stand-ins for) the protection of the writable `workspace`, with
/// `caller`'s credentials: nothing is made that the caller could not make.
pub(crate) fn prepare(workspace: &Path, caller: Option<&Creds>) -> io::Result<Guard> {
    let since = std::time::SystemTime::now()
        .checked_sub(std::time::Duration::from_millis(20))
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or((0, 0), |d| (d.as_secs() as i64, d.subsec_nanos() as i64));
    dirfd::with_creds_here(caller, || {
        let mut g = Guard {
            workspace: workspace.to_path_buf(),
            since,
            ..Guard::default()
        };
        let ws = dirfd::open_dir(workspace)?;
        match dirfd::open_at(ws.as_fd(), Path::new(".git"), OFlag::O_PATH, 0) {
            Ok(fd) => {
                let st = dirfd::stat_fd(fd.as_fd())?;
                g.pinned.push(workspace.join(".git"));
                if dirfd::is_dir(&st) {
                    g.protect_git_dir(&ws, Path::new(".git"))?;
                } else if let Some(rel) = git_file_target(&ws, workspace)? {
                    // `.git` is a file naming a git directory: one inside the workspace is
                    // protected like `.git` itself; one outside is not in the view at all.
                    g.protect_git_dir(&ws, &rel)?;
                }
                // The `.git` file itself stays read-only (see `view::protect`).
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if inside_repository(workspace) {
                    let held = hold(&ws, ".git", StandIn::Dir)?;
                    g.shadow = Some(workspace.join(".git"));
                    g.held.push(held);
                }
            }
            Err(e) => return Err(e),
        }
        Ok(g)
    })
}

/// The git directory a `.git` file names (`gitdir: <path>`), relative to the workspace, if it
/// lies inside it.
fn git_file_target(ws: &OwnedFd, workspace: &Path) -> io::Result<Option<PathBuf>> {
    let text = dirfd::read_at(ws.as_fd(), Path::new(".git"), 4096)?;
    let text = String::from_utf8_lossy(&text);
    let Some(target) = text.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else {
        return Ok(None);
    };
    let target = Path::new(target.trim());
    let rel = if target.is_absolute() {
        match target.strip_prefix(workspace) {
            Ok(rel) => rel.to_path_buf(),
            Err(_) => return Ok(None),
        }
    } else {
        target.to_path_buf()
    };
    // Opened beneath the workspace with no `..` or symlink: anything else is not inside it.
    if rel.as_os_str().is_empty() || dirfd::open_subdir(ws.as_fd(), &rel).is_err() {
        return Ok(None);
    }
    Ok(Some(rel))
}

impl Guard {
    /// The workspace's git directory `rel` (`.git`, or the one a `.git` file names): its own
    /// files, its submodules' and its linked worktrees'.
    fn protect_git_dir(&mut self, ws: &OwnedFd, rel: &Path) -> io::Result<()> {
        let gd = dirfd::open_subdir(ws.as_fd(), rel)?;
        let path = self.workspace.join(rel);
        self.git_dir(&path, &gd, 0)?;
        self.worktrees(&path, &gd)?;
        self.gitdir = Some(rel.to_path_buf());
        Ok(())
    }

    /// A git directory (the workspace's, or a submodule's under `modules/`, `depth` deep).
    fn git_dir(&mut self, path: &Path, fd: &OwnedFd, depth: u32) -> io::Result<()> {
        for name in PROTECTED_DIRS {
            match dirfd::ensure_subdir(fd.as_fd(), name, 0o755, None) {
                Ok(_) => self.read_only.push(path.join(name)),
                Err(e) => return Err(e),
            }
        }
        for name in PROTECTED_FILES {
            let stand_in = FILE_STAND_INS.iter().find(|(n, _)| n == name);
            match stand_in {
                Some((name, content)) if !exists_as_own(fd, name, content)? => {
                    // Missing (or a stand-in an earlier run left): held for this run.
                    self.held.push(hold(fd, name, StandIn::File(content))?);
                    self.read_only.push(path.join(name));
                }
                _ if exists(fd, name)? => self.read_only.push(path.join(name)),
                _ => {}
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

    /// After the run: sets aside every repository staged in the index (a gitlink) whose `.git`,
    /// or that `.git`'s `config` or `hooks`, changed during the run, so that host git at the
    /// top does not enter it and run its configuration. Returns the paths set aside (relative
    /// to the workspace). With `caller`'s credentials.
    pub(crate) fn quarantine_staged_repositories(&self, caller: Option<&Creds>) -> Vec<String> {
        let Some(gitdir) = &self.gitdir else {
            return Vec::new();
        };
        dirfd::with_creds_here(caller, || {
            let ws = dirfd::open_dir(&self.workspace)?;
            let gd = dirfd::open_subdir(ws.as_fd(), gitdir)?;
            let index = match dirfd::read_at(gd.as_fd(), Path::new("index"), MAX_INDEX_BYTES) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e),
            };
            let hash = if sha256_repository(&gd) { 32 } else { 20 };
            let mut set_aside = Vec::new();
            for link in gitlinks(&index, hash).unwrap_or_default() {
                let rel = Path::new(&link);
                if rel.is_absolute()
                    || rel
                        .components()
                        .any(|c| !matches!(c, std::path::Component::Normal(_)))
                {
                    continue;
                }
                let Ok(dir) = dirfd::open_subdir(ws.as_fd(), rel) else {
                    continue;
                };
                if self.changed_during_run(&dir) {
                    let mut name = QUARANTINE.to_owned();
                    for n in 1..100 {
                        if !exists(&dir, &name)? {
                            break;
                        }
                        name = format!("{QUARANTINE}-{n}");
                    }
                    dirfd::rename_at(dir.as_fd(), ".git", &name)?;
                    set_aside.push(format!("{link}/.git"));
                }
            }
            Ok(set_aside)
        })
        .unwrap_or_default()
    }

    /// Did `dir/.git` (or its `config` or `hooks`) change since the run began? By the inode
    /// change time, which a run cannot set back.
    fn changed_during_run(&self, dir: &OwnedFd) -> bool {
        let newer = |rel: &str| {
            nix::sys::stat::fstatat(dir.as_fd(), rel, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .is_ok_and(|st| (st.st_ctime, st.st_ctime_nsec) >= self.since)
        };
        newer(".git") || newer(".git/config") || newer(".git/hooks")
    }

    /// After the run: drops this run's hold on its stand-ins, removing each one no other run
    /// holds any more (and that still is the stand-in). With `caller`'s credentials.
    pub(crate) fn release(mut self, caller: Option<&Creds>) {
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
        if !same_entry(&self.parent, self.name, &self.fd) || !is_stand_in(&self.fd, self.kind) {
            return;
        }
        let _ = match self.kind {
            StandIn::Dir => dirfd::rmdir_at(self.parent.as_fd(), self.name),
            StandIn::File(_) => dirfd::unlink_at(self.parent.as_fd(), self.name),
        };
    }
}

/// Takes a shared hold on the stand-in `name` in `parent`, making it first if it is missing.
/// Another run may remove a stand-in it holds last just as this one opens it: then the entry
/// at `name` is no longer the one held, and this tries again.
fn hold(parent: &OwnedFd, name: &'static str, kind: StandIn) -> io::Result<Held> {
    for _ in 0..8 {
        let flags = match kind {
            StandIn::Dir => OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            StandIn::File(_) => OFlag::O_RDONLY,
        };
        let fd = match dirfd::open_at(parent.as_fd(), Path::new(name), flags, 0) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let made = match kind {
                    StandIn::Dir => dirfd::mkdir_at(parent.as_fd(), name, 0o755),
                    StandIn::File(content) => dirfd::create_at(parent.as_fd(), name, 0o644)
                        .and_then(|fd| {
                            use std::io::Write;
                            std::fs::File::from(fd).write_all(content)
                        }),
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
                kind,
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

/// Is this still what sidejob made: the stand-in's content, or an empty directory?
fn is_stand_in(fd: &OwnedFd, kind: StandIn) -> bool {
    match kind {
        StandIn::Dir => std::fs::read_dir(dirfd::proc_fd_path(fd.as_fd()))
            .map(|mut d| d.next().is_none())
            .unwrap_or(false),
        StandIn::File(content) => {
            let mut buf = [0u8; 8];
            match nix::sys::uio::pread(fd.as_fd(), &mut buf, 0) {
                Ok(n) => &buf[..n] == content,
                Err(_) => false,
            }
        }
    }
}

/// Does `name` exist as something other than a stand-in holding `content`?
fn exists_as_own(dir: &OwnedFd, name: &str, content: &'static [u8]) -> io::Result<bool> {
    match dirfd::open_at(dir.as_fd(), Path::new(name), OFlag::O_RDONLY, 0) {
        Ok(fd) => Ok(!(dirfd::is_file(&dirfd::stat_fd(fd.as_fd())?)
            && is_stand_in(&fd, StandIn::File(content)))),
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

/// The largest index read after a run (a repository of a million files has one of ~100 MiB).
const MAX_INDEX_BYTES: u64 = 256 << 20;

/// Does the repository use SHA-256 object names (`extensions.objectFormat = sha256`)?
fn sha256_repository(gitdir: &OwnedFd) -> bool {
    dirfd::read_at(gitdir.as_fd(), Path::new("config"), 1 << 20).is_ok_and(|c| {
        String::from_utf8_lossy(&c).lines().any(|l| {
            let l = l.trim().to_ascii_lowercase().replace(' ', "");
            l == "objectformat=sha256"
        })
    })
}

/// The paths of the gitlinks (mode 160000: a repository staged as a submodule) in a git
/// index of version 2, 3 or 4, whose object names are `hash` bytes long. `None` if the bytes
/// are not such an index.
fn gitlinks(index: &[u8], hash: usize) -> Option<Vec<String>> {
    let be32 = |at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(index.get(at..at + 4)?.try_into().ok()?))
    };
    if index.get(..4)? != b"DIRC" {
        return None;
    }
    let version = be32(4)?;
    if !(2..=4).contains(&version) {
        return None;
    }
    let count = be32(8)? as usize;
    let mut links = Vec::new();
    let mut pos = 12;
    let mut name: Vec<u8> = Vec::new();
    for _ in 0..count {
        let start = pos;
        let mode = be32(pos + 24)?;
        pos += 40 + hash;
        let flags = u16::from_be_bytes(index.get(pos..pos + 2)?.try_into().ok()?);
        pos += 2;
        if version >= 3 && flags & 0x4000 != 0 {
            pos += 2; // extended flags
        }
        if version == 4 {
            // The name is the previous one less `strip` bytes, then a NUL-terminated suffix.
            let mut c = *index.get(pos)?;
            pos += 1;
            let mut strip = (c & 0x7f) as usize;
            while c & 0x80 != 0 {
                c = *index.get(pos)?;
                pos += 1;
                strip = ((strip + 1) << 7) | (c & 0x7f) as usize;
            }
            name.truncate(name.len().checked_sub(strip)?);
            let end = pos + index.get(pos..)?.iter().position(|&b| b == 0)?;
            name.extend_from_slice(&index[pos..end]);
            pos = end + 1;
        } else {
            let end = pos + index.get(pos..)?.iter().position(|&b| b == 0)?;
            name.clear();
            name.extend_from_slice(&index[pos..end]);
            // Entries are padded with NULs to a multiple of 8 bytes.
            pos = start + ((pos - start + name.len() + 8) & !7);
        }
        if mode & 0o170000 == 0o160000 {
            links.push(String::from_utf8_lossy(&name).into_owned());
        }
    }
    Some(links)
}

/// Does a directory above `workspace` hold a `.git` (a host repository the workspace lies in)?
fn inside_repository(workspace: &Path) -> bool {
    workspace
        .ancestors()
        .skip(1)
        .any(|dir| std::fs::symlink_metadata(dir.join(".git")).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// An index made by the real git, of each version, with a gitlink among files.
    #[test]
    fn gitlinks_are_found_in_every_index_version() {
        if Command::new("git").arg("--version").output().is_err() {
            eprintln!("SKIPPED: no git");
            return;
        }
        for version in ["2", "3", "4"] {
            let scratch = crate::scratch::ScratchDir::new("gitindex");
            let dir = scratch.path();
            std::fs::create_dir_all(dir.join("sub/deeper")).unwrap();
            let git = |args: &[&str], at: &Path| {
                let ok = Command::new("git")
                    .args(["-c", "user.name=t", "-c", "user.email=t@t"])
                    .args(args)
                    .current_dir(at)
                    .output()
                    .unwrap();
                assert!(ok.status.success(), "git {args:?}: {ok:?}");
            };
            git(&["init", "-q"], dir);
            std::fs::write(dir.join("a.txt"), "a").unwrap();
            std::fs::write(dir.join("sub/deeper/b.txt"), "b").unwrap();
            git(&["init", "-q", "sub/deeper/repo"], dir);
            git(
                &["commit", "-q", "--allow-empty", "-m", "x"],
                &dir.join("sub/deeper/repo"),
            );
            git(
                &["add", "a.txt", "sub/deeper/b.txt", "sub/deeper/repo"],
                dir,
            );
            git(&["update-index", "--index-version", version], dir);
            let index = std::fs::read(dir.join(".git/index")).unwrap();
            assert_eq!(
                gitlinks(&index, 20),
                Some(vec!["sub/deeper/repo".to_owned()]),
                "index version {version}"
            );
        }
        assert_eq!(gitlinks(b"not an index", 20), None);
        assert_eq!(gitlinks(b"DIRC\0\0\0\x02\0\0\0\x05", 20), None);
    }
}
