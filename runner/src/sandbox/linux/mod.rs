//! Applies a [`SandboxPlan`] on Linux (sandbox-profiles/README.md). The supervisor calls [`prepare`] (checks
//! what this host offers, creates the cgroup, compiles the seccomp filter — everything that
//! may allocate or fail early) and the run's init calls [`launch`], the one linear function
//! that builds the sandbox and starts the command in it.

pub(crate) mod caller_path;
pub(crate) mod cgroup;
pub(crate) mod git;
pub(crate) mod landlock;
pub(crate) mod netns;
pub(crate) mod offline_net;
pub(crate) mod oneshot;
pub(crate) mod seccomp;
mod setid;
pub(crate) mod view;

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use nix::sys::resource::Resource;
use serde::Serialize;

use crate::run::plan::LaunchPlan;
use crate::run::report::StartFailure;
use crate::sandbox::profile::{Limits, Network};
use crate::sandbox::SandboxPlan;
use crate::sys::{self, sandbox as ssys, SigSet};

/// A step of [`launch`] that failed: which step, on which path, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{step}{}: {source}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
pub(crate) struct LaunchError {
    pub step: &'static str,
    pub path: Option<PathBuf>,
    pub source: io::Error,
}

fn step(step: &'static str) -> impl FnOnce(io::Error) -> LaunchError {
    move |source| LaunchError {
        step,
        path: None,
        source,
    }
}

/// The command, ready to exec (strings converted before any fork).
pub(crate) struct Command {
    pub program: CString,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub cwd: PathBuf,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Supplementary groups it keeps after the switch to `uid`/`gid`.
    pub groups: Vec<u32>,
    /// `bash -c` of one plain simple command: what bash would exec in its place, tried first
    /// (see [`oneshot`]).
    pub oneshot: Option<oneshot::OneShot>,
}

// ---- what this host offers ------------------------------------------------------------------

/// One layer as `sidejob doctor` shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LayerStatus {
    pub layer: &'static str,
    pub active: bool,
    pub detail: String,
}

/// What the kernel and our privileges allow, probed without forking (the daemon calls this).
#[derive(Debug, Clone)]
pub(crate) struct Availability {
    pub kernel: String,
    pub root: bool,
    /// Needed for every namespace when not root.
    pub user_namespaces: Result<(), NoUserNamespaces>,
    pub landlock_abi: Result<u32, NoLandlock>,
    pub seccomp: bool,
    pub memfd_noexec: bool,
    /// Where memory, pids and cpu can be limited (all three); detected on first use, as
    /// most runs need no cgroup.
    cgroup: OnceLock<Result<cgroup::Hierarchy, NoCgroup>>,
}

/// Why runs cannot have user namespaces (when not root).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NoUserNamespaces {
    #[error("user.max_user_namespaces is 0")]
    MaxZero,
    #[error("kernel.unprivileged_userns_clone is 0")]
    UnprivilegedCloneOff,
}

/// Why runs cannot have landlock.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NoLandlock {
    #[error("landlock is built in but disabled at boot (lsm=)")]
    Disabled,
    #[error("the kernel has no landlock")]
    Absent,
    #[error("landlock probe: {0}")]
    Probe(Arc<io::Error>),
}

/// Why runs cannot have cgroup limits here.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NoCgroup {
    #[error(transparent)]
    Detect(#[from] cgroup::DetectError),
    #[error("the cgroup we run in is not delegated to our uid")]
    NotOurs,
}

/// Why a trial cgroup (what `doctor` makes) could not be made.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CgroupTrialError {
    #[error(transparent)]
    Unavailable(NoCgroup),
    #[error(transparent)]
    Failed(#[from] cgroup::CgroupError),
}

fn read_trim(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

impl Availability {
    pub(crate) fn probe() -> Availability {
        let root = sys::getuid() == 0;
        let user_namespaces = if root {
            Ok(())
        } else if read_trim("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
            Err(NoUserNamespaces::MaxZero)
        } else if read_trim("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
            Err(NoUserNamespaces::UnprivilegedCloneOff)
        } else {
            Ok(())
        };
        let landlock_abi = match ssys::landlock_abi() {
            Ok(v) => Ok(v),
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Err(NoLandlock::Disabled),
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Err(NoLandlock::Absent),
            Err(e) => Err(NoLandlock::Probe(Arc::new(e))),
        };
        Availability {
            kernel: read_trim("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
            root,
            user_namespaces,
            landlock_abi,
            seccomp: ssys::seccomp_available(),
            memfd_noexec: Path::new("/proc/sys/vm/memfd_noexec").exists(),
            cgroup: OnceLock::new(),
        }
    }

    /// Where memory, pids and cpu can be limited, or why not.
    pub(crate) fn cgroup(&self) -> &Result<cgroup::Hierarchy, NoCgroup> {
        self.cgroup.get_or_init(|| {
            let h = cgroup::detect(&cgroup::Controller::ALL)?;
            if self.root {
                return Ok(h);
            }
            // Unprivileged: only a cgroup delegated to us (owned by our uid) is writable.
            let ours = h.bases.iter().all(|(_, b)| {
                let parent = b.parent().unwrap_or(b);
                std::fs::metadata(parent)
                    .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == sys::getuid())
                    .unwrap_or(false)
            });
            if ours {
                Ok(h)
            } else {
                Err(NoCgroup::NotOurs)
            }
        })
    }

    /// [`Availability::missing`], and then, when the limits need cgroups that were found,
    /// whether a run's cgroup can really be made there ([`cgroup::trial`]): what `doctor`
    /// reports. (The daemon and `exec` do not try first; a run that cannot make its cgroup
    /// fails with the step and the path.)
    pub(crate) fn missing_when_tried(
        &self,
        network: Network,
        limits: &Limits,
        tried: &Result<(), CgroupTrialError>,
    ) -> Vec<(&'static str, String)> {
        let mut out = self.missing(network, limits);
        if let Err(why) = tried {
            for c in cgroup::needed(limits) {
                let layer = cgroup_layer(c);
                if !out.iter().any(|(l, _)| *l == layer) {
                    out.push((layer, why.to_string()));
                }
            }
        }
        out
    }

    /// Creates, limits and removes a cgroup where runs would make theirs; `Err` says which
    /// step failed on which path.
    pub(crate) fn try_cgroups(&self) -> Result<(), CgroupTrialError> {
        let h = self
            .cgroup()
            .as_ref()
            .map_err(|e| CgroupTrialError::Unavailable(e.clone()))?;
        Ok(cgroup::trial(h)?)
    }

    /// Probed once per process.
    pub(crate) fn cached() -> &'static Availability {
        static CELL: OnceLock<Availability> = OnceLock::new();
        CELL.get_or_init(Availability::probe)
    }

    /// Every layer with whether this host can apply it, and why not.
    pub(crate) fn report(&self) -> Vec<LayerStatus> {
        let mut v = Vec::new();
        let mut push = |layer, active, detail: String| {
            v.push(LayerStatus {
                layer,
                active,
                detail,
            })
        };
        let ns = match &self.user_namespaces {
            Ok(()) if self.root => Ok("running as root".to_owned()),
            Ok(()) => Ok("through a user namespace (not root)".to_owned()),
            Err(e) => Err(e.to_string()),
        };
        if !self.root {
            push(
                "user_namespace",
                ns.is_ok(),
                ns.clone().unwrap_or_else(|e| e),
            );
        }
        for layer in [
            "pid_namespace",
            "mount_namespace",
            "ipc_namespace",
            "uts_namespace",
            "net_namespace",
            "mount_view",
        ] {
            push(layer, ns.is_ok(), ns.clone().unwrap_or_else(|e| e));
        }
        match &self.landlock_abi {
            Ok(abi) => {
                let (active, missing) = landlock::coverage(*abi, Network::None);
                for l in active {
                    push(l, true, format!("landlock ABI {abi}"));
                }
                for (l, why) in missing {
                    push(l, false, why);
                }
            }
            Err(e) => {
                for l in ["landlock_fs", "landlock_net", "landlock_scope"] {
                    push(l, false, e.to_string());
                }
            }
        }
        push(
            "seccomp",
            self.seccomp,
            if self.seccomp {
                "filter mode, with an architecture check".into()
            } else {
                "the kernel has no seccomp".into()
            },
        );
        push("no_new_privs", true, "always available".into());
        push(
            "capabilities",
            true,
            "bounding, ambient, effective, permitted and inheritable sets emptied".into(),
        );
        push(
            "uid",
            true,
            if self.root {
                "runs as the caller's uid".into()
            } else {
                "runs as our own uid".into()
            },
        );
        push(
            "rlimits",
            true,
            "open files, file size, CPU time, no core dumps".into(),
        );
        push(
            "memfd_noexec",
            self.memfd_noexec,
            if self.memfd_noexec {
                "executable memfds refused in the run's PID namespace".into()
            } else {
                "vm.memfd_noexec needs Linux 6.3".into()
            },
        );
        for c in cgroup::Controller::ALL {
            let layer = cgroup_layer(c);
            match self.cgroup() {
                Ok(h) => {
                    let base = h
                        .bases
                        .iter()
                        .find(|(x, _)| *x == c)
                        .map(|(_, b)| b.display().to_string())
                        .unwrap_or_default();
                    push(
                        layer,
                        true,
                        format!(
                            "cgroup {} at {base}",
                            match h.version {
                                cgroup::Version::V1 => "v1",
                                cgroup::Version::V2 => "v2",
                            }
                        ),
                    );
                }
                Err(e) => push(layer, false, e.to_string()),
            }
        }
        push("env", true, "allow-list from the profile".into());
        v
    }

    /// The layers a sandbox with this network and these limits needs that this host cannot
    /// give it, with the reason. Nothing else of a profile or a plan decides which layers it
    /// needs, so a profile is checked without resolving it for a run first.
    pub(crate) fn missing(&self, network: Network, limits: &Limits) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Err(e) = &self.user_namespaces {
            out.push(("mount_namespace", e.to_string()));
        }
        match &self.landlock_abi {
            Ok(abi) => out.extend(landlock::coverage(*abi, network).1),
            Err(e) => out.push(("landlock_fs", e.to_string())),
        }
        if !self.seccomp {
            out.push(("seccomp", "the kernel has no seccomp".into()));
        }
        let want = cgroup::needed(limits);
        if !want.is_empty() {
            match cgroup::detect(&want) {
                Ok(_) if self.root || self.cgroup().is_ok() => {}
                Ok(_) => {
                    let why = self
                        .cgroup()
                        .as_ref()
                        .err()
                        .map(ToString::to_string)
                        .unwrap_or_default();
                    out.extend(want.iter().map(|c| (cgroup_layer(*c), why.clone())));
                }
                Err(e) => {
                    for c in want {
                        out.push((cgroup_layer(c), e.to_string()));
                    }
                }
            }
        }
        out
    }
}

fn cgroup_layer(c: cgroup::Controller) -> &'static str {
    match c {
        cgroup::Controller::Memory => "cgroup_memory",
        cgroup::Controller::Pids => "cgroup_pids",
        cgroup::Controller::Cpu => "cgroup_cpu",
    }
}

/// Formats missing layers for an error message.
pub(crate) fn describe_missing(missing: &[(&'static str, String)]) -> String {
    missing
        .iter()
        .map(|(l, why)| format!("{l} ({why})"))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- the supervisor's half ------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub(crate) enum PrepareError {
    #[error("sandbox unavailable: {}", describe_missing(.0))]
    Unavailable(Vec<(&'static str, String)>),
    #[error("protect git in {path}: {source}")]
    Git { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Cgroup(#[from] cgroup::CgroupError),
    #[error("egress: {0}")]
    Egress(String),
}

/// Everything [`launch`] needs, computed by the supervisor before it forks.
pub(crate) struct Prepared {
    /// The layers the run will have, for `result.json`.
    pub layers: Vec<String>,
    /// Whose credentials the caller's paths are opened with.
    caller: Option<crate::sys::dirfd::Creds>,
    /// Does the command run as uid 0 (root's own runs)?
    root_run: bool,
    /// Git in the writable workspace (see [`git`]); released when the run is over.
    git: Option<git::Guard>,
    /// Where the view mounts a private tmpfs on an empty `.git` stand-in ([`git::Guard`]),
    /// and that tmpfs's options (owned by the run's user).
    pub git_shadow: Option<(PathBuf, CString)>,
    pub cgroup: Option<cgroup::RunCgroup>,
    plan: SandboxPlan,
    staging: PathBuf,
    tmp_options: CString,
    pinned: Vec<PathBuf>,
    landlock: Option<landlock::Plan>,
    seccomp: Option<Vec<libc::sock_filter>>,
    rlimits: Vec<(Resource, u64, u64)>,
    last_cap: u32,
    /// An allow-list run: init binds the relay's ports and sends them to the supervisor.
    egress: bool,
    /// The session's shared network namespace, which init joins instead of making one
    /// (see [`Prepared::give_shared_netns`]); only ever set when the network is off.
    given_netns: Option<OwnedFd>,
    /// The bare mount namespace the view is built in a copy of, instead of a copy of the
    /// host's (see [`Prepared::give_bare_mntns`]).
    bare_mntns: Option<OwnedFd>,
}

impl Prepared {
    /// Gives the run the offline network namespace its session's runs share (see
    /// `supervisor::spawner`), to join instead of making its own. It is taken only when the
    /// run's network is off and landlock scopes its abstract sockets (so the session's other
    /// runs in that namespace cannot reach them); otherwise it is dropped, and init makes its
    /// own.
    pub(crate) fn give_shared_netns(&mut self, fd: OwnedFd) {
        let scoped = self.layers.iter().any(|l| l == "landlock_scope");
        self.given_netns = (scoped && self.plan.network == Network::None).then_some(fd);
    }

    /// Gives the run the spawner's bare mount namespace (`view::bare_namespace`), whose copy
    /// its init builds the view in: a copy of the host's costs a mount per host mount, and
    /// leaving it for the view a `pivot_root`, which walks every process on the host.
    pub(crate) fn give_bare_mntns(&mut self, fd: OwnedFd) {
        self.bare_mntns = Some(fd);
    }

    /// After the run: sets aside the repositories it staged in the workspace's index (see
    /// [`git::Guard::quarantine_staged_repositories`]); returns their paths.
    pub(crate) fn quarantine_git(&self) -> Vec<String> {
        self.git
            .as_ref()
            .map(|g| g.quarantine_staged_repositories(self.caller.as_ref()))
            .unwrap_or_default()
    }

    /// After the run: lets go of its git stand-ins (the last run out removes them).
    pub(crate) fn release_git(&mut self) {
        if let Some(g) = self.git.take() {
            g.release(self.caller.as_ref());
        }
    }
}

/// Checks the plan against this host, creates the cgroup and compiles the filters.
pub(crate) fn prepare(plan: &LaunchPlan) -> Result<Prepared, PrepareError> {
    let mut sb = plan.sandbox.clone();
    // The run's bridge socket is the one socket of the host the run may reach (docs/plugins.md).
    if let Some(bridge) = &plan.bridge_socket {
        sb.mounts.push(crate::sandbox::MountSpec {
            source: Some(bridge.clone()),
            target: bridge.clone(),
            exec: false,
            write: true,
            required: true,
            as_caller: false,
        });
    }
    // An allow-list run: a resolv.conf naming the run's own DNS responder.
    let egress = match &sb.egress {
        Some(e) => {
            egress_mounts(plan, e, &mut sb.mounts)?;
            true
        }
        None => false,
    };
    // Parents before children, whatever order the mounts were added in (stable: a mount added
    // later at the same depth lands on top).
    sb.mounts.sort_by_key(|m| m.target.components().count());
    let sb = &sb;
    let avail = Availability::cached();
    let missing = avail.missing(sb.network, &sb.limits);
    if !missing.is_empty() && !sb.best_effort {
        return Err(PrepareError::Unavailable(missing));
    }
    let lacks = |layer: &str| missing.iter().any(|(l, _)| *l == layer);
    let mut layers: Vec<String> = [
        "mount_namespace",
        "ipc_namespace",
        "uts_namespace",
        "mount_view",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    if sb.network != Network::Host {
        layers.push("net_namespace".into());
    }
    if egress {
        layers.push("egress_proxy".into());
    }

    let landlock = match avail.landlock_abi {
        Ok(abi) if !lacks("landlock_fs") || sb.best_effort => {
            let (active, _) = landlock::coverage(abi, sb.network);
            layers.extend(active.iter().map(|l| l.to_string()));
            Some(landlock::Plan::new(abi, sb))
        }
        _ => None,
    };
    let seccomp = avail.seccomp.then(|| seccomp::build(sb.network));
    if seccomp.is_some() {
        layers.push("seccomp".into());
    }
    if avail.memfd_noexec {
        layers.push("memfd_noexec".into());
    }
    layers.extend(["no_new_privs", "capabilities", "rlimits", "env"].map(String::from));
    if plan.uid.is_some() {
        layers.push("uid".into());
    }

    // Cgroups: skipped when this host cannot give them (only reachable when best-effort:
    // `missing` named them otherwise), and a best-effort run also goes ahead without them
    // when creating one fails.
    let want = cgroup::needed(&sb.limits);
    let cgroup = if want.is_empty() || want.iter().any(|c| lacks(cgroup_layer(*c))) {
        None
    } else {
        match cgroup::detect(&want)
            .map_err(|why| cgroup::CgroupError {
                step: "detect",
                path: PathBuf::from("/proc/self/cgroup"),
                source: io::Error::other(why),
            })
            .and_then(|h| cgroup::create(&h, &plan.task_id, &sb.limits))
        {
            Ok(run) => {
                layers.extend(want.iter().map(|c| cgroup_layer(*c).to_string()));
                Some(run)
            }
            Err(_) if sb.best_effort => None,
            Err(e) => return Err(e.into()),
        }
    };

    let mut rlimits = vec![(Resource::RLIMIT_CORE, 0, 0)];
    let l = &sb.limits;
    if let Some(n) = l.open_files {
        rlimits.push((Resource::RLIMIT_NOFILE, n, n));
    }
    if let Some(n) = l.file_size {
        rlimits.push((Resource::RLIMIT_FSIZE, n, n));
    }
    if let Some(s) = l.cpu_time_s {
        // SIGXCPU at the soft limit (reported as `cpu_limit`), SIGKILL a second later.
        rlimits.push((Resource::RLIMIT_CPU, s, s + 1));
    }

    // The private /tmp is as large as the memory limit, if there is one (its pages are
    // charged to the run's memory cgroup either way).
    let tmp_options = match l.memory {
        Some(m) => format!("mode=1777,size={m}"),
        None => "mode=1777".into(),
    };
    // Git in the writable workspace: its configuration and hooks read-only, its stand-ins
    // made (with the caller's credentials) before the view is built.
    let git =
        match sb
            .mounts
            .iter()
            .find(|m| m.write && m.as_caller && m.required)
            .and_then(|m| m.source.as_ref())
        {
            Some(ws) => Some(git::prepare(ws, plan.caller.as_ref()).map_err(|source| {
                PrepareError::Git {
                    path: ws.clone(),
                    source,
                }
            })?),
            None => None,
        };
    let mut protected = sb.protected.clone();
    let mut pinned: Vec<PathBuf> = Vec::new();
    if let Some(g) = &git {
        for p in &g.read_only {
            if !protected.contains(p) {
                protected.push(p.clone());
            }
        }
        pinned.extend(g.pinned.iter().cloned());
    }
    for p in &protected {
        // The top directory below the workspace (e.g. `.git`) of a nested protected path.
        // The deepest writable mount holding it: the workspace, not a /tmp above it.
        let Some(ws) = sb
            .mounts
            .iter()
            .filter(|m| m.write && m.source.is_some() && p.starts_with(&m.target))
            .max_by_key(|m| m.target.components().count())
            .map(|m| &m.target)
        else {
            continue;
        };
        let rel = p.strip_prefix(ws).unwrap_or(p);
        if rel.components().count() > 1 {
            if let Some(first) = rel.components().next() {
                let pin = ws.join(first);
                if !pinned.contains(&pin) {
                    pinned.push(pin);
                }
            }
        }
    }
    layers.sort();
    layers.dedup();
    let mut plan_sb = sb.clone();
    plan_sb.protected = protected;
    Ok(Prepared {
        layers,
        caller: plan.caller.clone(),
        root_run: plan.uid.map_or(sys::getuid() == 0, |u| u == 0),
        git_shadow: git.as_ref().and_then(|g| g.shadow.clone()).map(|path| {
            let mut opts = "mode=0755,size=64m".to_owned();
            if let (Some(uid), Some(gid)) = (plan.uid, plan.gid) {
                opts.push_str(&format!(",uid={uid},gid={gid}"));
            }
            (path, CString::new(opts).unwrap_or_default())
        }),
        git,
        cgroup,
        plan: plan_sb,
        staging: plan.private_dir.clone(),
        tmp_options: CString::new(tmp_options).unwrap_or_default(),
        pinned,
        landlock,
        seccomp,
        rlimits,
        last_cap: ssys::last_cap(),
        egress,
        given_netns: None,
        bare_mntns: None,
    })
}

/// The mount of an allow-list run: the resolver configuration, written into the run's
/// private directory (where only the daemon and the supervisor write) and shown read-only as
/// `/etc/resolv.conf`, over any the profile lists. The proxy's socket is not in the view: the
/// supervisor relays to it (see [`netns`]).
fn egress_mounts(
    plan: &LaunchPlan,
    e: &crate::egress::EgressPlan,
    mounts: &mut Vec<crate::sandbox::MountSpec>,
) -> Result<(), PrepareError> {
    use crate::egress::RESOLV_CONF;
    if plan.sandbox.network != Network::Loopback {
        return Err(PrepareError::Egress(
            "an allow-list needs the run's own network namespace (network = loopback)".into(),
        ));
    }
    if !e.socket_dir.is_absolute() {
        return Err(PrepareError::Egress(format!(
            "no socket directory for the proxy (got {:?})",
            e.socket_dir
        )));
    }
    let resolv = plan.private().resolv_conf();
    std::fs::write(&resolv, RESOLV_CONF)
        .map_err(|err| PrepareError::Egress(format!("write {}: {err}", resolv.display())))?;
    let etc_resolv = Path::new("/etc/resolv.conf");
    mounts.retain(|m| m.target != etc_resolv);
    let spec = |source: PathBuf, target: &Path| crate::sandbox::MountSpec {
        source: Some(source),
        target: target.to_path_buf(),
        exec: false,
        write: false,
        required: true,
        as_caller: false,
    };
    mounts.push(spec(resolv, etc_resolv));
    Ok(())
}

// ---- the init's half: the launch --------------------------------------------------------------

/// Builds the sandbox and starts the command in it. Runs in the run's init (PID 1 of the
/// PID namespace the supervisor created), which stays outside the confinement so it can
/// reap and stop everything; returns the command's pid. The order of the steps matters and
/// each says why it comes where it does.
pub(crate) fn launch(
    p: &Prepared,
    cmd: &Command,
    output: &OwnedFd,
    stderr: Option<&OwnedFd>,
    exec_error: &OwnedFd,
    relay: Option<&OwnedFd>,
) -> Result<i32, LaunchError> {
    // 1. Non-dumpable: init's memory holds the caller's environment (it is a fork of the
    //    supervisor), and a non-dumpable process's /proc entries are closed to the run.
    ssys::set_dumpable(false).map_err(step("set non-dumpable"))?;

    // 2. Join the cgroup first, while the host's /sys/fs/cgroup is still in view: every
    //    process forked from here on (the command and all its descendants) is limited.
    if let Some(cg) = &p.cgroup {
        for procs in cg.procs_files() {
            std::fs::write(&procs, "0").map_err(|source| LaunchError {
                step: "join cgroup",
                path: Some(procs.clone()),
                source,
            })?;
        }
    }

    // 3. Where the view is built in a copy of the bare mount namespace
    //    (`Prepared::give_bare_mntns`), every profile path is opened and copied now, with
    //    the devices `/dev` shows: from that namespace the host's mounts can be neither
    //    reached nor copied. (In a copy of the host's, after step 6.)
    let bare = p.bare_mntns.as_ref();
    let opened = match bare {
        Some(_) => Some(open_and_copy(p, || {
            view::HostTree::leaving().map_err(step("open the host's mount namespace"))
        })?),
        None => None,
    };

    // 4. The remaining namespaces. The supervisor already made us PID 1 of a new PID
    //    namespace; mount, IPC, UTS and network are unshared here, not in the supervisor, so
    //    the supervisor keeps the host's view to write output.log and result.json. A run
    //    given a network namespace (see `give_shared_netns`) joins it instead of making one;
    //    one given the bare mount namespace copies that one instead of the host's.
    if let Some(bare) = bare {
        nix::sched::setns(bare, nix::sched::CloneFlags::CLONE_NEWNS)
            .map_err(io::Error::from)
            .map_err(step("join the bare mount namespace"))?;
    }
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    match (&p.given_netns, p.plan.network) {
        (_, Network::Host) => {}
        (Some(netns), _) => {
            nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(io::Error::from)
                .map_err(step("join the network namespace given to the run"))?;
        }
        (None, _) => flags |= libc::CLONE_NEWNET,
    }
    sys::unshare(flags).map_err(step("unshare mount, ipc, uts and network namespaces"))?;
    // 5. Loopback needs `lo` up in the new network namespace; `none` leaves it down.
    if p.plan.network == Network::Loopback {
        ssys::loopback_up().map_err(step("bring lo up"))?;
    }
    // 5b. An allow-list run's relay listens on that loopback: its ports are bound now, while
    //     init still has the privilege port 53 needs, and handed to the supervisor, which
    //     relays them to the proxy (see `netns`). Nothing of the run holds them.
    if p.egress {
        let chan = relay.ok_or_else(|| LaunchError {
            step: "bind the network relay's ports",
            path: None,
            source: io::Error::other("no channel to the supervisor"),
        })?;
        let listeners = netns::bind().map_err(step("bind the network relay's ports"))?;
        netns::send(listeners, chan).map_err(step("hand the relay's ports to the supervisor"))?;
    }
    ssys::sethostname("sidejob").map_err(step("sethostname"))?;

    // 6. In a copy of the host's mount namespace, nothing mounted from here on may propagate
    //    back to the host, and the sources are opened and copied now: a mount can be copied
    //    only from the namespace it is in (and in a user namespace, only from one of its
    //    own). A copy of the bare one is private already: its mounts are.
    let (sources, devices, host) = match opened {
        Some(opened) => opened,
        None => {
            view::make_private().map_err(step("make mounts private"))?;
            open_and_copy(p, || Ok(view::HostTree::Here))?
        }
    };
    // 7. The minimal root view: an empty tmpfs, the profile's paths, a minimal /dev, a fresh
    //    /proc for this PID namespace (masked with that /dev's null), and the protected paths
    //    read-only on top. Once its root is mounted, the view is built from inside it: every
    //    path below is relative to it, so the kernel walks only the part inside the view, not
    //    the run directory's whole path again for each of the view's some hundred calls.
    let staging = match bare {
        Some(_) => Path::new(view::VIEW),
        None => p.staging.as_path(),
    };
    view::mount_root(staging)?;
    std::env::set_current_dir(staging).map_err(|source| LaunchError {
        step: "enter the view",
        path: Some(staging.to_path_buf()),
        source,
    })?;
    let root = Path::new(".");
    view::mount_sources(root, &sources, &host, &p.tmp_options)?;
    //    A root run's writable paths may hold set-id files it could rewrite through a
    //    shared mapping, keeping their bits: each is made read-only (see `setid`).
    if p.root_run {
        setid::pin(root, &sources)?;
    }
    drop((sources, host));
    view::mount_dev(root, &devices)?;
    drop(devices);
    view::mount_proc(root, p.root_run)?;
    view::mask_sys(root)?;
    view::protect(root, &p.pinned, &p.plan.protected)?;
    if let Some((shadow, options)) = &p.git_shadow {
        view::shadow_git(root, shadow, options)?;
    }
    // 8. Make it the root: in a copy of the bare namespace by `chroot` (nothing of the host
    //    is there, see `view::enter_view`), in a copy of the host's by `pivot_root`, which
    //    detaches the host's tree, unreachable from here on.
    //    Init holds its CPU, real-time, from here to the command's exec (see `ExecHold`):
    //    detaching the host's tree sleeps through an RCU grace period, and woken without
    //    priority init would wait behind whatever runs on its CPU. (On a failure init only
    //    reports and exits.)
    let hold = sys::cpu::hold_through_exec();
    match bare {
        Some(_) => view::enter_view()?,
        None => view::pivot(staging)?,
    }

    // 9. Seccomp, in init rather than in the command, which inherits it: init's reference
    //    keeps the filter when the command exits. The last one's exit frees it through a
    //    kernel worker woken on that CPU, which preempted the command at its exit and, on a
    //    busy machine, left it behind another process for a whole slice. Init makes no call
    //    the filter denies from here on, and neither does the command before its exec.
    if let Some(filter) = &p.seccomp {
        ssys::seccomp_install(filter).map_err(step("install the seccomp filter"))?;
    }

    // 10. The command. Init stays here to reap and to stop what the command leaves behind.
    //    Its process shares init's memory until it execs (see `spawn_sharing_memory`): it
    //    only reads the plan, and init waits meanwhile.
    //    When init holds its CPU, the command keeps it through its exec.
    let held = hold.is_some();
    let child = sys::spawn::spawn_sharing_memory(&mut || {
        confine_and_exec(p, cmd, held, output, stderr.unwrap_or(output), exec_error)
    });
    if let (Some(hold), Ok(pid)) = (hold, &child) {
        hold.release(*pid);
    }
    child.map_err(step("start the command"))
}

/// The view's sources and devices, opened and copied (see [`view::copy_sources`]), and the
/// way back to the host's tree `host` makes: in the mount namespace the host's tree is in.
fn open_and_copy(
    p: &Prepared,
    host: impl FnOnce() -> Result<view::HostTree, LaunchError>,
) -> Result<(Vec<view::Source>, view::Devices, view::HostTree), LaunchError> {
    let mut sources = view::open_sources(&p.plan.mounts, &p.plan.off_limits, p.caller.as_ref())?;
    view::copy_sources(&mut sources)?;
    let devices = view::copy_devices()?;
    Ok((sources, devices, host()?))
}

/// The command's side: confinement that applies to the process itself, then exec. Never
/// returns; a failure is written to the exec-error pipe.
fn confine_and_exec(
    p: &Prepared,
    cmd: &Command,
    held: bool,
    output: &OwnedFd,
    stderr: &OwnedFd,
    exec_error: &OwnedFd,
) -> ! {
    let fail_with = |e: &dyn std::fmt::Display| -> ! {
        sys::write_all_fd(exec_error, &StartFailure::Sandbox(e.to_string()).encode());
        sys::exit_now(127)
    };
    let fail = |what: &str, e: &dyn std::fmt::Display| -> ! { fail_with(&format!("{what}: {e}")) };
    // a. Every CPU the caller allowed, unless init gives them back after the exec
    //    (`sidejob exec` keeps itself and init on one, see `sys::cpu`), default signal
    //    handling (the dispositions first: init's handlers must never run here, in init's
    //    memory), its own session (no terminal to steal), output to the pipe (stderr to its
    //    own, when the run has one).
    if !held {
        sys::cpu::free_to_move();
    }
    sys::reset_signal_dispositions();
    let _ = SigSet::all().unblock();
    if let Err(e) = sys::setsid() {
        fail("setsid", &e);
    }
    if let Err(e) = sys::dup2(output, 1).and_then(|_| sys::dup2(stderr, 2)) {
        fail("redirect output", &e);
    }
    // b. The working directory, resolved inside the view.
    if let Err(e) = std::env::set_current_dir(&cmd.cwd) {
        fail(&format!("chdir {}", cmd.cwd.display()), &e);
    }
    // c. Resource limits, while we still may (only lowering, but some kernels check).
    for &(res, soft, hard) in &p.rlimits {
        if let Err(e) = ssys::setrlimit(res, soft, hard) {
            fail("setrlimit", &e);
        }
    }
    // d. The landlock ruleset is built now (its rules open paths of the view, which the
    //    target uid might not be allowed to traverse) and enforced after no_new_privs.
    let ruleset = match &p.landlock {
        Some(plan) => match landlock::ruleset(plan) {
            Ok(rs) => Some((rs, plan)),
            Err(e) => fail_with(&e),
        },
        None => None,
    };
    // e. Capabilities out of the bounding and ambient sets (needs CAP_SETPCAP, so before the
    //    uid changes): no later exec, setuid file or file capability can bring one back.
    if let Err(e) = ssys::drop_bounding_and_ambient_caps(p.last_cap) {
        fail("drop capabilities", &e);
    }
    // f. The run's uid and gid, with the caller's own supplementary groups when it runs as
    //    the caller, none otherwise.
    if let (Some(uid), Some(gid)) = (cmd.uid, cmd.gid) {
        if let Err(e) = sys::drop_to(uid, gid, &cmd.groups) {
            fail(&format!("switch to uid {uid} gid {gid}"), &e);
        }
    }
    // g. Whatever is left (a uid-0 run keeps its sets across setresuid) is emptied.
    if let Err(e) = ssys::clear_caps() {
        fail("clear capabilities", &e);
    }
    // h. no_new_privs: setuid bits and file capabilities stop working; landlock requires it
    //    (init installed the seccomp filter with its own privilege).
    if let Err(e) = ssys::set_no_new_privs() {
        fail("no_new_privs", &e);
    }
    // i. Landlock: filesystem, TCP and scoping; what the kernel enforced is checked against
    //    the layers the run reports.
    if let Some((rs, plan)) = ruleset {
        if let Err(e) = landlock::restrict(rs, plan) {
            fail_with(&e);
        }
    }
    // j. Nothing beyond stdio crosses into the command (the error pipe closes on exec).
    if let Err(e) = sys::cloexec_from(3) {
        fail("close inherited descriptors", &e);
    }
    // k. A plain simple command skips bash's start-up; back here only if bash must run it.
    if let Some(o) = &cmd.oneshot {
        oneshot::exec(o);
    }
    let err = sys::execve(&cmd.program, &cmd.argv, &cmd.envp);
    let failure = StartFailure::Exec(format!(
        "{}: {err}",
        OsStr::from_bytes(cmd.program.as_bytes()).to_string_lossy()
    ));
    sys::write_all_fd(exec_error, &failure.encode());
    sys::exit_now(if err.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}
