//! Notifications (the inbox) and reading the event log forward, for pushes (docs/protocol.md).

use rusqlite::{params, OptionalExtension, Row, Transaction};
use serde_json::{Map, Value};

use super::{obj, Entity, Event, Op, Registry, RegistryError, Result};
use crate::protocol::Notification;

/// A durable inbox entry.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NotificationRow {
    pub id: String,
    pub session_id: String,
    pub owner_uid: u32,
    pub task_id: Option<String>,
    /// `info | success | warn | error | action_required`
    pub severity: String,
    /// `wake` (an `[automatic]` prompt), `notice` (one line), `schedule`, `action_required`
    pub kind: String,
    pub text: String,
    pub created_at: String,
    pub acked: bool,
    pub acked_at: Option<String>,
    /// Set for schedule occurrences: makes each occurrence fire at most once.
    pub occurrence_key: Option<String>,
}

impl NotificationRow {
    fn from_row(r: &Row) -> rusqlite::Result<NotificationRow> {
        Ok(NotificationRow {
            id: r.get("id")?,
            session_id: r.get("session_id")?,
            owner_uid: r.get("owner_uid")?,
            task_id: r.get("task_id")?,
            severity: r.get("severity")?,
            kind: r.get("kind")?,
            text: r.get("text")?,
            created_at: r.get("created_at")?,
            acked: r.get("acked")?,
            acked_at: r.get("acked_at")?,
            occurrence_key: r.get("occurrence_key")?,
        })
    }

    pub(crate) fn to_patch(&self) -> Map<String, Value> {
        obj([
            ("id", self.id.clone().into()),
            ("session_id", self.session_id.clone().into()),
            ("owner_uid", self.owner_uid.into()),
            ("task_id", self.task_id.clone().into()),
            ("severity", self.severity.clone().into()),
            ("kind", self.kind.clone().into()),
            ("text", self.text.clone().into()),
            ("created_at", self.created_at.clone().into()),
            ("acked", self.acked.into()),
            ("acked_at", self.acked_at.clone().into()),
            ("occurrence_key", self.occurrence_key.clone().into()),
        ])
    }

    pub(crate) fn to_wire(&self) -> Notification {
        Notification {
            id: self.id.clone(),
            session_id: self.session_id.clone(),
            task_id: self.task_id.clone(),
            severity: self.severity.clone(),
            kind: self.kind.clone(),
            text: self.text.clone(),
            created_at: self.created_at.clone(),
            acked: self.acked,
        }
    }

    /// Inserts the notification and its `notification.created` event in `tx`.
    pub(crate) fn insert(&self, tx: &Transaction) -> Result<i64> {
        Registry::apply(
            tx,
            Event::NotificationCreated,
            Entity::Notification,
            &self.id,
            &self.session_id,
            Op::Insert,
            &self.to_patch(),
        )
    }
}

/// One event of the log, as the hub needs it.
#[derive(Debug, Clone)]
pub(crate) struct EventRef {
    pub seq: i64,
    pub kind: String,
    pub entity: Entity,
    pub entity_id: String,
    pub session_id: Option<String>,
}

impl Registry {
    /// Records a notification on its own (one that no state change carries).
    pub(crate) fn notify(&self, n: &NotificationRow) -> Result<()> {
        self.write(|tx| n.insert(tx).map(drop))
    }

    pub(crate) fn get_notification(&self, id: &str) -> Result<Option<NotificationRow>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached("SELECT * FROM notifications WHERE id = ?1")?;
            Ok(stmt.query_row([id], NotificationRow::from_row).optional()?)
        })
    }

    /// Notifications, newest first: of one session or of every session `owner` may see.
    pub(crate) fn list_notifications(
        &self,
        session_id: Option<&str>,
        owner: Option<u32>,
        unread_only: bool,
    ) -> Result<Vec<NotificationRow>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT * FROM notifications
                 WHERE (?1 IS NULL OR session_id = ?1) AND (?2 IS NULL OR owner_uid = ?2) AND (?3 = 0 OR acked = 0)
                 ORDER BY created_at DESC, id DESC LIMIT 1000",
            )?;
            let rows = stmt.query_map(params![session_id, owner, unread_only as i64], NotificationRow::from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Unacked notifications of a session with the seq of their creation, oldest first.
    pub(crate) fn unacked_with_seq(&self, session_id: &str) -> Result<Vec<(i64, NotificationRow)>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT n.*, e.seq AS created_seq FROM notifications n
                 JOIN events e ON e.entity = 'notification' AND e.entity_id = n.id AND e.op = 'insert'
                 WHERE n.session_id = ?1 AND n.acked = 0 ORDER BY e.seq",
            )?;
            let rows = stmt.query_map([session_id], |r| Ok((r.get::<_, i64>("created_seq")?, NotificationRow::from_row(r)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Acks one notification if it is unacked; returns whether it changed.
    pub(crate) fn ack_notification(&self, id: &str) -> Result<bool> {
        self.write(|tx| {
            let row: Option<(String, bool)> = tx
                .query_row(
                    "SELECT session_id, acked FROM notifications WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            match row {
                Some((session_id, false)) => {
                    let patch = obj([
                        ("acked", true.into()),
                        ("acked_at", crate::ids::now_rfc3339().into()),
                    ]);
                    Registry::apply(
                        tx,
                        Event::NotificationAcked,
                        Entity::Notification,
                        id,
                        &session_id,
                        Op::Update,
                        &patch,
                    )?;
                    Ok(true)
                }
                Some((_, true)) | None => Ok(false),
            }
        })
    }

    /// Events after `seq`, oldest first, at most `limit`.
    pub(crate) fn events_after(&self, seq: i64, limit: usize) -> Result<Vec<EventRef>> {
        self.follow(|c| {
            let mut stmt = c.prepare_cached("SELECT seq, kind, entity, entity_id, session_id FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2")?;
            let rows = stmt.query_map(params![seq, limit as i64], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, String>(3)?, r.get::<_, Option<String>>(4)?))
            })?;
            let mut out = Vec::new();
            for row in rows {
                let (seq, kind, entity, entity_id, session_id) = row?;
                let entity = Entity::parse(&entity).ok_or_else(|| RegistryError::Corrupt(format!("event {seq}: entity {entity:?}")))?;
                out.push(EventRef { seq, kind, entity, entity_id, session_id });
            }
            Ok(out)
        })
    }

    /// The owner of a session, if it exists.
    pub(crate) fn session_owner(&self, session_id: &str) -> Result<Option<u32>> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT owner_uid FROM sessions WHERE session_id = ?1",
                [session_id],
                |r| r.get(0),
            )
            .optional()?)
        })
    }
}
