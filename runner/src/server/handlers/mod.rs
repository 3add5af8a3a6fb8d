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
use crate::protocol::{Method, RpcError};

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
    let m = Method::from_name(method)
        .filter(|m| caller.serves(*m))
        .ok_or_else(|| caller.method_not_found(method))?;
    let p = caller.scoped_params(m, p)?;
    let name = m.name();
    match m {
        Method::Initialize => daemon::initialize(caller.host()?, parse(name, p)?),
        Method::SessionOpen => session::open(d, caller.host()?, parse(name, p)?),
        Method::SessionClose => session::close(d, caller.host()?, parse(name, p)?).await,
        Method::SessionStatus => session::status(d, caller.host()?, parse(name, p)?),
        Method::SessionList => session::list(d, caller.host()?),
        Method::ToolList => task::tools(d),
        Method::ToolCall => task::call(d, caller, parse(name, p)?, closed).await,
        Method::TaskList => task::list(d, caller, parse(name, p)?),
        Method::TaskGet => task::get(d, caller, parse(name, p)?),
        Method::TaskOutput => task::output(d, caller, parse(name, p)?),
        Method::TaskWait => task::wait(d, caller, parse(name, p)?, closed).await,
        Method::TaskCancel => task::cancel(d, caller, parse(name, p)?).await,
        Method::TaskMessage => task::message(d, caller.host()?, parse(name, p)?),
        Method::TaskAnswer => task::answer(d, caller.host()?, parse(name, p)?),
        Method::TaskBackground => task::background(d, caller.host()?, parse(name, p)?),
        Method::TaskRequestInput => task::request_input(d, caller, parse(name, p)?, closed).await,
        Method::EventsSubscribe => events::subscribe(d, caller.host()?, parse(name, p)?).await,
        Method::InboxList => events::inbox_list(d, caller.host()?, parse(name, p)?),
        Method::InboxAck => events::inbox_ack(d, caller.host()?, parse(name, p)?),
        Method::ScheduleCreate => schedule::create(d, caller.host()?, parse(name, p)?),
        Method::ScheduleList => schedule::list(d, caller.host()?, parse(name, p)?),
        Method::ScheduleCancel => schedule::cancel(d, caller.host()?, parse(name, p)?).await,
        Method::DaemonStatus => daemon::status(d, caller.host()?, parse(name, p)?),
    }
}

#[cfg(test)]
mod tests {
    use crate::protocol::Method;

    /// Every method has one name, and the name leads back to it.
    #[test]
    fn names_round_trip() {
        for m in Method::ALL {
            assert_eq!(Method::from_name(m.name()), Some(*m));
            assert!(
                m.for_hosts() || m.for_bridges(),
                "{m:?} is served to no one"
            );
        }
        assert_eq!(Method::from_name("task.nope"), None);
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
        for m in Method::ALL.iter().filter(|m| m.for_bridges()) {
            let m = m.name();
            let named = [format!("`{m}`"), format!("`{m} ")];
            assert!(
                named.iter().any(|n| section.contains(n.as_str())),
                "{m} is not documented"
            );
        }
        for m in Method::ALL.iter().filter(|m| !m.for_bridges()) {
            assert!(
                !section.contains(&format!("| `{}`", m.name())),
                "{} is documented as served on the bridge",
                m.name()
            );
        }
    }
}
