//! What a test needs from the machine, and what happens when the machine lacks it.
//!
//! A test that needs root, python3, node, unprivileged user namespaces, writable cgroups or
//! the agent CLIs starts with `if skip_without(&[Need::Root]) { return; }`. When a need is
//! missing the test skips, unless the run declared that this machine provides it:
//! `SIDEJOB_TEST_REQUIRE` lists the declared needs by name (`.ci/run` sets
//! `root,python3,node,userns,cgroups,strace,agents`), and a test that would skip for a
//! declared need fails instead, saying what is missing. A skip is never silent either: it is
//! printed, and appended as one line to the file `SIDEJOB_TEST_SKIPS` names, so the run's
//! summary can list every test that passed without running.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Something a test may need from the machine it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// The tests run as root: the sandbox's mount view, uid changes, connecting as others.
    Root,
    /// `python3` is where a run's sandbox finds it (the `code` tool, the bridge, subagents).
    Python3,
    /// `node` is where a run's sandbox finds it (the `code` tool's JavaScript).
    Node,
    /// An unprivileged user may create a user namespace (the daemon run as `nobody`).
    UserNamespaces,
    /// Memory, pids and cpu cgroups this process can create children in (the `ci` profile,
    /// the pids and memory limits).
    Cgroups,
    /// `strace`, whose fault injection kills a process at an exact system call (the spawner
    /// that dies between its fork and its reply).
    Strace,
    /// The agent CLIs the tests drive against a scripted model (`claude`, `codex`,
    /// `opencode`, `mcp-inspector`), in `$SIDEJOB_TEST_AGENTS` (see [`crate::agents`]).
    Agents,
}

impl Need {
    pub const ALL: [Need; 7] = [
        Need::Root,
        Need::Python3,
        Need::Node,
        Need::UserNamespaces,
        Need::Cgroups,
        Need::Strace,
        Need::Agents,
    ];

    /// The name `SIDEJOB_TEST_REQUIRE` uses.
    pub fn name(self) -> &'static str {
        match self {
            Need::Root => "root",
            Need::Python3 => "python3",
            Need::Node => "node",
            Need::UserNamespaces => "userns",
            Need::Cgroups => "cgroups",
            Need::Strace => "strace",
            Need::Agents => "agents",
        }
    }

    pub fn from_name(name: &str) -> Option<Need> {
        Need::ALL.into_iter().find(|n| n.name() == name)
    }

    /// `None` when the machine provides this, else why not (checked once per process).
    pub fn missing(self) -> Option<String> {
        static CHECKED: [OnceLock<Option<String>>; 7] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        let i = Need::ALL.iter().position(|n| *n == self).unwrap_or(0);
        CHECKED[i]
            .get_or_init(|| match self {
                Need::Root => (!crate::is_root()).then(|| "the tests do not run as root".into()),
                Need::Python3 => sandbox_program("python3")
                    .is_none()
                    .then(|| format!("no python3 in {SANDBOX_PATH}")),
                Need::Node => sandbox_program("node")
                    .is_none()
                    .then(|| format!("no node in {SANDBOX_PATH}")),
                Need::UserNamespaces => userns_missing(),
                Need::Cgroups => cgroups_missing(),
                Need::Strace => sandbox_program("strace")
                    .is_none()
                    .then(|| format!("no strace in {SANDBOX_PATH}")),
                Need::Agents => crate::agents::missing_clients(),
            })
            .clone()
    }
}

/// The needs this run declared the machine provides (`SIDEJOB_TEST_REQUIRE`, comma-separated).
/// An unknown name is an error: a typo must not quietly let a test skip.
pub fn declared() -> Vec<Need> {
    let Ok(list) = std::env::var("SIDEJOB_TEST_REQUIRE") else {
        return Vec::new();
    };
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            Need::from_name(s).unwrap_or_else(|| {
                panic!(
                    "SIDEJOB_TEST_REQUIRE names {s:?}; known needs: {}",
                    Need::ALL.map(Need::name).join(", ")
                )
            })
        })
        .collect()
}

/// True (and the skip recorded) when one of `needs` is missing and this run did not declare
/// it; panics when a missing need was declared.
pub fn skip_without(needs: &[Need]) -> bool {
    let declared = declared();
    for need in needs {
        let Some(why) = need.missing() else { continue };
        assert!(
            !declared.contains(need),
            "this machine was declared to provide {} (SIDEJOB_TEST_REQUIRE), but {why}",
            need.name()
        );
        record_skip(&format!("needs {}: {why}", need.name()));
        return true;
    }
    false
}

/// Prints a skip and appends it to `SIDEJOB_TEST_SKIPS` (when set) as `<test>: <reason>`.
pub fn record_skip(reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("<unnamed test>");
    eprintln!("SKIPPED {test}: {reason}");
    if let Some(file) = std::env::var_os("SIDEJOB_TEST_SKIPS") {
        // One write per line with O_APPEND: lines from tests running at once do not mix.
        let line = format!("{test}: {reason}\n");
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&file)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = written {
            panic!(
                "cannot record the skip in {}: {e}",
                Path::new(&file).display()
            );
        }
    }
}

/// The `PATH` the shipped profiles give a run.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where a run finds `name` on its `PATH`: the one way the tests look for python3 and node,
/// since what counts is what the sandbox sees, not the test's own `PATH` (which may hold a
/// shim under a home directory the sandbox does not show).
pub fn sandbox_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    SANDBOX_PATH
        .split(':')
        // The shipped profiles show /usr, /bin and /sbin; /usr/local is under /usr.
        .map(|dir| Path::new(dir).join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

const NOBODY: u32 = 65534;

fn userns_missing() -> Option<String> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("unshare");
    cmd.args(["--user", "--pid", "--fork", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if crate::is_root() {
        // What counts is an unprivileged user's right to one, not root's.
        cmd.uid(NOBODY).gid(NOBODY);
    }
    match cmd.output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`unshare --user` as an unprivileged user failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run unshare: {e}")),
    }
}

/// Memory, pids and cpu each need a hierarchy (v2, or v1 per controller) in which this
/// process can create a child of its own cgroup.
fn cgroups_missing() -> Option<String> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // (root within the hierarchy, mount point, fstype, super options)
    let mounts: Vec<(String, String, String, String)> = mountinfo
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            let fstype = post.next()?.to_owned();
            let opts = post.nth(1).unwrap_or("").to_owned();
            Some((
                (*pre.get(3)?).to_owned(),
                (*pre.get(4)?).to_owned(),
                fstype,
                opts,
            ))
        })
        .collect();
    let own = |controllers: &dyn Fn(&str) -> bool| {
        cgroup.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers(ctrls).then(|| path.to_owned())
        })
    };
    let dir_of = |root: &str, point: &str, path: &str| {
        let rel = path
            .strip_prefix(root.trim_end_matches('/'))
            .unwrap_or(path);
        Path::new(point).join(rel.trim_start_matches('/'))
    };
    let mut why = Vec::new();
    for controller in ["memory", "pids", "cpu"] {
        let v2 = mounts
            .iter()
            .find(|m| m.2 == "cgroup2")
            .zip(own(&|c| c.is_empty()))
            .map(|(m, path)| dir_of(&m.0, &m.1, &path))
            .filter(|dir| {
                std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                    .is_ok_and(|s| s.split_whitespace().any(|c| c == controller))
            });
        let v1 = mounts
            .iter()
            .find(|m| m.2 == "cgroup" && m.3.split(',').any(|o| o == controller))
            .zip(own(&|c| c.split(',').any(|c| c == controller)))
            .map(|(m, path)| dir_of(&m.0, &m.1, &path));
        let Some(dir) = v2.or(v1) else {
            why.push(format!("no cgroup hierarchy delegates {controller}"));
            continue;
        };
        let probe = dir.join(format!("sidejob-test-probe-{}", std::process::id()));
        match std::fs::create_dir(&probe) {
            Ok(()) => {
                let _ = std::fs::remove_dir(&probe);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => why.push(format!(
                "cannot create a {controller} cgroup in {}: {e}",
                dir.display()
            )),
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}
