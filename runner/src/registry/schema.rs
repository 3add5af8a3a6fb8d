//! Embedded, versioned migrations. `PRAGMA user_version` records how many have run; each
//! migration runs once, in its own transaction, in order. Add new ones at the end; never edit
//! one that has shipped.

pub(super) const MIGRATIONS: &[&str] = &[
    // 1: sessions, tasks and the authoritative event log.
    r#"
    CREATE TABLE sessions (
        session_id        TEXT PRIMARY KEY,
        owner_uid         INTEGER NOT NULL,
        workspace         TEXT NOT NULL,
        session_dir       TEXT NOT NULL,
        profile           TEXT NOT NULL,
        proactive_wake    INTEGER NOT NULL,
        parent_session_id TEXT,
        state             TEXT NOT NULL,
        created_at        TEXT NOT NULL,
        closed_at         TEXT
    );
    CREATE TABLE tasks (
        task_id               TEXT PRIMARY KEY,
        session_id            TEXT NOT NULL,
        owner_uid             INTEGER NOT NULL,
        tool                  TEXT NOT NULL,
        kind                  TEXT NOT NULL,
        state                 TEXT NOT NULL,
        mode                  TEXT NOT NULL,
        reason                TEXT,
        exit_code             INTEGER,
        signal                INTEGER,
        summary               TEXT NOT NULL,
        args                  TEXT NOT NULL,
        created_at            TEXT NOT NULL,
        started_at            TEXT,
        ended_at              TEXT,
        run_dir               TEXT NOT NULL,
        delivery              TEXT,
        service               INTEGER NOT NULL,
        parent_task_id        TEXT,
        profile               TEXT NOT NULL,
        timeout_ms            INTEGER,
        stdin                 TEXT NOT NULL,
        supervisor_pid        INTEGER,
        supervisor_start_time INTEGER,
        duration_ms           INTEGER,
        output_bytes          INTEGER,
        output_truncated      INTEGER,
        leftover_processes    INTEGER,
        error                 TEXT
    );
    CREATE INDEX tasks_by_session ON tasks (session_id, state);
    CREATE INDEX tasks_by_state ON tasks (state);
    CREATE TABLE events (
        seq        INTEGER PRIMARY KEY AUTOINCREMENT,
        at         TEXT NOT NULL,
        kind       TEXT NOT NULL,
        entity     TEXT NOT NULL,
        entity_id  TEXT NOT NULL,
        op         TEXT NOT NULL,
        session_id TEXT,
        patch      TEXT NOT NULL
    );
    CREATE INDEX events_by_entity ON events (entity, entity_id);
    "#,
    // 2: wakes and the inbox, durable schedules, per-call wake mode, occurrence keys.
    r#"
    ALTER TABLE tasks ADD COLUMN wake TEXT NOT NULL DEFAULT 'on_terminal';
    ALTER TABLE tasks ADD COLUMN occurrence_key TEXT;
    CREATE UNIQUE INDEX tasks_by_occurrence ON tasks (occurrence_key) WHERE occurrence_key IS NOT NULL;
    CREATE TABLE notifications (
        id             TEXT PRIMARY KEY,
        session_id     TEXT NOT NULL,
        owner_uid      INTEGER NOT NULL,
        task_id        TEXT,
        severity       TEXT NOT NULL,
        kind           TEXT NOT NULL,
        text           TEXT NOT NULL,
        created_at     TEXT NOT NULL,
        acked          INTEGER NOT NULL DEFAULT 0,
        acked_at       TEXT,
        occurrence_key TEXT
    );
    CREATE INDEX notifications_unacked ON notifications (session_id, acked);
    CREATE UNIQUE INDEX notifications_by_occurrence ON notifications (occurrence_key) WHERE occurrence_key IS NOT NULL;
    CREATE TABLE schedules (
        schedule_id     TEXT PRIMARY KEY,
        session_id      TEXT NOT NULL,
        owner_uid       INTEGER NOT NULL,
        owner_gid       INTEGER NOT NULL,
        task_id         TEXT NOT NULL,
        trigger         TEXT NOT NULL,
        action          TEXT NOT NULL,
        action_kind     TEXT NOT NULL,
        max_occurrences INTEGER,
        catch_up        TEXT NOT NULL,
        occurrences     INTEGER NOT NULL DEFAULT 0,
        next_due_ms     INTEGER,
        enabled         INTEGER NOT NULL,
        claimed_by      TEXT,
        lease_until_ms  INTEGER,
        last_key        TEXT,
        created_at      TEXT NOT NULL
    );
    CREATE INDEX schedules_due ON schedules (enabled, next_due_ms);
    "#,
    // 3: who a session and a run act for, kept where no caller can write it. The group a
    // session's files are handed to; the uid/gid a run runs as; the session a run's bridge
    // is scoped to (a restarted daemon serves the bridge again from these, never from a file
    // in a run directory).
    r#"
    ALTER TABLE sessions ADD COLUMN owner_gid INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN owner_gid INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN run_uid INTEGER;
    ALTER TABLE tasks ADD COLUMN run_gid INTEGER;
    ALTER TABLE tasks ADD COLUMN bridge_session_id TEXT;
    ALTER TABLE tasks ADD COLUMN output_deleted INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX tasks_by_owner ON tasks (owner_uid, state);
    CREATE INDEX sessions_by_owner ON sessions (owner_uid, state);
    "#,
    // 4: one line saying what a run ran into (limits, refused network connections), from its
    // result.json, so task.get can show it without reading the run's directory.
    r#"
    ALTER TABLE tasks ADD COLUMN violations TEXT;
    "#,
    // 5: what a call was granted beyond its profile (`tool.call` `grants`, as JSON), so
    // `task.get` and `sidejob tasks` can show it and a run's bridge can bound what it starts.
    r#"
    ALTER TABLE tasks ADD COLUMN grants TEXT;
    "#,
];

/// The tables the event log rebuilds, with their key column, in replay-check order.
pub(super) const REPLAYED_TABLES: &[(&str, &str)] = &[
    ("sessions", "session_id"),
    ("tasks", "task_id"),
    ("notifications", "id"),
    ("schedules", "schedule_id"),
];
