//! `initialize` and `daemon.status` (docs/protocol.md).

use super::super::rpc::{to_value, Reply};
use super::super::{status, Daemon, Peer};
use crate::protocol::{
    DaemonStatusParams, ErrorKind, InitializeParams, InitializeResult, Method, RpcError,
    ServerInfo, PROTOCOL_VERSION,
};

pub(super) fn initialize(peer: &Peer, p: InitializeParams) -> Result<Reply, RpcError> {
    if let Some(v) = p.protocol_version.filter(|v| *v != PROTOCOL_VERSION) {
        return Err(RpcError::new(
            ErrorKind::InvalidParams,
            format!("unsupported protocol_version {v}; this server speaks {PROTOCOL_VERSION}"),
        ));
    }
    // What the client says it is goes to the log only: it decides nothing.
    tracing::debug!(uid = peer.uid, client = ?p.client, "initialize");
    to_value(InitializeResult {
        protocol_version: PROTOCOL_VERSION,
        server: ServerInfo {
            name: "sidejob".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        uid: peer.uid,
        methods: Method::host_names().into_iter().map(String::from).collect(),
    })
}

pub(super) fn status(d: &Daemon, peer: &Peer, _: DaemonStatusParams) -> Result<Reply, RpcError> {
    to_value(status::collect(d, peer.uid)?)
}
