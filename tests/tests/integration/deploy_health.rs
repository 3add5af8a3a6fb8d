//! A deployed daemon's health as an orchestrator sees it: its own plugin copies after
//! Kubernetes' `fsGroup` re-owns the state volume, and `sidejob status --ready` failing when
//! a shipped tool is missing.

use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;
use sidejob_tests::{sidejob_bin, skip_without, Client, Daemon, Need, TempDir};

use crate::plugins::{built_plugin, tool_names};

/// What kubelet does to every file and directory of a volume with `fsGroup` set: group
/// `gid`, set-gid directories, and `add` (kubelet's own masks: 0660 on a writable volume,
/// 0440 on a read-only one; directories also get 0110).
fn apply_fs_group(path: &Path, gid: u32, add: u32) {
    let meta = std::fs::symlink_metadata(path).expect("stat");
    if meta.file_type().is_symlink() {
        return;
    }
    lchown(path, None, Some(gid)).expect("chgrp");
    let mut mode = meta.mode() & 0o7777 | add;
    if meta.is_dir() {
        mode |= 0o2000 | 0o110;
        for entry in std::fs::read_dir(path).expect("read_dir").flatten() {
            apply_fs_group(&entry.path(), gid, add);
        }
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn tools_work(d: &Daemon) {
    let mut c = d.client();
    let names = tool_names(&mut c);
    for tool in ["bash", "code", "subagent"] {
        assert!(
            names.iter().any(|n| n == tool),
            "{tool} is gone after the volume was re-owned: {names:?}\n{}",
            d.log()
        );
    }
    let s = d.open_session(&mut c);
    let r = c.bash(&s, "echo still here", json!({}));
    assert_eq!(r["output"], "still here\n", "{r}");
    let st = c.ok("daemon.status", json!({}));
    assert_eq!(st["plugin_errors"], json!([]), "{st}");
}

#[test]
fn the_daemons_plugin_copies_survive_an_fs_group_change_of_its_state_volume() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let mut d = Daemon::start();
    tools_work(&d);
    d.terminate();
    // Group-readable and set-gid, no write for the group: the daemon's copies are still
    // only root's to change, so it keeps using them.
    apply_fs_group(&d.state_dir, 2000, 0o040);
    d.restart();
    tools_work(&d);
    d.terminate();
    // What kubelet really does on a writable volume: group read and write. The copies were
    // open to the group, so the daemon trusts none of them: it closes its directory again
    // and copies the plugins anew.
    apply_fs_group(&d.state_dir, 2000, 0o660);
    d.restart();
    tools_work(&d);
    let copies = d.state_dir.join("plugins");
    for path in std::iter::once(copies.clone()).chain(
        std::fs::read_dir(&copies)
            .expect("copies")
            .flatten()
            .map(|e| e.path()),
    ) {
        let mode = std::fs::symlink_metadata(&path).expect("stat").mode();
        assert_eq!(
            mode & 0o022,
            0,
            "{} is writable by others (mode {mode:o})",
            path.display()
        );
    }
}

/// `sidejob status [--ready]` against `socket`.
fn status(socket: &Path, ready: bool) -> std::process::Output {
    let mut cmd = Command::new(sidejob_bin());
    cmd.arg("status").arg("--socket").arg(socket);
    if ready {
        cmd.arg("--ready");
    }
    cmd.stdin(Stdio::null())
        .output()
        .expect("run sidejob status")
}

#[test]
fn status_ready_fails_while_a_shipped_tool_is_missing() {
    // A prefix like install.sh's with the subagent plugin left out.
    let root = TempDir::new("ready");
    let prefix = root.path().join("prefix");
    let plugins = prefix.join("lib/sidejob/plugins");
    std::fs::create_dir_all(prefix.join("bin")).expect("bin");
    std::fs::create_dir_all(&plugins).expect("plugins");
    for dir in [
        root.path(),
        &prefix,
        &prefix.join("bin"),
        &prefix.join("lib"),
        &prefix.join("lib/sidejob"),
        &plugins,
    ] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let bin = prefix.join("bin/sidejob");
    std::fs::copy(sidejob_bin(), &bin).expect("copy sidejob");
    for name in ["bash", "code"] {
        let lib = format!("libsidejob_plugin_{name}.so");
        crate::plugins::install(
            &built_plugin(&format!("sidejob_plugin_{name}")),
            &plugins,
            &lib,
            0o644,
        );
    }
    let socket = root.path().join("run/ready.sock");
    let notify = crate::deploy::Notify::new(root.path());
    let _child = crate::deploy::Serve(
        Command::new(&bin)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .env("NOTIFY_SOCKET", &notify.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sidejob"),
    );
    assert_eq!(notify.next(), "READY=1");
    let tools = tool_names(&mut Client::connect(&socket));
    assert!(!tools.iter().any(|t| t == "subagent"), "{tools:?}");
    // Alive: it answers, so a liveness probe passes (a restart would not bring the tool back).
    let live = status(&socket, false);
    assert_eq!(live.status.code(), Some(0), "{live:?}");
    // Not ready: a shipped tool is missing.
    let ready = status(&socket, true);
    let err = String::from_utf8_lossy(&ready.stderr);
    assert_eq!(ready.status.code(), Some(1), "{ready:?}");
    assert!(
        err.contains("not ready") && err.contains("subagent"),
        "{err}"
    );
    // Once the plugin is installed (the watcher loads it), the daemon is ready.
    crate::plugins::install(
        &built_plugin("sidejob_plugin_subagent"),
        &plugins,
        "libsidejob_plugin_subagent.so",
        0o644,
    );
    assert!(
        sidejob_tests::wait_until(std::time::Duration::from_secs(30), || {
            status(&socket, true).status.success()
        }),
        "still not ready with every shipped plugin installed"
    );
    // A daemon that does not answer is neither alive nor ready.
    let gone = root.path().join("run/nobody-here.sock");
    assert_eq!(status(&gone, false).status.code(), Some(1));
    assert_eq!(status(&gone, true).status.code(), Some(1));
}

#[test]
fn status_ready_passes_on_a_daemon_with_its_shipped_tools() {
    let d = Daemon::start();
    let o = status(&d.socket, true);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

/// `sidejob doctor --json`, run through `sh -c "<setup>; exec sidejob doctor --json"` in a
/// mount namespace of its own.
fn doctor_in_own_mounts(setup: &str) -> serde_json::Value {
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(format!("{setup}\nexec \"$0\" doctor --json"))
        .arg(sidejob_bin())
        .stdin(Stdio::null())
        .output()
        .expect("run unshare");
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

fn profile<'a>(doctor: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doctor["profiles"]
        .as_array()
        .expect("profiles")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no profile {name}: {doctor}"))
}

#[test]
fn doctor_calls_ci_unusable_when_the_cgroupfs_is_read_only() {
    if skip_without(&[Need::Root, Need::Cgroups]) {
        return;
    }
    let writable = doctor_in_own_mounts("");
    assert_eq!(profile(&writable, "ci")["usable"], true, "{writable}");
    // What a container runtime does: the cgroup hierarchies are there, mounted read-only.
    let read_only = doctor_in_own_mounts(
        "for m in $(findmnt -rn -t cgroup,cgroup2 -o TARGET); do \
         mount -o remount,bind,ro \"$m\" || exit 1; done",
    );
    let ci = profile(&read_only, "ci");
    let detail = ci["detail"].as_str().unwrap_or("");
    assert_eq!(ci["usable"], false, "{read_only}");
    assert!(
        detail.contains("cgroup_memory") && detail.contains("Read-only file system"),
        "{detail}"
    );
    let layer = read_only["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .find(|l| l["layer"] == "cgroup_memory")
        .expect("cgroup_memory layer");
    assert_eq!(layer["active"], false, "{layer}");
    // The default profile needs no cgroup: still usable, and doctor still passes.
    assert_eq!(profile(&read_only, "workspace-write")["usable"], true);
    assert_eq!(read_only["ok"], true, "{read_only}");
}

/// The capabilities the pod manifest adds for the sidejob container, lower-case.
pub(crate) fn manifest_capabilities() -> Vec<String> {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/kubernetes/sidejob-pod.yaml");
    let text = std::fs::read_to_string(path).expect("manifest");
    let mut lines = text.lines().skip_while(|l| l.trim() != "add:").skip(1);
    let mut caps = Vec::new();
    while let Some(cap) = lines.next().and_then(|l| l.trim().strip_prefix("- ")) {
        let name = cap.split_whitespace().next().unwrap_or("");
        caps.push(name.to_lowercase());
    }
    assert!(!caps.is_empty(), "no capabilities found in the manifest");
    caps
}

#[test]
fn the_pod_manifests_capabilities_are_enough_for_another_users_runs() {
    if skip_without(&[Need::Root, Need::Cgroups]) {
        return;
    }
    let caps = manifest_capabilities();
    assert!(caps.iter().any(|c| c == "sys_chroot"), "{caps:?}");
    another_users_runs_work_with(&caps);
}

/// A deployment whose capabilities predate `SYS_CHROOT` in the manifest: runs still work,
/// their views built in copies of the host's mount namespace rather than of the bare one.
#[test]
fn without_sys_chroot_another_users_runs_still_work() {
    if skip_without(&[Need::Root, Need::Cgroups]) {
        return;
    }
    let caps: Vec<String> = manifest_capabilities()
        .into_iter()
        .filter(|c| c != "sys_chroot")
        .collect();
    another_users_runs_work_with(&caps);
}

/// A daemon with `caps` as its bounding set (as a container runtime gives them) runs calls
/// of uid 65534: a plain one, one under the `ci` profile, and a background one it cancels.
fn another_users_runs_work_with(caps: &[String]) {
    let bounding = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    let root = TempDir::new("podcaps");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = root.path().join("run/caps.sock");
    let notify = crate::deploy::Notify::new(root.path());
    // What a container runtime gives the container: this bounding set, nothing inherited.
    let _child = crate::deploy::Serve(
        Command::new("setpriv")
            .arg(format!("--bounding-set={bounding}"))
            .arg("--inh-caps=-all")
            .arg(sidejob_bin())
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .arg("--state-dir")
            .arg(root.path().join("state"))
            .env("NOTIFY_SOCKET", &notify.path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sidejob under setpriv"),
    );
    assert_eq!(notify.next(), "READY=1");
    // The agent's uid reaches the socket (in the pod: through the fsGroup).
    for p in [socket.parent().expect("run dir"), &socket] {
        let mode = if p == socket { 0o666 } else { 0o755 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let ws = TempDir::new("podcaps-ws");
    std::os::unix::fs::chown(
        ws.path(),
        Some(crate::isolation::NOBODY),
        Some(crate::isolation::NOBODY),
    )
    .expect("chown");
    let nobody = crate::isolation::NOBODY;
    let mut c = Client::connect_as(&socket, nobody, nobody);
    let s = c.open_session_in(ws.path());
    let r = c.bash(&s, "echo hi > f && cat f", json!({}));
    assert_eq!(r["output"], "hi\n", "with {caps:?}: {r}");
    let r = c.bash(&s, "echo limited", json!({"profile": "ci"}));
    assert_eq!(r["output"], "limited\n", "with {caps:?}: {r}");
    let bg = c.bash(&s, "sleep 300", json!({"background": true}));
    let task = bg["task_id"].as_str().expect("task id").to_owned();
    c.ok("task.cancel", json!({"task_id": task}));
    let done = c.wait_settled(&task);
    assert_eq!(done["state"], "canceled", "with {caps:?}: {done}");
}
