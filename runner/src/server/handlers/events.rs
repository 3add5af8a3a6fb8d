//! `events.subscribe`, `inbox.list`, `inbox.ack` (docs/protocol.md): live pushes and the
//! notifications a session keeps.

use std::sync::Arc;

use super::super::rpc::{to_value, Reply};
use super::super::{Daemon, Peer};
use crate::protocol::*;
use crate::session;

pub(super) async fn subscribe(
    d: &Arc<Daemon>,
    peer: &Peer,
    p: EventsSubscribeParams,
) -> Result<Reply, RpcError> {
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
    if !conn
        .tools_watched
        .swap(true, std::sync::atomic::Ordering::Relaxed)
    {
        push_tool_changes(d, conn.channel.push.clone());
    }
    to_value(EventsSubscribeResult {
        session_ids: p.session_ids,
        seq,
    })
}

pub(super) fn inbox_list(d: &Daemon, peer: &Peer, p: InboxListParams) -> Result<Reply, RpcError> {
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

pub(super) fn inbox_ack(d: &Daemon, peer: &Peer, p: InboxAckParams) -> Result<Reply, RpcError> {
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

/// Pushes `tools.changed` to a subscribed connection each time the plugins' tools change,
/// until the connection goes away.
fn push_tool_changes(d: &Arc<Daemon>, push: tokio::sync::mpsc::Sender<String>) {
    let mut changes = d.executor.tools().watch_changes();
    changes.borrow_and_update();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = push.closed() => return,
            }
            let line = serde_json::json!({
                "jsonrpc": "2.0",
                "method": "tools.changed",
                "params": ToolsChangedNotification {},
            });
            if push.send(line.to_string()).await.is_err() {
                return;
            }
        }
    });
}
