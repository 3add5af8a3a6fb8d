//! Wakes, routes and live events (docs/protocol.md).
//!
//! The hub follows the registry's event log: after every commit the registry bumps its last
//! seq, the hub reads the new events and pushes `task.updated` and `notification` messages to
//! every live route of the event's session. A route is a connection that called
//! `events.subscribe`. Each connection has a bounded push queue: a subscriber that stops
//! reading gets one `events.gap {from_seq}` and nothing more until it subscribes again, so it
//! never stalls the daemon, the runs or the other subscribers.

#[cfg(test)]
mod tests;
pub(crate) mod text;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Mutex, Notify};
use tracing::warn;

use crate::protocol::{NotificationNotification, TaskUpdatedNotification};
use crate::registry::{Entity, EventRef, Registry, RegistryError, Routable};

/// Pushes a connection may have queued before it is cut off with `events.gap`.
pub(crate) const PUSH_QUEUE: usize = 4096;

/// Where one connection's pushes go.
#[derive(Debug, Clone)]
pub(crate) struct PushChannel {
    pub push: mpsc::Sender<String>,
    pub gap: watch::Sender<Option<i64>>,
}

struct Route {
    uid: u32,
    /// `None`: every session the uid owns (root: all), including ones opened later.
    sessions: Option<HashSet<String>>,
    channel: PushChannel,
    gapped: bool,
}

struct State {
    cursor: i64,
    routes: HashMap<u64, Route>,
    owners: HashMap<String, u32>,
}

pub(crate) struct Hub {
    registry: Arc<Registry>,
    state: Mutex<State>,
    /// Wakes the scheduler when routes come and go.
    pub routes_changed: Arc<Notify>,
    /// Wakes the hub's own loop when a route is added: with none, commits do not wake it.
    route_added: Notify,
    /// Set when the daemon stops; the hub's thread then ends.
    stop: watch::Sender<bool>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn push_line(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

impl Hub {
    pub(crate) fn new(registry: Arc<Registry>) -> Result<Arc<Hub>, RegistryError> {
        let cursor = registry.last_seq()?;
        Ok(Arc::new(Hub {
            registry,
            state: Mutex::new(State {
                cursor,
                routes: HashMap::new(),
                owners: HashMap::new(),
            }),
            routes_changed: Arc::new(Notify::new()),
            route_added: Notify::new(),
            stop: watch::channel(false).0,
            thread: std::sync::Mutex::new(None),
        }))
    }

    /// Follows the event log for the daemon's life, on a thread of its own: the runtime's
    /// workers are shared by every connection and run, and under load a push waiting for a
    /// turn among them fell tens of milliseconds behind the commit it announces.
    pub(crate) fn start(self: Arc<Self>) -> std::io::Result<()> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("sidejob-hub".into())
            .spawn(move || rt.block_on(me.run()))?;
        *self.thread.lock().unwrap_or_else(|e| e.into_inner()) = Some(thread);
        Ok(())
    }

    /// Ends the hub's thread (and with it its hold on the registry, which checkpoints when
    /// the last holder lets go).
    pub(crate) fn stop(&self) {
        self.stop.send_replace(true);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    async fn run(self: Arc<Self>) {
        let mut seq = self.registry.subscribe_seq();
        let mut stop = self.stop.subscribe();
        loop {
            let idle = {
                let mut st = self.state.lock().await;
                self.publish(&mut st);
                st.routes.is_empty()
            };
            // With nobody subscribed, a commit has nothing to push: this thread sleeps until
            // a subscription (which catches up from the log itself) instead of waking on
            // every commit, alongside the run the commit belongs to.
            if idle {
                tokio::select! {
                    _ = self.route_added.notified() => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                continue;
            }
            tokio::select! {
                changed = seq.changed() => if changed.is_err() {
                    return;
                },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Pushes what has been committed, now, on the calling thread, unless the hub's thread
    /// is at it. A runtime worker that has just settled a task calls it: the push then wakes
    /// the connection's writer on that same worker, where through the hub's thread it took
    /// two more wake-ups (the hub's thread, then another worker), each of which a busy
    /// machine can delay by a scheduler slice. Nothing depends on it: the hub's thread
    /// follows every commit, and whoever holds the state pushes in seq order.
    pub(crate) fn publish_now(&self) {
        if let Ok(mut st) = self.state.try_lock() {
            self.publish(&mut st);
        }
    }

    /// [`Hub::publish_new`], its failure logged (the next commit tries again).
    fn publish(&self, st: &mut State) {
        if let Err(e) = self.publish_new(st) {
            warn!("cannot publish events: {e}");
        }
    }

    fn owner(&self, st: &mut State, session_id: &str) -> Option<u32> {
        if let Some(uid) = st.owners.get(session_id) {
            return Some(*uid);
        }
        let uid = self.registry.session_owner(session_id).ok().flatten()?;
        st.owners.insert(session_id.to_owned(), uid);
        Some(uid)
    }

    /// Pushes every event after the cursor to the routes it concerns.
    fn publish_new(&self, st: &mut State) -> Result<(), RegistryError> {
        if st.routes.is_empty() {
            // Nobody to push to: nothing to read (a subscriber catches up from the log as
            // it subscribes). Reading anyway contends with the writer for SQLite's shared
            // memory index just as the call that committed is answering.
            st.cursor = st.cursor.max(self.registry.newest_seq());
            return Ok(());
        }
        loop {
            let events = self.registry.events_after(st.cursor, 1000)?;
            let Some(last) = events.last().map(|e| e.seq) else {
                return Ok(());
            };
            // A task.updated carries the task as it is now, so of several changes of one
            // task in this batch only the last needs a push: the others would say the
            // same (and under load, a reader that keeps up is what matters).
            let last_of_task: HashMap<&str, i64> = events
                .iter()
                .filter(|e| e.entity == Entity::Task)
                .map(|e| (e.entity_id.as_str(), e.seq))
                .collect();
            for ev in &events {
                if ev.entity == Entity::Task
                    && last_of_task.get(ev.entity_id.as_str()) != Some(&ev.seq)
                {
                    continue;
                }
                let Some(session) = ev.session_id.clone() else {
                    continue;
                };
                let owner = self.owner(st, &session);
                let targets: Vec<u64> = st
                    .routes
                    .iter()
                    .filter(|(_, r)| !r.gapped && route_matches(r, &session, owner))
                    .map(|(id, _)| *id)
                    .collect();
                if targets.is_empty() {
                    continue;
                }
                let Some(line) = self.message_for(ev)? else {
                    continue;
                };
                if ev.entity == Entity::Notification {
                    crate::metrics::wake_pushed();
                }
                for id in targets {
                    send(st, id, ev.seq, line.clone());
                }
            }
            st.cursor = last;
        }
    }

    fn message_for(&self, ev: &EventRef) -> Result<Option<String>, RegistryError> {
        Ok(match (ev.entity, ev.kind.as_str()) {
            (Entity::Task, _) => self.registry.get_task_committed(&ev.entity_id)?.map(|t| {
                push_line(
                    "task.updated",
                    json!(TaskUpdatedNotification {
                        seq: ev.seq,
                        task: t.to_wire()
                    }),
                )
            }),
            (Entity::Notification, "notification.created") => {
                self.registry.get_notification(&ev.entity_id)?.map(|n| {
                    push_line(
                        "notification",
                        json!(NotificationNotification {
                            seq: ev.seq,
                            notification: n.to_wire()
                        }),
                    )
                })
            }
            (Entity::Notification | Entity::Session | Entity::Schedule, _) => None,
        })
    }

    /// Registers (or replaces) a connection's route, pushes its unacked notifications again
    /// and, with `since_seq`, the task changes it missed. Returns the current seq.
    ///
    /// The backlog is sent before the route goes live, waiting for the connection to take
    /// it (a slow reader slows only its own subscribe); what happened meanwhile is sent as
    /// the route goes live, so nothing falls between the two.
    pub(crate) async fn subscribe(
        &self,
        conn_id: u64,
        uid: u32,
        sessions: Option<Vec<String>>,
        since_seq: Option<i64>,
        channel: PushChannel,
    ) -> Result<i64, RegistryError> {
        // A resubscribe replaces the old route; until the new one is live, nothing is pushed.
        self.state.lock().await.routes.remove(&conn_id);
        let _ = channel.gap.send(None);
        let explicit: Option<HashSet<String>> = sessions.map(|s| s.into_iter().collect());
        let session_list: Vec<String> = match &explicit {
            Some(s) => s.iter().cloned().collect(),
            None => self
                .registry
                .list_sessions((uid != 0).then_some(uid))?
                .into_iter()
                .map(|s| s.session_id)
                .collect(),
        };
        let snapshot = {
            let mut st = self.state.lock().await;
            self.publish_new(&mut st)?;
            st.cursor
        };
        let mut backlog: Vec<(i64, String)> = Vec::new();
        for session in &session_list {
            for (seq, n) in self.registry.unacked_with_seq(session)? {
                backlog.push((
                    seq,
                    push_line(
                        "notification",
                        json!(NotificationNotification {
                            seq,
                            notification: n.to_wire()
                        }),
                    ),
                ));
            }
        }
        if let Some(since) = since_seq {
            backlog.extend(self.task_changes(&session_list, since, snapshot)?);
        }
        backlog.sort_by_key(|(seq, _)| *seq);
        for (_, line) in backlog {
            if channel.push.send(line).await.is_err() {
                return Ok(snapshot); // the connection is gone
            }
        }
        let mut st = self.state.lock().await;
        self.publish_new(&mut st)?;
        let catch_up = self.task_changes(&session_list, snapshot, st.cursor)?;
        let mut fresh_notes = Vec::new();
        for session in &session_list {
            for (seq, n) in self.registry.unacked_with_seq(session)? {
                if seq > snapshot {
                    fresh_notes.push((
                        seq,
                        push_line(
                            "notification",
                            json!(NotificationNotification {
                                seq,
                                notification: n.to_wire()
                            }),
                        ),
                    ));
                }
            }
        }
        st.routes.insert(
            conn_id,
            Route {
                uid,
                sessions: explicit,
                channel,
                gapped: false,
            },
        );
        let mut late: Vec<(i64, String)> = catch_up.into_iter().chain(fresh_notes).collect();
        late.sort_by_key(|(seq, _)| *seq);
        for (seq, line) in late {
            send(&mut st, conn_id, seq, line);
        }
        let cursor = st.cursor;
        drop(st);
        self.routes_changed.notify_one();
        self.route_added.notify_one();
        Ok(cursor)
    }

    /// `task.updated` pushes for the tasks of `sessions` that changed in `(after, upto]`,
    /// one per task (its latest state).
    fn task_changes(
        &self,
        sessions: &[String],
        after: i64,
        upto: i64,
    ) -> Result<Vec<(i64, String)>, RegistryError> {
        let wanted: HashSet<&String> = sessions.iter().collect();
        let mut latest: HashMap<String, i64> = HashMap::new();
        let mut from = after;
        while from < upto {
            let events = self.registry.events_after(from, 5000)?;
            let Some(last) = events.last().map(|e| e.seq) else {
                break;
            };
            for ev in events
                .iter()
                .filter(|e| e.seq <= upto && e.entity == Entity::Task)
            {
                if ev.session_id.as_ref().is_some_and(|s| wanted.contains(s)) {
                    latest.insert(ev.entity_id.clone(), ev.seq);
                }
            }
            from = last;
        }
        let mut out = Vec::new();
        for (task_id, seq) in latest {
            if let Some(t) = self.registry.get_task(&task_id)? {
                out.push((
                    seq,
                    push_line(
                        "task.updated",
                        json!(TaskUpdatedNotification {
                            seq,
                            task: t.to_wire()
                        }),
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// Forgets a connection's route (it closed).
    pub(crate) async fn unsubscribe(&self, conn_id: u64) {
        if self.state.lock().await.routes.remove(&conn_id).is_some() {
            self.routes_changed.notify_one();
        }
    }

    /// The sessions that have a live route now.
    pub(crate) async fn routable(&self) -> Routable {
        let st = self.state.lock().await;
        let mut r = Routable::default();
        for route in st.routes.values() {
            match &route.sessions {
                Some(s) => r.sessions.extend(s.iter().cloned()),
                None if route.uid == 0 => r.everyone = true,
                None => r.owners.push(route.uid),
            }
        }
        r.sessions.sort();
        r.sessions.dedup();
        r.owners.sort();
        r.owners.dedup();
        r
    }
}

fn route_matches(r: &Route, session: &str, owner: Option<u32>) -> bool {
    match &r.sessions {
        Some(s) => s.contains(session),
        None => r.uid == 0 || owner == Some(r.uid),
    }
}

/// Queues one push; on overflow the route gets `events.gap` once and no more pushes.
fn send(st: &mut State, conn_id: u64, seq: i64, line: String) {
    let Some(route) = st.routes.get_mut(&conn_id) else {
        return;
    };
    if route.gapped {
        return;
    }
    match route.channel.push.try_send(line) {
        Ok(()) => {}
        Err(mpsc::error::TrySendError::Full(_)) => {
            route.gapped = true;
            let _ = route.channel.gap.send(Some(seq));
        }
        Err(mpsc::error::TrySendError::Closed(_)) => {
            st.routes.remove(&conn_id);
        }
    }
}
