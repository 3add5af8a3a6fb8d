//! Each user's share of the control socket (`[per_user]` in the configuration): open
//! connections, and bytes of request lines received but not yet complete. One user at a
//! limit is refused (`limit_exceeded`); nobody else notices.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::config::PerUser;

#[derive(Default)]
struct Held {
    connections: usize,
    buffered: usize,
}

/// What every uid holds now.
#[derive(Default)]
pub(super) struct Shares {
    by_uid: Mutex<HashMap<u32, Held>>,
    /// Connections open over every uid (`max_connections`).
    total: std::sync::atomic::AtomicUsize,
}

impl Shares {
    fn lock(&self) -> MutexGuard<'_, HashMap<u32, Held>> {
        self.by_uid.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a new connection of `uid`, or says why it may not have one: the daemon's
    /// `max_connections`, or the user's `per_user.connections`.
    pub(super) fn connect(
        self: &Arc<Self>,
        uid: u32,
        limits: &PerUser,
        max_connections: usize,
    ) -> Result<Connection, Full> {
        use std::sync::atomic::Ordering;
        let mut map = self.lock();
        let total = self.total.load(Ordering::Relaxed);
        if total >= max_connections {
            return Err(Full::Daemon {
                open: total,
                max: max_connections,
            });
        }
        let held = map.entry(uid).or_default();
        if held.connections >= limits.connections {
            return Err(Full::User {
                uid,
                open: held.connections,
                max: limits.connections,
            });
        }
        held.connections += 1;
        self.total.fetch_add(1, Ordering::Relaxed);
        Ok(Connection {
            shares: self.clone(),
            uid,
            limit: limits.buffered_bytes,
            buffered: 0,
        })
    }
}

/// Why [`Shares::connect`] refuses a connection (`limit_exceeded`).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Full {
    #[error(
        "the daemon has {open} connections open: max_connections ({max}) is reached; try again once some close"
    )]
    Daemon { open: usize, max: usize },
    #[error("uid {uid} has {open} connections open: per_user.connections ({max}) is reached; close some")]
    User { uid: u32, open: usize, max: usize },
}

/// One counted connection; gives its share back when dropped.
pub(super) struct Connection {
    shares: Arc<Shares>,
    uid: u32,
    limit: usize,
    /// Bytes of the unfinished line this connection holds.
    buffered: usize,
}

impl Connection {
    /// The unfinished line now holds `len` bytes; false if that takes the user past
    /// `per_user.buffered_bytes`.
    pub(super) fn hold(&mut self, len: usize) -> bool {
        let mut map = self.shares.lock();
        let held = map.entry(self.uid).or_default();
        let total = held.buffered - self.buffered + len;
        if len > self.buffered && total > self.limit {
            return false;
        }
        held.buffered = total;
        self.buffered = len;
        true
    }

    /// The message for a refusal by [`Connection::hold`].
    pub(super) fn over_message(&self) -> String {
        format!(
            "uid {} holds more than {} bytes of unfinished request lines: per_user.buffered_bytes is reached; the connection is closed",
            self.uid, self.limit
        )
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        let mut map = self.shares.lock();
        if let Some(held) = map.get_mut(&self.uid) {
            held.connections = held.connections.saturating_sub(1);
            held.buffered = held.buffered.saturating_sub(self.buffered);
            if held.connections == 0 {
                map.remove(&self.uid);
            }
        }
        let left = self.shares.total.fetch_sub(1, Ordering::Relaxed) - 1;
        drop(map);
        // Once a crowd of connections has gone, give the memory they used back to the
        // system (the allocator keeps freed memory for reuse otherwise).
        if left.is_multiple_of(1024) {
            crate::sys::trim_heap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_per_user_and_given_back() {
        let shares = Arc::new(Shares::default());
        let limits = PerUser {
            connections: 2,
            buffered_bytes: 100,
            ..PerUser::default()
        };
        let mut a1 = shares.connect(1, &limits, 100).unwrap();
        let mut a2 = shares.connect(1, &limits, 100).unwrap();
        assert!(
            shares.connect(1, &limits, 100).is_err(),
            "a third connection of uid 1"
        );
        let mut b = shares.connect(2, &limits, 100).unwrap();
        assert!(
            shares.connect(3, &limits, 3).is_err(),
            "the daemon's own cap counts every uid"
        );
        assert!(a1.hold(60));
        assert!(!a2.hold(60), "uid 1 would hold 120 bytes");
        assert!(a2.hold(40));
        assert!(b.hold(100), "uid 2 has its own share");
        assert!(a1.hold(0));
        assert!(a2.hold(100));
        drop(a1);
        let _a3 = shares.connect(1, &limits, 100).unwrap();
        drop(a2);
        assert!(shares.lock().get(&1).is_some_and(|h| h.buffered == 0));
    }
}
