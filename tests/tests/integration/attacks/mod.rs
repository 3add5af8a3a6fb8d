//! Attack tests for the privilege boundary (issues 8, 9 and 32): each does the attack for real —
//! as uid 65534 reaching a root daemon through its `socket_group`, or as root for the
//! command cases — and checks the side effect on the host, beside a positive control that
//! shows the same steps work where they are allowed.
//!
//! They need root (a root daemon, another uid, the sandbox) and skip with a printed reason
//! otherwise.

mod caches;
mod egress;
mod git;
mod home_links;
mod host_state;
mod leaks;
mod paths;
mod results;
mod run_as;
mod setid;
mod users;
mod workspace;

use std::os::unix::fs::{chown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{skip_without, Need};
use sidejob_tests::{wait_until, Client, Daemon, TempDir};

/// The attacker: another local user with access to the socket.
pub(crate) use sidejob_tests::NOBODY;

/// A root daemon whose socket is open to group 65534 (nobody's primary group), as the
/// README's shared deployment has it; `None` (skipped) unless this is root.
pub(crate) fn daemon() -> Option<Daemon> {
    daemon_with("")
}

/// [`daemon`] with extra configuration.
pub(crate) fn daemon_with(extra: &str) -> Option<Daemon> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let d = Daemon::start_with_config(&format!("socket_group = \"{NOBODY}\"\n{extra}"));
    // The socket's own directory is the daemon's; the temporary directory above it must
    // be passable, as /run is for a system daemon.
    set_mode(d.root.path(), 0o755);
    socket_handed_to_group(&d);
    Some(d)
}

/// Waits until the daemon has handed its socket to the group: the harness returns once the
/// socket accepts, which is as soon as it is bound, before its mode and group are set. A
/// reply to a request comes after both.
pub(crate) fn socket_handed_to_group(d: &Daemon) {
    d.client().ok("initialize", json!({}));
}

/// [`daemon`] with the profiles `(name, toml)` in a profile directory of its own (root's,
/// 0755), kept as long as the daemon.
pub(crate) fn daemon_with_profiles(profiles: &[(&str, &str)]) -> Option<(Daemon, TempDir)> {
    if skip_without(&[Need::Root]) {
        return None;
    }
    let dir = TempDir::new("profiles");
    set_mode(dir.path(), 0o755);
    for (name, text) in profiles {
        let p = dir.path().join(format!("{name}.toml"));
        std::fs::write(&p, text).expect("profile");
        set_mode(&p, 0o644);
    }
    let d = daemon_with(&format!("profiles_dir = \"{}\"\n", dir.path().display()))?;
    Some((d, dir))
}

/// A connection to `d` as uid 65534.
pub(crate) fn nobody(d: &Daemon) -> Client {
    Client::connect_as(&d.socket, NOBODY, NOBODY)
}

/// A fresh directory owned by uid 65534 (a workspace or a home of theirs), in a root-owned
/// 0755 parent that is removed with it.
pub(crate) struct NobodyDir {
    _parent: TempDir,
    path: PathBuf,
}

impl NobodyDir {
    pub(crate) fn new(tag: &str) -> NobodyDir {
        let parent = TempDir::new(tag);
        set_mode(parent.path(), 0o755);
        let path = parent.path().join("mine");
        std::fs::create_dir(&path).expect("mkdir");
        chown(&path, Some(NOBODY), Some(NOBODY)).expect("chown");
        NobodyDir {
            _parent: parent,
            path,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A path inside it (not created).
    pub(crate) fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

/// Opens uid 65534's session `id` in a workspace of theirs, with its session directory `sd`
/// in a directory of theirs (`home`), so they may swap anything under it. Returns
/// `(workspace, home, sd)`; the directories go when the first two are dropped.
pub(crate) fn open_with_own_session_dir(
    n: &mut Client,
    id: &str,
) -> (NobodyDir, NobodyDir, PathBuf) {
    let ws = NobodyDir::new("ws");
    let home = NobodyDir::new("home");
    let sd = home.join("sd");
    n.ok(
        "session.open",
        json!({"session_id": id, "workspace": ws.path(), "session_dir": sd}),
    );
    (ws, home, sd)
}

pub(crate) fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, path.display()));
}

/// `(mode & 0o7777, uid)` of a path, not following a symlink.
pub(crate) fn mode_uid(path: &Path) -> (u32, u32) {
    let m =
        std::fs::symlink_metadata(path).unwrap_or_else(|e| panic!("stat {}: {e}", path.display()));
    (m.mode() & 0o7777, m.uid())
}

/// Does anything (a dangling symlink included) exist at `path`?
pub(crate) fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// A name no other test or process uses, for files the attacks aim at in shared places.
pub(crate) fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "sidejob-attack-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The `data.kind` of a JSON-RPC error.
pub(crate) fn kind(e: &Value) -> &str {
    e["data"]["kind"].as_str().unwrap_or("")
}

/// Calls a method that must fail with `expected` (a `data.kind`); panics with what happened
/// otherwise.
pub(crate) fn refused(c: &mut Client, method: &str, params: Value, expected: &str) -> Value {
    match c.call(method, params.clone()) {
        Ok(v) => panic!("{method} {params} was allowed: {v}"),
        Err(e) => {
            assert_eq!(
                kind(&e),
                expected,
                "{method} {params} should be {expected}: {e}"
            );
            e
        }
    }
}

/// Runs `script` as uid 65534 on the host (what the attacker does between calls); panics if
/// it fails.
pub(crate) fn as_nobody(script: &str) {
    let o = sidejob_tests::sh_as(NOBODY, NOBODY, script);
    assert!(
        o.status.success(),
        "as uid {NOBODY}: {script}\nstdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Starts `command` in the background in `session` behind a gate: the command first
/// touches `ready` in the workspace, then waits until the test opens `gate` there (see
/// [`Gate`]). Returns the task id once the command is running.
pub(crate) fn start_gated(
    c: &mut Client,
    session: &str,
    workspace: &Path,
    command: &str,
    extra: Value,
) -> (String, Gate) {
    let gate = Gate::new(workspace);
    let mut params = json!({"background": true});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        params[k] = v;
    }
    let r = c.bash(
        session,
        &format!(
            "touch {ready}; until [ -e {gate} ]; do sleep 0.02; done; {command}",
            ready = gate.ready.display(),
            gate = gate.gate.display()
        ),
        params,
    );
    let id = r["task_id"].as_str().expect("task_id").to_owned();
    gate.wait_ready(c, &id);
    (id, gate)
}

/// A file a run waits for (`gate`) and the one it makes when it is waiting (`ready`), both
/// in the workspace.
pub(crate) struct Gate {
    pub ready: PathBuf,
    pub gate: PathBuf,
}

impl Gate {
    pub(crate) fn new(workspace: &Path) -> Gate {
        let name = unique("gate");
        Gate {
            ready: workspace.join(format!("{name}.ready")),
            gate: workspace.join(format!("{name}.open")),
        }
    }

    /// Waits until the run is at the gate (or panics with the task if it ended first).
    pub(crate) fn wait_ready(&self, c: &mut Client, task_id: &str) {
        let ready = self.ready.clone();
        if !wait_until(Duration::from_secs(60), || ready.exists()) {
            panic!("the run never reached its gate: {}", c.task(task_id));
        }
    }

    pub(crate) fn open(&self) {
        std::fs::write(&self.gate, "").expect("open the gate");
    }
}

/// A task's `result.json` as the host reads it (root, from its public run directory).
pub(crate) fn result_json(task: &Value) -> Value {
    let p = task["result_path"].as_str().expect("result_path");
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("read {p}: {e}"));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// Is `program` on this host's PATH?
pub(crate) fn has(program: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}
