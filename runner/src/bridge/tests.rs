//! A bridge's scope, its socket's and directory's modes, and the questions runs ask, with a
//! real registry and executor (no run is started).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;

use serde_json::json;

use super::*;
use crate::config::Config;
use crate::plugin_host::ToolHost;
use crate::protocol::{ErrorKind, TaskKind, TaskRequestInputParams};
use crate::registry::fixtures::session;
use crate::registry::Registry;
use crate::scratch::ScratchDir;

struct Fixture {
    exec: Arc<Executor>,
    _dir: ScratchDir,
}

/// An executor on a fresh registry with session `top` and its subagent's child session
/// `sub-t1`, where task `t1` of `top` runs and holds a bridge to `sub-t1`.
fn fixture() -> Fixture {
    let dir = ScratchDir::new("bridge");
    let cfg = Arc::new(Config {
        state_dir: dir.path().join("state"),
        shipped_plugins: false,
        ..Config::default()
    });
    std::fs::create_dir_all(&cfg.state_dir).unwrap();
    let registry = Arc::new(Registry::open(&cfg.state_dir).unwrap());
    let top = session("top", 1000, None);
    registry.insert_session(&top).unwrap();
    registry
        .insert_session(&session("sub-t1", 1000, Some("top")))
        .unwrap();
    let mut t1 = TaskRow::new(
        "t1".into(),
        &top,
        "subagent".into(),
        TaskKind::Call,
        "ask".into(),
        "{}".into(),
    );
    t1.bridge_session_id = Some("sub-t1".into());
    registry.insert_task(&t1).unwrap();
    let tools = ToolHost::start(&cfg, None);
    let runs = crate::run::dir::RunsDirs::new(cfg.runs_dir(), None);
    let exec = Executor::new(cfg, registry, tools, PathBuf::from("/nonexistent"), runs);
    Fixture { exec, _dir: dir }
}

impl Fixture {
    fn scope(&self) -> Scope {
        let row = self.exec.registry().get_task("t1").unwrap().unwrap();
        Scope::of_task(&row).unwrap()
    }

    fn start(&self) {
        self.exec
            .registry()
            .mark_started("t1", "top", 1, 1, &crate::ids::now_rfc3339())
            .unwrap();
    }

    fn state(&self) -> TaskState {
        self.exec.registry().get_task("t1").unwrap().unwrap().state
    }
}

fn question() -> TaskRequestInputParams {
    TaskRequestInputParams {
        prompt: "which branch?".into(),
        schema: json!({"type": "string"}),
    }
}

#[test]
fn a_bridge_acts_for_its_tasks_row_and_nothing_else() {
    let f = fixture();
    let s = f.scope();
    assert_eq!(s.session_id, "sub-t1");
    assert_eq!(s.caller_task_id, "t1");
    assert_eq!(s.caller_session_id, "top");
    assert_eq!(s.owner_uid, 1000);
    assert_eq!(s.ceiling, "workspace-write");
    assert!(s.is_subagent());
    let mut plain = f.exec.registry().get_task("t1").unwrap().unwrap();
    plain.bridge_session_id = None;
    assert!(Scope::of_task(&plain).is_none(), "a task without a bridge");
}

#[test]
fn the_socket_and_its_directory_are_the_runs_users_alone() {
    let dir = ScratchDir::new("bridge-socket");
    let bridge = dir.path().join("task");
    let ids = if crate::sys::getuid() == 0 {
        (Some(1000), Some(1000))
    } else {
        (None, None)
    };
    make_private_dir(&bridge, ids).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let _listener = bind(&socket_in(&bridge), ids).unwrap();
    let d = std::fs::metadata(&bridge).unwrap();
    let s = std::fs::metadata(socket_in(&bridge)).unwrap();
    assert_eq!(d.permissions().mode() & 0o777, 0o700);
    assert_eq!(s.permissions().mode() & 0o777, 0o600);
    if let (Some(uid), Some(gid)) = ids {
        assert_eq!((d.uid(), d.gid()), (uid, gid));
        assert_eq!((s.uid(), s.gid()), (uid, gid));
    }
    // Made again (a restarted daemon): the same modes, a fresh socket.
    make_private_dir(&bridge, ids).unwrap();
    assert!(bind(&socket_in(&bridge), ids).is_ok());
}

#[tokio::test]
async fn a_question_waits_for_the_hosts_answer() {
    let f = fixture();
    f.start();
    let scope = f.scope();
    let questions = Questions::default();
    let ask = questions.request(&f.exec, &scope, question(), std::future::pending());
    let answer = async {
        // The host sees the task waiting, and the question at the top of its session tree.
        let notes = loop {
            let notes = f
                .exec
                .registry()
                .list_notifications(Some("top"), None, true)
                .unwrap();
            if !notes.is_empty() {
                break notes;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(f.state(), TaskState::AwaitingInput);
        assert_eq!(notes[0].severity, "action_required");
        assert!(notes[0].text.contains("which branch?"), "{}", notes[0].text);
        // A second question of the same task is refused while the first waits.
        let again = questions
            .request(&f.exec, &scope, question(), std::future::ready(()))
            .await
            .unwrap_err();
        assert_eq!(again.kind(), Some(ErrorKind::InvalidState.name()));
        questions.answer(&f.exec, "t1", json!("main")).unwrap()
    };
    let (asked, state) = tokio::join!(ask, answer);
    assert_eq!(asked.unwrap(), json!({"answer": "main"}));
    assert_eq!(state, TaskState::Running);
    assert_eq!(f.state(), TaskState::Running);
    // Answered once: a second answer finds nobody waiting.
    let late = questions.answer(&f.exec, "t1", json!("x")).unwrap_err();
    assert_eq!(late.kind(), Some(ErrorKind::InvalidState.name()));
}

#[tokio::test]
async fn only_a_running_task_asks_and_a_hang_up_takes_the_question_back() {
    let f = fixture();
    let scope = f.scope();
    let questions = Questions::default();
    let queued = questions
        .request(&f.exec, &scope, question(), std::future::pending())
        .await
        .unwrap_err();
    assert!(queued.to_string().contains("not running"), "{queued}");
    assert_eq!(f.state(), TaskState::Queued);
    f.start();
    // The run hangs up while it waits: running again, and nothing left to answer.
    let hung_up = questions
        .request(&f.exec, &scope, question(), tokio::task::yield_now())
        .await
        .unwrap_err();
    assert!(hung_up.to_string().contains("closed"), "{hung_up}");
    assert_eq!(f.state(), TaskState::Running);
    assert!(questions.answer(&f.exec, "t1", json!(1)).is_err());
}
