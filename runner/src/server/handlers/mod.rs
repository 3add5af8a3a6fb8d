//! One handler file per method family (docs/protocol.md), shared by the control socket and
//! the bridges: `session.rs` (`session.*`), `task.rs` (`tool.*`, `task.*`), `events.rs`
//! (`events.subscribe`, `inbox.*`), `schedule.rs` (`schedule.*`), `daemon.rs` (`initialize`,
//! `daemon.status`). [`route`] only routes: who may call what is the caller's scope
//! (`scope.rs`), checked before a handler runs.

mod daemon;
mod events;
mod schedule;
pub(super) mod session;
mod task;

use std::future::Future;
use std::sync::Arc;

use serde_json::Value;

use super::rpc::{parse, Reply};
use super::scope::Caller;
use super::Daemon;
use crate::protocol::RpcError;

/// Answers `method` for `caller`: refused unless the caller's scope serves it, its params
/// read as the scope reads them, then handed to the method's handler.
pub(super) async fn route(
    d: &Arc<Daemon>,
    caller: &Caller,
    method: &str,
    p: Value,
    closed: impl Future<Output = ()>,
) -> Result<Reply, RpcError> {
    caller.admitted()?;
    if !caller.serves(method) {
        return Err(caller.method_not_found(method));
    }
    let p = caller.scoped_params(method, p)?;
    match method {
        "initialize" => daemon::initialize(caller.host()?, parse(method, p)?),
        "session.open" => session::open(d, caller.host()?, parse(method, p)?),
        "session.close" => session::close(d, caller.host()?, parse(method, p)?).await,
        "session.status" => session::status(d, caller.host()?, parse(method, p)?),
        "session.list" => session::list(d, caller.host()?),
        "tool.list" => task::tools(d),
        "tool.call" => task::call(d, caller, parse(method, p)?, closed).await,
        "task.list" => task::list(d, caller, parse(method, p)?),
        "task.get" => task::get(d, caller, parse(method, p)?),
        "task.output" => task::output(d, caller, parse(method, p)?),
        "task.wait" => task::wait(d, caller, parse(method, p)?, closed).await,
        "task.cancel" => task::cancel(d, caller, parse(method, p)?).await,
        "task.message" => task::message(d, caller.host()?, parse(method, p)?),
        "task.answer" => task::answer(d, caller.host()?, parse(method, p)?),
        "task.background" => task::background(d, caller.host()?, parse(method, p)?),
        "task.request_input" => task::request_input(d, caller, parse(method, p)?, closed).await,
        "events.subscribe" => events::subscribe(d, caller.host()?, parse(method, p)?).await,
        "inbox.list" => events::inbox_list(d, caller.host()?, parse(method, p)?),
        "inbox.ack" => events::inbox_ack(d, caller.host()?, parse(method, p)?),
        "schedule.create" => schedule::create(d, caller.host()?, parse(method, p)?),
        "schedule.list" => schedule::list(d, caller.host()?, parse(method, p)?),
        "schedule.cancel" => schedule::cancel(d, caller.host()?, parse(method, p)?).await,
        "daemon.status" => daemon::status(d, caller.host()?, parse(method, p)?),
        other => Err(caller.method_not_found(other)),
    }
}

#[cfg(test)]
mod tests {
    use crate::protocol::{BRIDGE_METHODS, METHODS};

    /// Every method a caller may be served has a route (the match above).
    #[test]
    fn every_method_has_a_route() {
        let src = include_str!("mod.rs");
        for m in METHODS.iter().chain(BRIDGE_METHODS) {
            assert!(src.contains(&format!("\"{m}\" =>")), "{m} has no route");
        }
    }

    /// The bridge's allow-list is the one docs/plugins.md documents ("The bridge").
    #[test]
    fn the_bridge_serves_the_documented_methods() {
        let doc = include_str!("../../../../docs/plugins.md");
        let start = doc
            .find("## The bridge")
            .expect("docs/plugins.md has The bridge");
        let section = &doc[start..];
        let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
        for m in BRIDGE_METHODS {
            let named = [format!("`{m}`"), format!("`{m} ")];
            assert!(
                named.iter().any(|n| section.contains(n.as_str())),
                "{m} is not documented"
            );
        }
        for m in METHODS.iter().filter(|m| !BRIDGE_METHODS.contains(m)) {
            assert!(
                !section.contains(&format!("| `{m}`")),
                "{m} is documented as served on the bridge"
            );
        }
    }
}
