//! Durable schedules (docs/protocol.md): a monitor task per schedule, leased claims in SQLite, and
//! exactly-once occurrences.
//!
//! The loop claims due schedules (only prompt schedules whose session has a live route; call
//! schedules always), delivers each occurrence under an idempotency key
//! (`<schedule_id>:<n>`), and advances the schedule only after delivery. A claim of a daemon
//! that died expires with its lease and is taken over. Occurrences that fell due while the
//! daemon was down follow the schedule's `catch_up`.

pub(crate) mod cron;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tracing::{info, warn};

use crate::executor::{CallRequest, ExecError, Executor};
use crate::ids;
use crate::protocol::{
    CancelOutcome, ScheduleAction, ScheduleCreateParams, ScheduleCreateResult, ScheduleInfo,
    StderrMode, StdinMode, TaskKind,
};
use crate::registry::{NotificationRow, Registry, RegistryError, ScheduleRow, SessionRow, TaskRow};
use crate::wake::Hub;

/// A prompt occurrence waiting to be recorded: schedule, key, next due time, its notification.
type PromptOccurrence = (ScheduleRow, String, Option<i64>, Option<NotificationRow>);

/// Schedules claimed per transaction.
const CLAIM_BATCH: usize = 500;

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// When a schedule fires, normalised and stored as JSON.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Trigger {
    Once { due_ms: i64 },
    Every { every_ms: u64, anchor_ms: i64 },
    Cron { expr: String, timezone: String },
}

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error(transparent)]
    Exec(#[from] ExecError),
}

impl Trigger {
    pub(crate) fn from_params(
        p: &ScheduleCreateParams,
        now: i64,
    ) -> Result<Trigger, ScheduleError> {
        let given = [
            p.delay_ms.is_some(),
            p.at.is_some(),
            p.every_ms.is_some(),
            p.cron.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            return Err(ScheduleError::Invalid(
                "give exactly one of delay_ms, at, every_ms or cron".into(),
            ));
        }
        if p.timezone.is_some() && p.cron.is_none() {
            return Err(ScheduleError::Invalid(
                "timezone only applies to cron".into(),
            ));
        }
        if let Some(d) = p.delay_ms {
            return Ok(Trigger::Once {
                due_ms: now + d as i64,
            });
        }
        if let Some(at) = &p.at {
            let t = ids::parse_rfc3339(at).ok_or_else(|| {
                ScheduleError::Invalid(format!("at {at:?} is not an RFC 3339 time"))
            })?;
            let due_ms = t
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_millis() as i64)
                .unwrap_or(0);
            return Ok(Trigger::Once { due_ms });
        }
        if let Some(every) = p.every_ms {
            if every < 10 {
                return Err(ScheduleError::Invalid(
                    "every_ms must be at least 10".into(),
                ));
            }
            return Ok(Trigger::Every {
                every_ms: every,
                anchor_ms: now,
            });
        }
        let expr = p.cron.clone().unwrap_or_default();
        let timezone = p.timezone.clone().unwrap_or_else(|| "UTC".into());
        cron::Cron::parse(&expr)
            .map_err(|e| ScheduleError::Invalid(format!("cron {expr:?}: {e}")))?;
        jiff::tz::TimeZone::get(&timezone)
            .map_err(|e| ScheduleError::Invalid(format!("timezone {timezone:?}: {e}")))?;
        Ok(Trigger::Cron { expr, timezone })
    }

    /// The first due time of an occurrence strictly after `after_ms` (for one-shots: their
    /// due time if it is later, else none).
    pub(crate) fn next_after(&self, after_ms: i64) -> Option<i64> {
        match self {
            Trigger::Once { due_ms } => (*due_ms > after_ms).then_some(*due_ms),
            Trigger::Every {
                every_ms,
                anchor_ms,
            } => {
                let every = *every_ms as i64;
                let k = if after_ms < *anchor_ms {
                    0
                } else {
                    (after_ms - anchor_ms) / every + 1
                };
                Some(anchor_ms + k * every)
            }
            Trigger::Cron { expr, timezone } => {
                let c = cron::Cron::parse(expr).ok()?;
                let tz = jiff::tz::TimeZone::get(timezone).ok()?;
                c.next_after(after_ms, &tz)
            }
        }
    }

    fn first_due(&self, now: i64) -> Option<i64> {
        match self {
            Trigger::Once { due_ms } => Some(*due_ms),
            Trigger::Every { .. } | Trigger::Cron { .. } => self.next_after(now),
        }
    }

    fn describe(&self) -> String {
        match self {
            Trigger::Once { due_ms } => format!("once at {}", ms_rfc3339(*due_ms)),
            Trigger::Every { every_ms, .. } => format!("every {} ms", every_ms),
            Trigger::Cron { expr, timezone } => format!("cron {expr} ({timezone})"),
        }
    }
}

pub(crate) fn ms_rfc3339(ms: i64) -> String {
    ids::rfc3339(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64))
}

pub(crate) struct Scheduler {
    registry: Arc<Registry>,
    executor: Arc<Executor>,
    hub: Arc<Hub>,
    /// Who holds claims made by this daemon (one id per start).
    instance: String,
    lease_ms: i64,
    /// Occurrences due before this instant fell due while the daemon was down.
    started_ms: i64,
    wake: Notify,
}

impl Scheduler {
    pub(crate) fn new(
        registry: Arc<Registry>,
        executor: Arc<Executor>,
        hub: Arc<Hub>,
        lease_ms: u64,
    ) -> Arc<Scheduler> {
        Arc::new(Scheduler {
            registry,
            executor,
            hub,
            instance: format!("daemon-{}-{}", std::process::id(), ids::ulid()),
            lease_ms: lease_ms as i64,
            started_ms: now_ms(),
            wake: Notify::new(),
        })
    }

    /// `schedule.create`: arms a monitor task and its schedule.
    pub(crate) fn create(
        &self,
        session: &SessionRow,
        p: ScheduleCreateParams,
    ) -> Result<ScheduleCreateResult, ScheduleError> {
        let now = now_ms();
        let trigger = Trigger::from_params(&p, now)?;
        if p.max_occurrences == Some(0) {
            return Err(ScheduleError::Invalid(
                "max_occurrences must be at least 1".into(),
            ));
        }
        let (action_kind, what) = match &p.action {
            ScheduleAction::Prompt(text) => {
                if text.trim().is_empty() {
                    return Err(ScheduleError::Invalid("action.prompt is empty".into()));
                }
                ("prompt", format!("prompt: {}", first_line(text)))
            }
            ScheduleAction::Call(call) => {
                if self.executor.tools().get(&call.tool).is_none() {
                    return Err(ScheduleError::Invalid(format!(
                        "unknown tool {:?}; tool.list names the tools there are",
                        call.tool
                    )));
                }
                (
                    "call",
                    format!(
                        "{}: {}",
                        call.tool,
                        call.args
                            .get("command")
                            .and_then(|c| c.as_str())
                            .map(first_line)
                            .unwrap_or_default()
                    ),
                )
            }
        };
        let task_id = ids::ulid();
        let schedule_id = ids::ulid();
        let next_due = trigger.first_due(now);
        let monitor = TaskRow::new(
            task_id.clone(),
            session,
            "schedule".into(),
            TaskKind::Monitor,
            format!("{}: {what}", trigger.describe()),
            serde_json::to_string(&p.action).unwrap_or_default(),
        );
        let row = ScheduleRow {
            schedule_id: schedule_id.clone(),
            session_id: session.session_id.clone(),
            owner_uid: session.owner_uid,
            owner_gid: session.owner_gid,
            task_id: task_id.clone(),
            trigger: serde_json::to_string(&trigger).unwrap_or_default(),
            action: serde_json::to_string(&p.action).unwrap_or_default(),
            action_kind: action_kind.into(),
            max_occurrences: p.max_occurrences,
            catch_up: p.catch_up.unwrap_or_default().as_str().into(),
            occurrences: 0,
            next_due_ms: next_due,
            enabled: true,
            claimed_by: None,
            lease_until_ms: None,
            last_key: None,
            created_at: ids::now_rfc3339(),
        };
        self.registry.create_schedule(&monitor, &row)?;
        self.wake.notify_one();
        Ok(ScheduleCreateResult {
            schedule_id,
            task_id,
            next_due_at: next_due.map(ms_rfc3339),
        })
    }

    /// Disables a schedule (its monitor settles `canceled`) and cancels its runs still going.
    pub(crate) async fn disarm(&self, schedule_id: &str) -> Result<CancelOutcome, ScheduleError> {
        let Some(s) = self.registry.get_schedule(schedule_id)? else {
            return Err(ScheduleError::Invalid(format!(
                "schedule {schedule_id} not found"
            )));
        };
        self.registry.disable_schedule(schedule_id)?;
        self.wake.notify_one();
        // Stop the runs it started; report whether they are gone within a moment, without
        // waiting out a slow one's grace.
        let children = self.registry.live_children(&s.task_id)?;
        for child in &children {
            self.executor
                .request_cancel(child, Some(format!("schedule {schedule_id} was canceled")));
        }
        let mut pending = false;
        for child in &children {
            pending |= !self
                .executor
                .settled_within(child, Duration::from_millis(500))
                .await;
        }
        Ok(if pending {
            CancelOutcome::CancellationPending
        } else {
            CancelOutcome::Disarmed
        })
    }

    pub(crate) fn info(row: &ScheduleRow) -> ScheduleInfo {
        ScheduleInfo {
            schedule_id: row.schedule_id.clone(),
            session_id: row.session_id.clone(),
            task_id: row.task_id.clone(),
            trigger: serde_json::from_str(&row.trigger).unwrap_or_default(),
            action: serde_json::from_str(&row.action)
                .unwrap_or(ScheduleAction::Prompt(String::new())),
            max_occurrences: row.max_occurrences,
            catch_up: serde_json::from_value(serde_json::Value::String(row.catch_up.clone()))
                .unwrap_or_default(),
            occurrences: row.occurrences,
            next_due_at: row.next_due_ms.map(ms_rfc3339),
            enabled: row.enabled,
            created_at: row.created_at.clone(),
        }
    }

    /// The schedule loop, for the daemon's life.
    pub(crate) async fn run(self: Arc<Self>) {
        loop {
            let routable = self.hub.routable().await;
            let claimed = match self.registry.claim_due(
                now_ms(),
                &self.instance,
                self.lease_ms,
                CLAIM_BATCH,
                &routable,
            ) {
                Ok(c) => c,
                Err(e) => {
                    warn!("cannot claim due schedules: {e}");
                    Vec::new()
                }
            };
            let full = claimed.len() == CLAIM_BATCH;
            let mut renewed_at = now_ms();
            let mut prompts = Vec::new();
            for s in claimed {
                // Keep the rest of the batch ours while this one is delivered.
                if now_ms() - renewed_at > self.lease_ms / 2 {
                    renewed_at = now_ms();
                    if let Err(e) = self
                        .registry
                        .renew_claims(&self.instance, renewed_at + self.lease_ms)
                    {
                        warn!("cannot renew schedule leases: {e}");
                    }
                }
                if let Err(e) = self.fire(&s, &mut prompts).await {
                    warn!(schedule_id = %s.schedule_id, "occurrence failed, retried after the lease: {e}");
                }
            }
            if let Err(e) = self.registry.record_occurrences(&prompts) {
                warn!(
                    "cannot record {} scheduled prompts, retried after the lease: {e}",
                    prompts.len()
                );
            }
            if full {
                continue;
            }
            let sleep_ms = match self.registry.next_due_ms(&routable) {
                Ok(Some(due)) => (due - now_ms()).clamp(0, 3_600_000),
                Ok(None) => 3_600_000,
                Err(e) => {
                    warn!("cannot read schedules: {e}");
                    1_000
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(sleep_ms as u64)) => {}
                _ = self.wake.notified() => {}
                _ = self.hub.routes_changed.notified() => {}
            }
        }
    }

    /// Delivers one claimed occurrence (or skips missed ones) and advances the schedule.
    /// Prompt occurrences are appended to `prompts`, for the caller to record in one
    /// transaction per batch; everything else is recorded here.
    async fn fire(
        &self,
        s: &ScheduleRow,
        prompts: &mut Vec<PromptOccurrence>,
    ) -> Result<(), ScheduleError> {
        let trigger: Trigger = serde_json::from_str(&s.trigger)
            .map_err(|e| ScheduleError::Invalid(format!("stored trigger: {e}")))?;
        let Some(due) = s.next_due_ms else {
            return Ok(());
        };
        let now = now_ms();
        let missed = due < self.started_ms;
        let next = match (missed, s.catch_up.as_str()) {
            (true, "skip") => {
                self.registry.skip_to(s, trigger.next_after(now))?;
                return Ok(());
            }
            (true, "once") => trigger.next_after(now),
            _ => trigger.next_after(due),
        };
        let n = s.occurrences + 1;
        let key = format!("{}:{n}", s.schedule_id);
        let action: ScheduleAction = serde_json::from_str(&s.action)
            .map_err(|e| ScheduleError::Invalid(format!("stored action: {e}")))?;
        match action {
            ScheduleAction::Prompt(text) => {
                let note = NotificationRow {
                    id: ids::ulid(),
                    session_id: s.session_id.clone(),
                    owner_uid: s.owner_uid,
                    task_id: Some(s.task_id.clone()),
                    severity: "info".into(),
                    kind: "schedule".into(),
                    text: crate::wake::text::scheduled_prompt(&s.schedule_id, n, &text),
                    created_at: ids::now_rfc3339(),
                    acked: false,
                    acked_at: None,
                    occurrence_key: Some(key.clone()),
                };
                prompts.push((s.clone(), key, next, Some(note)));
            }
            ScheduleAction::Call(call) => {
                if !self.registry.occurrence_started(&key)? {
                    let session = self
                        .registry
                        .get_session(&s.session_id)?
                        .ok_or_else(|| ScheduleError::Invalid("session is gone".into()))?;
                    if !session.is_open() {
                        info!(schedule_id = %s.schedule_id, "session closed: disarming");
                        self.registry.disable_schedule(&s.schedule_id)?;
                        return Ok(());
                    }
                    let req = CallRequest {
                        owner: crate::session::owner_creds(&session, None),
                        session,
                        tool: call.tool,
                        args: call.args,
                        yield_after_ms: Some(0),
                        background: true,
                        timeout_ms: call.timeout_ms,
                        stdin: StdinMode::Null,
                        service: false,
                        profile: call.profile,
                        ceiling: None,
                        wake: call.wake.unwrap_or_default(),
                        parent_task_id: Some(s.task_id.clone()),
                        occurrence_key: Some(key.clone()),
                        on_disconnect: Default::default(),
                        stderr: StderrMode::Merged,
                        // A stored call grants nothing: its paths would be checked long
                        // after the caller named them.
                        grants: None,
                    };
                    self.executor.submit(req, false)?;
                }
                self.registry.record_occurrence(s, &key, next, None)?;
            }
        }
        Ok(())
    }
}

fn first_line(s: &str) -> String {
    let line = s.lines().next().unwrap_or("").trim();
    if line.chars().count() > 80 {
        format!("{}…", line.chars().take(79).collect::<String>())
    } else {
        line.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counts_from_its_anchor() {
        let t = Trigger::Every {
            every_ms: 100,
            anchor_ms: 1_000,
        };
        assert_eq!(t.next_after(999), Some(1_000));
        assert_eq!(t.next_after(1_000), Some(1_100));
        assert_eq!(t.next_after(1_250), Some(1_300));
    }

    #[test]
    fn once_has_no_second_occurrence() {
        let t = Trigger::Once { due_ms: 500 };
        assert_eq!(t.first_due(0), Some(500));
        assert_eq!(t.next_after(500), None);
    }
}
