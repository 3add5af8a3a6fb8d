//! The delivery decision in the settle path, with a real registry and no run at all: a task
//! is recorded, made live without spawning anything, and settled the way the supervisor's
//! watcher settles it; each case checks what the registry recorded (the delivery, the wake
//! notification) and who heard the result.

use super::*;
use crate::registry::{SessionRow, Settlement};
use crate::run::dir::PrivateDir;
use crate::scratch::ScratchDir;

struct Fixture {
    ex: Arc<Executor>,
    session: SessionRow,
    // Last, so the directory goes after the executor and its registry.
    _root: ScratchDir,
}

fn fixture() -> Fixture {
    let scratch = ScratchDir::new("settle");
    let root = scratch.path();
    let cfg = Arc::new(Config {
        state_dir: root.join("state"),
        shipped_plugins: false,
        ..Config::default()
    });
    std::fs::create_dir_all(&cfg.state_dir).expect("state dir");
    let registry = Arc::new(Registry::open(&cfg.state_dir).expect("registry"));
    let session = SessionRow {
        session_id: "s1".into(),
        owner_uid: crate::sys::getuid(),
        owner_gid: crate::sys::getgid(),
        workspace: root.display().to_string(),
        session_dir: root.join("session").display().to_string(),
        profile: "workspace-write".into(),
        proactive_wake: true,
        parent_session_id: None,
        state: crate::protocol::SessionState::Open,
        created_at: ids::now_rfc3339(),
        closed_at: None,
    };
    registry.insert_session(&session).expect("session");
    let tools = ToolHost::start(&cfg, None);
    let runs = crate::run::dir::RunsDirs::new(cfg.runs_dir(), None);
    let ex = Executor::new(cfg, registry, tools, PathBuf::from("/nonexistent"), runs);
    Fixture {
        ex,
        session,
        _root: scratch,
    }
}

impl Fixture {
    /// A task recorded and live, as if its supervisor ran.
    fn live_task(&self, wake: WakeMode) -> Arc<Live> {
        let mut row = TaskRow::new(
            ids::ulid(),
            &self.session,
            "bash".into(),
            TaskKind::Call,
            "true".into(),
            "{}".into(),
        );
        row.wake = wake;
        self.ex.registry.insert_task(&row).expect("task");
        let private = PrivateDir::new(&self.ex.cfg.runs_dir(), &row.task_id);
        Live::new(&row, private, None, None)
    }

    fn settle(&self, live: &Arc<Live>) -> TaskRow {
        let s = Settlement {
            state: TaskState::Succeeded,
            exit_code: Some(0),
            ..lost_settlement(FailReason::Lost, String::new())
        };
        let mut st = live.lock();
        self.ex
            .attempt_settle(live, &mut st, &Settlement { reason: None, ..s })
            .expect("recorded");
        assert!(st.settled);
        drop(st);
        self.ex
            .registry
            .get_task(&live.task_id)
            .expect("read")
            .expect("task")
    }

    fn wakes(&self, task_id: &str) -> usize {
        self.ex
            .registry
            .list_notifications(Some(&self.session.session_id), None, false)
            .expect("inbox")
            .iter()
            .filter(|n| n.task_id.as_deref() == Some(task_id) && n.kind == "wake")
            .count()
    }
}

#[test]
fn a_call_still_waiting_in_the_foreground_gets_the_result_inline_and_nothing_wakes() {
    let f = fixture();
    let live = f.live_task(WakeMode::OnTerminal);
    let (tx, mut rx) = oneshot::channel();
    live.lock().fg = Some(tx);
    let row = f.settle(&live);
    assert_eq!(row.delivery, Some(Delivery::Inline));
    assert_eq!(row.state, TaskState::Succeeded);
    assert!(matches!(rx.try_recv(), Ok(FgEvent::Settled(r)) if r.task_id == live.task_id));
    assert_eq!(f.wakes(&live.task_id), 0);
}

#[test]
fn a_foreground_call_that_went_away_leaves_the_result_to_a_wake() {
    let f = fixture();
    let live = f.live_task(WakeMode::OnTerminal);
    let (tx, rx) = oneshot::channel();
    live.lock().fg = Some(tx);
    drop(rx);
    let row = f.settle(&live);
    assert_eq!(row.delivery, Some(Delivery::Wake));
    assert_eq!(f.wakes(&live.task_id), 1);
}

#[test]
fn a_task_wait_claims_the_result_before_a_wake_would() {
    let f = fixture();
    let live = f.live_task(WakeMode::OnTerminal);
    let (gone, gone_rx) = oneshot::channel();
    drop(gone_rx);
    let (tx, mut rx) = oneshot::channel();
    live.lock().waiters = vec![gone, tx];
    let row = f.settle(&live);
    assert_eq!(row.delivery, Some(Delivery::Wait));
    assert_eq!(
        rx.try_recv().expect("the waiter heard").task_id,
        live.task_id
    );
    assert_eq!(f.wakes(&live.task_id), 0);
}

#[test]
fn a_background_result_wakes_once_unless_the_call_asked_for_silence() {
    let f = fixture();
    let loud = f.live_task(WakeMode::OnTerminal);
    assert_eq!(f.settle(&loud).delivery, Some(Delivery::Wake));
    // Settling again (a retry racing the first) decides nothing new.
    f.settle(&loud);
    assert_eq!(f.wakes(&loud.task_id), 1);

    let quiet = f.live_task(WakeMode::Silent);
    assert_eq!(f.settle(&quiet).delivery, Some(Delivery::Pending));
    assert_eq!(f.wakes(&quiet.task_id), 0);
}

#[test]
fn each_holding_of_a_uid_is_counted_on_its_own() {
    let f = fixture();
    let reg = &f.ex.registry;
    let uid = f.session.owner_uid;
    let count = |what| reg.count_of(uid, what).expect("count");
    let task = |kind| {
        let row = TaskRow::new(
            ids::ulid(),
            &f.session,
            "bash".into(),
            kind,
            "true".into(),
            "{}".into(),
        );
        reg.insert_task(&row).expect("task");
        row.task_id
    };
    let calls: Vec<String> = (0..3).map(|_| task(TaskKind::Call)).collect();
    // A monitor is no call: it counts for neither.
    task(TaskKind::Monitor);
    assert_eq!(count(Holding::QueuedCalls), 3);
    assert_eq!(count(Holding::RunningCalls), 0);
    for id in &calls[..2] {
        reg.mark_started(id, &f.session.session_id, 1, 1, &ids::now_rfc3339())
            .expect("started");
    }
    assert_eq!(count(Holding::QueuedCalls), 1);
    assert_eq!(count(Holding::RunningCalls), 2);
    assert_eq!(count(Holding::OpenSessions), 1);
    assert_eq!(count(Holding::ArmedSchedules), 0);
    // Another uid holds none of them.
    assert_eq!(
        reg.count_of(uid + 1, Holding::RunningCalls).expect("count"),
        0
    );
}
