//! A run's two directories, and every file name in them.
//!
//! - The **private** half, `<state_dir>/runs/<task_id>/` (the state dir is 0700): what only
//!   the daemon and the run's supervisor may write or trust — the launch plan, cancel
//!   requests, the supervisor's pid and log, a plan's stdin and files. The sandbox's root is
//!   also staged there. Removed once the task has settled.
//! - The **public** half, `<session_dir>/.background/<task_id>/`: what the host reads —
//!   `output.log` and `result.json` (and a subagent's `handover.json`, and `output.streams`
//!   for a run with a separate stderr). It belongs to the
//!   session's owner (mode 0700), who may therefore swap things in it; so it is only ever
//!   used through a descriptor, without following symlinks, and nothing read back from it
//!   decides anything but what it describes.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use crate::sys::dirfd;

/// The command's output, in the public half.
pub(crate) const OUTPUT: &str = "output.log";
/// Which ranges of `output.log` came from the command's stderr (`run::streams`), in the
/// public half: only for a run whose plan asks for a separate stderr.
pub(crate) const STREAMS: &str = "output.streams";
/// The run's result, in the public half.
pub(crate) const RESULT: &str = "result.json";
/// What a subagent handed over to its parent session, in the public half.
pub(crate) const HANDOVER: &str = "handover.json";
/// The directory inside a session directory that holds its runs' public halves.
pub(crate) const BACKGROUND: &str = ".background";
/// The bridge's socket, in a run's bridge directory ([`socket_dir`]).
pub(crate) const BRIDGE_SOCKET: &str = "sock";

/// `<runs_dir>/<task_id>/`: `<state_dir>/runs`, or a root daemon's directory in `/dev/shm`
/// ([`memory_runs_dir`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PrivateDir {
    dir: PathBuf,
    /// Where [`Self::files`] is made instead of in `dir`, for a private half in `/dev/shm`:
    /// a plan's files are mounted in the run's view at their own path, and a view's `/dev`
    /// is its own.
    files_in: Option<PathBuf>,
    /// For a private half in `/dev/shm`: the directory it must still be in ([`Self::check`]).
    guard: Option<Guard>,
}

/// A daemon's directory in `/dev/shm` as it made or found it at start: root's, mode 0700,
/// this device and inode. Nobody but root can remove it or rename it there (the sticky bit);
/// should root remove it all the same, another user could make one of that name, and a path
/// through it would lead into theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Guard {
    path: PathBuf,
    dev: u64,
    ino: u64,
}

impl Guard {
    fn of(path: &Path) -> io::Result<Guard> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(path)?;
        Ok(Guard {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// Whether `path` is still that directory, as it was.
    fn holds(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| roots_alone(&m) && (m.dev(), m.ino()) == (self.dev, self.ino))
    }
}

/// A directory (not a symlink to one) of root's that only root may enter: mode 0700.
fn roots_alone(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    m.is_dir() && m.uid() == 0 && m.mode() & 0o7777 == 0o700
}

impl PrivateDir {
    pub(crate) fn new(runs_dir: &Path, task_id: &str) -> PrivateDir {
        PrivateDir::at(runs_dir.join(task_id))
    }

    /// A private directory at a given path (`sidejob exec` keeps one in `/dev/shm`).
    pub(crate) fn at(path: PathBuf) -> PrivateDir {
        PrivateDir {
            dir: path,
            files_in: None,
            guard: None,
        }
    }

    /// Refuses to go on with a private half in `/dev/shm` whose directory there is not the
    /// one the daemon made (see [`Guard`]): the daemon writes and trusts what is in it.
    pub(crate) fn check(&self) -> io::Result<()> {
        match &self.guard {
            Some(g) if !g.holds() => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is no longer the directory this daemon made for its runs",
                    g.path.display()
                ),
            )),
            _ => Ok(()),
        }
    }

    /// The same, with the plan's files in `<dir>/files` instead (made only for a plan that
    /// has files, and removed with the rest).
    pub(crate) fn with_files_in(self, dir: PathBuf) -> PrivateDir {
        PrivateDir {
            files_in: Some(dir),
            ..self
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// The launch plan (`LaunchPlan` as JSON), written by the daemon before the run starts.
    pub(crate) fn plan(&self) -> PathBuf {
        self.dir.join("plan.json")
    }

    /// Why the daemon asked the run to stop (`CancelRequest`), written before its SIGTERM.
    pub(crate) fn cancel(&self) -> PathBuf {
        self.dir.join("cancel.json")
    }

    /// Where the next cancel request is written before it is renamed to [`Self::cancel`].
    pub(crate) fn cancel_next(&self) -> PathBuf {
        self.dir.join("cancel.json.next")
    }

    /// `pid start_time` of the supervisor, for a daemon that restarts before it recorded them:
    /// written by the spawner before the daemon hears the pid (or, started directly, by the
    /// supervisor first thing).
    pub(crate) fn pid_file(&self) -> PathBuf {
        self.dir.join("supervisor.pid")
    }

    /// The egress proxy's record of what it refused (`egress::record`), read by the
    /// supervisor into `result.json`.
    pub(crate) fn network_record(&self) -> PathBuf {
        self.dir.join("network.jsonl")
    }

    /// The resolver configuration of an allow-list run's view (`egress::RESOLV_CONF`).
    pub(crate) fn resolv_conf(&self) -> PathBuf {
        self.dir.join("resolv.conf")
    }

    /// Where `sidejob exec` serves the egress proxy of its one run (the daemon's runs have
    /// theirs in the bridge directory: [`socket_dir`]).
    pub(crate) fn exec_egress_dir(&self) -> PathBuf {
        self.dir.join("egress")
    }

    /// The supervisor's stderr.
    pub(crate) fn log(&self) -> PathBuf {
        self.dir.join("supervisor.log")
    }

    /// A plan's fixed stdin.
    pub(crate) fn stdin(&self) -> PathBuf {
        self.dir.join("stdin")
    }

    /// A plan's files; mounted read-only in the run's view at this same path.
    pub(crate) fn files(&self) -> PathBuf {
        self.files_in.as_ref().unwrap_or(&self.dir).join("files")
    }

    /// Makes the directory, private to the daemon, in a `runs_dir` that exists: that one is
    /// made (and checked) once, at the daemon's start, and never made again on the way
    /// (in `/dev/shm`, a directory of that name made by someone else in between would be
    /// theirs).
    pub(crate) fn create(&self) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().mode(0o700).create(&self.dir)
    }

    /// Makes [`Self::files`] (and the directory it is in, private to the daemon).
    pub(crate) fn create_files(&self) -> io::Result<PathBuf> {
        use std::os::unix::fs::DirBuilderExt;
        if let Some(dir) = &self.files_in {
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
        }
        let files = self.files();
        std::fs::create_dir(&files)?;
        Ok(files)
    }

    /// Removes it and everything in it (nothing in it is needed once the task settled).
    pub(crate) fn remove(&self) {
        if self.check().is_ok() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
        if let Some(dir) = &self.files_in {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Where a daemon's runs' private halves are: new runs' in `memory` when it has a directory
/// there ([`memory_runs_dir`]), else in `disk` (`<state_dir>/runs`), which also holds those
/// an older daemon started (before an upgrade).
#[derive(Debug, Clone)]
pub(crate) struct RunsDirs {
    pub disk: PathBuf,
    memory: Option<Guard>,
}

impl RunsDirs {
    /// `memory`: the directory [`memory_runs_dir`] made or found, if any.
    pub(crate) fn new(disk: PathBuf, memory: Option<PathBuf>) -> RunsDirs {
        let memory = memory.and_then(|m| Guard::of(&m).ok());
        RunsDirs { disk, memory }
    }

    /// The directory in `/dev/shm`, if there is one.
    pub(crate) fn memory(&self) -> Option<&Path> {
        self.memory.as_ref().map(|g| g.path.as_path())
    }

    /// Where new runs' private halves go.
    pub(crate) fn current(&self) -> &Path {
        self.memory().unwrap_or(&self.disk)
    }

    /// A new run's private half, with a plan's files (mounted in the run's view at their
    /// own path, and a view's `/dev` is its own) on disk when the rest is in `/dev/shm`.
    pub(crate) fn new_private(&self, task_id: &str) -> PrivateDir {
        let dir = PrivateDir::new(self.current(), task_id);
        match &self.memory {
            Some(g) => PrivateDir {
                guard: Some(g.clone()),
                ..dir.with_files_in(self.disk.join(task_id))
            },
            None => dir,
        }
    }

    /// Makes `private` (from [`Self::new_private`]). Should the directory in `/dev/shm` be
    /// gone (removed by someone, or `/dev/shm` mounted anew) or not be the one found at start
    /// ([`PrivateDir::check`]), this run's private half is made on disk instead: a run never
    /// fails for it, and nothing is made where another user may have made the name.
    pub(crate) fn create(&self, private: PrivateDir, task_id: &str) -> io::Result<PrivateDir> {
        if private.check().is_ok() {
            match private.create() {
                // Made in the daemon's directory, which nobody else can have swapped since.
                Ok(()) if private.check().is_ok() => return Ok(private),
                Ok(()) => {}
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                Err(_) => {}
            }
        }
        // The directory in /dev/shm is gone, or is not the daemon's any more: this run's
        // private half goes on disk (the daemon's next start makes or refuses it again).
        let disk = PrivateDir::new(&self.disk, task_id);
        disk.create()?;
        Ok(disk)
    }

    /// The private half of a run that exists: where new ones go, or on disk where it is
    /// there instead (started by an older daemon).
    pub(crate) fn existing_private(&self, task_id: &str) -> PrivateDir {
        let here = self.new_private(task_id);
        if self.memory.is_some() && (here.check().is_err() || !here.path().exists()) {
            let before = PrivateDir::new(&self.disk, task_id);
            if before.path().exists() {
                return before;
            }
        }
        here
    }
}

/// Where the private halves go when the state directory's filesystem is not the place: the
/// machine's memory-backed `/dev/shm`.
const MEMORY_FS: &str = "/dev/shm";
/// The smallest `/dev/shm` given private halves (a container's is often 64 MiB, which a
/// plan's stdin or files could fill).
const MEMORY_FS_MIN_BYTES: u64 = 256 << 20;

/// Where a root daemon keeps its runs' private halves, when it can: a directory of its own
/// in `/dev/shm`, `sidejob-runs-<dev>-<inode>` of its state directory (so the same daemon
/// finds it again after a restart, and two daemons never share one), mode 0700.
///
/// A private half lives only as long as its run's supervisor, which a reboot or a container
/// restart ends too, so it needs no disk; on one it costs inode allocations at every run
/// (four of a run's eight), which some filesystems make slow (docs/performance.md). `None`
/// (the private halves stay in `<state_dir>/runs`) for a daemon that is not root (a user's
/// files in `/dev/shm` may be removed at their logout), when `/dev/shm` is not a tmpfs of at
/// least 256 MiB owned by root and sticky, and when the name is taken by anything but a
/// directory of root's that only root may enter: a squatter makes sidejob slower, never
/// makes it write where another user can reach.
pub(crate) fn memory_runs_dir(state_dir: &Path) -> Result<PathBuf, NoMemoryDir> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    if crate::sys::getuid() != 0 {
        return Err(NoMemoryDir::Unsuitable("the daemon is not root".into()));
    }
    let base = Path::new(MEMORY_FS);
    let fs = nix::sys::statfs::statfs(base)
        .map_err(|e| NoMemoryDir::Unsuitable(format!("{MEMORY_FS}: {e}")))?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        return Err(NoMemoryDir::Unsuitable(format!(
            "{MEMORY_FS} is not a tmpfs"
        )));
    }
    let size = fs.blocks().saturating_mul(fs.block_size() as u64);
    if size < MEMORY_FS_MIN_BYTES {
        return Err(NoMemoryDir::Unsuitable(format!(
            "{MEMORY_FS} holds {} MiB, less than {} MiB",
            size >> 20,
            MEMORY_FS_MIN_BYTES >> 20
        )));
    }
    let meta = std::fs::symlink_metadata(base)
        .map_err(|e| NoMemoryDir::Unsuitable(format!("{MEMORY_FS}: {e}")))?;
    // Others may make entries there; the sticky bit keeps them from removing or renaming ours.
    if !meta.is_dir() || meta.uid() != 0 || (meta.mode() & 0o002 != 0 && meta.mode() & 0o1000 == 0)
    {
        return Err(NoMemoryDir::Unsuitable(format!(
            "{MEMORY_FS} is not root's, or is open without the sticky bit"
        )));
    }
    let state = std::fs::metadata(state_dir)
        .map_err(|e| NoMemoryDir::Unsuitable(format!("{}: {e}", state_dir.display())))?;
    let dir = base.join(format!("sidejob-runs-{}-{}", state.dev(), state.ino()));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => return Ok(dir),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(NoMemoryDir::Unsuitable(format!("{}: {e}", dir.display()))),
    }
    // Ours from an earlier start, or someone else's.
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| NoMemoryDir::Unsuitable(format!("{}: {e}", dir.display())))?;
    if roots_alone(&meta) {
        Ok(dir)
    } else {
        Err(NoMemoryDir::Taken(dir))
    }
}

/// Why a daemon keeps its runs' private halves on disk ([`memory_runs_dir`]).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoMemoryDir {
    /// Nothing anyone did: the daemon is not root, or `/dev/shm` will not do.
    #[error("{0}")]
    Unsuitable(String),
    /// Someone else made the directory's name first.
    #[error("{} exists and is not a directory of root's with mode 0700", .0.display())]
    Taken(PathBuf),
}

/// The public half's path (as shown to hosts: `output_path`, `result_path`).
pub(crate) fn public_path(session_dir: &str, task_id: &str) -> String {
    format!("{session_dir}/{BACKGROUND}/{task_id}")
}

/// The task ids of the runs with a public half in a session directory (valid ids only;
/// nothing opened).
pub(crate) fn run_ids(session_dir: &Path) -> Vec<String> {
    let Ok(runs) = std::fs::read_dir(session_dir.join(BACKGROUND)) else {
        return Vec::new();
    };
    runs.flatten()
        .filter_map(|r| r.file_name().to_str().map(str::to_owned))
        .filter(|id| crate::ids::is_valid_task_id(id))
        .collect()
}

/// A file of the public half, as hosts see its path (`output_path`, `result_path`).
pub(crate) fn public_file(public_dir: &str, name: &str) -> String {
    format!("{public_dir}/{name}")
}

/// Makes `<session_dir>/.background/<task_id>/` for a new run, handed to the session's
/// owner, and opens it.
pub(crate) fn create_public(
    session_dir: &Path,
    owner: (u32, u32),
    task_id: &str,
) -> io::Result<OwnedFd> {
    let bg = open_background(session_dir, owner.0)?;
    dirfd::mkdir_at(bg.as_fd(), task_id, 0o700)?;
    let fd = dirfd::open_subdir(bg.as_fd(), Path::new(task_id))?;
    dirfd::chown_fd(fd.as_fd(), owner.0, owner.1)?;
    Ok(fd)
}

/// Opens an existing run's public half (after a daemon restart, or to read its output).
pub(crate) fn open_public(
    session_dir: &Path,
    owner_uid: u32,
    task_id: &str,
) -> io::Result<OwnedFd> {
    let bg = open_background(session_dir, owner_uid)?;
    dirfd::open_subdir(bg.as_fd(), Path::new(task_id))
}

/// Creates a file of the run in its public half: never one that exists (a planted symlink or
/// link makes this fail), handed to the session's owner, mode 0600.
pub(crate) fn create_file(
    dir: BorrowedFd<'_>,
    name: &str,
    owner: Option<(u32, u32)>,
) -> io::Result<std::fs::File> {
    let fd = dirfd::create_at(dir, name, 0o600)?;
    if let Some((uid, gid)) = owner {
        dirfd::chown_fd(fd.as_fd(), uid, gid)?;
    }
    Ok(std::fs::File::from(fd))
}

/// Opens a file of the run for reading: a regular file, not a symlink, and one the session's
/// owner owns (the supervisor hands every file it makes to them) — a hard link to someone
/// else's file, swapped in by whoever controls the directory, is refused.
pub(crate) fn open_file(
    dir: BorrowedFd<'_>,
    name: &str,
    owner_uid: u32,
) -> io::Result<std::fs::File> {
    let fd = dirfd::open_at(dir, Path::new(name), OFlag::O_RDONLY, 0)?;
    let st = dirfd::stat_fd(fd.as_fd())?;
    if !dirfd::is_file(&st) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{name} is not a regular file"),
        ));
    }
    if st.st_uid != owner_uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{name} belongs to uid {}, not to the session's owner",
                st.st_uid
            ),
        ));
    }
    Ok(std::fs::File::from(fd))
}

/// A run's socket directory, `<bridge dir>/<name>` (its bridge's is the task id, its egress
/// proxy's `<task_id>.egress`): not in the run directory, whose path can exceed the 108
/// bytes a socket address holds.
pub(crate) fn socket_dir(name: &str) -> io::Result<PathBuf> {
    Ok(bridge_dir()?.join(name))
}

/// [`default_bridge_dir`], created 0711 (the runs' users must reach their
/// sockets) and refused if it is not the daemon's.
fn bridge_dir() -> io::Result<PathBuf> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let uid = crate::sys::getuid();
    let dir = default_bridge_dir();
    match std::fs::create_dir(&dir) {
        Ok(()) => std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is not a directory owned by uid {uid} and writable only by it",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Where runs' bridge sockets live: `/run/sidejob-bridge` for root, else
/// `$XDG_RUNTIME_DIR/sidejob-bridge`, else `/tmp/sidejob-bridge-<uid>`.
pub(crate) fn default_bridge_dir() -> PathBuf {
    let uid = crate::sys::getuid();
    if uid == 0 {
        return PathBuf::from("/run/sidejob-bridge");
    }
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        Some(d) => PathBuf::from(d).join("sidejob-bridge"),
        None => PathBuf::from(format!("/tmp/sidejob-bridge-{uid}")),
    }
}

/// Opens `<session_dir>/.background` for the daemon: no symlink on the way, and the
/// directory must still be the session owner's (a caller who controls the session directory
/// can swap things in it, but nothing they swap in can lead the daemon elsewhere).
pub(crate) fn open_background(session_dir: &Path, owner_uid: u32) -> io::Result<OwnedFd> {
    let dir = dirfd::open_dir(session_dir)?;
    let bg = dirfd::open_subdir(dir.as_fd(), Path::new(BACKGROUND))?;
    let st = dirfd::stat_fd(bg.as_fd())?;
    if st.st_uid != owner_uid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}/{BACKGROUND} belongs to uid {}, not to the session's owner (uid {owner_uid})",
                session_dir.display(),
                st.st_uid
            ),
        ));
    }
    Ok(bg)
}
