//! The daemon (docs/protocol.md): it starts the executor, the hub, the scheduler and the
//! bridges, and serves the control socket.
//!
//! - `listen.rs`: the state directory and the listening socket;
//! - `connection.rs`: a connection's lines, peer credentials, shares (`shares.rs`) and pushes,
//!   for the control socket and for every run's bridge alike;
//! - `rpc.rs`: the one RPC core (envelope, params, replies, errors);
//! - `scope.rs`: who a request is from and what it may reach (a host or a run's bridge);
//! - `handlers/`: one file per method family; `status.rs` gathers `daemon.status`.

mod connection;
mod handlers;
mod listen;
mod metrics;
mod profiles;
mod rpc;
mod scope;
mod shares;
mod status;
pub(crate) mod upgrade;

pub(crate) use listen::lock_state_dir;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use tokio::net::UnixListener;
use tracing::{debug, error, info, warn, Instrument};

use crate::bridge::{self, Bridges};
use crate::config::Config;
use crate::executor::Executor;
use crate::plugin_host::ToolHost;
use crate::registry::Registry;
use crate::run::dir::RunsDirs;
use crate::schedule::Scheduler;
use crate::wake::{Hub, PushChannel};

#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
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
pub(crate) struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The connection, for `events.subscribe` (absent where pushes make no sense).
    pub conn: Option<Conn>,
}

#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub id: u64,
    pub channel: PushChannel,
    /// Set once this connection gets `tools.changed` pushes (its first `events.subscribe`).
    pub tools_watched: Arc<std::sync::atomic::AtomicBool>,
}

pub(crate) struct Daemon {
    pub executor: Arc<Executor>,
    pub hub: Arc<Hub>,
    pub scheduler: Arc<Scheduler>,
    /// The runs' bridges: the executor's run hooks; their connections are served here.
    pub bridges: Arc<Bridges>,
    pub started: status::Started,
    /// Each user's connections and unfinished request bytes.
    shares: Arc<shares::Shares>,
}

impl Peer {
    /// The peer's credentials, to act with on its behalf (see `sys::dirfd::as_caller`).
    pub(crate) fn creds(&self) -> crate::sys::dirfd::Creds {
        crate::sys::dirfd::Creds {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Runs the daemon until SIGTERM or SIGINT. Runs keep going when it stops: their supervisors
/// own them, and the next start re-attaches. SIGHUP re-executes it in place (`upgrade/`).
pub(crate) async fn serve(cfg: Config) -> Result<(), ServeError> {
    // Nothing the daemon creates is readable by others unless it says so (the socket, the
    // bridge directory and the sessions directory set their modes explicitly). Supervisors
    // set the usual 022 again for the commands they run.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    // Signals first: a stop that comes as soon as the socket accepts is a clean stop too, and
    // a SIGHUP sent right after an upgrade finds its handler (the default would end the
    // daemon).
    let mut signals = Signals {
        term: signal(tokio::signal::unix::SignalKind::terminate())?,
        int: signal(tokio::signal::unix::SignalKind::interrupt())?,
        hup: signal(tokio::signal::unix::SignalKind::hangup())?,
    };
    let mut cfg = cfg;
    listen::prepare_state_dir(&mut cfg)?;
    listen::raise_fd_limit();
    let inherited = upgrade::handover::take(&cfg.state_dir)?;
    let upgraded = inherited.is_some();
    // The metrics port is bound again: it was not handed over.
    let (lock, metrics, listener, activated) = match inherited {
        Some(h) => {
            let metrics = cfg.metrics_addr.map(metrics::bind).transpose()?;
            (h.lock, metrics, h.listener, h.activated)
        }
        None => {
            let lock = lock_state_dir(&cfg.state_dir)?;
            let socket_gid = cfg
                .socket_group
                .as_deref()
                .map(listen::resolve_group)
                .transpose()?;
            let metrics = cfg.metrics_addr.map(metrics::bind).transpose()?;
            match listen::activated_listener()? {
                Some(l) => (lock, metrics, l, true),
                None => (
                    lock,
                    metrics,
                    listen::bind_socket(&cfg.socket, socket_gid)?,
                    false,
                ),
            }
        }
    };
    let runs = listen::runs_dirs(&cfg);
    // The socket the service manager bound is the one clients use: report that one.
    if let Some(path) = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .filter(|path| activated && *path != cfg.socket)
    {
        cfg.socket = path;
    }
    let cfg = Arc::new(cfg);
    let daemon = start(cfg.clone(), activated, runs.clone())?;
    if upgraded {
        info!(
            version = env!("CARGO_PKG_VERSION"),
            "upgraded in place: the same socket, the same runs"
        );
    }
    let _profile_watch = profiles::watch(daemon.executor.catalog().clone());
    if let Some(listener) = metrics {
        metrics::serve(daemon.clone(), listener);
    }
    // Tell a service manager (Type=notify) that clients may connect now (after an upgrade:
    // that the reload is done); a no-op elsewhere.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!("cannot notify the service manager: {e}");
    }
    loop {
        match accept(&daemon, &listener, &mut signals).await {
            Ending::Stop => break,
            Ending::Upgrade => {
                let kept = upgrade::Kept {
                    listener: &listener,
                    lock: &lock,
                    activated,
                };
                upgrade_in_place(&daemon, kept).await
            }
        }
    }
    info!("stopping: runs keep going under their supervisors");
    daemon.hub.stop();
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
    drop(listener);
    // An activated socket belongs to the service manager, which keeps it for the next start.
    if !activated {
        let _ = std::fs::remove_file(&cfg.socket);
    }
    // The runs' directory in /dev/shm goes too when no run is left in it.
    if let Some(dir) = runs.memory() {
        let _ = std::fs::remove_dir(dir);
    }
    drop(lock);
    Ok(())
}

struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

/// Why the daemon stopped accepting.
enum Ending {
    /// SIGTERM or SIGINT.
    Stop,
    /// SIGHUP.
    Upgrade,
}

/// Accepts connections until a signal says what comes next.
async fn accept(daemon: &Arc<Daemon>, listener: &UnixListener, signals: &mut Signals) -> Ending {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(connection::control(daemon.clone(), stream));
                }
                Err(e) => warn!("accept failed: {e}"),
            },
            _ = signals.term.recv() => return Ending::Stop,
            _ = signals.int.recv() => return Ending::Stop,
            _ = signals.hup.recv() => return Ending::Upgrade,
        }
    }
}

/// Re-executes the daemon in place, or says why not and goes on serving with this binary.
/// New connections wait in the socket's backlog meanwhile.
async fn upgrade_in_place(daemon: &Arc<Daemon>, kept: upgrade::Kept<'_>) {
    let cfg = daemon.executor.config();
    let (candidate, version) = match upgrade::prepare(cfg).await {
        Ok(c) => c,
        Err(e) => {
            error!(hint = %e.hint(), "upgrade refused, serving on with this binary: {e}");
            return;
        }
    };
    info!(binary = %candidate.path.display(), %version, "upgrading in place");
    // systemd (Type=notify): reloading until the new image says READY=1.
    let mut reloading = vec![sd_notify::NotifyState::Reloading];
    if let Ok(now) = sd_notify::NotifyState::monotonic_usec_now() {
        reloading.push(now);
    }
    let _ = sd_notify::notify(&reloading);
    // The new image knows its supervisors from the registry, and no other child: the
    // spawner is stopped, no plugin rescan (with its schema-check child) is under way, and no
    // registry transaction is half done when the exec happens.
    daemon.executor.stop_spawner();
    let reloads = daemon.executor.tools().hold_reloads();
    let writes = daemon.executor.registry().hold_writes();
    let e = upgrade::reexec(&candidate, kept);
    drop(writes);
    drop(reloads);
    error!(binary = %candidate.path.display(), "upgrade failed, serving on with this binary: cannot execute it: {e}");
    let _ = sd_notify::notify(&[sd_notify::NotifyState::Ready]);
}

/// Builds the daemon's parts, takes over the runs a previous daemon left (their tasks, then
/// their bridges), and starts the hub, the scheduler and the backups.
fn start(cfg: Arc<Config>, activated: bool, runs: RunsDirs) -> Result<Arc<Daemon>, ServeError> {
    let registry = Arc::new(Registry::open(&cfg.state_dir)?);
    let exe = std::env::current_exe().map_err(|source| ServeError::Io {
        step: "locate",
        path: "/proc/self/exe".into(),
        source,
    })?;
    let executor = Executor::new(
        cfg.clone(),
        registry,
        ToolHost::start(&cfg, Some(exe.clone())),
        exe,
        runs,
    );
    let hub = Hub::new(executor.registry().clone())?;
    executor.set_hub(hub.clone());
    let scheduler = Scheduler::new(
        executor.registry().clone(),
        executor.clone(),
        hub.clone(),
        cfg.schedule_lease_ms,
    );
    let daemon = Arc::new_cyclic(|me: &Weak<Daemon>| Daemon {
        executor,
        hub,
        scheduler,
        bridges: Bridges::new(bridge_connections(me.clone())),
        shares: Arc::default(),
        started: status::Started::now(activated),
    });
    // Before the first run (recovery's included): the executor tells the bridges of each.
    daemon.executor.set_hooks(daemon.bridges.clone())?;
    let recovered = daemon.executor.recover()?;
    daemon.bridges.after_restart(&daemon.executor);
    daemon
        .hub
        .clone()
        .start()
        .map_err(|source| ServeError::Io {
            step: "start the event hub's thread in",
            path: cfg.state_dir.clone(),
            source,
        })?;
    if cfg.backup_interval_ms > 0 {
        tokio::spawn(backups(
            daemon.executor.registry().clone(),
            cfg.state_dir.clone(),
            std::time::Duration::from_millis(cfg.backup_interval_ms),
        ));
    }
    tokio::spawn(daemon.scheduler.clone().run());
    if cfg.session_idle_ms > 0 {
        tokio::spawn(expire_idle_sessions(
            daemon.clone(),
            std::time::Duration::from_millis(cfg.session_idle_ms),
        ));
    }
    info!(socket = %cfg.socket.display(), state_dir = %cfg.state_dir.display(), socket_activated = activated, ?recovered, "sidejob is listening");
    Ok(daemon)
}

/// Serves each connection to a run's bridge with the same core as the control socket.
fn bridge_connections(daemon: Weak<Daemon>) -> bridge::Serve {
    Arc::new(move |scope, stream| {
        if let Some(d) = daemon.upgrade() {
            tokio::spawn(connection::bridge(d, scope, stream).in_current_span());
        }
    })
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

/// Closes idle sessions (`session_idle_ms`), looking a quarter of that time apart (at most
/// every ten minutes), so that no share of sessions fills up with ones nobody uses.
async fn expire_idle_sessions(daemon: Arc<Daemon>, idle: std::time::Duration) {
    let every = (idle / 4).clamp(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(600),
    );
    loop {
        tokio::time::sleep(every).await;
        if let Err(e) = handlers::session::expire_idle(&daemon, idle).await {
            warn!("cannot close idle sessions: {}", e.message);
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
