//! Containment of processes and kernel interfaces, the run's lifetime and its environment
//! (see `containment.rs` for how these tests work).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sidejob_tests::sidejob_bin;

use crate::containment::{exec, exec_env, inside, outside, probe_bin, profile_with, Out, Ws};

// ---- processes and the kernel ----------------------------------------------------------------

#[test]
fn ptrace_is_denied() {
    let Some(ws) = Ws::new() else { return };
    let out = inside(&ws, &["ptrace", "1"]);
    assert_eq!(out.errno(), libc::EPERM as i64, "{}", out.stdout);
    // Control: on the host, root may attach to a process of its own.
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let ctl = outside(&["ptrace", &sleeper.id().to_string()]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(ctl.ok(), "{}", ctl.stdout);
}

#[test]
fn a_process_outside_cannot_be_signalled() {
    let Some(ws) = Ws::new() else { return };
    let mut victim = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = victim.id().to_string();
    let out = inside(&ws, &["kill", &pid, "9"]);
    assert!(!out.ok(), "{}", out.stdout);
    assert!(
        sidejob_tests::process_alive(victim.id() as i32),
        "the host process died"
    );
    // Control: from the host the same signal lands.
    assert!(outside(&["kill", &pid, "9"]).ok());
    let status = victim.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(9)
    );
}

#[test]
fn mount_unshare_and_setns_are_denied() {
    let Some(ws) = Ws::new() else { return };
    let m = inside(&ws, &["mount", "/tmp/m"]);
    assert_eq!(m.errno(), libc::EPERM as i64, "{}", m.stdout);
    for kind in ["user", "net", "mount"] {
        let u = inside(&ws, &["unshare", kind]);
        assert_eq!(
            u.errno(),
            libc::EPERM as i64,
            "unshare {kind}: {}",
            u.stdout
        );
    }
    let s = inside(&ws, &["setns", "/proc/self/ns/net"]);
    assert!(!s.ok(), "{}", s.stdout);
    // Controls on the host (root): unsharing a user namespace and joining our own netns work.
    assert!(outside(&["unshare", "user"]).ok());
    assert!(outside(&["setns", "/proc/self/ns/net"]).ok());
}

#[test]
fn tiocsti_io_uring_bpf_and_keyctl_are_denied() {
    let Some(ws) = Ws::new() else { return };
    for op in ["tiocsti", "io_uring", "bpf", "keyctl"] {
        let out = inside(&ws, &[op]);
        assert_eq!(out.errno(), libc::EPERM as i64, "{op}: {}", out.stdout);
        // Control: on the host the call reaches the kernel (it may still fail, e.g. TIOCSTI on
        // a non-terminal, but not with the filter's EPERM).
        let ctl = outside(&[op]);
        assert!(
            ctl.ok() || ctl.errno() != libc::EPERM as i64,
            "{op} outside: {}",
            ctl.stdout
        );
    }
}

#[test]
fn clone3_answers_enosys_so_libc_falls_back_to_clone() {
    let Some(ws) = Ws::new() else { return };
    let out = inside(&ws, &["clone3"]);
    assert_eq!(out.errno(), libc::ENOSYS as i64, "{}", out.stdout);
    assert!(
        outside(&["clone3"]).ok(),
        "control: clone3 works on the host"
    );
    // And ordinary process creation still works inside.
    let sh = exec(&ws, &[], &["/bin/sh", "-c", "/bin/true && echo forked"]);
    assert!(sh.stdout.contains("forked"), "{}", sh.stdout);
}

#[test]
fn memfd_create_then_execveat_is_refused() {
    let Some(ws) = Ws::new() else { return };
    let out = inside(&ws, &["memfd-exec"]);
    assert!(!out.ok(), "{}", out.stdout);
    assert_eq!(out.code, 1);
    // Control: on the host the memfd executes (/bin/true replaces the probe: exit 0, no report).
    let ctl = outside(&["memfd-exec"]);
    assert_eq!(ctl.code, 0, "{} {}", ctl.stdout, ctl.stderr);
}

#[test]
fn capabilities_are_gone_and_no_new_privs_is_set() {
    let Some(ws) = Ws::new() else { return };
    let out = inside(&ws, &["status"]);
    let d = out.report()["detail"].as_str().unwrap().to_owned();
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            d.contains(&format!("{set}:\t0000000000000000")),
            "{set}: {d}"
        );
    }
    assert!(
        d.contains("NoNewPrivs:\t1") && d.contains("Seccomp:\t2"),
        "{d}"
    );
    // Control: the host process has capabilities (we are root).
    let ctl = outside(&["status"]);
    assert!(!ctl.report()["detail"]
        .as_str()
        .unwrap()
        .contains("CapEff:\t0000000000000000"));
}

/// A copy of the probe owned by root with the setuid bit, and one with a file capability.
fn privileged_copies(ws: &Ws) -> (PathBuf, PathBuf) {
    let suid = ws.path().join("suid-probe");
    std::fs::copy(probe_bin(), &suid).unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let capped = ws.path().join("cap-probe");
    std::fs::copy(probe_bin(), &capped).unwrap();
    std::fs::set_permissions(&capped, std::fs::Permissions::from_mode(0o755)).unwrap();
    // struct vfs_cap_data, revision 2: CAP_NET_RAW (13) permitted, effective flag set.
    let mut data = [0u8; 20];
    data[0..4].copy_from_slice(&(0x0200_0000u32 | 1).to_le_bytes());
    data[4..8].copy_from_slice(&(1u32 << 13).to_le_bytes());
    let path = std::ffi::CString::new(capped.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path, name and a buffer of the length we pass.
    let r = unsafe {
        libc::setxattr(
            path.as_ptr(),
            c"security.capability".as_ptr(),
            data.as_ptr().cast(),
            data.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr: {}", std::io::Error::last_os_error());
    (suid, capped)
}

#[test]
fn a_setuid_binary_and_a_file_with_capabilities_gain_nothing() {
    let Some(ws) = Ws::new() else { return };
    let (suid, capped) = privileged_copies(&ws);
    // The workspace must be reachable for uid 65534.
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = ws.profile("nobody", &profile_with("run_as = \"nobody\"", ""));
    let s = exec(
        &ws,
        &["--profile", &nobody],
        &[suid.to_str().unwrap(), "status"],
    );
    let d = s.report()["detail"].as_str().unwrap().to_owned();
    assert!(
        d.contains("Uid:\t65534\t65534\t65534"),
        "setuid took effect: {d}"
    );
    let c = exec(
        &ws,
        &["--profile", &nobody],
        &[capped.to_str().unwrap(), "status"],
    );
    let d = c.report()["detail"].as_str().unwrap().to_owned();
    assert!(
        d.contains("CapEff:\t0000000000000000") && d.contains("CapPrm:\t0000000000000000"),
        "{d}"
    );
    // Controls on the host, as nobody: the setuid bit and the file capability both work.
    // Each reads the probe's own report, so a probe that did not run fails the control.
    let status_as_nobody = |p: &Path| {
        let o = Out::from(
            Command::new(p)
                .arg("status")
                .uid(65534)
                .gid(65534)
                .output()
                .unwrap(),
        );
        assert!(o.ok(), "{} {}", o.stdout, o.stderr);
        o.report()["detail"].as_str().unwrap().to_owned()
    };
    use std::os::unix::process::CommandExt;
    let d = status_as_nobody(&suid);
    assert!(d.contains("Uid:\t65534\t0\t0"), "control setuid: {d}");
    let d = status_as_nobody(&capped);
    // CAP_NET_RAW is bit 13: permitted and effective.
    assert!(
        d.contains("CapPrm:\t0000000000002000") && d.contains("CapEff:\t0000000000002000"),
        "control caps: {d}"
    );
}

// ---- lifetime --------------------------------------------------------------------------------

fn host_processes_with(marker: &str) -> Vec<i32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            if String::from_utf8_lossy(&env).contains(marker) && sidejob_tests::process_alive(pid) {
                v.push(pid);
            }
        }
    }
    v
}

#[test]
fn a_setsid_grandchild_is_gone_when_the_run_ends() {
    let Some(ws) = Ws::new() else { return };
    let marker = format!("orphan-{}-{}", std::process::id(), line!());
    let out = exec(&ws, &["--json"], &[&ws.probe(), "orphan", &marker]);
    assert!(out.ok(), "{}", out.stdout);
    assert!(
        out.result()["leftover_processes"].as_u64().unwrap() >= 1,
        "{}",
        out.stdout
    );
    assert!(
        host_processes_with(&marker).is_empty(),
        "the grandchild survived the run"
    );
    // Control: on the host the same probe does leave the grandchild behind.
    let ctl_marker = format!("{marker}-control");
    assert!(outside(&["orphan", &ctl_marker]).ok());
    // The grandchild execs `sleep` after the probe has returned: wait for it to show.
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left = host_processes_with(&ctl_marker);
        if !left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        !left.is_empty(),
        "control: the grandchild is left behind on the host"
    );
    for p in left {
        // SAFETY: killing the control's leftover.
        unsafe { libc::kill(p, libc::SIGKILL) };
    }
}

#[test]
fn killing_the_supervisor_takes_the_whole_run_with_it() {
    let Some(ws) = Ws::new() else { return };
    let marker = format!("killsup-{}-{}", std::process::id(), line!());
    let script = format!("{} orphan {marker}; exec /bin/sleep 60", ws.probe());
    let mut child = Command::new(sidejob_bin())
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .args(["--", "/bin/sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while host_processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the run never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL the supervisor
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !host_processes_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the run outlived its supervisor");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The killed exec could not remove its run directory; the next exec sweeps it.
    let leftover = format!("sidejob-exec-{}-", child.id());
    let left = |l: &str| {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(l))
            })
            .unwrap_or(false)
    };
    let _ = Command::new(sidejob_bin())
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .args(["--", "/bin/true"])
        .status();
    assert!(!left(&leftover), "the killed run's directory was not swept");
}

/// `Cpus_allowed_list` of `/proc/<who>/status`.
fn cpus_allowed(who: &str) -> String {
    sidejob_tests::proc_status(who, "Cpus_allowed_list").expect("Cpus_allowed_list")
}

/// This test process's CPUs, when there are several (a skip is printed otherwise).
fn several_cpus() -> Option<String> {
    let mine = cpus_allowed("thread-self");
    if !mine.contains(['-', ',']) {
        eprintln!("skipped: this test process may use one CPU only ({mine})");
        return None;
    }
    Some(mine)
}

/// `sidejob exec` keeps itself (and its run's init) on the CPU it started on, so that their
/// hand-offs wake no idle CPU; the command may still use every CPU its caller could, and a
/// caller held to one CPU has its command held there too.
#[test]
fn the_command_may_use_the_callers_cpus_while_exec_stays_on_one() {
    let Some(ws) = Ws::new() else { return };
    let Some(mine) = several_cpus() else { return };
    let script = "grep Cpus_allowed_list /proc/self/status; exec sleep 5";
    let mut child = crate::containment::exec_command(&ws, &[], &["sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let exec_cpus = cpus_allowed(&child.id().to_string());
    child.kill().unwrap();
    child.wait().unwrap();
    let command_cpus = line
        .trim()
        .strip_prefix("Cpus_allowed_list:")
        .unwrap()
        .trim();
    assert_eq!(command_cpus, mine, "the command's CPUs");
    assert!(
        exec_cpus.parse::<usize>().is_ok(),
        "sidejob exec may use {exec_cpus}, not one CPU"
    );

    // A caller held to one CPU: so is its command.
    let last = mine.rsplit(['-', ',']).next().unwrap().to_owned();
    let cpu: usize = last.parse().unwrap();
    let mut held = crate::containment::exec_command(
        &ws,
        &[],
        &["grep", "Cpus_allowed_list", "/proc/self/status"],
    );
    // SAFETY: sched_setaffinity is async-signal-safe and touches only the set on this stack.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut held, move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = held.output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        got.trim().strip_prefix("Cpus_allowed_list:").map(str::trim),
        Some(last.as_str()),
        "{got}"
    );
}

/// What the command starts with, whichever way it is started: every CPU its caller could use
/// (and so does what it forks at once), normal scheduling (init holds the command to its own
/// CPU, real-time, while the command execs: none of that may reach the command), and its own
/// `sched_setaffinity` kept (ours comes before its first instruction, never after).
fn assert_starts_free(out: &str, mine: &str, own: &str) {
    let lines: Vec<&str> = out.lines().map(str::trim).collect();
    let cpus = |l: &str| {
        l.strip_prefix("Cpus_allowed_list:")
            .map(|c| c.trim().to_owned())
    };
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        cpus(lines[0]).as_deref(),
        Some(mine),
        "the command's CPUs: {out}"
    );
    assert_eq!(
        cpus(lines[1]).as_deref(),
        Some(mine),
        "its first child's CPUs: {out}"
    );
    let policy = lines[2].rsplit(':').next().map(str::trim);
    assert_eq!(
        policy,
        Some("0"),
        "its scheduling policy (0: SCHED_OTHER): {out}"
    );
    assert_eq!(
        cpus(lines[3]).as_deref(),
        Some(own),
        "its own taskset: {out}"
    );
}

/// The script [`assert_starts_free`] reads, with `taskset -c <own>` as the command's own.
fn start_script(own: &str) -> String {
    format!(
        "grep Cpus_allowed_list /proc/self/status; sleep 5 & grep Cpus_allowed_list /proc/$!/status; \
         kill $!; grep -E '^policy' /proc/self/sched; taskset -c {own} grep Cpus_allowed_list /proc/self/status"
    )
}

#[test]
fn the_command_starts_on_every_cpu_with_normal_scheduling_and_keeps_its_own_affinity() {
    let Some(ws) = Ws::new() else { return };
    let Some(mine) = several_cpus() else { return };
    let own = mine.rsplit(['-', ',']).next().unwrap().to_owned();
    let script = start_script(&own);
    // sidejob exec, which keeps itself and init on one CPU.
    for _ in 0..5 {
        let out = exec(&ws, &[], &["sh", "-c", &script]);
        assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
        assert_starts_free(&out.stdout, &mine, &own);
    }
    // The daemon's runs, whose init holds itself to its CPU only while the command execs.
    let d = sidejob_tests::Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    for _ in 0..5 {
        let r = c.bash(&s, &script, serde_json::json!({}));
        assert_eq!(r["exit_code"], 0, "{r}");
        assert_starts_free(r["output"].as_str().unwrap(), &mine, &own);
    }
}

// ---- environment -----------------------------------------------------------------------------

#[test]
fn the_callers_secrets_are_not_in_the_environment_or_in_proc() {
    let Some(ws) = Ws::new() else { return };
    let env = [
        ("SIDEJOB_TEST_SECRET", "hunter2-token"),
        ("TERM", "xterm-test"),
    ];
    let out = exec_env(&ws, &[], &[&ws.probe(), "env"], &env);
    let d = out.report()["detail"].as_str().unwrap().to_owned();
    assert!(!d.contains("hunter2"), "{d}");
    assert!(
        d.contains("TERM=xterm-test"),
        "an allowed variable passes: {d}"
    );
    let all = exec_env(&ws, &[], &[&ws.probe(), "environs"], &env);
    assert!(!all.stdout.contains("hunter2"), "{}", all.stdout);
    // Control: the secret is in the caller's environment (the unconfined probe sees it).
    let ctl = Command::new(probe_bin())
        .arg("env")
        .envs(env)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&ctl.stdout).contains("hunter2"));
}
