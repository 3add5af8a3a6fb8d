//! Checkpoints of the registry's write-ahead log, made on a thread of their own.
//!
//! SQLite's own checkpoint runs inside the commit that finds the log past its limit (1 000
//! pages), so that commit waits for the log's and the database's `fsync`s: a few milliseconds
//! on a busy machine, during which the writer's lock is held and every other write waits too.
//! A run's settlement is such a commit, and its wake is pushed after it, so one settlement in
//! so many carried the whole checkpoint into its exit → notification time (`perf record -e
//! sched:sched_switch -g` of the wakes bench: nine in ten of the daemon's waits for the disk
//! were in `sqlite3WalCheckpoint`, under the settlement's commit).
//!
//! Here the writer only counts its commits; this thread checkpoints on a connection of its
//! own (`PASSIVE`: it never waits for the writer, nor the writer for it) after every
//! [`NUDGE_EVERY`] commits, and at the end of every [`IDLE`] that had a commit. The
//! writer keeps SQLite's checkpoint only as a bound the log should never reach
//! ([`WRITER_LIMIT_PAGES`]). A commit is made durable by the next checkpoint
//! (`synchronous = NORMAL`), so with this thread that is within a second of the last write,
//! where before it waited for the next thousand pages.
//!
//! After that second kind, once the log is all copied, the thread also empties the log file
//! (`TRUNCATE`: it holds the writer's lock, and copies whatever came since the `PASSIVE`
//! checkpoint before the `ftruncate`). A log left at its longest would keep that disk space
//! for good (up to the writer's limit, 64 MiB), and a full disk would be met not by the next
//! commit but at whatever later moment the space the log once took ran out. Waiting for an
//! interval with no commit instead let the log grow while commits flowed, and the daemon's
//! memory with its index, for no measured gain (docs/performance.md).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;
use tracing::{debug, warn};

/// Commits after which the thread is asked for a checkpoint (a commit is a few pages).
const NUDGE_EVERY: u64 = 256;
/// A checkpoint once the registry has had no commit for this long.
const IDLE: Duration = Duration::from_millis(500);
/// The writer's own checkpoint limit, in pages: reached only if this thread falls behind a
/// long burst of writes (it cannot finish a checkpoint while a reader holds old frames).
pub(super) const WRITER_LIMIT_PAGES: u32 = 16_384;

/// The writer's side: counts commits and wakes the thread; joins it when dropped.
pub(super) struct Checkpoints {
    commits: Arc<AtomicU64>,
    nudge: Option<SyncSender<()>>,
    /// Held while a checkpoint is made (see [`Checkpoints::hold`]).
    busy: Arc<Mutex<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpoints {
    /// Starts the thread, on its own connection to `path`. Without a thread (one could not
    /// be started), the writer's checkpoints stay as SQLite makes them.
    pub(super) fn start(path: &Path, writer: &Connection) -> Checkpoints {
        let mut none = Checkpoints {
            commits: Arc::new(AtomicU64::new(0)),
            nudge: None,
            busy: Arc::new(Mutex::new(())),
            thread: None,
        };
        let conn = match Connection::open(path) {
            Ok(c) => c,
            Err(e) => {
                warn!(registry = %path.display(), "no checkpoint thread (cannot open a connection: {e}); commits checkpoint as SQLite does");
                return none;
            }
        };
        // The thread waits for nobody: a checkpoint that finds the database busy does what
        // it can and is tried again later.
        let _ = conn.busy_timeout(Duration::ZERO);
        let (nudge, asked) = mpsc::sync_channel(1);
        let (commits, busy) = (none.commits.clone(), none.busy.clone());
        let spawned = std::thread::Builder::new()
            .name("sidejob-checkpoint".into())
            .spawn(move || run(conn, asked, commits, busy));
        match spawned {
            Ok(thread) => {
                if let Err(e) = writer.pragma_update(None, "wal_autocheckpoint", WRITER_LIMIT_PAGES)
                {
                    warn!("cannot move the writer's checkpoint limit: {e}");
                }
                none.nudge = Some(nudge);
                none.thread = Some(thread);
                none
            }
            Err(e) => {
                warn!("no checkpoint thread ({e}); commits checkpoint as SQLite does");
                none
            }
        }
    }

    /// Counts one commit, asking for a checkpoint every [`NUDGE_EVERY`].
    pub(super) fn committed(&self) {
        let n = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_multiple_of(NUDGE_EVERY) {
            if let Some(nudge) = &self.nudge {
                // Full: a checkpoint is already asked for.
                let _ = nudge.try_send(());
            }
        }
    }

    /// Waits for a checkpoint under way and keeps another from starting until dropped.
    pub(super) fn hold(&self) -> MutexGuard<'_, ()> {
        self.busy.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Checkpoints {
    /// The thread ends once it sees the writer gone; joined, so that its connection is
    /// closed before the writer's (the last connection to close checkpoints the whole log).
    fn drop(&mut self) {
        self.nudge = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(conn: Connection, asked: mpsc::Receiver<()>, commits: Arc<AtomicU64>, busy: Arc<Mutex<()>>) {
    // The commits the log held when it was last emptied.
    let mut emptied = commits.load(Ordering::Relaxed);
    loop {
        // An [`IDLE`] passed, with commits since the log was last emptied: empty it too.
        let lapsed = match asked.recv_timeout(IDLE) {
            Ok(()) => false,
            Err(RecvTimeoutError::Timeout) if commits.load(Ordering::Relaxed) != emptied => true,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let upto = commits.load(Ordering::Relaxed);
        let _held = busy.lock().unwrap_or_else(|e| e.into_inner());
        match checkpoint(&conn, "PASSIVE") {
            Ok((false, log, copied)) if copied >= log => {
                debug!(log, copied, "registry checkpoint");
                if lapsed {
                    match checkpoint(&conn, "TRUNCATE") {
                        Ok((false, 0, _)) => emptied = upto,
                        // A reader or the writer came first: the next interval tries again.
                        Ok(_) => debug!("registry log not emptied: in use"),
                        Err(e) => warn!("registry log not emptied: {e}"),
                    }
                }
            }
            // Stopped short (a reader still on old frames, or the writer's commits coming
            // faster): the next nudge or interval goes on.
            Ok((_, log, copied)) => debug!(log, copied, "registry checkpoint incomplete"),
            Err(e) => warn!("registry checkpoint failed: {e}"),
        }
    }
}

/// One checkpoint in `mode` (`PASSIVE` or `TRUNCATE`): whether it was stopped short, the
/// log's frames, and how many of them are in the database now.
pub(super) fn checkpoint(conn: &Connection, mode: &str) -> rusqlite::Result<(bool, i64, i64)> {
    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
        Ok((r.get::<_, i64>(0)? != 0, r.get(1)?, r.get(2)?))
    })
}
