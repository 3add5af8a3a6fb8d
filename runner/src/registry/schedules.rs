//! Durable schedules: leased claims and exactly-once occurrences (docs/protocol.md).

use rusqlite::{OptionalExtension, Row, Transaction};
use serde_json::{Map, Value};

use super::{obj, Entity, Event, NotificationRow, Op, Registry, Result, Settlement, TaskRow};

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScheduleRow {
    pub schedule_id: String,
    pub session_id: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    /// The monitor task that owns the schedule.
    pub task_id: String,
    /// JSON: `{"delay_ms"|"at"|"every_ms"|"cron", ...}` as normalised by `schedule::Trigger`.
    pub trigger: String,
    /// JSON: `{"prompt": text}` or `{"call": {...}}`.
    pub action: String,
    /// `prompt` or `call`: a prompt needs a live route to be delivered.
    pub action_kind: String,
    pub max_occurrences: Option<u32>,
    /// `once | all | skip`: what happens to occurrences missed while the daemon was down.
    pub catch_up: String,
    pub occurrences: u32,
    pub next_due_ms: Option<i64>,
    pub enabled: bool,
    pub claimed_by: Option<String>,
    pub lease_until_ms: Option<i64>,
    pub last_key: Option<String>,
    pub created_at: String,
}

impl ScheduleRow {
    fn from_row(r: &Row) -> rusqlite::Result<ScheduleRow> {
        Ok(ScheduleRow {
            schedule_id: r.get("schedule_id")?,
            session_id: r.get("session_id")?,
            owner_uid: r.get("owner_uid")?,
            owner_gid: r.get("owner_gid")?,
            task_id: r.get("task_id")?,
            trigger: r.get("trigger")?,
            action: r.get("action")?,
            action_kind: r.get("action_kind")?,
            max_occurrences: r.get("max_occurrences")?,
            catch_up: r.get("catch_up")?,
            occurrences: r.get("occurrences")?,
            next_due_ms: r.get("next_due_ms")?,
            enabled: r.get("enabled")?,
            claimed_by: r.get("claimed_by")?,
            lease_until_ms: r.get("lease_until_ms")?,
            last_key: r.get("last_key")?,
            created_at: r.get("created_at")?,
        })
    }

    fn to_patch(&self) -> Map<String, Value> {
        obj([
            ("schedule_id", self.schedule_id.clone().into()),
            ("session_id", self.session_id.clone().into()),
            ("owner_uid", self.owner_uid.into()),
            ("owner_gid", self.owner_gid.into()),
            ("task_id", self.task_id.clone().into()),
            ("trigger", self.trigger.clone().into()),
            ("action", self.action.clone().into()),
            ("action_kind", self.action_kind.clone().into()),
            ("max_occurrences", self.max_occurrences.into()),
            ("catch_up", self.catch_up.clone().into()),
            ("occurrences", self.occurrences.into()),
            ("next_due_ms", self.next_due_ms.into()),
            ("enabled", self.enabled.into()),
            ("claimed_by", self.claimed_by.clone().into()),
            ("lease_until_ms", self.lease_until_ms.into()),
            ("last_key", self.last_key.clone().into()),
            ("created_at", self.created_at.clone().into()),
        ])
    }
}

/// Which sessions can take a prompt now (they have a live route).
#[derive(Debug, Clone, Default)]
pub(crate) struct Routable {
    pub sessions: Vec<String>,
    pub owners: Vec<u32>,
    pub everyone: bool,
}

impl Routable {
    /// A SQL condition (and its parameters) selecting schedules that may fire now.
    fn condition(&self) -> (String, Vec<Value>) {
        if self.everyone {
            return ("1".into(), Vec::new());
        }
        let mut cond = String::from("(action_kind = 'call'");
        let mut params = Vec::new();
        if !self.sessions.is_empty() {
            cond.push_str(&format!(
                " OR session_id IN ({})",
                vec!["?"; self.sessions.len()].join(",")
            ));
            params.extend(self.sessions.iter().map(|s| Value::from(s.clone())));
        }
        if !self.owners.is_empty() {
            cond.push_str(&format!(
                " OR owner_uid IN ({})",
                vec!["?"; self.owners.len()].join(",")
            ));
            params.extend(self.owners.iter().map(|u| Value::from(*u)));
        }
        cond.push(')');
        (cond, params)
    }
}

fn to_sql(values: &[Value]) -> Vec<rusqlite::types::Value> {
    values.iter().map(super::json_to_sql).collect()
}

impl Registry {
    /// Creates the monitor task and its schedule in one transaction.
    pub(crate) fn create_schedule(&self, monitor: &TaskRow, s: &ScheduleRow) -> Result<()> {
        self.write(|tx| {
            Registry::apply(
                tx,
                Event::TaskSubmitted,
                Entity::Task,
                &monitor.task_id,
                &monitor.session_id,
                Op::Insert,
                &monitor.to_patch(),
            )?;
            Registry::apply(
                tx,
                Event::ScheduleCreated,
                Entity::Schedule,
                &s.schedule_id,
                &s.session_id,
                Op::Insert,
                &s.to_patch(),
            )?;
            Ok(())
        })
    }

    pub(crate) fn get_schedule(&self, schedule_id: &str) -> Result<Option<ScheduleRow>> {
        self.schedule_where("schedule_id", schedule_id)
    }

    /// The schedule a monitor task owns.
    pub(crate) fn schedule_of_task(&self, task_id: &str) -> Result<Option<ScheduleRow>> {
        self.schedule_where("task_id", task_id)
    }

    fn schedule_where(&self, column: &'static str, value: &str) -> Result<Option<ScheduleRow>> {
        self.read(|c| {
            let mut stmt =
                c.prepare_cached(&format!("SELECT * FROM schedules WHERE {column} = ?1"))?;
            Ok(stmt.query_row([value], ScheduleRow::from_row).optional()?)
        })
    }

    pub(crate) fn list_schedules(&self, session_id: &str) -> Result<Vec<ScheduleRow>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT * FROM schedules WHERE session_id = ?1 ORDER BY created_at",
            )?;
            let rows = stmt.query_map([session_id], ScheduleRow::from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Atomically leases up to `limit` due schedules to `claimer` until `now + lease_ms`.
    pub(crate) fn claim_due(
        &self,
        now_ms: i64,
        claimer: &str,
        lease_ms: i64,
        limit: usize,
        routable: &Routable,
    ) -> Result<Vec<ScheduleRow>> {
        let (cond, extra) = routable.condition();
        self.write(|tx| {
            let sql = format!(
                "SELECT * FROM schedules WHERE enabled = 1 AND next_due_ms <= ?1
                 AND (claimed_by IS NULL OR lease_until_ms < ?1) AND {cond}
                 ORDER BY next_due_ms LIMIT {limit}"
            );
            let mut bound = vec![rusqlite::types::Value::Integer(now_ms)];
            bound.extend(to_sql(&extra));
            let mut stmt = tx.prepare(&sql)?;
            let rows: Vec<ScheduleRow> = stmt
                .query_map(rusqlite::params_from_iter(bound), ScheduleRow::from_row)?
                .collect::<rusqlite::Result<_>>()?;
            drop(stmt);
            let mut out = Vec::with_capacity(rows.len());
            for mut s in rows {
                s.claimed_by = Some(claimer.to_owned());
                s.lease_until_ms = Some(now_ms + lease_ms);
                let patch = obj([
                    ("claimed_by", claimer.into()),
                    ("lease_until_ms", (now_ms + lease_ms).into()),
                ]);
                Registry::apply(
                    tx,
                    Event::ScheduleClaimed,
                    Entity::Schedule,
                    &s.schedule_id,
                    &s.session_id,
                    Op::Update,
                    &patch,
                )?;
                out.push(s);
            }
            Ok(out)
        })
    }

    /// Extends the leases `claimer` still holds (while a long batch is being delivered).
    pub(crate) fn renew_claims(&self, claimer: &str, lease_until_ms: i64) -> Result<usize> {
        self.write(|tx| {
            let ids: Vec<(String, String)> = tx
                .prepare_cached(
                    "SELECT schedule_id, session_id FROM schedules WHERE claimed_by = ?1",
                )?
                .query_map([claimer], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<_>>()?;
            for (id, session) in &ids {
                let patch = obj([("lease_until_ms", lease_until_ms.into())]);
                Registry::apply(
                    tx,
                    Event::ScheduleRenewed,
                    Entity::Schedule,
                    id,
                    session,
                    Op::Update,
                    &patch,
                )?;
            }
            Ok(ids.len())
        })
    }

    /// When the next schedule that may fire now is due (lease expiry included), if any.
    pub(crate) fn next_due_ms(&self, routable: &Routable) -> Result<Option<i64>> {
        let (cond, extra) = routable.condition();
        self.read(|c| {
            let sql = format!(
                "SELECT MIN(CASE WHEN claimed_by IS NOT NULL AND lease_until_ms > next_due_ms THEN lease_until_ms ELSE next_due_ms END)
                 FROM schedules WHERE enabled = 1 AND next_due_ms IS NOT NULL AND {cond}"
            );
            Ok(c.query_row(&sql, rusqlite::params_from_iter(to_sql(&extra)), |r| r.get(0))?)
        })
    }

    /// Records one delivered occurrence — with its notification for a prompt, in the same
    /// transaction — and advances the schedule to `next_due_ms` (or disables it and settles
    /// its monitor when there is none). An occurrence key seen before is not delivered twice.
    pub(crate) fn record_occurrence(
        &self,
        s: &ScheduleRow,
        key: &str,
        next_due_ms: Option<i64>,
        prompt: Option<&NotificationRow>,
    ) -> Result<bool> {
        self.write(|tx| record_occurrence_in(tx, s, key, next_due_ms, prompt))
    }

    /// [`Registry::record_occurrence`] for many occurrences in one transaction.
    pub(crate) fn record_occurrences(
        &self,
        batch: &[(ScheduleRow, String, Option<i64>, Option<NotificationRow>)],
    ) -> Result<usize> {
        self.write(|tx| {
            let mut n = 0;
            for (s, key, next, prompt) in batch {
                n += record_occurrence_in(tx, s, key, *next, prompt.as_ref())? as usize;
            }
            Ok(n)
        })
    }

    /// Moves a claimed schedule to `next_due_ms` without delivering anything (missed
    /// occurrences under `catch_up = "skip"`), releasing the claim.
    pub(crate) fn skip_to(&self, s: &ScheduleRow, next_due_ms: Option<i64>) -> Result<()> {
        self.write(|tx| {
            let patch = obj([
                ("next_due_ms", next_due_ms.into()),
                ("enabled", next_due_ms.is_some().into()),
                ("claimed_by", Value::Null),
                ("lease_until_ms", Value::Null),
            ]);
            Registry::apply(
                tx,
                Event::ScheduleSkipped,
                Entity::Schedule,
                &s.schedule_id,
                &s.session_id,
                Op::Update,
                &patch,
            )?;
            if next_due_ms.is_none() {
                settle_monitor(
                    tx,
                    s,
                    crate::protocol::TaskState::Succeeded,
                    crate::protocol::Delivery::Wake,
                )?;
            }
            Ok(())
        })
    }

    /// Disables a schedule and settles its monitor as canceled. False if it was not enabled.
    pub(crate) fn disable_schedule(&self, schedule_id: &str) -> Result<bool> {
        self.write(|tx| {
            let s: Option<ScheduleRow> = tx
                .prepare_cached("SELECT * FROM schedules WHERE schedule_id = ?1")?
                .query_row([schedule_id], ScheduleRow::from_row)
                .optional()?;
            let Some(s) = s else { return Ok(false) };
            let monitor_live: bool = tx
                .query_row(
                    "SELECT state = 'scheduled' FROM tasks WHERE task_id = ?1",
                    [&s.task_id],
                    |r| r.get(0),
                )
                .unwrap_or(false);
            if s.enabled {
                let patch = obj([
                    ("enabled", false.into()),
                    ("next_due_ms", Value::Null),
                    ("claimed_by", Value::Null),
                    ("lease_until_ms", Value::Null),
                ]);
                Registry::apply(
                    tx,
                    Event::ScheduleDisabled,
                    Entity::Schedule,
                    &s.schedule_id,
                    &s.session_id,
                    Op::Update,
                    &patch,
                )?;
            }
            if monitor_live {
                settle_monitor(
                    tx,
                    &s,
                    crate::protocol::TaskState::Canceled,
                    crate::protocol::Delivery::Inline,
                )?;
            }
            Ok(s.enabled || monitor_live)
        })
    }

    /// Ids of live tasks started by a monitor.
    pub(crate) fn live_children(&self, parent_task_id: &str) -> Result<Vec<String>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached("SELECT task_id FROM tasks WHERE parent_task_id = ?1 AND state NOT IN ('succeeded','failed','canceled')")?;
            let rows = stmt.query_map([parent_task_id], |r| r.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Is a run with this occurrence key already recorded?
    pub(crate) fn occurrence_started(&self, key: &str) -> Result<bool> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT COUNT(*) FROM tasks WHERE occurrence_key = ?1",
                [key],
                |r| r.get::<_, i64>(0),
            )? > 0)
        })
    }
}

fn settle_monitor(
    tx: &Transaction,
    s: &ScheduleRow,
    state: crate::protocol::TaskState,
    delivery: crate::protocol::Delivery,
) -> Result<()> {
    let settlement = Settlement {
        state,
        reason: None,
        exit_code: None,
        signal: None,
        ended_at: crate::ids::now_rfc3339(),
        started_at: None,
        duration_ms: None,
        output_bytes: None,
        output_truncated: None,
        leftover_processes: None,
        error: None,
        delivery,
        violations: None,
    };
    Registry::apply(
        tx,
        Event::TaskSettled,
        Entity::Task,
        &s.task_id,
        &s.session_id,
        Op::Update,
        &settlement.to_patch(),
    )?;
    Ok(())
}

fn record_occurrence_in(
    tx: &Transaction,
    s: &ScheduleRow,
    key: &str,
    next_due_ms: Option<i64>,
    prompt: Option<&NotificationRow>,
) -> Result<bool> {
    let current: Option<(Option<String>, bool)> = tx
        .query_row(
            "SELECT last_key, enabled FROM schedules WHERE schedule_id = ?1",
            [&s.schedule_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((last_key, enabled)) = current else {
        return Ok(false);
    };
    if !enabled || last_key.as_deref() == Some(key) {
        return Ok(false);
    }
    if let Some(n) = prompt {
        let seen: bool = tx
            .query_row(
                "SELECT COUNT(*) FROM notifications WHERE occurrence_key = ?1",
                [key],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)?;
        if !seen {
            n.insert(tx)?;
        }
    }
    let occurrences = s.occurrences + 1;
    let done = next_due_ms.is_none() || s.max_occurrences.is_some_and(|m| occurrences >= m);
    let patch = obj([
        ("occurrences", occurrences.into()),
        (
            "next_due_ms",
            if done {
                Value::Null
            } else {
                next_due_ms.into()
            },
        ),
        ("enabled", (!done).into()),
        ("claimed_by", Value::Null),
        ("lease_until_ms", Value::Null),
        ("last_key", key.into()),
    ]);
    Registry::apply(
        tx,
        Event::ScheduleFired,
        Entity::Schedule,
        &s.schedule_id,
        &s.session_id,
        Op::Update,
        &patch,
    )?;
    if done {
        settle_monitor(
            tx,
            s,
            crate::protocol::TaskState::Succeeded,
            crate::protocol::Delivery::Wake,
        )?;
    }
    Ok(true)
}
