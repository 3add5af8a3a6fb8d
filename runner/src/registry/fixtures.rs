//! Rows for the unit tests of the registry and of the modules above it.

use super::{SessionRow, Settlement, TaskRow};
use crate::protocol::{Delivery, FailReason, SessionState, TaskKind, TaskState};

/// An open session `id` of `uid` (its group the same number), below `parent` if given.
pub(crate) fn session(id: &str, uid: u32, parent: Option<&str>) -> SessionRow {
    SessionRow {
        session_id: id.into(),
        owner_uid: uid,
        owner_gid: uid,
        workspace: "/w".into(),
        session_dir: format!("/sessions/{id}"),
        profile: "workspace-write".into(),
        proactive_wake: true,
        parent_session_id: parent.map(str::to_owned),
        state: SessionState::Open,
        created_at: crate::ids::now_rfc3339(),
        closed_at: None,
    }
}

/// A bash call `id` of session `s`, queued.
pub(crate) fn call(id: &str, s: &SessionRow) -> TaskRow {
    TaskRow::new(
        id.into(),
        s,
        "bash".into(),
        TaskKind::Call,
        "true".into(),
        r#"{"command":"true"}"#.into(),
    )
}

/// A run that ended in `state` with `exit_code`, its result not yet delivered.
pub(crate) fn ended(state: TaskState, exit_code: i32) -> Settlement {
    Settlement {
        state,
        reason: (state == TaskState::Failed).then_some(FailReason::ExitCode),
        exit_code: Some(exit_code),
        signal: None,
        ended_at: crate::ids::now_rfc3339(),
        started_at: None,
        duration_ms: Some(5),
        output_bytes: Some(3),
        output_truncated: Some(false),
        leftover_processes: Some(0),
        error: None,
        delivery: Delivery::Pending,
        violations: None,
    }
}
