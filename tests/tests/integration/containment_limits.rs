//! Resource limits, exit codes and profiles (see `containment.rs` for how these tests work).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sidejob_tests::{sidejob_bin, skip_without, Need};

use crate::containment::{exec, inside, profile_with, Ws};

// ---- limits ----------------------------------------------------------------------------------

/// A workspace for a test whose profile sets cgroup limits (memory, pids, cpu).
fn cgroup_ws() -> Option<Ws> {
    if skip_without(&[Need::Root, Need::Cgroups]) {
        return None;
    }
    Ws::new()
}

#[test]
fn a_fork_bomb_is_bounded_and_the_host_stays_healthy() {
    let Some(ws) = cgroup_ws() else { return };
    let p = ws.profile("pids", &profile_with("", "pids = 64"));
    let t = Instant::now();
    let out = exec(
        &ws,
        &["--profile", &p, "--json"],
        &[&ws.probe(), "fork-bomb", "100000"],
    );
    let r = out.report();
    assert_eq!(r["ok"], false, "{}", out.stdout);
    let made: u32 = r["detail"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(made < 64, "forked {made}");
    assert!(
        out.result()["violations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "pids_limit"),
        "{}",
        out.stdout
    );
    assert!(t.elapsed() < Duration::from_secs(30));
    // Control: the host can still fork, and the same probe forks freely under a higher cap.
    assert!(Command::new("/bin/true").status().unwrap().success());
    let roomy = ws.profile("roomy", &profile_with("", "pids = 512"));
    let ok = exec(
        &ws,
        &["--profile", &roomy],
        &[&ws.probe(), "fork-bomb", "100"],
    );
    assert!(ok.ok(), "{}", ok.stdout);
}

#[test]
fn a_memory_hog_is_killed_at_the_limit() {
    let Some(ws) = cgroup_ws() else { return };
    let p = ws.profile("mem", &profile_with("", "memory = \"64MiB\""));
    let out = exec(
        &ws,
        &["--profile", &p, "--json"],
        &[&ws.probe(), "alloc", "512"],
    );
    let r = out.result();
    assert_eq!(r["signal"], 9, "{}", out.stdout);
    assert_eq!(out.code, 137);
    assert!(
        r["violations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "oom_kill"),
        "{r}"
    );
    // Control: under the limit the same allocation pattern succeeds.
    let ok = exec(&ws, &["--profile", &p], &[&ws.probe(), "alloc", "16"]);
    assert!(ok.ok(), "{}", ok.stdout);
}

#[test]
fn a_cpu_spin_ends_at_the_timeout_with_exit_124() {
    let Some(ws) = Ws::new() else { return };
    let t = Instant::now();
    let out = exec(&ws, &["--timeout", "1s", "--json"], &[&ws.probe(), "spin"]);
    assert_eq!(out.code, 124, "{} {}", out.stdout, out.stderr);
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    let r = out.result();
    assert_eq!(r["reason"], "timeout");
    assert!(r["violations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v == "timeout"));
    // Control: a command that ends in time is not cut.
    assert_eq!(exec(&ws, &["--timeout", "10s"], &["/bin/true"]).code, 0);
}

#[test]
fn a_cpu_time_limit_stops_a_spin() {
    let Some(ws) = Ws::new() else { return };
    let p = ws.profile("cpu", &profile_with("", "cpu_time = \"1s\""));
    let out = exec(
        &ws,
        &["--profile", &p, "--json", "--timeout", "30s"],
        &[&ws.probe(), "spin"],
    );
    let r = out.result();
    assert_eq!(r["signal"], libc::SIGXCPU, "{}", out.stdout);
    assert!(
        r["violations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "cpu_limit"),
        "{r}"
    );
}

#[test]
fn an_output_flood_is_capped_not_blocked() {
    let Some(ws) = Ws::new() else { return };
    let p = ws.profile("out", &profile_with("", "output = \"1MiB\""));
    let t = Instant::now();
    let mut c = Command::new(sidejob_bin());
    c.args(["exec", "--json", "--profile", &p, "--workspace"])
        .arg(ws.path())
        .arg("--")
        .arg(ws.probe())
        .args(["flood", &(64u64 << 20).to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = c.spawn().unwrap();
    let mut err = child.stderr.take().unwrap();
    let flood = std::thread::spawn(move || {
        let mut all = Vec::new();
        err.read_to_end(&mut all).unwrap();
        all
    });
    let mut json = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut json).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(60));
    // With --json the command's output goes to stderr, all of it; the log keeps the head
    // and the tail; stdout holds the result alone, so it parses as it is.
    let flood = flood.join().unwrap();
    assert!(String::from_utf8_lossy(&flood).contains("FLOOD-END"));
    let r: Value = serde_json::from_slice(&json).unwrap_or_else(|e| {
        panic!(
            "stdout is not the result alone ({e}): {}",
            String::from_utf8_lossy(&json)
        )
    });
    assert_eq!(r["output_truncated"], true);
    assert!(r["output_bytes"].as_u64().unwrap() > 64 << 20);
    assert!(r["violations"]
        .as_array()
        .unwrap()
        .iter()
        .any(|v| v == "output_cap"));
    // Control: a small output is not truncated.
    let small = exec(
        &ws,
        &["--profile", &p, "--json"],
        &[&ws.probe(), "flood", "1000"],
    );
    assert_eq!(small.result()["output_truncated"], false);
}

#[test]
fn filling_the_disk_is_stopped_by_the_file_size_limit() {
    let Some(ws) = Ws::new() else { return };
    let p = ws.profile("fsize", &profile_with("", "file_size = \"8MiB\""));
    let big = ws.path().join("big");
    let out = exec(
        &ws,
        &["--profile", &p],
        &[&ws.probe(), "fill", big.to_str().unwrap()],
    );
    assert_eq!(out.errno(), libc::EFBIG as i64, "{}", out.stdout);
    assert!(std::fs::metadata(&big).unwrap().len() <= 8 << 20);
    // Through a shell, the writer dies of SIGXFSZ and the result says why.
    let sh = exec(
        &ws,
        &["--profile", &p, "--json"],
        &[
            "/bin/sh",
            "-c",
            &format!(
                "head -c 20000000 /dev/zero > {}",
                ws.path().join("big2").display()
            ),
        ],
    );
    assert!(
        sh.result()["violations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v == "file_size"),
        "{}",
        sh.stdout
    );
    assert!(std::fs::metadata(ws.path().join("big2")).unwrap().len() <= 8 << 20);
    // Control: a file under the limit is written whole.
    let ok = exec(
        &ws,
        &["--profile", &p],
        &[
            &ws.probe(),
            "fill",
            ws.path().join("small").to_str().unwrap(),
            "4194304",
        ],
    );
    assert!(ok.ok(), "{}", ok.stdout);
}

// ---- exit codes and profiles -----------------------------------------------------------------

#[test]
fn exit_codes_and_signals_pass_through() {
    let Some(ws) = Ws::new() else { return };
    assert_eq!(inside(&ws, &["exit", "0"]).code, 0);
    assert_eq!(inside(&ws, &["exit", "7"]).code, 7);
    assert_eq!(inside(&ws, &["signal", "9"]).code, 137);
    assert_eq!(inside(&ws, &["signal", "15"]).code, 143);
    let j = exec(&ws, &["--json"], &[&ws.probe(), "signal", "6"]);
    assert_eq!(j.code, 134);
    assert_eq!(j.result()["signal"], 6);
    let missing = exec(&ws, &[], &["no-such-command-sidejob"]);
    assert_eq!(missing.code, 127, "{}", missing.stderr);
}

#[test]
fn result_json_names_the_active_layers() {
    let Some(ws) = cgroup_ws() else { return };
    let out = exec(&ws, &["--json"], &["/bin/true"]);
    let r = out.result();
    assert_eq!(r["state"], "succeeded");
    let layers: Vec<&str> = r["sandbox_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for l in [
        "pid_namespace",
        "mount_namespace",
        "net_namespace",
        "mount_view",
        "landlock_fs",
        "seccomp",
        "no_new_privs",
        "capabilities",
    ] {
        assert!(layers.contains(&l), "{l} missing from {layers:?}");
    }
    assert_eq!(r["profile"], "workspace-write");
    // The ci profile adds the cgroup limits.
    let ci = exec(&ws, &["--profile", "ci", "--json"], &["/bin/true"]).result();
    let layers: Vec<&str> = ci["sandbox_layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for l in ["cgroup_memory", "cgroup_pids", "cgroup_cpu"] {
        assert!(layers.contains(&l), "{l} missing from {layers:?}");
    }
}

#[test]
fn an_invalid_profile_is_refused_with_file_line_and_field() {
    let Some(ws) = cgroup_ws() else { return };
    let bad = ws.profile("bad", "network = \"none\"\n[limits]\nmemory = \"lots\"\n");
    let out = exec(&ws, &["--profile", &bad], &["/bin/true"]);
    assert_eq!(out.code, 125);
    assert!(
        out.stderr.contains(&format!("{bad}:3: limits.memory")),
        "{}",
        out.stderr
    );
    let unknown = exec(&ws, &["--profile", "no-such-profile"], &["/bin/true"]);
    assert_eq!(unknown.code, 125);
    assert!(
        unknown.stderr.contains("unknown profile"),
        "{}",
        unknown.stderr
    );
    // Control: the shipped profiles all run.
    for p in ["read-only", "workspace-write", "ci", "network"] {
        assert_eq!(exec(&ws, &["--profile", p], &["/bin/true"]).code, 0, "{p}");
    }
}

#[test]
fn the_read_only_profile_cannot_write_the_workspace() {
    let Some(ws) = Ws::new() else { return };
    let f = ws.path().join("file");
    std::fs::write(&f, "orig").unwrap();
    let out = exec(
        &ws,
        &["--profile", "read-only"],
        &[&ws.probe(), "write", f.to_str().unwrap(), "x"],
    );
    assert!(!out.ok());
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "orig");
    // Control: reading works, and workspace-write may write.
    assert!(exec(
        &ws,
        &["--profile", "read-only"],
        &[&ws.probe(), "read", f.to_str().unwrap()]
    )
    .ok());
    assert!(inside(&ws, &["write", f.to_str().unwrap(), "x"]).ok());
}

#[test]
fn sidejob_doctor_reports_every_layer() {
    // The trial run needs root; the layers it reports include the cgroup limits.
    if skip_without(&[Need::Root, Need::Cgroups]) {
        return;
    }
    let o = Command::new(sidejob_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    let layers = v["layers"].as_array().unwrap();
    for l in ["landlock_fs", "seccomp", "cgroup_memory", "mount_view"] {
        let e = layers
            .iter()
            .find(|x| x["layer"] == l)
            .unwrap_or_else(|| panic!("{l}"));
        assert_eq!(e["active"], true, "{e}");
    }
    assert_eq!(v["trial"]["ok"], true);
    let text = Command::new(sidejob_bin()).arg("doctor").output().unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("landlock"));
}
