//! `schedule.create`, `schedule.list`, `schedule.cancel` (docs/protocol.md): the handlers;
//! schedules themselves are `schedule/`.

use super::super::rpc::{to_value, Reply};
use super::super::{Daemon, Peer};
use crate::protocol::*;
use crate::registry::Holding;
use crate::schedule::Scheduler;
use crate::session;

pub(super) fn create(d: &Daemon, peer: &Peer, p: ScheduleCreateParams) -> Result<Reply, RpcError> {
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
    let armed = d
        .executor
        .registry()
        .count_of(sess.owner_uid, Holding::ArmedSchedules)?;
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

pub(super) fn list(d: &Daemon, peer: &Peer, p: ScheduleListParams) -> Result<Reply, RpcError> {
    let registry = d.executor.registry();
    session::get_for(registry, peer.uid, &p.session_id)?;
    let schedules = registry
        .list_schedules(&p.session_id)?
        .iter()
        .map(Scheduler::info)
        .collect();
    to_value(ScheduleListResult { schedules })
}

pub(super) async fn cancel(
    d: &Daemon,
    peer: &Peer,
    p: ScheduleCancelParams,
) -> Result<Reply, RpcError> {
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
