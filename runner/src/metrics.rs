//! Process-wide counters for `daemon.status` (and its Prometheus rendering): plain atomics
//! that the layers which see an occurrence bump, and nothing else reads but the status.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::protocol::TaskState;

/// Notifications pushed to at least one subscribed host.
static WAKES_PUSHED: AtomicU64 = AtomicU64::new(0);
/// Resource limits hit by runs (`result.json`'s `violations`, one per entry).
static VIOLATIONS: AtomicU64 = AtomicU64::new(0);

/// Runs settled, by terminal state: succeeded, failed, canceled.
static SETTLED: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

/// Counts a run's terminal state (live states are counted from the registry instead).
pub(crate) fn settled(state: TaskState) {
    let i = match state {
        TaskState::Succeeded => 0,
        TaskState::Failed => 1,
        TaskState::Canceled => 2,
        TaskState::Queued
        | TaskState::Running
        | TaskState::AwaitingInput
        | TaskState::Scheduled => return,
    };
    SETTLED[i].fetch_add(1, Ordering::Relaxed);
}

/// `(succeeded, failed, canceled)` since the daemon started.
pub(crate) fn settled_counts() -> [(TaskState, u64); 3] {
    [
        (TaskState::Succeeded, SETTLED[0].load(Ordering::Relaxed)),
        (TaskState::Failed, SETTLED[1].load(Ordering::Relaxed)),
        (TaskState::Canceled, SETTLED[2].load(Ordering::Relaxed)),
    ]
}

/// `task.wait` calls waiting for a live run now.
static WAITS: AtomicU64 = AtomicU64::new(0);

/// One `task.wait` waiting for a live run, counted in [`waits`] while it is held.
pub(crate) struct Waiting(());

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Counts a `task.wait` as waiting until the returned guard drops.
pub(crate) fn waiting() -> Waiting {
    WAITS.fetch_add(1, Ordering::Relaxed);
    Waiting(())
}

pub(crate) fn waits() -> u64 {
    WAITS.load(Ordering::Relaxed)
}

pub(crate) fn wake_pushed() {
    WAKES_PUSHED.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn violations_seen(n: usize) {
    VIOLATIONS.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn wakes_pushed() -> u64 {
    WAKES_PUSHED.load(Ordering::Relaxed)
}

pub(crate) fn violations() -> u64 {
    VIOLATIONS.load(Ordering::Relaxed)
}
