//! The registry on a real SQLite file in a scratch directory: states move only the ways the
//! protocol allows, a result is delivered once, the counts follow the rows, and the event
//! log rebuilds every row.

use std::os::unix::fs::PermissionsExt;

use super::fixtures::{call as task, ended as settlement};
use super::*;
use crate::protocol::FailReason;
use crate::scratch::ScratchDir;

/// A registry with one open session `s1` of uid 1000 holding task `t1`, queued.
fn with_a_task() -> (ScratchDir, Registry, SessionRow) {
    let dir = ScratchDir::new("registry");
    let r = Registry::open(dir.path()).unwrap();
    let s = super::fixtures::session("s1", 1000, None);
    r.insert_session(&s).unwrap();
    r.insert_task(&task("t1", &s)).unwrap();
    (dir, r, s)
}

#[test]
fn the_file_is_its_owners_alone() {
    let (_dir, r, _) = with_a_task();
    let mode = std::fs::metadata(r.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{:o}", mode);
}

#[test]
fn a_task_goes_queued_running_settled_and_keeps_its_result() {
    let (_dir, r, _) = with_a_task();
    assert_eq!(r.get_task("t1").unwrap().unwrap().state, TaskState::Queued);
    r.mark_started("t1", "s1", 4242, 77, &crate::ids::now_rfc3339())
        .unwrap();
    let t = r.get_task("t1").unwrap().unwrap();
    assert_eq!(
        (t.state, t.supervisor_pid),
        (TaskState::Running, Some(4242))
    );
    let settled = r
        .settle("t1", "s1", &settlement(TaskState::Failed, 3), None)
        .unwrap()
        .unwrap();
    assert_eq!(settled.state, TaskState::Failed);
    assert_eq!(settled.reason, Some(FailReason::ExitCode));
    assert_eq!(settled.exit_code, Some(3));
    assert_eq!(settled.delivery, Some(Delivery::Pending));
    assert_eq!(r.get_task("t1").unwrap().unwrap(), settled);
    assert!(r.get_task("t2").unwrap().is_none());
}

#[test]
fn a_result_is_delivered_once() {
    let (_dir, r, _) = with_a_task();
    // Nothing to claim before it settles.
    assert!(!r
        .claim_delivery("t1", Delivery::Pending, Delivery::Wait)
        .unwrap());
    r.settle("t1", "s1", &settlement(TaskState::Succeeded, 0), None)
        .unwrap();
    assert!(r
        .claim_delivery("t1", Delivery::Pending, Delivery::Wait)
        .unwrap());
    // The wake that comes second finds it taken.
    assert!(!r
        .claim_delivery("t1", Delivery::Pending, Delivery::Wake)
        .unwrap());
    assert_eq!(
        r.get_task("t1").unwrap().unwrap().delivery,
        Some(Delivery::Wait)
    );
    assert!(!r
        .claim_delivery("nope", Delivery::Pending, Delivery::Wait)
        .unwrap());
}

#[test]
fn the_counts_follow_the_states() {
    let (_dir, r, s) = with_a_task();
    let count = |what| r.count_of(1000, what).unwrap();
    assert_eq!(count(Holding::QueuedCalls), 1);
    assert_eq!(count(Holding::RunningCalls), 0);
    assert_eq!(count(Holding::OpenSessions), 1);
    r.mark_started("t1", "s1", 1, 1, &crate::ids::now_rfc3339())
        .unwrap();
    assert_eq!(count(Holding::QueuedCalls), 0);
    assert_eq!(count(Holding::RunningCalls), 1);
    // Waiting for an answer still holds a run slot.
    assert!(r.mark_awaiting_input("t1", "s1", None).unwrap());
    assert_eq!(count(Holding::RunningCalls), 1);
    r.insert_task(&task("t2", &s)).unwrap();
    assert_eq!(count(Holding::QueuedCalls), 1);
    // Another uid's rows are not counted.
    assert_eq!(r.count_of(1001, Holding::QueuedCalls).unwrap(), 0);
    r.close_session("s1").unwrap();
    assert_eq!(count(Holding::OpenSessions), 0);
    let states: std::collections::HashMap<_, _> =
        r.count_states("s1").unwrap().into_iter().collect();
    assert_eq!(states.get(&TaskState::AwaitingInput), Some(&1));
    assert_eq!(states.get(&TaskState::Queued), Some(&1));
}

#[test]
fn a_question_is_asked_only_by_a_running_task_and_answered_once() {
    let (_dir, r, _) = with_a_task();
    assert!(!r.mark_awaiting_input("t1", "s1", None).unwrap(), "queued");
    r.mark_started("t1", "s1", 1, 1, &crate::ids::now_rfc3339())
        .unwrap();
    assert!(r.mark_awaiting_input("t1", "s1", None).unwrap());
    assert!(!r.mark_awaiting_input("t1", "s1", None).unwrap(), "twice");
    assert!(r.mark_input_answered("t1", "s1").unwrap());
    assert_eq!(r.get_task("t1").unwrap().unwrap().state, TaskState::Running);
    assert!(
        !r.mark_input_answered("t1", "s1").unwrap(),
        "answered twice"
    );
    assert!(!r.abandon_input("t1", "s1").unwrap());
}

#[test]
fn the_event_log_rebuilds_every_row() {
    let (dir, r, s) = with_a_task();
    let before = r.newest_seq();
    r.mark_started("t1", "s1", 1, 1, &crate::ids::now_rfc3339())
        .unwrap();
    r.mark_yielded("t1", "s1").unwrap();
    r.settle("t1", "s1", &settlement(TaskState::Succeeded, 0), None)
        .unwrap();
    r.claim_delivery("t1", Delivery::Pending, Delivery::Wake)
        .unwrap();
    r.insert_task(&task("t2", &s)).unwrap();
    r.hand_over_task("t2", "s2").unwrap();
    r.close_session("s1").unwrap();
    // Every change wrote one event, and seq grew with each.
    assert_eq!(r.newest_seq(), before + 7);
    let events = r.events_after(0, 100).unwrap();
    assert_eq!(events.len(), 9, "two inserts first, then seven changes");
    let report = replay::replay_check(&dir.path().join("sidejob.db")).unwrap();
    assert!(report.ok(), "{:?}", report.differences);
    assert!(report.rows_checked >= 3);
}

#[test]
fn a_row_changed_behind_the_log_is_found() {
    let (dir, r, _) = with_a_task();
    r.write(|tx| {
        tx.execute("UPDATE tasks SET exit_code = 9 WHERE task_id = 't1'", [])?;
        Ok(())
    })
    .unwrap();
    let report = replay::replay_check(&dir.path().join("sidejob.db")).unwrap();
    assert!(!report.ok());
    assert!(
        report.differences.iter().any(|d| d.contains("exit_code")),
        "{:?}",
        report.differences
    );
}

/// The log's frames, and how many of them are in the database, as the wal-index (the
/// `-shm` file, https://www.sqlite.org/walformat.html) says: `mxFrame` in its header,
/// `nBackfill` after the header's two copies.
fn log_frames(db: &std::path::Path) -> (u32, u32) {
    let mut shm = db.as_os_str().to_owned();
    shm.push("-shm");
    let b = std::fs::read(&shm).unwrap();
    let word = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
    (word(16), word(96))
}

#[test]
fn a_write_that_reads_first_survives_the_log_being_emptied_under_it() {
    let (_dir, r, _) = with_a_task();
    // The checkpoint thread's side: the log all copied, so the writer's reads come from the
    // database file alone, the one kind of reader an emptying of the log does not wait for.
    let other = rusqlite::Connection::open(r.path()).unwrap();
    other.busy_timeout(std::time::Duration::ZERO).unwrap();
    let (_, log, copied) = checkpoint::checkpoint(&other, "PASSIVE").unwrap();
    assert_eq!(log, copied);
    // The registry left idle and emptied between a write's read and its change (a settlement
    // reads the row it settles): the change must still commit.
    r.write(|tx| {
        let n: i64 = tx.query_row("SELECT COUNT(*) FROM tasks", [], |row| row.get(0))?;
        let _ = checkpoint::checkpoint(&other, "TRUNCATE");
        tx.execute("UPDATE tasks SET exit_code = ?1 WHERE task_id = 't1'", [n])?;
        Ok(())
    })
    .unwrap();
}

#[test]
fn commits_leave_checkpoints_to_their_thread_which_keeps_up() {
    let (_dir, r, s) = with_a_task();
    // The writer checkpoints only far past SQLite's usual 1 000 pages...
    let limit: u32 = r
        .read(|c| Ok(c.pragma_query_value(None, "wal_autocheckpoint", |v| v.get(0))?))
        .unwrap();
    assert_eq!(limit, checkpoint::WRITER_LIMIT_PAGES);
    // ...so a few thousand pages of commits are left in the log by their commits,
    for i in 0..1500 {
        r.insert_task(&task(&format!("t-{i}"), &s)).unwrap();
    }
    let (frames, _) = log_frames(r.path());
    assert!(frames > 1000, "{frames} frames");
    // and the thread has them all in the database soon after the last.
    let all_copied = || {
        let (frames, copied) = log_frames(r.path());
        copied == frames
    };
    assert!(
        within_10s(all_copied),
        "(frames, checkpointed) {:?} after 10 s",
        log_frames(r.path())
    );
    let tasks = || -> i64 {
        r.read(|c| Ok(c.query_row("SELECT COUNT(*) FROM tasks", [], |row| row.get(0))?))
            .unwrap()
    };
    assert_eq!(tasks(), 1501);
    // Left alone, the log file is emptied: its disk space given back.
    let mut wal = r.path().as_os_str().to_owned();
    wal.push("-wal");
    let wal_len = || std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert!(
        within_10s(|| wal_len() == 0),
        "the log still holds {} bytes 10 s after the last commit",
        wal_len()
    );
    // And the next commit starts it again.
    r.insert_task(&task("t-after", &s)).unwrap();
    assert!(wal_len() > 0);
    assert_eq!(tasks(), 1502);
}

/// Whether `done` holds within 10 s, asked every 20 ms.
fn within_10s(mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}
