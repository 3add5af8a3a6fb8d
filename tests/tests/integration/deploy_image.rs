//! The container image as an operator builds and runs it, here where no registry is reachable:
//! a Debian base made with debootstrap from the machine's own apt mirror (`podman import`),
//! the repository's Dockerfile built from this build (`BINARIES=prebuilt`: no Rust image, no
//! cargo), run with the pod manifest's capabilities, its seccomp profile and a read-only root. Inside it: `status`,
//! a call, an in-place upgrade (`kill -HUP 1`) with a run in flight that settles with its own
//! exit code, and a container restart that ends a run and says so.
//!
//! Slow the first time: about 2.5 minutes here (debootstrap, then apt-get in the image's build);
//! the base tarball is kept in /var/tmp/sidejob-test-image and podman keeps the image's
//! layers, so later runs take about 15 s. Skipped, saying why, only where podman cannot
//! run a container.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use sidejob_tests::sidejob_bin;

pub(super) const BASE: &str = "localhost/sidejob-test-base:bookworm";
const IMAGE: &str = "localhost/sidejob-image-test:latest";
const CACHE: &str = "/var/tmp/sidejob-test-image";

pub(super) fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

pub(super) fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

/// Runs `cmd`, failing the test with its output unless it succeeds; returns its stdout.
pub(super) fn ok(cmd: &mut Command) -> String {
    let o = run(cmd);
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The Debian mirror apt uses here (the one machine-wide source that is reachable).
fn mirror() -> String {
    let mut texts = Vec::new();
    for dir in ["/etc/apt/sources.list.d"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "sources" || x == "list") {
                    texts.push(std::fs::read_to_string(p).unwrap_or_default());
                }
            }
        }
    }
    texts.push(std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default());
    texts
        .iter()
        .flat_map(|t| t.lines())
        .find_map(|l| {
            let l = l.trim();
            let url = l
                .strip_prefix("URIs:")
                .or_else(|| l.strip_prefix("deb "))?
                .split_whitespace()
                .find(|w| w.starts_with("http"))?;
            (url.ends_with("/debian") || url.ends_with("/debian/")).then(|| url.to_owned())
        })
        .unwrap_or_else(|| "http://deb.debian.org/debian".into())
}

/// The base image, imported from the cached debootstrap tarball (made first if missing).
/// The image tests run at once, each in its own process: the first makes the image while the
/// others wait for it (two debootstraps into one cache lost one's tarball to the other).
pub(super) fn base_image() {
    let _only_one = sidejob_tests::host::HostLock::take("base-image");
    if run(Command::new("podman").args(["image", "exists", BASE]))
        .status
        .success()
    {
        return;
    }
    let tarball = Path::new(CACHE).join("bookworm-minbase.tar");
    if !tarball.exists() {
        assert!(
            Command::new("debootstrap")
                .arg("--version")
                .output()
                .is_ok(),
            "debootstrap is needed to make the base image here: apt-get install -y debootstrap"
        );
        std::fs::create_dir_all(CACHE).expect("cache dir");
        let rootfs = Path::new(CACHE).join(format!("rootfs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&rootfs);
        ok(Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&rootfs)
            .arg(mirror()));
        let partial = tarball.with_extension("tar.partial");
        ok(Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .arg("-cf")
            .arg(&partial)
            .arg("."));
        std::fs::rename(&partial, &tarball).expect("keep the tarball");
        let _ = std::fs::remove_dir_all(&rootfs);
    }
    ok(Command::new("podman").arg("import").arg(&tarball).arg(BASE));
}

/// The image, from this build installed into a tree inside the build context.
fn build_image() {
    let tree = workspace().join("target/image-root");
    let _ = std::fs::remove_dir_all(&tree);
    let built = sidejob_bin();
    ok(Command::new(workspace().join("deploy/install.sh"))
        .arg("--from")
        .arg(built.parent().expect("target dir"))
        .arg("--destdir")
        .arg(&tree));
    ok(Command::new("podman")
        .args(["build", "--runtime", "runc", "--network", "host"])
        .arg("-f")
        .arg(workspace().join("deploy/container/Dockerfile"))
        .args(["--build-arg", "BINARIES=prebuilt"])
        .args(["--build-arg", "PREBUILT=target/image-root"])
        .args(["--build-arg", &format!("RUNTIME_IMAGE={BASE}")])
        .args(["-t", IMAGE])
        .arg(workspace()));
}

/// A container of the image and its state volume, removed on drop.
struct Container {
    name: String,
}

impl Container {
    /// Runs the image as the pod manifest does: root, its capabilities only, its seccomp
    /// profile (sidejob-seccomp.json), AppArmor unconfined, a read-only root with the socket, tmp and workspace on tmpfs and
    /// the state on a volume. (podman here needs runc and the descriptor and process limits.)
    fn start() -> Container {
        let name = format!("sidejob-image-test-{}", std::process::id());
        let c = Container { name };
        c.remove();
        let hard = nix_hard_nofile();
        let caps = super::deploy_health::manifest_capabilities().join(",");
        ok(Command::new("podman")
            .args(["run", "-d", "--name", &c.name, "--runtime", "runc"])
            .args(["--ulimit", &format!("nofile={hard}:{hard}")])
            .args(["--ulimit", "nproc=4096:4096"])
            .args(["--cap-drop", "ALL", "--cap-add", &caps])
            .args(["--security-opt"])
            .arg(format!(
                "seccomp={}",
                workspace()
                    .join("deploy/kubernetes/sidejob-seccomp.json")
                    .display()
            ))
            .args(["--security-opt", "apparmor=unconfined"])
            .args(["--read-only", "--tmpfs", "/run/sidejob"])
            .args(["--tmpfs", "/tmp:rw,exec", "--tmpfs", "/workspace:rw,exec"])
            .args(["-v", &format!("{}:/var/lib/sidejob", c.name)])
            .arg(IMAGE));
        c
    }

    fn exec(&self, args: &[&str]) -> Output {
        run(Command::new("podman")
            .args(["exec", "-w", "/workspace", &self.name])
            .args(args))
    }

    fn sh(&self, script: &str) -> String {
        ok(Command::new("podman").args([
            "exec",
            "-w",
            "/workspace",
            &self.name,
            "sh",
            "-c",
            script,
        ]))
    }

    /// Waits (up to 30 s) until the daemon answers `sidejob status --ready`.
    fn ready(&self) {
        let o = self.sh(
            "for i in $(seq 300); do sidejob status --ready >/dev/null 2>&1 && exit 0; \
             sleep 0.1; done; sidejob status --ready",
        );
        let _ = o;
    }

    fn logs(&self) -> String {
        let o = run(Command::new("podman").args(["logs", &self.name]));
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    }

    fn remove(&self) {
        let _ = run(Command::new("podman").args(["rm", "-f", "-t", "0", &self.name]));
        let _ = run(Command::new("podman").args(["volume", "rm", "-f", &self.name]));
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        self.remove();
    }
}

pub(super) fn nix_hard_nofile() -> u64 {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit, which `rl` is.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) };
    rl.rlim_max
}

/// Why podman cannot run a container here, if it cannot.
pub(super) fn podman_cannot_run() -> Option<String> {
    let info = Command::new("podman").arg("info").output();
    match info {
        Err(e) => {
            return Some(format!(
                "podman is not installed ({e}): apt-get install -y podman"
            ))
        }
        Ok(o) if !o.status.success() => {
            return Some(format!(
                "podman info fails: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Ok(_) => {}
    }
    if Command::new("runc").arg("--version").output().is_err() {
        return Some(
            "runc is not installed (podman here runs containers with it): apt-get install -y runc"
                .into(),
        );
    }
    if !sidejob_tests::is_root() {
        return Some("needs root (rootful podman, the image's capabilities)".into());
    }
    None
}

/// The id `sidejob call --background` printed.
fn background(c: &Container, command: &str) -> String {
    let o = c.exec(&["sidejob", "call", "--background", "--", command]);
    assert!(o.status.success(), "{o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

fn task(c: &Container, id: &str) -> serde_json::Value {
    let out = c.sh(&format!("sidejob rpc task.get '{{\"task_id\": \"{id}\"}}'"));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("task.get: {e}: {out}"))
}

#[test]
fn the_image_builds_here_serves_and_upgrades_in_place_with_a_run_in_flight() {
    if let Some(why) = podman_cannot_run() {
        sidejob_tests::skip_unless(false, &why);
        return;
    }
    base_image();
    build_image();
    let c = Container::start();
    c.ready();
    let status = c.exec(&["sidejob", "status"]);
    assert!(status.status.success(), "{status:?}\n{}", c.logs());
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(
        said.contains("/run/sidejob/sidejob.sock") && said.contains("bash"),
        "{said}"
    );
    let hi = c.exec(&["sidejob", "call", "--", "echo", "hi"]);
    assert_eq!(
        String::from_utf8_lossy(&hi.stdout),
        "hi\n",
        "{hi:?}\n{}",
        c.logs()
    );
    assert_eq!(hi.status.code(), Some(0));

    // The seccomp profile is in force: swapoff(2) is refused before the kernel would look
    // for the file (ENOENT with CAP_SYS_ADMIN and no filter).
    let errno = c.sh(
        "python3 -c 'import ctypes; l = ctypes.CDLL(None, use_errno=True); \
         l.swapoff(b\"/nonexistent\"); print(ctypes.get_errno())'",
    );
    assert_eq!(errno.trim(), "1", "swapoff was not refused with EPERM");

    // In place, a run in flight: the new binary staged on the state volume (the image's own
    // files are read-only), checked, then SIGHUP to tini, which passes it to the daemon.
    c.sh("mkfifo /workspace/gate");
    let id = background(&c, ": < /workspace/gate; echo upgraded; exit 4");
    c.sh(
        "set -e; cd /var/lib/sidejob; mkdir -p upgrade/bin upgrade/lib; \
         cp /usr/local/bin/sidejob upgrade/bin/; cp -r /usr/local/lib/sidejob upgrade/lib/; \
         sidejob upgrade-check",
    );
    // The daemon is tini's only child.
    let daemon = || c.sh("cat /proc/1/task/1/children").trim().to_owned();
    let before = daemon();
    assert!(!before.is_empty() && !before.contains(' '), "{before}");
    c.sh("kill -HUP 1");
    c.sh("for i in $(seq 300); do for p in /proc/[0-9]*; do \
           [ \"$(readlink $p/exe)\" = /var/lib/sidejob/upgrade/bin/sidejob ] && exit 0; \
         done; sleep 0.1; done; exit 1");
    c.ready();
    let after = daemon();
    assert_eq!(before, after, "the daemon's pid changed:\n{}", c.logs());
    assert_eq!(task(&c, &id)["state"], "running");
    // Opening it for writing lets the reader go on (nothing is written, so no SIGPIPE).
    c.sh(": > /workspace/gate");
    let waited = c.exec(&["sidejob", "wait", &id]);
    assert_eq!(waited.status.code(), Some(4), "{waited:?}\n{}", c.logs());
    let out = c.exec(&["sidejob", "logs", &id]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "upgraded\n");
    assert!(c.logs().contains("upgraded in place"), "{}", c.logs());

    // A container restart ends the run in flight, and the next start says so.
    let id = background(&c, "sleep 600");
    let t = task(&c, &id);
    assert_eq!(t["state"], "running", "{t}");
    ok(Command::new("podman").args(["restart", "-t", "1", &c.name]));
    c.ready();
    let t = task(&c, &id);
    assert_eq!(
        (&t["state"], &t["reason"]),
        (&"failed".into(), &"lost".into()),
        "{t}"
    );
    assert!(
        t["error"]
            .as_str()
            .is_some_and(|e| e.contains("container (or pod) it ran in was restarted")),
        "{t}"
    );
}

/// The pod's seccomp profile (policy as data): every rule says why, the manifest uses it, and
/// nothing a run's sandbox is built with is refused (the image test shows the daemon works
/// under it; this keeps a later edit from refusing one of them).
#[test]
fn the_seccomp_profile_gives_a_reason_per_rule_and_keeps_what_the_sandbox_needs() {
    let path = workspace().join("deploy/kubernetes/sidejob-seccomp.json");
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("profile")).expect("JSON");
    assert_eq!(profile["defaultAction"], "SCMP_ACT_ALLOW", "{profile}");
    let rules = profile["syscalls"].as_array().expect("syscalls");
    let mut refused = Vec::new();
    for rule in rules {
        assert!(
            rule["comment"].as_str().is_some_and(|c| !c.is_empty()),
            "a rule without its reason: {rule}"
        );
        assert_eq!(rule["action"], "SCMP_ACT_ERRNO", "{rule}");
        for n in rule["names"].as_array().expect("names") {
            refused.push(n.as_str().expect("name").to_owned());
        }
    }
    for needed in [
        "unshare",
        "setns",
        "mount",
        "umount2",
        "pivot_root",
        "clone",
        "clone3",
        "seccomp",
        "landlock_create_ruleset",
        "landlock_add_rule",
        "landlock_restrict_self",
        "prctl",
        "capset",
        "pidfd_open",
        "execveat",
        "sethostname",
    ] {
        assert!(!refused.iter().any(|r| r == needed), "{needed} is refused");
    }
    let manifest = std::fs::read_to_string(workspace().join("deploy/kubernetes/sidejob-pod.yaml"))
        .expect("manifest");
    assert!(
        manifest.contains("localhostProfile: profiles/sidejob-seccomp.json"),
        "the pod does not use the profile"
    );
}
