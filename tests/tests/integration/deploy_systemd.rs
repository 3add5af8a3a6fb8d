//! The shipped units under systemd itself (the machine's PID 1 is not systemd, so a container
//! boots it): the debootstrap base of deploy_image.rs plus Debian's systemd, booted with
//! systemd as PID 1; sidejob installed by deploy/install.sh and the units copied as the
//! README says, `systemctl enable --now sidejob.socket`. With runs in flight, a staged binary
//! and `systemctl reload sidejob`, which returns once the daemon serves again from it (same
//! MainPID, the runs settle with their own exit codes); then `systemctl restart sidejob`, a
//! new daemon that re-attaches to the runs (KillMode=process), which settle with theirs.
//!
//! The first run builds the base if it is missing (see deploy_image.rs), then the systemd
//! layer: about 26 s here with the base there. podman keeps the layer, so later runs take
//! about 15 s. Skipped, saying why, only where podman cannot run a container.

use std::process::{Command, Output};

use super::deploy_image::{base_image, nix_hard_nofile, ok, podman_cannot_run, run, workspace};
use sidejob_tests::sidejob_bin;

const IMAGE: &str = "localhost/sidejob-systemd-test:bookworm";
const STAGED: &str = "/var/lib/sidejob/upgrade/bin/sidejob";

/// The base with Debian's systemd (no procps: the unit must not need `kill`), and /srv/work,
/// the workspace (a path the unit leaves writable).
fn build_image() {
    let context = workspace().join("target/systemd-image");
    std::fs::create_dir_all(&context).expect("build context");
    std::fs::write(
        context.join("Containerfile"),
        format!(
            "FROM {}\n\
             RUN apt-get update && apt-get install -y --no-install-recommends systemd \
             && rm -rf /var/lib/apt/lists/* && mkdir -p /srv/work\n",
            super::deploy_image::BASE
        ),
    )
    .expect("Containerfile");
    ok(Command::new("podman")
        .args([
            "build",
            "--runtime",
            "runc",
            "--network",
            "host",
            "-t",
            IMAGE,
        ])
        .arg(&context));
}

/// A container booted with systemd as PID 1, this build and the repository mounted read-only
/// at /build and /src; removed on drop.
struct Machine {
    name: String,
}

impl Machine {
    /// Privileged: sidejob makes namespaces, mounts and cgroups for each run, and systemd
    /// mounts its own cgroup tree (the host's v1 hierarchies with a v2 one beside them).
    fn boot() -> Machine {
        let m = Machine {
            name: format!("sidejob-systemd-test-{}", std::process::id()),
        };
        m.remove();
        let hard = nix_hard_nofile();
        let built = sidejob_bin();
        let built = built.parent().expect("target dir");
        ok(Command::new("podman")
            .args(["run", "-d", "--name", &m.name, "--runtime", "runc"])
            .args(["--ulimit", &format!("nofile={hard}:{hard}")])
            .args(["--ulimit", "nproc=4096:4096"])
            .args(["--privileged", "--systemd=always"])
            // A host's /dev/shm (podman's default is 64 MiB, which the daemon leaves alone): a
            // root daemon keeps its runs' private halves there.
            .args(["--shm-size", "1g"])
            .args(["-v", &format!("{}:/src:ro", workspace().display())])
            .args(["-v", &format!("{}:/build:ro", built.display())])
            .arg(IMAGE)
            .arg("/lib/systemd/systemd"));
        // `running` or `degraded` (a unit of the image's own that does not start in a
        // container); either way systemd has booted and answers.
        // (The manager's socket first: until it is there, systemctl cannot ask.)
        let booted = m.sh_status(
            "for i in $(seq 300); do [ -S /run/systemd/private ] && break; sleep 0.1; done; \
             systemctl is-system-running --wait",
        );
        let said = String::from_utf8_lossy(&booted.stdout).trim().to_owned();
        assert!(
            said == "running" || said == "degraded",
            "systemd did not boot: {booted:?}\n{}",
            m.logs()
        );
        m
    }

    fn sh_status(&self, script: &str) -> Output {
        run(Command::new("podman").args([
            "exec",
            "-w",
            "/srv/work",
            &self.name,
            "sh",
            "-c",
            script,
        ]))
    }

    /// Runs `script` in /srv/work, failing the test with
    /// the daemon's journal unless it succeeds; its stdout.
    fn sh(&self, script: &str) -> String {
        let o = self.sh_status(script);
        assert!(
            o.status.success(),
            "{script} failed ({}):\n{}{}\njournal:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
            self.journal()
        );
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    fn journal(&self) -> String {
        let o = self.sh_status("journalctl -u sidejob.service --no-pager -o cat");
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn logs(&self) -> String {
        let o = run(Command::new("podman").args(["logs", &self.name]));
        String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
    }

    /// `systemctl show -P <property> sidejob`.
    fn property(&self, name: &str) -> String {
        self.sh(&format!("systemctl show -P {name} sidejob.service"))
    }

    /// A background run of `command` (the CLI's session of /srv/work); its task id.
    fn background(&self, command: &str) -> String {
        self.sh(&format!("sidejob call --background -- '{command}'"))
    }

    fn task(&self, id: &str) -> serde_json::Value {
        let out = self.sh(&format!("sidejob rpc task.get '{{\"task_id\": \"{id}\"}}'"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("task.get: {e}: {out}"))
    }

    /// `sidejob wait`'s exit code (the run's own) and `sidejob logs`.
    fn settled(&self, id: &str) -> (Option<i32>, String) {
        let waited = self.sh_status(&format!("sidejob wait {id}"));
        (waited.status.code(), self.sh(&format!("sidejob logs {id}")))
    }

    fn status(&self) -> serde_json::Value {
        let out = self.sh("sidejob status --json");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status: {e}: {out}"))
    }

    fn remove(&self) {
        let _ = run(Command::new("podman").args(["rm", "-f", "-t", "0", &self.name]));
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.remove();
    }
}

#[test]
fn systemctl_reload_upgrades_in_place_and_restart_keeps_the_runs_under_real_systemd() {
    if let Some(why) = podman_cannot_run() {
        sidejob_tests::skip_unless(false, &why);
        return;
    }
    base_image();
    build_image();
    let m = Machine::boot();
    // As the README says: install.sh, both units into /etc/systemd/system, the socket
    // enabled; the first connection starts the service.
    m.sh("/src/deploy/install.sh --from /build --prefix /usr/local \
          && cp /src/deploy/systemd/sidejob.service /src/deploy/systemd/sidejob.socket \
             /etc/systemd/system/ \
          && systemctl daemon-reload && systemctl enable --now sidejob.socket");
    m.sh("sidejob status --ready");
    let st = m.status();
    assert_eq!(st["socket_activated"], true, "{st}");
    let pid = m.property("MainPID");
    assert_eq!(st["pid"].to_string(), pid, "{st}");
    let hi = m.sh("sidejob call -- echo hi");
    assert_eq!(hi, "hi");

    // Two runs in flight, each held until the test lets it go.
    let failing = m.background("echo one; while [ ! -e go-1 ]; do sleep 0.05; done; exit 7");
    let passing = m.background("while [ ! -e go-2 ]; do sleep 0.05; done; seq 1 3");
    for id in [&failing, &passing] {
        assert_eq!(m.task(id)["state"], "running");
    }

    // The new build staged as the README says, then the reload.
    m.sh(
        "/src/deploy/install.sh --from /build --prefix /var/lib/sidejob/upgrade >/dev/null \
          && sidejob upgrade-check",
    );
    let reload = m.sh_status("systemctl reload sidejob");
    // What holds the moment `systemctl reload` returns: done, not still reloading; the same
    // process, now the staged binary, serving (a new start time).
    let state = m.sh("systemctl show -P ActiveState sidejob.service; \
                      systemctl show -P SubState sidejob.service; \
                      readlink /proc/$(systemctl show -P MainPID sidejob.service)/exe");
    assert!(
        reload.status.success(),
        "systemctl reload: {reload:?}\njournal:\n{}",
        m.journal()
    );
    assert_eq!(
        state,
        format!("active\nrunning\n{STAGED}"),
        "not upgraded when systemctl reload returned; journal:\n{}",
        m.journal()
    );
    assert_eq!(m.property("MainPID"), pid, "the daemon's pid changed");
    let after = m.status();
    assert_eq!(after["pid"].to_string(), pid, "{after}");
    assert_ne!(after["started_at"], st["started_at"], "{after}");
    assert_eq!(m.sh("systemctl is-active sidejob"), "active");
    assert!(m.journal().contains("upgraded in place"), "{}", m.journal());
    for id in [&failing, &passing] {
        assert_eq!(m.task(id)["state"], "running", "{}", m.journal());
    }
    m.sh("touch go-1 go-2");
    assert_eq!(m.settled(&failing), (Some(7), "one".into()));
    assert_eq!(m.settled(&passing), (Some(0), "1\n2\n3".into()));
    let t = m.task(&failing);
    assert_eq!(
        (&t["state"], &t["reason"], &t["exit_code"]),
        (&"failed".into(), &"exit_code".into(), &7.into()),
        "{t}"
    );

    // A restart is a new daemon (the installed binary, a new MainPID); KillMode=process leaves
    // the runs' supervisors alone, and it re-attaches to them.
    let held = m.background("echo held; while [ ! -e go-3 ]; do sleep 0.05; done; exit 9");
    let stopped = m.background("while :; do sleep 0.05; done");
    assert_eq!(m.task(&held)["state"], "running");
    // Their private halves are in the daemon's directory in /dev/shm, which the service
    // shares with the host (a restart finds them again), none in the state directory.
    let private = m.sh(&format!(
        "ls -d /dev/shm/sidejob-runs-*/{held}/plan.json; ls -A /var/lib/sidejob/runs"
    ));
    assert!(
        private.starts_with("/dev/shm/sidejob-runs-") && private.ends_with("/plan.json"),
        "{private}\n{}",
        m.journal()
    );
    m.sh("systemctl restart sidejob");
    let restarted = m.property("MainPID");
    assert_ne!(restarted, pid, "systemctl restart kept the daemon");
    assert_eq!(m.sh("systemctl is-active sidejob"), "active");
    assert_eq!(
        m.sh(&format!("readlink /proc/{restarted}/exe")),
        "/usr/local/bin/sidejob"
    );
    assert_eq!(m.task(&held)["state"], "running", "{}", m.journal());
    // The new daemon's cancel request reaches a supervisor the old one started.
    m.sh(&format!("sidejob cancel {stopped}"));
    let t = m.task(&stopped);
    let t = if t["state"] == "running" {
        m.sh_status(&format!("sidejob wait {stopped}"));
        m.task(&stopped)
    } else {
        t
    };
    assert_eq!(t["state"], "canceled", "{t}\n{}", m.journal());
    m.sh("touch go-3");
    assert_eq!(m.settled(&held), (Some(9), "held".into()));
    assert!(
        m.journal().contains("re-attached to a running supervisor"),
        "{}",
        m.journal()
    );
}
