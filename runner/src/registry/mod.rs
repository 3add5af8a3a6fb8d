//! The task registry: the only code that touches SQLite (ARCHITECTURE.md).
//!
//! Invariant: every row change is made by [`Registry::apply`], which writes the row and
//! appends its event (the same column patch) in one transaction. The event log is therefore
//! authoritative, and [`replay`] rebuilds identical rows from it.

mod checkpoint;
#[cfg(test)]
pub(crate) mod fixtures;
mod inbox;
mod input;
mod replay;
mod rows;
mod schedules;
mod schema;
#[cfg(test)]
mod tests;

pub(crate) mod health;

pub(crate) use inbox::{EventRef, NotificationRow};
pub(crate) use replay::replay_check;
pub(crate) use rows::{SessionRow, Settlement, TaskRow};
pub(crate) use schedules::{Routable, ScheduleRow};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use rusqlite::{params, Connection, OptionalExtension, Transaction};
use serde_json::{Map, Value};

use crate::names::named;
use crate::protocol::{Delivery, SessionState, TaskState};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("cannot create state directory {path}: {source}")]
    StateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open registry {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("registry migration {version} failed: {source}")]
    Migrate {
        version: usize,
        source: rusqlite::Error,
    },
    #[error("registry is at schema version {found}, newer than this sidejob knows ({known})")]
    TooNew { found: usize, known: usize },
    #[error("registry query failed: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("registry holds a malformed row: {0}")]
    Corrupt(String),
    /// The online backup could not be written (a full disk, say).
    #[error("cannot write {path}: {why}")]
    Backup { path: PathBuf, why: String },
    /// The file is there but must not be used as it is (damaged, or emptied).
    #[error("the registry {path} cannot be used: {why}")]
    Unusable { path: PathBuf, why: String },
}

pub(crate) type Result<T> = std::result::Result<T, RegistryError>;

named! {
    /// Which table an event changes (its `entity` column).
    pub(crate) enum Entity {
        Session = "session",
        Task = "task",
        Notification = "notification",
        Schedule = "schedule",
    }
}

impl Entity {
    fn table(self) -> &'static str {
        match self {
            Entity::Session => "sessions",
            Entity::Task => "tasks",
            Entity::Notification => "notifications",
            Entity::Schedule => "schedules",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Entity::Session => "session_id",
            Entity::Task => "task_id",
            Entity::Notification => "id",
            Entity::Schedule => "schedule_id",
        }
    }
}

named! {
    /// What an event in the log records (its `kind` column): one variant per change the
    /// registry makes, named once here.
    pub(crate) enum Event {
        NotificationAcked = "notification.acked",
        NotificationCreated = "notification.created",
        ScheduleClaimed = "schedule.claimed",
        ScheduleCreated = "schedule.created",
        ScheduleDisabled = "schedule.disabled",
        ScheduleFired = "schedule.fired",
        ScheduleRenewed = "schedule.renewed",
        ScheduleSkipped = "schedule.skipped",
        SessionClosed = "session.closed",
        SessionDeleted = "session.deleted",
        SessionOpened = "session.opened",
        SessionReopened = "session.reopened",
        TaskDelivered = "task.delivered",
        TaskHandedOver = "task.handed_over",
        TaskInputAbandoned = "task.input_abandoned",
        TaskInputAnswered = "task.input_answered",
        TaskInputRequested = "task.input_requested",
        TaskOutputDeleted = "task.output_deleted",
        TaskSettled = "task.settled",
        TaskStarted = "task.started",
        TaskSubmitted = "task.submitted",
        TaskYielded = "task.yielded",
    }
}

#[test]
fn every_event_is_named_once_after_the_entity_it_changes() {
    let mut seen = std::collections::BTreeSet::new();
    for e in Event::ALL {
        let name = e.as_str();
        assert!(seen.insert(name), "{name} twice");
        let (entity, verb) = name.split_once('.').unwrap_or_default();
        assert!(
            Entity::parse(entity).is_some(),
            "{name}: no entity {entity:?}"
        );
        assert!(
            !verb.is_empty() && verb.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
            "{name}"
        );
    }
}

named! {
    /// Whether an event creates its row or updates it (its `op` column).
    pub(crate) enum Op {
        Insert = "insert",
        Update = "update",
    }
}

/// What [`Registry::count_of`] counts of one uid's. Each is its own query, so that a submit
/// can ask only how many of the uid's calls wait: counting the running ones reads a row each
/// (for its kind), and would make every submit cost more the more the uid already runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Holding {
    /// Calls waiting as `queued`.
    QueuedCalls,
    /// Calls `running` or `awaiting_input`.
    RunningCalls,
    /// Open top-level sessions (a subagent's child sessions are not counted).
    OpenSessions,
    /// Enabled schedules.
    ArmedSchedules,
}

/// See [`Registry::hold_writes`].
pub(crate) struct WritesHeld<'a> {
    _writer: MutexGuard<'a, Connection>,
    _checkpoint: MutexGuard<'a, ()>,
}

pub(crate) struct Registry {
    /// Checkpoints of the log, off the writers' path (see [`checkpoint`]). Declared first:
    /// its thread and connection are gone before the others close.
    checkpoints: checkpoint::Checkpoints,
    /// A second, read-only connection for the wake hub, which reads every committed event and
    /// the rows they name: with WAL it never waits for the writers, nor they for it. Declared
    /// (so dropped) before `conn`: the writer closing last checkpoints the WAL into the file.
    follower: Mutex<Connection>,
    conn: Mutex<Connection>,
    path: PathBuf,
    /// The newest event's seq, updated after every commit that wrote events: the wake hub
    /// waits on it to push changes, so nothing is polled.
    last_seq: tokio::sync::watch::Sender<i64>,
}

/// Mode 0600, for the registry and its backups: they hold every user's commands and
/// arguments, the daemon's only. SQLite creates a database's -wal and -shm files with the
/// database's mode.
pub(super) fn owner_only(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

impl Registry {
    /// Opens (creating if needed) `<state_dir>/sidejob.db` in WAL mode and runs migrations,
    /// after checking it can be trusted (see [`health`]): a damaged registry, or an empty one
    /// beside the sessions of an earlier one, is refused.
    pub(crate) fn open(state_dir: &Path) -> Result<Registry> {
        Self::open_with(state_dir, true)
    }

    /// [`Registry::open`] without the check: for making a new registry in place of one set
    /// aside (`health::rebuild`).
    pub(crate) fn open_unchecked(state_dir: &Path) -> Result<Registry> {
        Self::open_with(state_dir, false)
    }

    fn open_with(state_dir: &Path, check: bool) -> Result<Registry> {
        std::fs::create_dir_all(state_dir).map_err(|source| RegistryError::StateDir {
            path: state_dir.into(),
            source,
        })?;
        let path = state_dir.join("sidejob.db");
        let conn = Connection::open(&path).map_err(|source| RegistryError::Open {
            path: path.clone(),
            source,
        })?;
        for suffix in ["", "-wal", "-shm"] {
            let mut p = path.clone().into_os_string();
            p.push(suffix);
            let _ = owner_only(Path::new(&p));
        }
        if check {
            health::check_on_open(&conn, &path, state_dir)?;
        }
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // A small page cache: the registry's hot rows are few (the live tasks), and the
        // daemon's memory should not grow with its history.
        conn.pragma_update(None, "cache_size", -1024)?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        // Every write parses its statements once: a patch's shape is a statement of its own
        // (a handful per table), and each commit adds its event's insert.
        conn.set_prepared_statement_cache_capacity(64);
        let mut conn = conn;
        migrate(&mut conn)?;
        let checkpoints = checkpoint::Checkpoints::start(&path, &conn);
        let last: i64 =
            conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get(0))?;
        let follower = Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|source| RegistryError::Open {
            path: path.clone(),
            source,
        })?;
        follower.busy_timeout(std::time::Duration::from_secs(5))?;
        follower.pragma_update(None, "cache_size", -512)?;
        Ok(Registry {
            checkpoints,
            conn: Mutex::new(conn),
            follower: Mutex::new(follower),
            path,
            last_seq: tokio::sync::watch::channel(last).0,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Holds the writer until the value is dropped: no transaction is under way, nor can
    /// one start, and no checkpoint either. The daemon holds it across an in-place re-exec
    /// (`server/upgrade/`), so the new image finds the registry at a commit boundary.
    pub(crate) fn hold_writes(&self) -> WritesHeld<'_> {
        let writer = self.lock();
        WritesHeld {
            _checkpoint: self.checkpoints.hold(),
            _writer: writer,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves SQLite consistent (the transaction rolls back
        // on drop), so a poisoned lock is safe to keep using.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` in one write transaction, which holds the log's write lock from its start:
    /// begun as a reader, a transaction that then writes fails (`SQLITE_BUSY_SNAPSHOT`, with
    /// no wait) when the checkpoint thread empties the log between the two (`checkpoint.rs`).
    pub(crate) fn write<T>(&self, f: impl FnOnce(&Transaction) -> Result<T>) -> Result<T> {
        let mut conn = self.lock();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let out = f(&tx)?;
        tx.commit()?;
        self.checkpoints.committed();
        // Every insert goes through `apply`, which inserts the event last, and only this
        // connection writes: the last inserted rowid is the newest event's seq.
        let last = conn.last_insert_rowid();
        drop(conn);
        self.last_seq.send_if_modified(|seq| {
            let changed = *seq != last;
            *seq = last;
            changed
        });
        Ok(out)
    }

    /// Watches the newest event seq (see [`Registry::write`]).
    pub(crate) fn subscribe_seq(&self) -> tokio::sync::watch::Receiver<i64> {
        self.last_seq.subscribe()
    }

    /// The newest committed event's seq (see [`Registry::write`]).
    pub(crate) fn newest_seq(&self) -> i64 {
        *self.last_seq.borrow()
    }

    /// Runs `f` with the connection, for reads.
    pub(crate) fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.lock();
        f(&conn)
    }

    /// Runs `f` with the follower connection (see [`Registry::follower`]): committed data
    /// only, for the wake hub.
    pub(crate) fn follow<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let conn = self.follower.lock().unwrap_or_else(|e| e.into_inner());
        f(&conn)
    }

    /// Lets go of what both connections cache (pages read, statements prepared), for when
    /// the daemon falls idle after a crowd of runs: SQLite keeps its caches full otherwise,
    /// and they hold the heap's pages in place so that trimming it returns little.
    pub(crate) fn release_memory(&self) {
        let shrink = |conn: &Connection| {
            conn.flush_prepared_statement_cache();
            let _ = conn.execute_batch("PRAGMA shrink_memory");
        };
        // One at a time: the wake hub may hold the follower while it waits for the other.
        shrink(&self.lock());
        shrink(&self.follower.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// [`Registry::get_task`] on the follower connection.
    pub(crate) fn get_task_committed(&self, task_id: &str) -> Result<Option<TaskRow>> {
        self.follow(|c| Self::task_in(c, task_id))
    }

    /// Writes a row change and its event in the same transaction; returns the event's seq.
    pub(crate) fn apply(
        tx: &Transaction,
        kind: Event,
        entity: Entity,
        id: &str,
        session_id: &str,
        op: Op,
        patch: &Map<String, Value>,
    ) -> Result<i64> {
        apply_patch(tx, entity, id, op, patch)?;
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (at, kind, entity, entity_id, op, session_id, patch) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?;
        insert.execute(params![
            crate::ids::now_rfc3339(),
            kind.as_str(),
            entity.as_str(),
            id,
            op.as_str(),
            session_id,
            serde_json::to_string(patch).map_err(|e| RegistryError::Corrupt(e.to_string()))?
        ])?;
        Ok(tx.last_insert_rowid())
    }

    // ----- sessions -----

    pub(crate) fn insert_session(&self, row: &SessionRow) -> Result<()> {
        self.write(|tx| {
            Self::apply(
                tx,
                Event::SessionOpened,
                Entity::Session,
                &row.session_id,
                &row.session_id,
                Op::Insert,
                &row.to_patch(),
            )?;
            Ok(())
        })
    }

    /// Opens a closed session again; `workspace` and `profile` record what was unknown (a
    /// session rebuilt from its directory: see `health::rebuild`).
    pub(crate) fn reopen_session(
        &self,
        session_id: &str,
        workspace: Option<&str>,
        profile: Option<&str>,
    ) -> Result<()> {
        self.write(|tx| {
            let mut patch = obj([
                ("state", SessionState::Open.as_str().into()),
                ("closed_at", Value::Null),
            ]);
            if let Some(w) = workspace {
                patch.insert("workspace".into(), w.into());
            }
            if let Some(p) = profile {
                patch.insert("profile".into(), p.into());
            }
            Self::apply(
                tx,
                Event::SessionReopened,
                Entity::Session,
                session_id,
                session_id,
                Op::Update,
                &patch,
            )?;
            Ok(())
        })
    }

    /// Records that a closed session's directory (and its runs' output) was removed: the
    /// session is `deleted` and each of its tasks' output is gone.
    pub(crate) fn mark_session_deleted(&self, session_id: &str) -> Result<()> {
        self.write(|tx| {
            let tasks: Vec<String> = {
                let mut stmt = tx.prepare_cached(
                    "SELECT task_id FROM tasks WHERE session_id = ?1 AND output_deleted = 0",
                )?;
                let rows = stmt.query_map([session_id], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for task_id in tasks {
                Self::apply(
                    tx,
                    Event::TaskOutputDeleted,
                    Entity::Task,
                    &task_id,
                    session_id,
                    Op::Update,
                    &obj([("output_deleted", true.into())]),
                )?;
            }
            Self::apply(
                tx,
                Event::SessionDeleted,
                Entity::Session,
                session_id,
                session_id,
                Op::Update,
                &obj([("state", SessionState::Deleted.as_str().into())]),
            )?;
            Ok(())
        })
    }

    pub(crate) fn close_session(&self, session_id: &str) -> Result<()> {
        self.write(|tx| {
            let patch = obj([
                ("state", SessionState::Closed.as_str().into()),
                ("closed_at", crate::ids::now_rfc3339().into()),
            ]);
            Self::apply(
                tx,
                Event::SessionClosed,
                Entity::Session,
                session_id,
                session_id,
                Op::Update,
                &patch,
            )?;
            Ok(())
        })
    }

    pub(crate) fn get_session(&self, session_id: &str) -> Result<Option<SessionRow>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached("SELECT * FROM sessions WHERE session_id = ?1")?;
        Ok(stmt
            .query_row([session_id], SessionRow::from_row)
            .optional()?)
    }

    /// Sessions, all of them or those of one owner.
    pub(crate) fn list_sessions(&self, owner: Option<u32>) -> Result<Vec<SessionRow>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached("SELECT * FROM sessions WHERE ?1 IS NULL OR owner_uid = ?1 ORDER BY created_at, session_id")?;
        let rows = stmt.query_map([owner], SessionRow::from_row)?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// Open top-level sessions with nothing live (no run, no armed schedule) whose last
    /// activity (opened, reopened, a task of theirs submitted or ended) was before `cutoff`
    /// (RFC 3339, as every timestamp here is written).
    pub(crate) fn idle_sessions(&self, cutoff: &str) -> Result<Vec<String>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT s.session_id FROM sessions s
             WHERE s.state = 'open' AND s.parent_session_id IS NULL
               AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.session_id = s.session_id
                               AND t.state NOT IN ('succeeded','failed','canceled'))
               AND NOT EXISTS (SELECT 1 FROM schedules c WHERE c.session_id = s.session_id AND c.enabled = 1)
               AND COALESCE((SELECT MAX(COALESCE(t.ended_at, t.created_at)) FROM tasks t
                             WHERE t.session_id = s.session_id), '') < ?1
               AND COALESCE((SELECT MAX(e.at) FROM events e
                             WHERE e.entity = 'session' AND e.entity_id = s.session_id), s.created_at) < ?1",
        )?;
        let rows = stmt.query_map([cutoff], |r| r.get(0))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    // ----- tasks -----

    pub(crate) fn insert_task(&self, row: &TaskRow) -> Result<i64> {
        self.write(|tx| {
            Self::apply(
                tx,
                Event::TaskSubmitted,
                Entity::Task,
                &row.task_id,
                &row.session_id,
                Op::Insert,
                &row.to_patch(),
            )
        })
    }

    /// The supervisor is running: record its pid and start time (to re-attach after restart).
    pub(crate) fn mark_started(
        &self,
        task_id: &str,
        session_id: &str,
        pid: i32,
        start_time: u64,
        started_at: &str,
    ) -> Result<i64> {
        self.write(|tx| {
            let patch = obj([
                ("state", TaskState::Running.as_str().into()),
                ("supervisor_pid", pid.into()),
                ("supervisor_start_time", start_time.into()),
                ("started_at", started_at.into()),
            ]);
            Self::apply(
                tx,
                Event::TaskStarted,
                Entity::Task,
                task_id,
                session_id,
                Op::Update,
                &patch,
            )
        })
    }

    /// A foreground call moved to the background (yield, `background: true`, `task.background`).
    pub(crate) fn mark_yielded(&self, task_id: &str, session_id: &str) -> Result<i64> {
        self.write(|tx| {
            let patch = obj([("mode", "background".into())]);
            Self::apply(
                tx,
                Event::TaskYielded,
                Entity::Task,
                task_id,
                session_id,
                Op::Update,
                &patch,
            )
        })
    }

    /// Records a terminal state and who the result is delivered to, in one transaction.
    /// With `wake`, the completion's notification is created in the same transaction.
    /// Returns the task's row as settled.
    pub(crate) fn settle(
        &self,
        task_id: &str,
        session_id: &str,
        s: &Settlement,
        wake: Option<&NotificationRow>,
    ) -> Result<Option<TaskRow>> {
        self.write(|tx| {
            Self::apply(
                tx,
                Event::TaskSettled,
                Entity::Task,
                task_id,
                session_id,
                Op::Update,
                &s.to_patch(),
            )?;
            if let Some(n) = wake {
                n.insert(tx)?;
            }
            // The settled row, read in the same transaction: the caller answers with it, and
            // a read of its own after the commit would take the shared-memory lock again just
            // as the wake hub reads the commit.
            Self::task_in(tx, task_id)
        })
    }

    /// Moves a terminal task's delivery from `from` to `to` if (and only if) it is still
    /// `from`. This conditional update is the single place later claims are decided.
    pub(crate) fn claim_delivery(
        &self,
        task_id: &str,
        from: Delivery,
        to: Delivery,
    ) -> Result<bool> {
        self.write(|tx| {
            let current: Option<Option<String>> = tx
                .query_row(
                    "SELECT delivery FROM tasks WHERE task_id = ?1",
                    [task_id],
                    |r| r.get(0),
                )
                .optional()?;
            let Some(Some(current)) = current else {
                return Ok(false);
            };
            if current != from.as_str() {
                return Ok(false);
            }
            let session_id: String = tx.query_row(
                "SELECT session_id FROM tasks WHERE task_id = ?1",
                [task_id],
                |r| r.get(0),
            )?;
            let patch = obj([("delivery", to.as_str().into())]);
            Self::apply(
                tx,
                Event::TaskDelivered,
                Entity::Task,
                task_id,
                &session_id,
                Op::Update,
                &patch,
            )?;
            Ok(true)
        })
    }

    pub(crate) fn get_task(&self, task_id: &str) -> Result<Option<TaskRow>> {
        Self::task_in(&self.lock(), task_id)
    }

    /// A task's row as `conn` sees it (in its transaction, if one is open).
    fn task_in(conn: &Connection, task_id: &str) -> Result<Option<TaskRow>> {
        let mut stmt = conn.prepare_cached("SELECT * FROM tasks WHERE task_id = ?1")?;
        stmt.query_row([task_id], TaskRow::from_row)
            .optional()?
            .map(TaskRow::check)
            .transpose()
    }

    /// A session's live tasks plus its `history` most recent terminal ones, newest first.
    pub(crate) fn list_tasks(&self, session_id: &str, history: usize) -> Result<Vec<TaskRow>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT * FROM tasks WHERE session_id = ?1 AND state NOT IN ('succeeded','failed','canceled')
             UNION ALL
             SELECT * FROM (SELECT * FROM tasks WHERE session_id = ?1 AND state IN ('succeeded','failed','canceled')
                            ORDER BY COALESCE(ended_at, created_at) DESC, task_id DESC LIMIT ?2)
             ORDER BY created_at DESC, task_id DESC",
        )?;
        let rows = stmt.query_map(params![session_id, history as i64], TaskRow::from_row)?;
        rows.map(|r| r.map_err(RegistryError::from).and_then(TaskRow::check))
            .collect()
    }

    /// Every task in one of `states`, across sessions (for recovery at start-up).
    pub(crate) fn tasks_in_states(&self, states: &[TaskState]) -> Result<Vec<TaskRow>> {
        let conn = self.lock();
        let list = states
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(",");
        let mut stmt = conn.prepare(&format!(
            "SELECT * FROM tasks WHERE state IN ({list}) ORDER BY created_at"
        ))?;
        let rows = stmt.query_map([], TaskRow::from_row)?;
        rows.map(|r| r.map_err(RegistryError::from).and_then(TaskRow::check))
            .collect()
    }

    /// Live tasks of a session (not terminal).
    pub(crate) fn live_tasks_of_session(&self, session_id: &str) -> Result<Vec<TaskRow>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached("SELECT * FROM tasks WHERE session_id = ?1 AND state NOT IN ('succeeded','failed','canceled')")?;
        let rows = stmt.query_map([session_id], TaskRow::from_row)?;
        rows.map(|r| r.map_err(RegistryError::from).and_then(TaskRow::check))
            .collect()
    }

    /// How much of `what` a uid holds now. Each count is indexed by uid and state, but
    /// [`Holding::RunningCalls`] reads each such row for its kind: ask for it only when
    /// needed.
    pub(crate) fn count_of(&self, uid: u32, what: Holding) -> Result<u64> {
        // The states are bound, not spelled in the SQL: their names live in the state enums.
        let (sql, states): (&str, &[&str]) = match what {
            Holding::QueuedCalls => (
                "SELECT COUNT(*) FROM tasks WHERE owner_uid = ?1 AND state = ?2 AND kind = 'call'",
                &[TaskState::Queued.as_str()],
            ),
            Holding::RunningCalls => (
                "SELECT COUNT(*) FROM tasks WHERE owner_uid = ?1 AND state IN (?2, ?3) AND kind = 'call'",
                &[TaskState::Running.as_str(), TaskState::AwaitingInput.as_str()],
            ),
            Holding::OpenSessions => (
                "SELECT COUNT(*) FROM sessions WHERE owner_uid = ?1 AND state = ?2 AND parent_session_id IS NULL",
                &[SessionState::Open.as_str()],
            ),
            Holding::ArmedSchedules => (
                "SELECT COUNT(*) FROM schedules WHERE owner_uid = ?1 AND enabled = 1",
                &[],
            ),
        };
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(sql)?;
        let mut bound: Vec<&dyn rusqlite::ToSql> = vec![&uid];
        bound.extend(states.iter().map(|s| s as &dyn rusqlite::ToSql));
        Ok(stmt.query_row(bound.as_slice(), |r| r.get(0))?)
    }

    /// The bytes of output a uid's runs keep under `sessions_dir` (their output not deleted).
    /// Reads every such task of the uid: the executor asks once and then keeps count.
    pub(crate) fn kept_output(&self, uid: u32, sessions_dir: &str) -> Result<u64> {
        let prefix = format!("{}/", sessions_dir.trim_end_matches('/'));
        let conn = self.lock();
        Ok(conn.query_row(
            "SELECT COALESCE(SUM(output_bytes), 0) FROM tasks \
             WHERE owner_uid = ?1 AND output_deleted = 0 AND substr(run_dir, 1, length(?2)) = ?2",
            rusqlite::params![uid, prefix],
            |r| r.get(0),
        )?)
    }

    /// How many of a session's tasks are in each live state.
    pub(crate) fn count_states(&self, session_id: &str) -> Result<Vec<(TaskState, u32)>> {
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(
            "SELECT state, COUNT(*) FROM tasks WHERE session_id = ?1 AND state NOT IN ('succeeded','failed','canceled') GROUP BY state",
        )?;
        let rows = stmt.query_map([session_id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (state, n) = row?;
            let state = TaskState::parse(&state)
                .ok_or_else(|| RegistryError::Corrupt(format!("task state {state:?}")))?;
            out.push((state, n));
        }
        Ok(out)
    }

    /// The newest event's seq (0 when the log is empty).
    pub(crate) fn last_seq(&self) -> Result<i64> {
        let conn = self.lock();
        Ok(conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |r| r.get(0))?)
    }
}

fn migrate(conn: &mut Connection) -> Result<()> {
    let version: usize =
        conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    if version > schema::MIGRATIONS.len() {
        return Err(RegistryError::TooNew {
            found: version,
            known: schema::MIGRATIONS.len(),
        });
    }
    for (i, sql) in schema::MIGRATIONS.iter().enumerate().skip(version) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)
            .map_err(|source| RegistryError::Migrate {
                version: i + 1,
                source,
            })?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

/// Applies one column patch to a row: the single code path shared by live writes and replay.
fn apply_patch(
    conn: &Connection,
    entity: Entity,
    id: &str,
    op: Op,
    patch: &Map<String, Value>,
) -> Result<()> {
    for col in patch.keys() {
        if !col.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
            return Err(RegistryError::Corrupt(format!("column name {col:?}")));
        }
    }
    // Built in one string: this runs on every write, and most of them are on a call's path.
    // (Writing to a String cannot fail.)
    use std::fmt::Write as _;
    let table = entity.table();
    let mut sql = String::with_capacity(64 + patch.len() * 32);
    match op {
        Op::Insert => {
            let _ = write!(sql, "INSERT INTO {table} (");
            comma_list(&mut sql, patch.keys(), |s, col| s.push_str(col));
            sql.push_str(") VALUES (");
            comma_list(&mut sql, 1..=patch.len(), |s, i| {
                let _ = write!(s, "?{i}");
            });
            sql.push(')');
        }
        Op::Update => {
            let _ = write!(sql, "UPDATE {table} SET ");
            comma_list(&mut sql, patch.keys().zip(1..), |s, (col, i)| {
                let _ = write!(s, "{col} = ?{i}");
            });
            let _ = write!(sql, " WHERE {} = ?{}", entity.key(), patch.len() + 1);
        }
    }
    let mut stmt = conn.prepare_cached(&sql)?;
    let values: Vec<JsonParam> = patch.values().map(JsonParam).collect();
    let mut bound: Vec<&dyn rusqlite::ToSql> =
        values.iter().map(|v| v as &dyn rusqlite::ToSql).collect();
    if op == Op::Update {
        bound.push(&id);
    }
    let changed = stmt.execute(bound.as_slice())?;
    if changed != 1 {
        return Err(RegistryError::Corrupt(format!(
            "{} {id} matched {changed} rows",
            entity.as_str()
        )));
    }
    Ok(())
}

/// Writes `items` into `sql`, each by `item`, separated by commas.
fn comma_list<T>(
    sql: &mut String,
    items: impl IntoIterator<Item = T>,
    mut item: impl FnMut(&mut String, T),
) {
    for (i, it) in items.into_iter().enumerate() {
        if i > 0 {
            sql.push_str(", ");
        }
        item(sql, it);
    }
}

/// A JSON value bound as the SQL value [`json_to_sql`] makes of it, its text not copied.
struct JsonParam<'a>(&'a Value);

impl rusqlite::ToSql for JsonParam<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(match self.0 {
            Value::String(s) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
            other => ToSqlOutput::Owned(json_to_sql(other)),
        })
    }
}

pub(crate) fn json_to_sql(v: &Value) -> rusqlite::types::Value {
    use rusqlite::types::Value as S;
    match v {
        Value::Null => S::Null,
        Value::Bool(b) => S::Integer(*b as i64),
        Value::Number(n) => match n.as_i64() {
            Some(i) => S::Integer(i),
            None => S::Real(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => S::Text(s.clone()),
        other => S::Text(other.to_string()),
    }
}

/// Builds a JSON object from `(column, value)` pairs.
pub(crate) fn obj<const N: usize>(pairs: [(&str, Value); N]) -> Map<String, Value> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}
