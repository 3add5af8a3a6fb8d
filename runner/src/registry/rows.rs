//! Typed rows of the registry and their column patches.

use rusqlite::Row;
use serde_json::{Map, Value};

use super::{obj, RegistryError};
use crate::protocol::{
    CallGrants, Delivery, FailReason, SessionInfo, SessionState, StdinMode, Task, TaskKind,
    TaskMode, TaskState, WakeMode,
};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct SessionRow {
    pub session_id: String,
    pub owner_uid: u32,
    /// The group the session's files are handed to (the owner's primary group at open).
    pub owner_gid: u32,
    pub workspace: String,
    pub session_dir: String,
    pub profile: String,
    pub proactive_wake: bool,
    pub parent_session_id: Option<String>,
    pub state: SessionState,
    pub created_at: String,
    pub closed_at: Option<String>,
}

impl SessionRow {
    pub(crate) fn from_row(r: &Row) -> rusqlite::Result<SessionRow> {
        Ok(SessionRow {
            session_id: r.get("session_id")?,
            owner_uid: r.get("owner_uid")?,
            owner_gid: r.get("owner_gid")?,
            workspace: r.get("workspace")?,
            session_dir: r.get("session_dir")?,
            profile: r.get("profile")?,
            proactive_wake: r.get("proactive_wake")?,
            parent_session_id: r.get("parent_session_id")?,
            state: {
                let s: String = r.get("state")?;
                SessionState::parse(&s).ok_or_else(|| {
                    rusqlite::Error::FromSqlConversionFailure(
                        0,
                        rusqlite::types::Type::Text,
                        format!("unknown session state {s:?}").into(),
                    )
                })?
            },
            created_at: r.get("created_at")?,
            closed_at: r.get("closed_at")?,
        })
    }

    pub(crate) fn to_patch(&self) -> Map<String, Value> {
        obj([
            ("session_id", self.session_id.clone().into()),
            ("owner_uid", self.owner_uid.into()),
            ("owner_gid", self.owner_gid.into()),
            ("workspace", self.workspace.clone().into()),
            ("session_dir", self.session_dir.clone().into()),
            ("profile", self.profile.clone().into()),
            ("proactive_wake", self.proactive_wake.into()),
            ("parent_session_id", self.parent_session_id.clone().into()),
            ("state", self.state.as_str().into()),
            ("created_at", self.created_at.clone().into()),
            ("closed_at", self.closed_at.clone().into()),
        ])
    }

    pub(crate) fn is_open(&self) -> bool {
        self.state == SessionState::Open
    }

    pub(crate) fn to_wire(&self) -> SessionInfo {
        SessionInfo {
            session_id: self.session_id.clone(),
            owner_uid: self.owner_uid,
            workspace: self.workspace.clone(),
            session_dir: self.session_dir.clone(),
            profile: self.profile.clone(),
            proactive_wake: self.proactive_wake,
            parent_session_id: self.parent_session_id.clone(),
            state: self.state,
            created_at: self.created_at.clone(),
            closed_at: self.closed_at.clone(),
        }
    }
}

/// A task row. Enum columns are kept as typed values; `check` refuses unknown spellings.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaskRow {
    pub task_id: String,
    pub session_id: String,
    pub owner_uid: u32,
    pub tool: String,
    pub kind: TaskKind,
    pub state: TaskState,
    /// `foreground` while a `tool.call` blocks on it, else `background`.
    pub mode: TaskMode,
    pub reason: Option<FailReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub summary: String,
    pub args: String,
    pub created_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    /// The run's public directory (`run::dir::public_path`; stored as `run_dir`).
    pub public_dir: String,
    pub delivery: Option<Delivery>,
    pub service: bool,
    pub parent_task_id: Option<String>,
    pub profile: String,
    pub timeout_ms: Option<u64>,
    pub stdin: StdinMode,
    pub supervisor_pid: Option<i32>,
    pub supervisor_start_time: Option<u64>,
    pub duration_ms: Option<u64>,
    pub output_bytes: Option<u64>,
    pub output_truncated: Option<bool>,
    pub leftover_processes: Option<u32>,
    pub error: Option<String>,
    /// Whether a background completion wakes the host.
    pub wake: WakeMode,
    /// For runs started by a schedule: `<schedule_id>:<occurrence>`, unique.
    pub occurrence_key: Option<String>,
    /// The session owner's group (files of the run are handed to `owner_uid:owner_gid`).
    pub owner_gid: u32,
    /// Who the command runs as; `None` keeps the daemon's own ids.
    pub run_uid: Option<u32>,
    pub run_gid: Option<u32>,
    /// The session the run's bridge is scoped to; `None`: the run has no bridge.
    pub bridge_session_id: Option<String>,
    /// Its output was removed with its session (`session.close` with `delete`).
    pub output_deleted: bool,
    /// What the run ran into, in one line (`supervisor::result::summary`).
    pub violations: Option<String>,
    /// What the call was granted beyond its profile (stored as JSON).
    pub grants: Option<CallGrants>,
}

/// Raw text of the enum columns, checked after the row is read.
fn parse_enum<T>(col: &str, s: &str, f: impl Fn(&str) -> Option<T>) -> Result<T, RegistryError> {
    f(s).ok_or_else(|| RegistryError::Corrupt(format!("{col} {s:?}")))
}

impl TaskRow {
    pub(crate) fn from_row(r: &Row) -> rusqlite::Result<RawTask> {
        Ok(RawTask {
            kind: r.get("kind")?,
            state: r.get("state")?,
            reason: r.get("reason")?,
            delivery: r.get("delivery")?,
            stdin: r.get("stdin")?,
            mode: r.get("mode")?,
            wake: r.get("wake")?,
            grants: r.get("grants")?,
            row: TaskRow {
                task_id: r.get("task_id")?,
                session_id: r.get("session_id")?,
                owner_uid: r.get("owner_uid")?,
                tool: r.get("tool")?,
                kind: TaskKind::Call,
                state: TaskState::Queued,
                mode: TaskMode::Background,
                reason: None,
                exit_code: r.get("exit_code")?,
                signal: r.get("signal")?,
                summary: r.get("summary")?,
                args: r.get("args")?,
                created_at: r.get("created_at")?,
                started_at: r.get("started_at")?,
                ended_at: r.get("ended_at")?,
                public_dir: r.get("run_dir")?,
                delivery: None,
                service: r.get("service")?,
                parent_task_id: r.get("parent_task_id")?,
                profile: r.get("profile")?,
                timeout_ms: r.get("timeout_ms")?,
                stdin: StdinMode::Null,
                supervisor_pid: r.get("supervisor_pid")?,
                supervisor_start_time: r.get("supervisor_start_time")?,
                duration_ms: r.get("duration_ms")?,
                output_bytes: r.get("output_bytes")?,
                output_truncated: r.get("output_truncated")?,
                leftover_processes: r.get("leftover_processes")?,
                error: r.get("error")?,
                wake: WakeMode::OnTerminal,
                occurrence_key: r.get("occurrence_key")?,
                owner_gid: r.get("owner_gid")?,
                run_uid: r.get("run_uid")?,
                run_gid: r.get("run_gid")?,
                bridge_session_id: r.get("bridge_session_id")?,
                output_deleted: r.get("output_deleted")?,
                violations: r.get("violations")?,
                grants: None,
            },
        })
    }

    pub(crate) fn check(raw: RawTask) -> Result<TaskRow, RegistryError> {
        let mut row = raw.row;
        row.kind = parse_enum("kind", &raw.kind, serde_enum)?;
        row.state = parse_enum("state", &raw.state, TaskState::parse)?;
        row.reason = raw
            .reason
            .as_deref()
            .map(|s| parse_enum("reason", s, FailReason::parse))
            .transpose()?;
        row.delivery = raw
            .delivery
            .as_deref()
            .map(|s| parse_enum("delivery", s, Delivery::parse))
            .transpose()?;
        row.stdin = parse_enum("stdin", &raw.stdin, serde_enum)?;
        row.mode = parse_enum("mode", &raw.mode, serde_enum)?;
        row.wake = parse_enum("wake", &raw.wake, serde_enum)?;
        row.grants = raw
            .grants
            .as_deref()
            .map(|s| {
                serde_json::from_str(s)
                    .map_err(|e| RegistryError::Corrupt(format!("grants {s:?}: {e}")))
            })
            .transpose()?;
        Ok(row)
    }

    pub(crate) fn to_patch(&self) -> Map<String, Value> {
        obj([
            ("task_id", self.task_id.clone().into()),
            ("session_id", self.session_id.clone().into()),
            ("owner_uid", self.owner_uid.into()),
            ("tool", self.tool.clone().into()),
            ("kind", enum_json(&self.kind)),
            ("state", self.state.as_str().into()),
            ("mode", enum_json(&self.mode)),
            ("reason", self.reason.map(|r| r.as_str()).into()),
            ("exit_code", self.exit_code.into()),
            ("signal", self.signal.into()),
            ("summary", self.summary.clone().into()),
            ("args", self.args.clone().into()),
            ("created_at", self.created_at.clone().into()),
            ("started_at", self.started_at.clone().into()),
            ("ended_at", self.ended_at.clone().into()),
            ("run_dir", self.public_dir.clone().into()),
            ("delivery", self.delivery.map(|d| d.as_str()).into()),
            ("service", self.service.into()),
            ("parent_task_id", self.parent_task_id.clone().into()),
            ("profile", self.profile.clone().into()),
            ("timeout_ms", self.timeout_ms.into()),
            ("stdin", enum_json(&self.stdin)),
            ("supervisor_pid", self.supervisor_pid.into()),
            ("supervisor_start_time", self.supervisor_start_time.into()),
            ("duration_ms", self.duration_ms.into()),
            ("output_bytes", self.output_bytes.into()),
            ("output_truncated", self.output_truncated.into()),
            ("leftover_processes", self.leftover_processes.into()),
            ("error", self.error.clone().into()),
            ("wake", enum_json(&self.wake)),
            ("occurrence_key", self.occurrence_key.clone().into()),
            ("owner_gid", self.owner_gid.into()),
            ("run_uid", self.run_uid.into()),
            ("run_gid", self.run_gid.into()),
            ("bridge_session_id", self.bridge_session_id.clone().into()),
            ("output_deleted", self.output_deleted.into()),
            ("violations", self.violations.clone().into()),
            (
                "grants",
                self.grants
                    .as_ref()
                    .and_then(|g| serde_json::to_string(g).ok())
                    .into(),
            ),
        ])
    }

    /// A new task of `session`, not yet started (a call is `queued`, a monitor `scheduled`),
    /// under the session's profile: everything a run fills in later is empty.
    pub(crate) fn new(
        task_id: String,
        session: &SessionRow,
        tool: String,
        kind: TaskKind,
        summary: String,
        args: String,
    ) -> TaskRow {
        let state = match kind {
            TaskKind::Call => TaskState::Queued,
            TaskKind::Monitor => TaskState::Scheduled,
        };
        TaskRow {
            public_dir: crate::run::dir::public_path(&session.session_dir, &task_id),
            task_id,
            session_id: session.session_id.clone(),
            owner_uid: session.owner_uid,
            tool,
            kind,
            state,
            mode: TaskMode::Background,
            reason: None,
            exit_code: None,
            signal: None,
            summary,
            args,
            created_at: crate::ids::now_rfc3339(),
            started_at: None,
            ended_at: None,
            delivery: None,
            service: false,
            parent_task_id: None,
            profile: session.profile.clone(),
            timeout_ms: None,
            stdin: StdinMode::Null,
            supervisor_pid: None,
            supervisor_start_time: None,
            duration_ms: None,
            output_bytes: None,
            output_truncated: None,
            leftover_processes: None,
            error: None,
            wake: WakeMode::OnTerminal,
            occurrence_key: None,
            owner_gid: session.owner_gid,
            run_uid: None,
            run_gid: None,
            bridge_session_id: None,
            output_deleted: false,
            violations: None,
            grants: None,
        }
    }

    pub(crate) fn output_path(&self) -> String {
        crate::run::dir::public_file(&self.public_dir, crate::run::dir::OUTPUT)
    }

    pub(crate) fn result_path(&self) -> String {
        crate::run::dir::public_file(&self.public_dir, crate::run::dir::RESULT)
    }

    pub(crate) fn to_wire(&self) -> Task {
        Task {
            task_id: self.task_id.clone(),
            session_id: self.session_id.clone(),
            tool: self.tool.clone(),
            kind: self.kind,
            state: self.state,
            reason: self.reason,
            exit_code: self.exit_code,
            signal: self.signal,
            summary: self.summary.clone(),
            created_at: self.created_at.clone(),
            started_at: self.started_at.clone(),
            ended_at: self.ended_at.clone(),
            output_path: self.output_path(),
            result_path: self.result_path(),
            delivery: self.delivery,
            service: self.service,
            parent_task_id: self.parent_task_id.clone(),
            duration_ms: self.duration_ms,
            output_bytes: self.output_bytes,
            output_truncated: self.output_truncated,
            leftover_processes: self.leftover_processes,
            error: self.error.clone(),
            profile: self.profile.clone(),
            violations: self.violations.clone(),
            grants: self.grants.clone(),
        }
    }
}

/// A task row as read, before its enum columns are checked.
pub(crate) struct RawTask {
    row: TaskRow,
    kind: String,
    state: String,
    reason: Option<String>,
    delivery: Option<String>,
    stdin: String,
    mode: String,
    wake: String,
    grants: Option<String>,
}

/// A small serde enum from its JSON string.
fn serde_enum<T: serde::de::DeserializeOwned>(s: &str) -> Option<T> {
    serde_json::from_value(Value::String(s.into())).ok()
}

/// A small serde enum as its JSON string.
fn enum_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Everything recorded when a task reaches a terminal state.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settlement {
    pub state: TaskState,
    pub reason: Option<FailReason>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub ended_at: String,
    pub started_at: Option<String>,
    pub duration_ms: Option<u64>,
    pub output_bytes: Option<u64>,
    pub output_truncated: Option<bool>,
    pub leftover_processes: Option<u32>,
    pub error: Option<String>,
    pub delivery: Delivery,
    /// What the run ran into, in one line.
    pub violations: Option<String>,
}

impl Settlement {
    /// What a run's `result.json` says, to be recorded (delivery still to be decided).
    pub(crate) fn from_result(r: &crate::run::result::RunResult) -> Settlement {
        crate::metrics::violations_seen(r.violations.len());
        Settlement {
            state: r.state,
            reason: r.reason,
            exit_code: r.exit_code,
            signal: r.signal,
            ended_at: r.ended_at.clone(),
            started_at: Some(r.started_at.clone()),
            duration_ms: Some(r.duration_ms),
            output_bytes: Some(r.output_bytes),
            output_truncated: Some(r.output_truncated),
            leftover_processes: Some(r.leftover_processes),
            error: r.error.clone(),
            delivery: Delivery::Pending,
            violations: crate::run::result::summary(&r.violations),
        }
    }

    pub(crate) fn to_patch(&self) -> Map<String, Value> {
        let mut patch = obj([
            ("state", self.state.as_str().into()),
            ("reason", self.reason.map(|r| r.as_str()).into()),
            ("exit_code", self.exit_code.into()),
            ("signal", self.signal.into()),
            ("ended_at", self.ended_at.clone().into()),
            ("duration_ms", self.duration_ms.into()),
            ("output_bytes", self.output_bytes.into()),
            ("output_truncated", self.output_truncated.into()),
            ("leftover_processes", self.leftover_processes.into()),
            ("error", self.error.clone().into()),
            ("delivery", self.delivery.as_str().into()),
        ]);
        if let Some(v) = &self.violations {
            patch.insert("violations".into(), v.clone().into());
        }
        if let Some(started) = &self.started_at {
            patch.insert("started_at".into(), started.clone().into());
        }
        patch
    }
}
