//! The daemon's place: its private state directory (one daemon per state dir), the listening
//! socket (0660, `socket_group`, stale-socket replacement, or the one systemd passes in
//! `LISTEN_FDS`), and the descriptor limit.

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tracing::{info, warn};

use super::ServeError;
use crate::config::Config;
use crate::run::dir::{NoMemoryDir, RunsDirs};

/// The state directory's mode: see [`prepare_state_dir`].
const STATE_DIR_MODE: u32 = 0o711;

/// Makes the state directory passable but unreadable (0711) and everything in it private
/// to its owner: the registry (every user's commands) 0600, the runs' private halves 0700,
/// the sessions' directories 0700 each, owned by the session's owner, so that a user of a
/// root daemon opens their own `output.log` and `result.json` at the paths results name,
/// and nothing else. Makes its `sessions` and `runs` directories, and pins its path to the
/// real one (workspaces are checked against it).
pub(super) fn prepare_state_dir(cfg: &mut Config) -> Result<(), ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ServeError::Io { step, path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(STATE_DIR_MODE)
        .create(&cfg.state_dir)
        .map_err(io("create", &cfg.state_dir))?;
    let meta = std::fs::symlink_metadata(&cfg.state_dir).map_err(io("inspect", &cfg.state_dir))?;
    if !meta.is_dir() || std::os::unix::fs::MetadataExt::uid(&meta) != crate::sys::getuid() {
        return Err(ServeError::Io {
            step: "use",
            path: cfg.state_dir.clone(),
            source: std::io::Error::other(
                "the state directory must be a real directory owned by the daemon's user",
            ),
        });
    }
    // An older daemon made it 0755 (open) or 0700 (closed to the sessions' owners too).
    std::fs::set_permissions(
        &cfg.state_dir,
        std::fs::Permissions::from_mode(STATE_DIR_MODE),
    )
    .map_err(io("set permissions on", &cfg.state_dir))?;
    cfg.state_dir = cfg
        .state_dir
        .canonicalize()
        .map_err(io("resolve", &cfg.state_dir))?;
    // Sessions' directories belong to their owners (0700 each); their parent only needs to
    // be passable, for a sessions_dir configured outside the state directory.
    for (dir, mode) in [(cfg.sessions_dir(), 0o711), (cfg.runs_dir(), 0o700)] {
        match std::fs::DirBuilder::new().mode(mode).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io("create", &dir)(e)),
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .map_err(io("set permissions on", &dir))?;
    }
    Ok(())
}

/// Where the runs' private halves go: a root daemon's directory in `/dev/shm` where it can
/// have one (`run::dir::memory_runs_dir`), else `<state_dir>/runs`. Called with the state
/// directory locked, so no other daemon of it removes the directory in between.
pub(super) fn runs_dirs(cfg: &Config) -> RunsDirs {
    let disk = cfg.runs_dir();
    let memory = match crate::run::dir::memory_runs_dir(&cfg.state_dir) {
        Ok(dir) => Some(dir),
        Err(why @ NoMemoryDir::Taken(_)) => {
            warn!("runs' private halves stay in {}: {why}", disk.display());
            None
        }
        Err(why) => {
            info!("runs' private halves stay in {}: {why}", disk.display());
            None
        }
    };
    RunsDirs::new(disk, memory)
}

/// Every live run holds a pidfd and a directory descriptor: lift the soft limit on open
/// descriptors to the hard one (commonly 1024 → 524288), as servers do.
pub(super) fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// A `socket_group` by name or number.
pub(super) fn resolve_group(name: &str) -> Result<u32, ServeError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(name) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(ServeError::Io {
            step: "find the socket group",
            path: PathBuf::from(name),
            source: std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no such group (socket_group takes a group name or a numeric gid)",
            ),
        }),
    }
}

/// One daemon per state directory: an exclusive lock held for the daemon's life (and by the
/// `registry restore`/`rebuild` commands, which must not run beside one).
pub(crate) fn lock_state_dir(state_dir: &Path) -> Result<File, ServeError> {
    let path = state_dir.join("daemon.lock");
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|source| ServeError::Io {
            step: "open",
            path: path.clone(),
            source,
        })?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(ServeError::StateDirLocked(state_dir.into())),
        Err(std::fs::TryLockError::Error(source)) => Err(ServeError::Io {
            step: "lock",
            path,
            source,
        }),
    }
}

/// The listening socket passed by a service manager (`LISTEN_PID` is us, `LISTEN_FDS` is 1,
/// the socket is descriptor 3), as systemd's socket activation does; `None` when there is
/// none.
pub(super) fn activated_listener() -> Result<Option<UnixListener>, ServeError> {
    let io = |source| ServeError::Io {
        step: "take over",
        path: "the socket passed in LISTEN_FDS".into(),
        source,
    };
    let fds: Vec<i32> = sd_notify::listen_fds().map_err(io)?.collect();
    let fd = match fds.as_slice() {
        [] => return Ok(None),
        [fd] => *fd,
        more => {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} sockets were passed; sidejob listens on exactly one",
                    more.len()
                ),
            )))
        }
    };
    let std_listener = crate::sys::activation::inherited_unix_listener(fd).map_err(io)?;
    std_listener.set_nonblocking(true).map_err(io)?;
    UnixListener::from_std(std_listener).map(Some).map_err(io)
}

/// Binds the control socket (mode 0660, handed to `group` when one is configured), replacing
/// the stale socket of a dead daemon and refusing to take over a live one.
pub(super) fn bind_socket(path: &Path, group: Option<u32>) -> Result<UnixListener, ServeError> {
    if let Some(dir) = path.parent().filter(|d| !d.exists()) {
        // Passable by everyone (0755 despite the daemon's umask): who may connect is the
        // socket's own mode and group.
        std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
            .map_err(|source| ServeError::Io {
                step: "create",
                path: dir.into(),
                source,
            })?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => {
            return Err(ServeError::NotASocket { path: path.into() })
        }
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(ServeError::AlreadyRunning(path.into()));
            }
            info!(socket = %path.display(), "replacing the stale socket of a daemon that is gone");
            std::fs::remove_file(path).map_err(|source| ServeError::Io {
                step: "remove stale socket",
                path: path.into(),
                source,
            })?;
        }
        Err(_) => {}
    }
    // Bound under a temporary name, given its mode and group, then renamed into place: a
    // client can only ever reach the socket as it is meant to be.
    let staged = path.with_file_name(format!(
        ".{}.{}",
        path.file_name()
            .map_or_else(|| "sock".into(), |n| n.to_string_lossy()),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&staged);
    let io = |step: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| ServeError::Io {
            step,
            path: p,
            source,
        }
    };
    let listener = UnixListener::bind(&staged).map_err(io("bind", path))?;
    std::fs::set_permissions(&staged, std::fs::Permissions::from_mode(0o660))
        .map_err(io("set permissions on", path))?;
    if let Some(gid) = group {
        std::os::unix::fs::lchown(&staged, None, Some(gid))
            .map_err(io("hand the socket to its group", path))?;
    }
    std::fs::rename(&staged, path).map_err(io("put in place", path))?;
    Ok(listener)
}
