//! The hub against a real registry: who is pushed what, a slow reader cut off with one
//! `events.gap`, and a resubscribe catching up from `since_seq`.

use std::time::Duration;

use serde_json::Value;

use super::*;
use crate::protocol::TaskState;
use crate::registry::fixtures::session;
use crate::registry::fixtures::{call as task, ended};
use crate::scratch::ScratchDir;

struct Fixture {
    _dir: ScratchDir,
    registry: Arc<Registry>,
    hub: Arc<Hub>,
}

/// A registry with sessions `a` (uid 1000) and `b` (uid 1001), and a running hub.
fn fixture() -> Fixture {
    let dir = ScratchDir::new("wake");
    let registry = Arc::new(Registry::open(dir.path()).unwrap());
    registry.insert_session(&session("a", 1000, None)).unwrap();
    registry.insert_session(&session("b", 1001, None)).unwrap();
    let hub = Hub::new(registry.clone()).unwrap();
    hub.clone().start().unwrap();
    Fixture {
        _dir: dir,
        registry,
        hub,
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        self.hub.stop();
    }
}

fn channel(
    capacity: usize,
) -> (
    PushChannel,
    mpsc::Receiver<String>,
    watch::Receiver<Option<i64>>,
) {
    let (push, rx) = mpsc::channel(capacity);
    let (gap, gap_rx) = watch::channel(None);
    (PushChannel { push, gap }, rx, gap_rx)
}

/// The next push, as JSON, within five seconds.
async fn next(rx: &mut mpsc::Receiver<String>) -> Value {
    let line = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a push within 5 s")
        .expect("the channel is open");
    serde_json::from_str(&line).unwrap()
}

#[tokio::test]
async fn a_subscriber_hears_of_its_own_sessions_only() {
    let f = fixture();
    let (mine, mut mine_rx, _) = channel(16);
    let (theirs, mut theirs_rx, _) = channel(16);
    f.hub.subscribe(1, 1000, None, None, mine).await.unwrap();
    f.hub.subscribe(2, 1001, None, None, theirs).await.unwrap();
    let a = session("a", 1000, None);
    f.registry.insert_task(&task("ta", &a)).unwrap();
    let push = next(&mut mine_rx).await;
    assert_eq!(push["method"], "task.updated");
    assert_eq!(push["params"]["task"]["task_id"], "ta");
    assert_eq!(push["params"]["task"]["state"], "queued");
    // uid 1001 hears nothing of it, only of its own session's task.
    let b = session("b", 1001, None);
    f.registry.insert_task(&task("tb", &b)).unwrap();
    let push = next(&mut theirs_rx).await;
    assert_eq!(push["params"]["task"]["task_id"], "tb");
    assert!(
        mine_rx.try_recv().is_err(),
        "uid 1000 heard of uid 1001's task"
    );
    let routable = f.hub.routable().await;
    assert_eq!(routable.owners, vec![1000, 1001]);
    assert!(!routable.everyone);
}

#[tokio::test]
async fn a_reader_that_falls_behind_gets_one_gap_and_nothing_more() {
    let f = fixture();
    let (slow, mut slow_rx, mut gap) = channel(1);
    f.hub
        .subscribe(1, 1000, Some(vec!["a".into()]), None, slow)
        .await
        .unwrap();
    let a = session("a", 1000, None);
    for i in 0..4 {
        f.registry.insert_task(&task(&format!("t{i}"), &a)).unwrap();
        // One commit at a time, so the hub cannot fold them into one push.
        let want = f.registry.newest_seq();
        tokio::time::timeout(Duration::from_secs(5), async {
            while f.hub.state.lock().await.cursor < want {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the hub reads each commit");
    }
    tokio::time::timeout(Duration::from_secs(5), gap.changed())
        .await
        .expect("a gap")
        .unwrap();
    let from = gap.borrow().expect("the gap's seq");
    assert!(from > 0);
    // The one push that fitted, then nothing: the reader must subscribe again.
    assert_eq!(next(&mut slow_rx).await["params"]["task"]["task_id"], "t0");
    assert!(slow_rx.try_recv().is_err());
}

#[tokio::test]
async fn a_resubscribe_catches_up_with_each_task_once_in_its_latest_state() {
    let f = fixture();
    let since = f.registry.newest_seq();
    let a = session("a", 1000, None);
    f.registry.insert_task(&task("t1", &a)).unwrap();
    f.registry
        .mark_started("t1", "a", 1, 1, &crate::ids::now_rfc3339())
        .unwrap();
    f.registry
        .settle("t1", "a", &ended(TaskState::Succeeded, 0), None)
        .unwrap();
    let b = session("b", 1001, None);
    f.registry.insert_task(&task("other", &b)).unwrap();
    let (ch, mut rx, _) = channel(16);
    f.hub
        .subscribe(1, 1000, Some(vec!["a".into()]), Some(since), ch)
        .await
        .unwrap();
    let push = next(&mut rx).await;
    assert_eq!(push["params"]["task"]["task_id"], "t1");
    assert_eq!(push["params"]["task"]["state"], "succeeded");
    assert!(rx.try_recv().is_err(), "t1 once, and nothing of session b");
    f.hub.unsubscribe(1).await;
    assert!(f.hub.routable().await.sessions.is_empty());
}
