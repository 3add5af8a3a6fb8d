use serde_json::json;
use sidejob_tests::Daemon;

#[test]
fn a_foreground_call_returns_inline_with_its_exit_code() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo hello; exit 3", json!({}));
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["state"], "failed");
    assert_eq!(r["reason"], "exit_code");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["output"], "hello\n");
    let t = c.ok("task.get", json!({"task_id": r["task_id"]}));
    assert_eq!(t["delivery"], "inline");
}
