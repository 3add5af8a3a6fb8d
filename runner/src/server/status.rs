//! `daemon.status`: what this daemon is, what it loaded, and its counters.

use std::collections::BTreeMap;
use std::time::Instant;

use super::Daemon;
use crate::protocol::{DaemonStatusResult, RpcError, TaskState, ToolSource};

/// When and how the daemon started, for `daemon.status`.
#[derive(Debug, Clone)]
pub(crate) struct Started {
    pub at: Instant,
    pub at_rfc3339: String,
    /// The listening socket came from the service manager.
    pub socket_activated: bool,
}

impl Started {
    pub(crate) fn now(socket_activated: bool) -> Started {
        Started {
            at: Instant::now(),
            at_rfc3339: crate::ids::now_rfc3339(),
            socket_activated,
        }
    }
}

const ALL_STATES: [TaskState; 7] = [
    TaskState::Queued,
    TaskState::Running,
    TaskState::AwaitingInput,
    TaskState::Scheduled,
    TaskState::Succeeded,
    TaskState::Failed,
    TaskState::Canceled,
];

/// The status as `uid` may see it (root: every session).
pub(super) fn collect(d: &Daemon, uid: u32) -> Result<DaemonStatusResult, RpcError> {
    let cfg = d.executor.config();
    let registry = d.executor.registry();
    let host = d.executor.tools();
    let tools = host
        .list()
        .into_iter()
        .map(|t| ToolSource {
            plugin: host
                .get(&t.name)
                .map(|tool| tool.source().display().to_string())
                .unwrap_or_default(),
            name: t.name,
        })
        .collect();
    let profile_errors = d
        .executor
        .catalog()
        .refresh()
        .into_iter()
        .filter(|line| !line.ends_with(": ok"))
        .collect();
    let owner = (uid != 0).then_some(uid);
    let mut tasks: BTreeMap<String, u32> = ALL_STATES
        .iter()
        .map(|s| (s.as_str().to_owned(), 0))
        .collect();
    let mut sessions = 0;
    for s in registry.list_sessions(owner)? {
        if s.is_open() {
            sessions += 1;
        }
        for (state, n) in registry.count_states(&s.session_id)? {
            *tasks.entry(state.as_str().to_owned()).or_default() += n;
        }
    }
    // Terminal states are counted as runs settle (since this daemon started): the registry
    // keeps history, which a counter of "runs by state" should not re-count on every scrape.
    // These counters are the whole daemon's, so only root (or the one user of an unprivileged
    // daemon) sees them: to anyone else they would tell when other users' runs end.
    let daemon_wide = uid == 0 || uid == crate::sys::getuid();
    if daemon_wide {
        for (state, n) in crate::metrics::settled_counts() {
            tasks.insert(state.as_str().to_owned(), n as u32);
        }
    }
    let queue_depth = tasks.get(TaskState::Queued.as_str()).copied().unwrap_or(0);
    Ok(DaemonStatusResult {
        version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        started_at: d.started.at_rfc3339.clone(),
        uptime_ms: d.started.at.elapsed().as_millis() as u64,
        socket: cfg.socket.display().to_string(),
        socket_activated: d.started.socket_activated,
        state_dir: cfg.state_dir.display().to_string(),
        tools,
        plugin_errors: host.errors(),
        profile_errors,
        sessions,
        tasks,
        queue_depth,
        wakes_pushed: if daemon_wide {
            crate::metrics::wakes_pushed()
        } else {
            0
        },
        violations: if daemon_wide {
            crate::metrics::violations()
        } else {
            0
        },
        waits: if daemon_wide {
            crate::metrics::waits()
        } else {
            0
        },
        daemon_wide_counters: daemon_wide,
    })
}
