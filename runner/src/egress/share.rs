//! The daemon's connections through the egress proxy, counted per user and over everyone.
//! Each open connection holds about [`DESCRIPTORS_PER_CONNECTION`] of the daemon's
//! descriptors; a user past `per_user.egress_connections`, or a daemon whose proxied
//! connections would take more than half its descriptor limit, has the next one closed as it
//! comes, so the proxy never takes the descriptors another user's call needs.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// The client's socket, the upstream socket and a pipe each way (see `splice.rs`).
pub(crate) const DESCRIPTORS_PER_CONNECTION: u64 = 6;

/// Who holds how many proxied connections.
#[derive(Debug)]
pub(crate) struct Shares {
    /// `per_user.egress_connections`.
    per_user: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    by_uid: HashMap<u32, usize>,
    total: usize,
}

/// Why a connection was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The user holds their whole share.
    User { uid: u32, held: usize, limit: usize },
    /// Proxied connections would take more than half the daemon's descriptors.
    Daemon { held: usize, limit: usize },
}

impl fmt::Display for Full {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Full::User { uid, held, limit } => write!(
                f,
                "uid {uid} has {held} connections through the egress proxy: per_user.egress_connections ({limit}) is reached"
            ),
            Full::Daemon { held, limit } => write!(
                f,
                "the egress proxy has {held} connections open, its share ({limit}) of the daemon's descriptor limit"
            ),
        }
    }
}

/// One counted connection; its share is given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Ticket {
    shares: Arc<Shares>,
    uid: u32,
}

impl Shares {
    pub(crate) fn new(per_user: usize) -> Arc<Shares> {
        Arc::new(Shares {
            per_user,
            held: Mutex::new(Held::default()),
        })
    }

    /// Counts a new connection of `uid`'s run, or says why it may not have one.
    pub(crate) fn take(self: &Arc<Self>, uid: u32) -> Result<Ticket, Full> {
        self.take_within(uid, daemon_limit())
    }

    fn take_within(self: &Arc<Self>, uid: u32, daemon: usize) -> Result<Ticket, Full> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.total >= daemon {
            return Err(Full::Daemon {
                held: held.total,
                limit: daemon,
            });
        }
        let mine = held.by_uid.entry(uid).or_default();
        if *mine >= self.per_user {
            return Err(Full::User {
                uid,
                held: *mine,
                limit: self.per_user,
            });
        }
        *mine += 1;
        held.total += 1;
        Ok(Ticket {
            shares: self.clone(),
            uid,
        })
    }
}

/// Proxied connections the daemon may hold at once: half its descriptor limit (now, so a
/// limit changed from outside counts).
fn daemon_limit() -> usize {
    let soft = crate::sys::descriptor_limit();
    (soft / 2 / DESCRIPTORS_PER_CONNECTION) as usize
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut held = self.shares.held.lock().unwrap_or_else(|e| e.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.by_uid.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn each_user_has_a_share_and_the_daemon_a_cap_over_everyone() {
        let shares = Shares::new(2);
        let a1 = shares.take_within(1, 3).unwrap();
        let _a2 = shares.take_within(1, 3).unwrap();
        assert_eq!(
            shares.take_within(1, 3).unwrap_err(),
            Full::User {
                uid: 1,
                held: 2,
                limit: 2
            }
        );
        let _b = shares.take_within(2, 3).unwrap();
        assert_eq!(
            shares.take_within(3, 3).unwrap_err(),
            Full::Daemon { held: 3, limit: 3 }
        );
        drop(a1);
        let _a3 = shares.take_within(1, 3).unwrap();
        assert!(daemon_limit() > 0);
    }
}
