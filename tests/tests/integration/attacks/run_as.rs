//! Issue 32, item 5: a fixed `run_as` uid would be one uid for every caller of the profile
//! (and, for `nobody`, for that user on the host), and any process of a uid can ptrace the
//! others and read their `/proc/<pid>/environ` and `/proc/<pid>/root`. The daemon shares no
//! uid between callers: fixed ids that are not the session owner's own are refused, saying
//! why, and every run runs as its own caller, whose runs no other caller can read.

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{pids_running, unique_sleep, wait_until, Client};

use super::{daemon_with_profiles, kind, nobody, NobodyDir, NOBODY};

const AS_NOBODY: &str = "extends = \"workspace-write\"\nrun_as = \"nobody\"\n";
const AS_1000: &str = "extends = \"workspace-write\"\nrun_as = \"1000:1000\"\n";

/// Does uid 65534, on the host, find the variable `needle` in process `pid`'s environment?
fn nobody_reads_environ(pid: i32, needle: &str) -> bool {
    sidejob_tests::sh_as(
        NOBODY,
        NOBODY,
        &format!("tr '\\0' '\\n' < /proc/{pid}/environ | grep -q '^{needle}='"),
    )
    .status
    .success()
}

/// Does uid 65534, on the host, reach `entry` through process `pid`'s root directory?
fn nobody_reads_through_root(pid: i32, entry: &Path) -> bool {
    sidejob_tests::sh_as(
        NOBODY,
        NOBODY,
        &format!("ls /proc/{pid}/root{} >/dev/null", entry.display()),
    )
    .status
    .success()
}

/// Starts `export NAME=secret; exec sleep <unique>` in `session` in the background and
/// returns the sleep's pid on the host.
fn holding_a_secret(c: &mut Client, session: &str, name: &str) -> (String, i32) {
    let sleep = unique_sleep();
    let r = c.bash(
        session,
        &format!("export {name}=s3cr3t-{NOBODY}; exec sleep {sleep}"),
        json!({"background": true}),
    );
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    let cmdline = format!("sleep {sleep}");
    let mut pids = Vec::new();
    assert!(
        wait_until(Duration::from_secs(20), || {
            pids = pids_running(&cmdline);
            !pids.is_empty()
        }),
        "the run never started its sleep: {}",
        c.task(&id)
    );
    (id, pids[0])
}

fn refused_sharing(e: &Value) {
    assert_eq!(kind(e), "invalid_params", "{e}");
    let m = e["message"].as_str().unwrap_or("");
    assert!(
        m.contains("share between callers") && m.contains("/proc"),
        "the refusal does not say why: {e}"
    );
}

#[test]
fn attack_a_shared_run_as_uid_never_lets_one_caller_read_anothers_run() {
    let Some((d, _profiles)) =
        daemon_with_profiles(&[("as-nobody", AS_NOBODY), ("as-1000", AS_1000)])
    else {
        return;
    };
    let mut c = d.client();
    let root_ws = sidejob_tests::TempDir::new("root-ws");
    super::set_mode(root_ws.path(), 0o755);
    std::fs::write(root_ws.path().join("deploy.key"), "root's").expect("root file");
    // Root's deploy run under the shared uid: refused at session.open and at a call, so no
    // run of root's ever runs as uid 65534.
    match c.call(
        "session.open",
        json!({"workspace": root_ws.path(), "profile": "as-nobody"}),
    ) {
        Err(e) => refused_sharing(&e),
        Ok(r) => {
            // The attack, as it went: the run's secret and files, read from the host.
            let s = r["session_id"].as_str().expect("session_id").to_owned();
            let (_, pid) = holding_a_secret(&mut c, &s, "DEPLOY_TOKEN");
            panic!(
                "root's session under run_as = nobody was opened; from the host, uid {NOBODY} \
                 reads its run's DEPLOY_TOKEN: {}, and root's workspace through \
                 /proc/{pid}/root: {}",
                nobody_reads_environ(pid, "DEPLOY_TOKEN"),
                nobody_reads_through_root(pid, &root_ws.path().join("deploy.key"))
            );
        }
    }
    let s = c.ok("session.open", json!({"workspace": root_ws.path()}))["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    let marker = root_ws.path().join("ran-as-nobody");
    let e = c
        .call(
            "tool.call",
            json!({"session_id": s, "tool": "bash", "profile": "as-nobody",
                "args": {"command": format!("id -u > {}", marker.display())}}),
        )
        .expect_err("root's call under run_as = nobody ran");
    refused_sharing(&e);
    assert!(!marker.exists(), "a refused call ran");

    // The run root does get runs as root, and uid 65534 on the host reads neither its
    // environment nor its files through /proc.
    let (root_task, root_pid) = holding_a_secret(&mut c, &s, "DEPLOY_TOKEN");
    assert!(
        !nobody_reads_environ(root_pid, "DEPLOY_TOKEN"),
        "uid {NOBODY} read root's run's environment"
    );
    assert!(
        !nobody_reads_through_root(root_pid, &root_ws.path().join("deploy.key")),
        "uid {NOBODY} reached root's workspace through /proc/{root_pid}/root"
    );

    // uid 65534 cannot take another uid either.
    let mut n = nobody(&d);
    let ws = NobodyDir::new("ws");
    let e = n
        .call(
            "session.open",
            json!({"workspace": ws.path(), "profile": "as-1000"}),
        )
        .expect_err("uid 65534's session under run_as = 1000:1000 was opened");
    refused_sharing(&e);

    // Positive control: a caller reads its own run's /proc, and run_as naming the caller's
    // own uid is theirs to use.
    let mine = n.ok(
        "session.open",
        json!({"workspace": ws.path(), "profile": "as-nobody"}),
    )["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    let id = n.bash(&mine, "id -u", json!({}));
    assert_eq!(id["output"], format!("{NOBODY}\n"), "{id}");
    let (own_task, own_pid) = holding_a_secret(&mut n, &mine, "MY_TOKEN");
    assert!(
        nobody_reads_environ(own_pid, "MY_TOKEN"),
        "uid {NOBODY} cannot read its own run's environment: the check proves nothing"
    );
    assert!(
        nobody_reads_through_root(own_pid, ws.path()),
        "uid {NOBODY} cannot reach its own run's root: the check proves nothing"
    );
    n.ok("task.cancel", json!({"task_id": own_task}));
    c.ok("task.cancel", json!({"task_id": root_task}));
}
