//! The daemon: the control socket, connections, framing and peer credentials (docs/protocol.md).

mod dispatch;
mod metrics;
mod profiles;
mod shares;
mod status;
mod wakes;

use dispatch::Reply;

use std::fs::File;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, info_span, warn, Instrument};

use crate::config::Config;
use crate::executor::Executor;
use crate::plugin_host::ToolHost;
use crate::protocol::{ErrorKind, Request, Response, RpcError, MAX_LINE_BYTES};
use crate::registry::Registry;
use crate::schedule::Scheduler;
use crate::wake::{Hub, PushChannel};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("another sidejob daemon is already listening on {0}")]
    AlreadyRunning(PathBuf),
    #[error("another sidejob daemon is using the state directory {0}")]
    StateDirLocked(PathBuf),
    #[error("{path} exists and is not a socket; remove it or choose another --socket")]
    NotASocket { path: PathBuf },
    #[error("cannot {step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Registry(#[from] crate::registry::RegistryError),
    #[error(transparent)]
    Exec(#[from] crate::executor::ExecError),
}

/// Who is on the other end of a connection (`SO_PEERCRED`, `SO_PEERGROUPS`), and where its
/// pushes go.
#[derive(Debug, Clone)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The connection, for `events.subscribe` (absent where pushes make no sense).
    pub conn: Option<Conn>,
}

#[derive(Debug, Clone)]
pub struct Conn {
    pub id: u64,
    pub channel: PushChannel,
    /// Set once this connection gets `tools.changed` pushes (its first `events.subscribe`).
    pub tools_watched: Arc<std::sync::atomic::AtomicBool>,
}

pub struct Daemon {
    pub executor: Arc<Executor>,
    pub hub: Arc<Hub>,
    pub scheduler: Arc<Scheduler>,
    pub started: status::Started,
    /// Each user's connections and unfinished request bytes.
    shares: Arc<shares::Shares>,
}

impl Peer {
    /// The peer's credentials, to act with on its behalf (see `sys::dirfd::as_caller`).
    pub fn creds(&self) -> crate::sys::dirfd::Creds {
        crate::sys::dirfd::Creds {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

static NEXT_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A line to write, and the task whose inline delivery rides on it.
struct Outgoing {
    line: String,
    inline_task: Option<String>,
}

/// Runs the daemon until SIGTERM or SIGINT. Runs keep going when it stops: their supervisors
/// own them, and the next start re-attaches.
pub async fn serve(cfg: Config) -> Result<(), ServeError> {
    // Nothing the daemon creates is readable by others unless it says so (the socket, the
    // bridge directory and the sessions directory set their modes explicitly). Supervisors
    // set the usual 022 again for the commands they run.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let mut cfg = cfg;
    prepare_state_dir(&mut cfg)?;
    raise_fd_limit();
    let cfg = Arc::new(cfg);
    // Handle SIGTERM/SIGINT before the socket exists, so a stop that comes as soon as it
    // accepts is a clean stop too.
    let mut term = signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = signal(tokio::signal::unix::SignalKind::interrupt())?;
    let lock = lock_state_dir(&cfg.state_dir)?;
    if let Some(dir) = &cfg.profiles_dir {
        crate::sandbox::Catalog::configure_dir(dir.clone());
    }
    let _profile_watch = crate::sandbox::Catalog::default_dir().and_then(profiles::watch);
    let socket_gid = cfg.socket_group.as_deref().map(resolve_group).transpose()?;
    let metrics = cfg.metrics_addr.map(metrics::bind).transpose()?;
    let (listener, activated) = match activated_listener()? {
        Some(l) => (l, true),
        None => (bind_socket(&cfg.socket, socket_gid)?, false),
    };
    // The socket the service manager bound is the one clients use: report that one.
    let cfg = match listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
    {
        Some(path) if activated && path != cfg.socket => {
            let mut c = (*cfg).clone();
            c.socket = path;
            Arc::new(c)
        }
        _ => cfg,
    };
    let registry = Arc::new(Registry::open(&cfg.state_dir)?);
    let exe = std::env::current_exe().map_err(|source| ServeError::Io {
        step: "locate",
        path: "/proc/self/exe".into(),
        source,
    })?;
    let executor = Executor::new(cfg.clone(), registry, ToolHost::start(&cfg), exe);
    let hub = Hub::new(executor.registry().clone())?;
    let recovered = executor.recover()?;
    crate::bridge::abandon_after_restart(&executor);
    crate::bridge::reopen_after_restart(&executor);
    let scheduler = Scheduler::new(
        executor.registry().clone(),
        executor.clone(),
        hub.clone(),
        cfg.schedule_lease_ms,
    );
    tokio::spawn(hub.clone().run());
    if cfg.backup_interval_ms > 0 {
        tokio::spawn(backups(
            executor.registry().clone(),
            cfg.state_dir.clone(),
            std::time::Duration::from_millis(cfg.backup_interval_ms),
        ));
    }
    tokio::spawn(scheduler.clone().run());
    info!(socket = %cfg.socket.display(), state_dir = %cfg.state_dir.display(), socket_activated = activated, ?recovered, "sidejob is listening");
    let daemon = Arc::new(Daemon {
        executor,
        hub,
        scheduler,
        shares: Arc::default(),
        started: status::Started::now(activated),
    });
    if let Some(listener) = metrics {
        metrics::serve(daemon.clone(), listener);
    }
    // Tell a service manager (Type=notify) that clients may connect now; a no-op elsewhere.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!("cannot notify the service manager: {e}");
    }

    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let d = daemon.clone();
                    tokio::spawn(async move { connection(d, stream).await });
                }
                Err(e) => warn!("accept failed: {e}"),
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    info!("stopping: runs keep going under their supervisors");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    drop(listener);
    // An activated socket belongs to the service manager, which keeps it for the next start.
    if !activated {
        let _ = std::fs::remove_file(&cfg.socket);
    }
    drop(lock);
    Ok(())
}

/// Backs the registry up every `every` when it has changed (and at once when there is no
/// backup yet), so a damaged registry can be restored (`sidejob registry restore`).
async fn backups(registry: Arc<Registry>, state_dir: PathBuf, every: std::time::Duration) {
    let seq = registry.subscribe_seq();
    let mut backed: Option<i64> = None;
    let mut first = !crate::registry::health::backup_path(&state_dir).exists();
    loop {
        if !first {
            tokio::time::sleep(every).await;
        }
        first = false;
        let now = *seq.borrow();
        if backed == Some(now) {
            continue;
        }
        let dir = state_dir.clone();
        match tokio::task::spawn_blocking(move || crate::registry::health::backup(&dir)).await {
            Ok(Ok(path)) => {
                debug!(path = %path.display(), seq = now, "registry backed up");
                backed = Some(now);
            }
            Ok(Err(e)) => warn!("cannot back up the registry: {e}"),
            Err(e) => warn!("the registry backup stopped: {e}"),
        }
    }
}

fn signal(
    kind: tokio::signal::unix::SignalKind,
) -> Result<tokio::signal::unix::Signal, ServeError> {
    tokio::signal::unix::signal(kind).map_err(|source| ServeError::Io {
        step: "handle signals for",
        path: "the daemon".into(),
        source,
    })
}

/// Makes the state directory private (0700: it holds the registry, with every user's
/// commands, and the runs' private halves) and its `sessions` and `runs` directories, and
/// pins its path to the real one (workspaces are checked against it).
fn prepare_state_dir(cfg: &mut Config) -> Result<(), ServeError> {
    use std::os::unix::fs::DirBuilderExt;
    let io = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |source| ServeError::Io { step, path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
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
    // An older daemon made it 0755: close it now.
    std::fs::set_permissions(&cfg.state_dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("make private", &cfg.state_dir))?;
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

/// Every live run holds a pidfd and a directory descriptor: lift the soft limit on open
/// descriptors to the hard one (commonly 1024 → 524288), as servers do.
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// A `socket_group` by name or number.
fn resolve_group(name: &str) -> Result<u32, ServeError> {
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
fn activated_listener() -> Result<Option<UnixListener>, ServeError> {
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
fn bind_socket(path: &Path, group: Option<u32>) -> Result<UnixListener, ServeError> {
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

async fn connection(d: Arc<Daemon>, stream: UnixStream) {
    let (push_tx, push_rx) = mpsc::channel::<String>(d.executor.config().push_queue.max(1));
    let (gap_tx, gap_rx) = watch::channel(None);
    let conn_id = NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let creds = match stream.peer_cred() {
        // An unprivileged daemon can only act as its own user: root connecting to it is
        // served as that user (everything it does runs with that user's authority anyway).
        Ok(c) if c.uid() == 0 && crate::sys::getuid() != 0 => crate::sys::dirfd::Creds::own(),
        Ok(c) => crate::sys::dirfd::Creds {
            uid: c.uid(),
            gid: c.gid(),
            groups: {
                use std::os::fd::AsFd;
                crate::sys::peer_groups(stream.as_fd()).unwrap_or_else(|_| vec![c.gid()])
            },
        },
        Err(e) => {
            warn!("cannot read peer credentials: {e}");
            return;
        }
    };
    let peer = Peer {
        uid: creds.uid,
        gid: creds.gid,
        groups: creds.groups,
        conn: Some(Conn {
            id: conn_id,
            channel: PushChannel {
                push: push_tx,
                gap: gap_tx,
            },
            tools_watched: Default::default(),
        }),
    };
    let span = info_span!("connection", uid = peer.uid, conn = conn_id);
    let limits = d.executor.config().per_user.clone();
    async move {
        debug!("connected");
        let max_connections = d.executor.config().max_connections;
        let mut share = match d.shares.connect(peer.uid, &limits, max_connections) {
            Ok(share) => share,
            Err(why) => {
                let err = RpcError::new(ErrorKind::LimitExceeded, why);
                let mut line = encode(&Response::err(Value::Null, err));
                line.push('\n');
                let mut stream = stream;
                let _ = stream.write_all(line.as_bytes()).await;
                return;
            }
        };
        let line_timeout = std::time::Duration::from_millis(limits.line_timeout_ms.max(1));
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel::<Outgoing>();
        let writer = tokio::spawn(write_loop(wr, rx, push_rx, gap_rx, d.clone()));
        let (closed_tx, closed_rx) = watch::channel(false);
        // Small to start (an idle connection costs little); a long line grows `line` only
        // while it is read.
        let mut reader = BufReader::with_capacity(8 * 1024, rd);
        let mut line = Vec::new();
        loop {
            match read_line(&mut reader, &mut line, &mut share, line_timeout).await {
                Ok(Line::Complete) => {
                    if line.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    let (d, tx, mut closed, peer) =
                        (d.clone(), tx.clone(), closed_rx.clone(), peer.clone());
                    let text = std::mem::take(&mut line);
                    // Start the next line small again (`take` left an empty buffer).
                    tokio::spawn(async move {
                        let closed = async move {
                            let _ = closed.wait_for(|c| *c).await;
                        };
                        if let Some(out) = handle_line(&d, &peer, &text, closed).await {
                            if let Err(mpsc::error::SendError(out)) = tx.send(out) {
                                if let Some(task) = out.inline_task {
                                    d.executor.undeliver(&task);
                                }
                            }
                        }
                    });
                }
                Ok(Line::TooLong) => {
                    let err = RpcError::new(
                        ErrorKind::InvalidRequest,
                        format!("line exceeds {MAX_LINE_BYTES} bytes; the connection is closed"),
                    );
                    let _ = tx.send(Outgoing {
                        line: encode(&Response::err(Value::Null, err)),
                        inline_task: None,
                    });
                    break;
                }
                Ok(refused @ (Line::OverShare | Line::TimedOut)) => {
                    let why = match refused {
                        Line::TimedOut => format!(
                            "a request line was not finished within {} ms (per_user.line_timeout_ms); the connection is closed",
                            line_timeout.as_millis()
                        ),
                        _ => share.over_message(),
                    };
                    let err = RpcError::new(ErrorKind::LimitExceeded, why);
                    let _ = tx.send(Outgoing {
                        line: encode(&Response::err(Value::Null, err)),
                        inline_task: None,
                    });
                    break;
                }
                Ok(Line::Eof) => break,
                Err(e) => {
                    debug!("read failed: {e}");
                    break;
                }
            }
        }
        let _ = closed_tx.send(true);
        d.hub.unsubscribe(conn_id).await;
        drop(peer);
        drop(tx);
        let _ = writer.await;
        debug!("disconnected");
    }
    .instrument(span)
    .await
}

/// Writes replies and pushes to the connection. Replies come first; pushes wait in a bounded
/// queue (see `wake`); a gap is announced once.
/// How many bytes of waiting pushes one write may carry.
const PUSH_BATCH_BYTES: usize = 256 * 1024;

async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    mut pushes: mpsc::Receiver<String>,
    mut gap: watch::Receiver<Option<i64>>,
    d: Arc<Daemon>,
) {
    let mut broken = false;
    loop {
        let (line, inline_task) = tokio::select! {
            biased;
            out = rx.recv() => match out {
                Some(out) => (out.line, out.inline_task),
                None => break,
            },
            Some(push) = pushes.recv() => (push, None),
            Ok(()) = gap.changed() => {
                let Some(from_seq) = *gap.borrow_and_update() else { continue };
                let params = serde_json::json!(crate::protocol::EventsGapNotification { from_seq });
                (serde_json::json!({"jsonrpc": "2.0", "method": "events.gap", "params": params}).to_string(), None)
            }
        };
        if !broken {
            let mut bytes = line.into_bytes();
            bytes.push(b'\n');
            // Pushes waiting behind this one go out in the same write: a subscriber under
            // load gets many lines per system call instead of one.
            if inline_task.is_none() {
                while bytes.len() < PUSH_BATCH_BYTES {
                    match pushes.try_recv() {
                        Ok(more) => {
                            bytes.extend_from_slice(more.as_bytes());
                            bytes.push(b'\n');
                        }
                        Err(_) => break,
                    }
                }
            }
            if wr.write_all(&bytes).await.is_ok() {
                continue;
            }
            broken = true;
        }
        // The host is gone: whatever this reply carried inline must be delivered another way.
        if let Some(task) = inline_task {
            d.executor.undeliver(&task);
        }
    }
}

enum Line {
    Complete,
    TooLong,
    /// The user's unfinished lines would take more than `per_user.buffered_bytes`.
    OverShare,
    /// A line was begun and not finished within `per_user.line_timeout_ms`.
    TimedOut,
    Eof,
}

/// Reads one newline-terminated line of at most [`MAX_LINE_BYTES`] into `buf`. The bytes of a
/// line not yet complete count against the user's share, and a line must be finished within
/// `timeout` of its first byte.
async fn read_line(
    r: &mut BufReader<OwnedReadHalf>,
    buf: &mut Vec<u8>,
    share: &mut shares::Connection,
    timeout: std::time::Duration,
) -> std::io::Result<Line> {
    buf.clear();
    let _ = share.hold(0);
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let avail = match deadline {
            None => r.fill_buf().await?,
            Some(at) => match tokio::time::timeout_at(at, r.fill_buf()).await {
                Ok(read) => read?,
                Err(_) => {
                    let _ = share.hold(0);
                    buf.clear();
                    return Ok(Line::TimedOut);
                }
            },
        };
        if avail.is_empty() {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Complete
            });
        }
        if let Some(i) = avail.iter().position(|&b| b == b'\n') {
            let too_long = buf.len() + i > MAX_LINE_BYTES;
            if !too_long {
                buf.extend_from_slice(&avail[..i]);
            }
            r.consume(i + 1);
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
        let n = avail.len();
        if buf.len() + n > MAX_LINE_BYTES {
            r.consume(n);
            return Ok(Line::TooLong);
        }
        if !share.hold(buf.len() + n) {
            let _ = share.hold(0);
            buf.clear();
            return Ok(Line::OverShare);
        }
        buf.extend_from_slice(avail);
        r.consume(n);
        deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
    }
}

fn encode(r: &Response) -> String {
    serde_json::to_string(r).unwrap_or_else(|e| {
        format!(r#"{{"jsonrpc":"2.0","id":null,"error":{{"code":-32603,"message":"cannot encode reply: {e}"}}}}"#)
    })
}

/// Parses and answers one line; `None` for notifications (no `id`), which get no reply.
async fn handle_line(
    d: &Arc<Daemon>,
    peer: &Peer,
    line: &[u8],
    closed: impl std::future::Future<Output = ()>,
) -> Option<Outgoing> {
    let reply_err = |id: Value, err: RpcError| {
        Some(Outgoing {
            line: encode(&Response::err(id, err)),
            inline_task: None,
        })
    };
    let value: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            return reply_err(
                Value::Null,
                RpcError::new(ErrorKind::ParseError, format!("parse error: {e}")),
            )
        }
    };
    if value.is_array() {
        return reply_err(
            Value::Null,
            RpcError::new(
                ErrorKind::InvalidRequest,
                "batch requests are not supported; send one object per line",
            ),
        );
    }
    if !value.is_object() {
        return reply_err(
            Value::Null,
            RpcError::new(ErrorKind::InvalidRequest, "a request must be a JSON object"),
        );
    }
    let has_id = value.get("id").is_some();
    let req: Request = match serde_json::from_value(value) {
        Ok(r) => r,
        Err(e) => {
            return reply_err(
                Value::Null,
                RpcError::new(ErrorKind::InvalidRequest, format!("invalid request: {e}")),
            )
        }
    };
    let id = req.id.clone().unwrap_or(Value::Null);
    if !matches!(id, Value::Null | Value::String(_) | Value::Number(_)) {
        return reply_err(
            Value::Null,
            RpcError::new(
                ErrorKind::InvalidRequest,
                "id must be a string, a number or null",
            ),
        );
    }
    if req.jsonrpc.as_deref() != Some("2.0") {
        return reply_err(
            id,
            RpcError::new(ErrorKind::InvalidRequest, "jsonrpc must be \"2.0\""),
        );
    }
    let Some(Value::String(method)) = req.method else {
        return reply_err(
            id,
            RpcError::new(ErrorKind::InvalidRequest, "method must be a string"),
        );
    };
    let params = match req.params {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => {
            return reply_err(
                id,
                RpcError::new(
                    ErrorKind::InvalidParams,
                    format!("{method}: params must be an object"),
                ),
            )
        }
    };
    let span = info_span!("request", method = %method);
    let outcome = dispatch::dispatch(d, peer, &method, params, closed)
        .instrument(span)
        .await;
    if !has_id {
        // A notification gets no reply, so nothing can be delivered inline through it.
        if let Ok(Reply {
            inline_task: Some(task),
            ..
        }) = &outcome
        {
            d.executor.undeliver(task);
        }
        return None;
    }
    Some(match outcome {
        Ok(reply) => Outgoing {
            line: encode(&Response::ok(id, reply.result)),
            inline_task: reply.inline_task,
        },
        Err(err) => Outgoing {
            line: encode(&Response::err(id, err)),
            inline_task: None,
        },
    })
}
