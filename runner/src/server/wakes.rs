//! Handlers for live events, the inbox and schedules (SPEC §7, §8).

use std::sync::Arc;

use serde_json::Value;

use super::dispatch::{params, to_value, Reply};
use super::{Daemon, Peer};
use crate::protocol::*;
use crate::schedule::{ScheduleError, Scheduler};
use crate::session;

impl From<ScheduleError> for RpcError {
    fn from(e: ScheduleError) -> RpcError {
        match e {
            ScheduleError::Invalid(m) => RpcError::new(ErrorKind::InvalidParams, m),
            ScheduleError::Registry(e) => e.into(),
            ScheduleError::Exec(e) => e.into(),
        }
    }
}

pub async fn events_subscribe(d: &Arc<Daemon>, peer: &Peer, p: Value) -> Result<Reply, RpcError> {
    let p: EventsSubscribeParams = params("events.subscribe", p)?;
    let registry = d.executor.registry();
    if let Some(ids) = &p.session_ids {
        for id in ids {
            session::get_for(registry, peer.uid, id)?;
        }
    }
    let Some(conn) = &peer.conn else {
        return Err(RpcError::new(
            ErrorKind::InvalidState,
            "this connection cannot receive pushes",
        ));
    };
    let seq = d
        .hub
        .subscribe(
            conn.id,
            peer.uid,
            p.session_ids.clone(),
            p.since_seq,
            conn.channel.clone(),
        )
        .await?;
    to_value(EventsSubscribeResult {
        session_ids: p.session_ids,
        seq,
    })
}

pub fn inbox_list(d: &Arc<Daemon>, peer: &Peer, p: Value) -> Result<Reply, RpcError> {
    let p: InboxListParams = params("inbox.list", p)?;
    let registry = d.executor.registry();
    if let Some(id) = &p.session_id {
        session::get_for(registry, peer.uid, id)?;
    }
    let owner = (peer.uid != 0).then_some(peer.uid);
    let rows = registry.list_notifications(
        p.session_id.as_deref(),
        owner,
        p.unread_only.unwrap_or(false),
    )?;
    to_value(InboxListResult {
        notifications: rows.iter().map(|n| n.to_wire()).collect(),
    })
}

pub fn inbox_ack(d: &Arc<Daemon>, peer: &Peer, p: Value) -> Result<Reply, RpcError> {
    let p: InboxAckParams = params("inbox.ack", p)?;
    let registry = d.executor.registry();
    // Check every id first, so a bad one acks nothing.
    for id in &p.ids {
        let n = registry.get_notification(id)?.ok_or_else(|| {
            RpcError::new(ErrorKind::NotFound, format!("notification {id} not found"))
        })?;
        if !session::may_access(peer.uid, n.owner_uid) {
            return Err(RpcError::new(
                ErrorKind::PermissionDenied,
                format!("notification {id} belongs to another user"),
            ));
        }
    }
    let mut result = InboxAckResult {
        acked: Vec::new(),
        already_acked: Vec::new(),
    };
    for id in p.ids {
        if registry.ack_notification(&id)? {
            result.acked.push(id);
        } else {
            result.already_acked.push(id);
        }
    }
    to_value(result)
}

pub fn schedule_create(d: &Arc<Daemon>, peer: &Peer, p: Value) -> Result<Reply, RpcError> {
    let p: ScheduleCreateParams = params("schedule.create", p)?;
    let sess = session::get_to_work_in(
        d.executor.registry(),
        peer.uid,
        &p.session_id,
        p.adopt.unwrap_or(false),
    )?;
    if !sess.is_open() {
        return Err(RpcError::new(
            ErrorKind::InvalidState,
            format!("session {} is closed", p.session_id),
        )
        .with_hint("open it again with session.open"));
    }
    let cfg = d.executor.config();
    let armed = d.executor.registry().usage_of(sess.owner_uid)?.schedules;
    if armed >= cfg.per_user.schedules as u64 {
        return Err(RpcError::new(
            ErrorKind::LimitExceeded,
            format!(
                "uid {} has {armed} armed schedules: per_user.schedules ({}) is reached; cancel some with schedule.cancel",
                sess.owner_uid, cfg.per_user.schedules
            ),
        ));
    }
    to_value(d.scheduler.create(&sess, p)?)
}

pub fn schedule_list(d: &Arc<Daemon>, peer: &Peer, p: Value) -> Result<Reply, RpcError> {
    let p: ScheduleListParams = params("schedule.list", p)?;
    let registry = d.executor.registry();
    session::get_for(registry, peer.uid, &p.session_id)?;
    let schedules = registry
        .list_schedules(&p.session_id)?
        .iter()
        .map(Scheduler::info)
        .collect();
    to_value(ScheduleListResult { schedules })
}

pub async fn schedule_cancel(d: &Arc<Daemon>, peer: &Peer, p: Value) -> Result<Reply, RpcError> {
    let p: ScheduleCancelParams = params("schedule.cancel", p)?;
    if !crate::ids::is_valid_task_id(&p.schedule_id) {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            format!("invalid schedule id {:?}", p.schedule_id),
        ));
    }
    let s = d
        .executor
        .registry()
        .get_schedule(&p.schedule_id)?
        .ok_or_else(|| {
            RpcError::new(
                ErrorKind::NotFound,
                format!("schedule {} not found", p.schedule_id),
            )
        })?;
    if !session::may_access(peer.uid, s.owner_uid) {
        return Err(RpcError::new(
            ErrorKind::PermissionDenied,
            format!("schedule {} belongs to another user", p.schedule_id),
        ));
    }
    let result = d.scheduler.disarm(&p.schedule_id).await?;
    to_value(ScheduleCancelResult {
        schedule_id: p.schedule_id,
        result,
    })
}
