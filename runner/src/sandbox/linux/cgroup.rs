//! Cgroup limits for memory, pids and CPU: cgroup v2 when the controllers are delegated to
//! the cgroup we run in, else cgroup v1, else unavailable. Detected from
//! `/proc/self/mountinfo` and `/proc/self/cgroup`, never assumed.
//!
//! We only ever create `<our cgroup>/sidejob/<task>-<supervisor pid>` and remove it when the
//! run ends; a supervisor that was killed leaves an empty directory that the next run sweeps
//! (its pid no longer exists).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::sandbox::profile::Limits;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }

    pub(crate) const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// Where each controller we can use lives: the `sidejob` directory under our own cgroup.
#[derive(Debug, Clone)]
pub(crate) struct Hierarchy {
    pub version: Version,
    /// `(controller, <mount>/<our cgroup>/sidejob)`; for v2 all share one directory.
    pub bases: Vec<(Controller, PathBuf)>,
}

/// The controllers a set of limits needs.
pub(crate) fn needed(limits: &Limits) -> Vec<Controller> {
    let mut v = Vec::new();
    if limits.memory.is_some() {
        v.push(Controller::Memory);
    }
    if limits.pids.is_some() {
        v.push(Controller::Pids);
    }
    if limits.cpu_millicores.is_some() {
        v.push(Controller::Cpu);
    }
    v
}

struct MountLine {
    root: String,
    point: String,
    fstype: String,
    super_opts: String,
}

fn mounts() -> Vec<MountLine> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let mut post = post.split(' ');
            Some(MountLine {
                root: unescape(pre.get(3)?),
                point: unescape(pre.get(4)?),
                fstype: post.next()?.to_owned(),
                super_opts: post.nth(1).unwrap_or("").to_owned(),
            })
        })
        .filter(|m| m.fstype == "cgroup" || m.fstype == "cgroup2")
        .collect()
}

fn unescape(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\134", "\\")
}

/// Our cgroup path in the hierarchy whose controller list is `key` ("" for v2).
fn own_path(cgroup_file: &str, wanted: &str) -> Option<String> {
    cgroup_file.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let matches = if wanted.is_empty() {
            ctrls.is_empty()
        } else {
            ctrls.split(',').any(|c| c == wanted)
        };
        matches.then(|| path.to_owned())
    })
}

fn join_under(mount: &MountLine, own: &str) -> PathBuf {
    // The mount may expose a subtree (root != "/"): strip it from our path.
    let rel = own
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(own)
        .trim_start_matches('/');
    let base = Path::new(&mount.point);
    if rel.is_empty() {
        base.to_path_buf()
    } else {
        base.join(rel)
    }
}

fn words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// Why cgroup v2 cannot limit what a run wants.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum NoV2 {
    #[error("no cgroup v2 hierarchy")]
    Absent,
    #[error(
        "cgroup v2 at {} does not delegate {} (cgroup.subtree_control: {:?})",
        .dir.display(),
        .missing.join(", "),
        .delegated.join(" ")
    )]
    NotDelegated {
        dir: PathBuf,
        missing: Vec<&'static str>,
        delegated: Vec<String>,
    },
}

/// Why [`detect`] found no hierarchy for what a run wants.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum DetectError {
    /// Shared: the host probe keeps it and each check that needs cgroups reports it.
    #[error("cannot read /proc/self/cgroup: {0}")]
    OwnCgroup(Arc<io::Error>),
    /// Neither version can: why not v2, and the first controller v1 has no hierarchy for.
    #[error("{v2}; no cgroup v1 hierarchy for {}", .v1_lacks.name())]
    NoHierarchy { v2: NoV2, v1_lacks: Controller },
}

/// Finds where `want` can be limited: v2 if every one of them is delegated to our cgroup
/// (listed in its `cgroup.subtree_control`), else v1 if each has a v1 hierarchy.
pub(crate) fn detect(want: &[Controller]) -> Result<Hierarchy, DetectError> {
    let cgroup_file = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|e| DetectError::OwnCgroup(Arc::new(e)))?;
    let mounts = mounts();

    let v2 = match (
        mounts.iter().find(|m| m.fstype == "cgroup2"),
        own_path(&cgroup_file, ""),
    ) {
        (Some(m), Some(own)) => {
            let dir = join_under(m, &own);
            let delegated = words(&dir.join("cgroup.subtree_control"));
            let missing: Vec<&'static str> = want
                .iter()
                .map(|c| c.name())
                .filter(|c| !delegated.iter().any(|d| d == c))
                .collect();
            if missing.is_empty() {
                let base = dir.join("sidejob");
                return Ok(Hierarchy {
                    version: Version::V2,
                    bases: want.iter().map(|c| (*c, base.clone())).collect(),
                });
            }
            NoV2::NotDelegated {
                dir,
                missing,
                delegated,
            }
        }
        _ => NoV2::Absent,
    };

    let mut bases = Vec::new();
    for c in want {
        let m = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.super_opts.split(',').any(|o| o == c.name()));
        match (m, own_path(&cgroup_file, c.name())) {
            (Some(m), Some(own)) => bases.push((*c, join_under(m, &own).join("sidejob"))),
            _ => return Err(DetectError::NoHierarchy { v2, v1_lacks: *c }),
        }
    }
    Ok(Hierarchy {
        version: Version::V1,
        bases,
    })
}

/// The cgroup of one run.
#[derive(Debug)]
pub(crate) struct RunCgroup {
    pub version: Version,
    pub dirs: Vec<(Controller, PathBuf)>,
}

#[derive(Debug, thiserror::Error)]
#[error("cgroup {step} {path}: {source}")]
pub(crate) struct CgroupError {
    pub step: &'static str,
    pub path: PathBuf,
    pub source: io::Error,
}

fn write(path: PathBuf, value: &str, step: &'static str) -> Result<(), CgroupError> {
    std::fs::write(&path, value).map_err(|source| CgroupError { step, path, source })
}

/// Removes `sidejob/<task>-<pid>` directories whose supervisor is gone (left behind by a
/// supervisor that was killed). A directory still in use is busy and stays.
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.rsplit_once('-'))
            .and_then(|(_, p)| p.parse::<i32>().ok())
        else {
            continue;
        };
        if crate::sys::kill(pid, 0).is_err_and(|e| e.raw_os_error() == Some(libc::ESRCH)) {
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Creates the run's cgroup(s) and writes the limits. The processes join later (the run's
/// init writes itself into `cgroup.procs` before it starts anything).
pub(crate) fn create(
    h: &Hierarchy,
    task_id: &str,
    limits: &Limits,
) -> Result<RunCgroup, CgroupError> {
    let name = format!("{task_id}-{}", crate::sys::getpid());
    let mut run = RunCgroup {
        version: h.version,
        dirs: Vec::new(),
    };
    let mut made: Vec<PathBuf> = Vec::new();
    for (c, base) in &h.bases {
        let dir = base.join(&name);
        if !made.contains(&dir) {
            // The `sidejob` directory is removed by the last run to leave it, possibly between
            // our creating it and our child in it: then make both again.
            let mut attempt = 0;
            loop {
                attempt += 1;
                if !base.exists() {
                    std::fs::create_dir_all(base).map_err(|source| CgroupError {
                        step: "create",
                        path: base.clone(),
                        source,
                    })?;
                } else {
                    sweep(base);
                }
                if h.version == Version::V2 {
                    let ctrls: Vec<String> = h
                        .bases
                        .iter()
                        .map(|(c, _)| format!("+{}", c.name()))
                        .collect();
                    write(
                        base.join("cgroup.subtree_control"),
                        &ctrls.join(" "),
                        "enable controllers",
                    )?;
                }
                match std::fs::create_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 3 => continue,
                    Err(source) => {
                        return Err(CgroupError {
                            step: "create",
                            path: dir.clone(),
                            source,
                        })
                    }
                }
            }
            made.push(dir.clone());
        }
        run.dirs.push((*c, dir));
    }
    if let Err(e) = run.write_limits(limits) {
        run.remove();
        return Err(e);
    }
    Ok(run)
}

/// Does what a run with limits does, without a run: creates a child (`doctor-<pid>`) of the
/// `sidejob` directory under our own cgroup, enables the controllers, writes a limit for
/// each, and removes it. Finding the hierarchy says nothing of whether it is writable (a
/// container's cgroupfs is often mounted read-only), so only this says a `ci` run can start.
pub(crate) fn trial(h: &Hierarchy) -> Result<(), CgroupError> {
    let has = |c: Controller| h.bases.iter().any(|(x, _)| *x == c);
    let limits = Limits {
        memory: has(Controller::Memory).then_some(256 << 20),
        pids: has(Controller::Pids).then_some(64),
        cpu_millicores: has(Controller::Cpu).then_some(1000),
        ..Limits::default()
    };
    create(h, "doctor", &limits)?.remove();
    Ok(())
}

impl RunCgroup {
    fn dir(&self, c: Controller) -> Option<&Path> {
        self.dirs
            .iter()
            .find(|(x, _)| *x == c)
            .map(|(_, d)| d.as_path())
    }

    fn write_limits(&self, l: &Limits) -> Result<(), CgroupError> {
        let v2 = self.version == Version::V2;
        if let (Some(mem), Some(d)) = (l.memory, self.dir(Controller::Memory)) {
            if v2 {
                write(d.join("memory.max"), &mem.to_string(), "memory limit")?;
                // Swap would let the run exceed its memory limit on the host's disk.
                let _ = std::fs::write(d.join("memory.swap.max"), "0");
            } else {
                write(
                    d.join("memory.limit_in_bytes"),
                    &mem.to_string(),
                    "memory limit",
                )?;
                let memsw = d.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    write(memsw, &mem.to_string(), "memory+swap limit")?;
                }
            }
        }
        if let (Some(p), Some(d)) = (l.pids, self.dir(Controller::Pids)) {
            write(d.join("pids.max"), &p.to_string(), "pids limit")?;
        }
        if let (Some(m), Some(d)) = (l.cpu_millicores, self.dir(Controller::Cpu)) {
            let period = 100_000u64;
            let quota = (m * period / 1000).max(1000);
            if v2 {
                write(d.join("cpu.max"), &format!("{quota} {period}"), "cpu limit")?;
            } else {
                write(
                    d.join("cpu.cfs_period_us"),
                    &period.to_string(),
                    "cpu period",
                )?;
                write(d.join("cpu.cfs_quota_us"), &quota.to_string(), "cpu limit")?;
            }
        }
        Ok(())
    }

    /// The `cgroup.procs` files the run's init writes itself into.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = self
            .dirs
            .iter()
            .map(|(_, d)| d.join("cgroup.procs"))
            .collect();
        v.dedup();
        v
    }

    fn counter(&self, c: Controller, file: &str, key: &str) -> u64 {
        let Some(d) = self.dir(c) else { return 0 };
        std::fs::read_to_string(d.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
            .unwrap_or(0)
    }

    /// Which limits the run ran into, from the kernel's own counters.
    pub(crate) fn violations(&self) -> Vec<&'static str> {
        let v2 = self.version == Version::V2;
        let mut out = Vec::new();
        let oom = if v2 {
            self.counter(Controller::Memory, "memory.events", "oom_kill")
        } else {
            self.counter(Controller::Memory, "memory.oom_control", "oom_kill")
        };
        if oom > 0 {
            out.push("oom_kill");
        }
        let pids_max = self.counter(Controller::Pids, "pids.events", "max");
        if pids_max > 0 {
            out.push("pids_limit");
        }
        if self.counter(Controller::Cpu, "cpu.stat", "nr_throttled") > 0 {
            out.push("cpu_limit");
        }
        out
    }

    /// Removes the run's directories (every process of the run is gone by now).
    pub(crate) fn remove(&self) {
        for (_, d) in &self.dirs {
            for _ in 0..20 {
                match std::fs::remove_dir(d) {
                    Ok(()) => break,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                    // EBUSY while the last exiting task is still being released.
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
                }
            }
            // The `sidejob` directory too, once no run is left in it (it fails while one is).
            if let Some(base) = d.parent() {
                let _ = std::fs::remove_dir(base);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_hierarchy_says_why_not_v2_then_v1() {
        let e = DetectError::NoHierarchy {
            v2: NoV2::NotDelegated {
                dir: "/sys/fs/cgroup/a".into(),
                missing: vec!["memory", "pids"],
                delegated: vec!["cpu".into(), "io".into()],
            },
            v1_lacks: Controller::Memory,
        };
        assert_eq!(
            e.to_string(),
            "cgroup v2 at /sys/fs/cgroup/a does not delegate memory, pids \
             (cgroup.subtree_control: \"cpu io\"); no cgroup v1 hierarchy for memory"
        );
        let e = DetectError::NoHierarchy {
            v2: NoV2::Absent,
            v1_lacks: Controller::Cpu,
        };
        assert_eq!(
            e.to_string(),
            "no cgroup v2 hierarchy; no cgroup v1 hierarchy for cpu"
        );
    }

    #[test]
    fn own_paths_are_found_per_controller() {
        let f = "9:name=systemd:/\n4:memory:/a/b\n2:cpu,cpuacct:/c\n0::/d\n";
        assert_eq!(own_path(f, "memory").as_deref(), Some("/a/b"));
        assert_eq!(own_path(f, "cpu").as_deref(), Some("/c"));
        assert_eq!(own_path(f, "").as_deref(), Some("/d"));
        assert_eq!(own_path(f, "pids"), None);
        let m = MountLine {
            root: "/a".into(),
            point: "/sys/fs/cgroup/memory".into(),
            fstype: "cgroup".into(),
            super_opts: "rw,memory".into(),
        };
        assert_eq!(
            join_under(&m, "/a/b"),
            PathBuf::from("/sys/fs/cgroup/memory/b")
        );
    }
}
