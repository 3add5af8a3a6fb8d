//! Installing and deploying: the install script's layout, systemd socket activation and
//! readiness, JSON logs (plugin panics included), plugins refused for a broken schema.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, signal, Client, Daemon, TempDir};

use super::plugins::{built_plugin, install};

/// A daemon this file started; killed if a test fails before it stops it.
pub(crate) struct Serve(pub(crate) Child);

impl Drop for Serve {
    /// A clean stop first (SIGTERM), so the daemon removes what it made outside the test's
    /// directory; SIGKILL if it is not gone in 5 s. (What it leaves in /dev/shm, the test's
    /// `TempDir` removes.) A child already reaped is not signalled: its pid may be reused.
    fn drop(&mut self) {
        if !matches!(self.0.try_wait(), Ok(Some(_))) {
            signal(self.0.id() as i32, libc::SIGTERM);
            let stopped = sidejob_tests::wait_until(std::time::Duration::from_secs(5), || {
                matches!(self.0.try_wait(), Ok(Some(_)))
            });
            if !stopped {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
}

/// A datagram socket standing in for systemd's NOTIFY_SOCKET.
pub(crate) struct Notify {
    pub(crate) path: PathBuf,
    sock: UnixDatagram,
}

impl Notify {
    pub(crate) fn new(dir: &Path) -> Notify {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).expect("bind notify socket");
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        Notify { path, sock }
    }

    /// The next state line the daemon sends (e.g. READY=1), within 30 s.
    pub(crate) fn next(&self) -> String {
        let mut buf = [0u8; 512];
        let n = self
            .sock
            .recv(&mut buf)
            .expect("the daemon notified the service manager within 30 s");
        String::from_utf8_lossy(&buf[..n]).trim().to_owned()
    }
}

/// `sidejob serve` started as systemd starts a socket-activated `Type=notify` service: the
/// listening socket is descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` is the service's own pid
/// (set by a shell that then execs, keeping its pid), and `NOTIFY_SOCKET` is set.
pub(crate) fn serve_activated(listener: &UnixListener, state_dir: &Path, notify: &Notify) -> Serve {
    let mut cmd = activated(listener.as_raw_fd(), state_dir, notify);
    Serve(cmd.spawn().expect("spawn sidejob serve"))
}

/// The command of [`serve_activated`], handed descriptor `fd` as its descriptor 3.
fn activated(fd: std::os::fd::RawFd, state_dir: &Path, notify: &Notify) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" serve --state-dir \"$1\"")
        .arg(sidejob_bin())
        .arg(state_dir)
        .env("NOTIFY_SOCKET", &notify.path)
        .env_remove("SIDEJOB_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe and touch only descriptors: `fd` (open in
    // the parent, so in the child) becomes descriptor 3 without close-on-exec.
    unsafe {
        cmd.pre_exec(move || {
            // dup2 onto itself would keep close-on-exec: clear it instead.
            let ok = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0) != -1
            } else {
                libc::dup2(fd, 3) != -1
            };
            if !ok {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn a_socket_activated_daemon_serves_the_socket_it_was_given_and_says_ready() {
    let root = TempDir::new("activation");
    // The socket's directory is the daemon's: a workspace beside it, not below it.
    std::fs::create_dir_all(root.path().join("run")).expect("run dir");
    let path = root.path().join("run/given.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let notify = Notify::new(root.path());
    let mut child = serve_activated(&listener, &root.path().join("state"), &notify);
    assert_eq!(notify.next(), "READY=1");
    drop(listener);
    let mut c = Client::connect(&path);
    let st = c.ok("daemon.status", json!({}));
    assert_eq!(st["socket_activated"], true, "{st}");
    assert_eq!(st["socket"], path.display().to_string(), "{st}");
    let ws = root.path().join("workspace");
    std::fs::create_dir(&ws).expect("workspace");
    let s = c.open_session_in(&ws);
    let r = c.bash(&s, "echo activated", json!({}));
    assert_eq!(r["output"], "activated\n", "{r}");
    signal(child.0.id() as i32, libc::SIGTERM);
    assert_eq!(notify.next(), "STOPPING=1");
    let status = child.0.wait().expect("wait");
    assert!(status.success(), "{status:?}");
    assert!(
        path.exists(),
        "the socket belongs to the service manager, which keeps it for the next start"
    );
}

#[test]
fn a_passed_descriptor_that_is_not_a_listening_socket_is_refused() {
    let root = TempDir::new("activation-bad");
    let not_listening = UnixDatagram::unbound().expect("socket");
    let notify = Notify::new(root.path());
    let mut cmd = activated(
        not_listening.as_raw_fd(),
        &root.path().join("state"),
        &notify,
    );
    let o = cmd.output().expect("run");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("LISTEN_FDS") && err.contains("not a stream socket"),
        "{err}"
    );
}

/// `sidejob serve` with extra arguments, on its own socket; returns when it is ready.
fn serve_with(root: &Path, args: &[&str], notify: &Notify) -> (Serve, PathBuf) {
    let socket = root.join("run/sidejob.sock");
    let child = Command::new(sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(root.join("state"))
        .args(args)
        .env("NOTIFY_SOCKET", &notify.path)
        .env_remove("SIDEJOB_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let child = Serve(child);
    assert_eq!(notify.next(), "READY=1");
    (child, socket)
}

#[test]
fn json_logs_carry_a_plugin_panic_and_nothing_else_reaches_stderr() {
    let root = TempDir::new("jsonlog");
    let plugins = root.path().join("plugins");
    std::fs::create_dir(&plugins).expect("mkdir");
    std::fs::set_permissions(&plugins, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    install(
        &built_plugin("sidejob_testplugin_panicky"),
        &plugins,
        "panicky.so",
        0o644,
    );
    let config = root.path().join("config.toml");
    std::fs::write(
        &config,
        format!("plugin_dirs = [{:?}]\n", plugins.display().to_string()),
    )
    .expect("config");
    let notify = Notify::new(root.path());
    let config_arg = config.display().to_string();
    let (mut child, socket) = serve_with(
        root.path(),
        &["--log-format", "json", "--config", &config_arg],
        &notify,
    );
    let mut c = Client::connect(&socket);
    let ws = root.path().join("workspace");
    std::fs::create_dir(&ws).expect("workspace");
    let s = c.open_session_in(&ws);
    let err = c
        .call(
            "tool.call",
            json!({"session_id": s, "tool": "panicky", "args": {}}),
        )
        .expect_err("a panicking plan is an error");
    assert!(
        err["message"].as_str().unwrap_or("").contains("panicked"),
        "{err}"
    );
    signal(child.0.id() as i32, libc::SIGTERM);
    let mut stderr = String::new();
    child
        .0
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read");
    child.0.wait().expect("wait");
    let lines: Vec<Value> = stderr
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}\n{stderr}"))
        })
        .collect();
    let panic_line = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("the plugin panicked in plan"))
        })
        .unwrap_or_else(|| panic!("the panic is not logged: {stderr}"));
    assert_eq!(panic_line["level"], "WARN", "{panic_line}");
    assert_eq!(panic_line["fields"]["tool"], "panicky", "{panic_line}");
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "sidejob is listening"),
        "{stderr}"
    );
}

#[test]
fn a_plugin_whose_schema_is_not_json_schema_is_refused_with_one_line() {
    let dir = TempDir::new("badschema");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    install(
        &built_plugin("sidejob_testplugin_bad_schema"),
        dir.path(),
        "bad.so",
        0o644,
    );
    let d = Daemon::start_with_config(&format!(
        "plugin_dirs = [{:?}]\n",
        dir.path().display().to_string()
    ));
    let mut c = d.client();
    let listed = c.ok("tool.list", json!({}));
    let names: Vec<&str> = listed["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert!(
        names.contains(&"bash") && !names.contains(&"misspelled"),
        "{names:?}"
    );
    let errors: Vec<&str> = listed["plugin_errors"]
        .as_array()
        .expect("plugin_errors")
        .iter()
        .map(|e| e.as_str().expect("line"))
        .collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("bad.so")
            && errors[0].contains("misspelled")
            && errors[0].contains("objekt"),
        "{errors:?}"
    );
    assert!(!errors[0].contains('\n'));
    let status = c.ok("daemon.status", json!({}));
    assert_eq!(status["plugin_errors"], listed["plugin_errors"], "{status}");
    // Checked in the helper process, not in the daemon (which would say so).
    let log = d.log();
    assert!(!log.contains("cannot check plugin schemas"), "{log}");
}

#[test]
fn the_install_script_puts_the_plugins_where_the_installed_daemon_finds_them() {
    let root = TempDir::new("install");
    let prefix = root.path().join("prefix");
    let from = sidejob_bin().parent().expect("target dir").to_path_buf();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/install.sh");
    let o = Command::new("bash")
        .arg(&script)
        .arg("--prefix")
        .arg(&prefix)
        .arg("--from")
        .arg(&from)
        .output()
        .expect("run install.sh");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for f in [
        "bin/sidejob",
        "lib/sidejob/plugins/libsidejob_plugin_bash.so",
        "lib/sidejob/plugins/libsidejob_plugin_code.so",
        "lib/sidejob/plugins/libsidejob_plugin_subagent.so",
        "share/bash-completion/completions/sidejob",
        "share/zsh/site-functions/_sidejob",
        "share/fish/vendor_completions.d/sidejob.fish",
        "share/man/man1/sidejob.1",
        "share/man/man1/sidejob-call.1",
    ] {
        assert!(prefix.join(f).is_file(), "{f} is not installed");
    }
    // The installed binary, with nothing next to it, finds its plugins in the prefix.
    let notify = Notify::new(root.path());
    let socket = root.path().join("run/installed.sock");
    let mut child = Serve(
        Command::new(prefix.join("bin/sidejob"))
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
            .expect("spawn the installed sidejob"),
    );
    assert_eq!(notify.next(), "READY=1");
    let status = Client::connect(&socket).ok("daemon.status", json!({}));
    signal(child.0.id() as i32, libc::SIGTERM);
    child.0.wait().expect("wait");
    let plugins = prefix.join("lib/sidejob/plugins");
    let mut tools: Vec<(String, String)> = status["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("name").to_owned(),
                t["plugin"].as_str().expect("plugin").to_owned(),
            )
        })
        .collect();
    tools.sort();
    let names: Vec<&str> = tools.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["bash", "code", "subagent"], "{status}");
    for (_, plugin) in &tools {
        assert!(
            Path::new(plugin).starts_with(&plugins),
            "{plugin} is not from {}",
            plugins.display()
        );
    }
}

/// `kubernetes-validate` from the test virtualenv (tests/requirements.txt).
fn kubernetes_validate() -> Option<PathBuf> {
    let workspace = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let candidates = [
        std::env::var_os("SIDEJOB_TEST_PYTHON")
            .map(PathBuf::from)
            .and_then(|p| p.parent().map(|d| d.join("kubernetes-validate"))),
        Some(workspace.join("target/ci-venv/bin/kubernetes-validate")),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() && std::env::var_os("CI").is_some() {
        panic!("kubernetes-validate is missing: .ci/run installs tests/requirements.txt into target/ci-venv");
    }
    found
}

#[test]
fn the_kubernetes_manifests_match_the_kubernetes_schema() {
    let Some(validate) = kubernetes_validate() else {
        sidejob_tests::skip_unless(
            false,
            "kubernetes-validate is not installed (pip install -r tests/requirements.txt)",
        );
        return;
    };
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut manifests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    manifests.sort();
    assert!(!manifests.is_empty());
    let check = |files: &[PathBuf]| {
        Command::new(&validate)
            .arg("--strict")
            .args(files)
            .output()
            .expect("run kubernetes-validate")
    };
    // Every version a manifest claims ("Kubernetes 1.30+"), up to the newest the pinned
    // kubernetes-validate knows (its own version, tests/requirements.txt).
    let newest =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("requirements.txt"))
            .expect("requirements.txt")
            .lines()
            .find_map(|l| l.strip_prefix("kubernetes-validate==1."))
            .and_then(|v| v.split('.').next()?.parse::<u32>().ok())
            .expect("kubernetes-validate is pinned to 1.N.x");
    for manifest in &manifests {
        let text = std::fs::read_to_string(manifest).expect("read");
        let oldest = text
            .split("Kubernetes 1.")
            .nth(1)
            .and_then(|rest| rest.split('+').next()?.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("{} claims no \"Kubernetes 1.N+\"", manifest.display()));
        for minor in oldest..=newest {
            let o = Command::new(&validate)
                .args(["--strict", "-k", &format!("1.{minor}.0")])
                .arg(manifest)
                .output()
                .expect("run kubernetes-validate");
            assert!(
                o.status.success(),
                "{} against Kubernetes 1.{minor}: {}{}",
                manifest.display(),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    let o = check(&manifests);
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The check can fail: a misspelled field is caught.
    let root = TempDir::new("k8s");
    let broken = root.path().join("broken.yaml");
    let text = std::fs::read_to_string(&manifests[0]).expect("read");
    std::fs::write(&broken, text.replacen("readinessProbe", "readinesProbe", 1)).expect("write");
    assert!(
        !check(&[broken]).status.success(),
        "a misspelled field passed"
    );
}

#[test]
fn the_opt_in_prometheus_endpoint_serves_the_status_counters() {
    let d = Daemon::start_with_config("metrics_addr = \"127.0.0.1:0\"\n");
    // The daemon logs the port it bound before its control socket accepts.
    let log = d.log();
    let addr = log
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split("/metrics").next())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"))
        .to_owned();
    let o = d.cli(&["call", "--", "exit 2"]);
    assert_eq!(o.status.code(), Some(2));
    let mut s = std::net::TcpStream::connect(&addr).expect("connect to the metrics endpoint");
    std::io::Write::write_all(&mut s, b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut response = String::new();
    s.read_to_string(&mut response).expect("response");
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.contains("text/plain; version=0.0.4"), "{response}");
    assert!(
        response.contains("sidejob_runs_settled_total{state=\"failed\"} 1"),
        "{response}"
    );
    assert!(
        response.contains("# TYPE sidejob_tasks gauge"),
        "{response}"
    );
    assert!(response.contains("sidejob_tools_loaded 3"), "{response}");
}

#[test]
fn metrics_are_refused_off_loopback() {
    let root = TempDir::new("metrics-public");
    let o = Command::new(sidejob_bin())
        .arg("serve")
        .arg("--socket")
        .arg(root.path().join("run/s.sock"))
        .arg("--state-dir")
        .arg(root.path().join("state"))
        .args(["--metrics-addr", "0.0.0.0:0"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("loopback"), "{err}");
}
