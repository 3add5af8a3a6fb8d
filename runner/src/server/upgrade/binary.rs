//! Which binary an in-place upgrade runs, and whether it runs at all.
//!
//! The daemon is root and whatever it executes becomes the daemon, so the binary is opened
//! the way plugins are (`sys::fs::TrustedDir`): every directory from `/` down walked by
//! descriptor with `O_NOFOLLOW`, the file and each directory owned by root (or the daemon's
//! uid) and writable by neither group nor others, checked on the very descriptor that is later
//! executed (`fexecve`), so nothing can be swapped between the check and the exec.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::sys::{self, fs::Refusal, fs::TrustedDir};

/// Where an operator stages the next binary, under the state directory: a prefix laid out as
/// `deploy/install.sh --prefix` lays one out (`bin/sidejob`, `lib/sidejob/plugins/`), so the
/// staged daemon finds its own plugins.
pub(crate) const STAGED: &str = "upgrade/bin/sidejob";

/// How long `--version` may take before the binary is called broken.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// The shipped plugins a daemon looks for beside its binary (`plugin_host`).
const SHIPPED_PLUGINS: [&str; 3] = [
    "libsidejob_plugin_bash.so",
    "libsidejob_plugin_code.so",
    "libsidejob_plugin_subagent.so",
];

/// Why a binary is not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpgradeError {
    #[error("{path} is refused: {refusal}")]
    Untrusted { path: PathBuf, refusal: Refusal },
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error("{path} is not executable (mode {mode:o})")]
    NotExecutable { path: PathBuf, mode: u32 },
    #[error("cannot {step} {path}: {source}")]
    Io {
        step: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("{path} does not run: `{path} --version` {outcome}")]
    DoesNotRun { path: PathBuf, outcome: String },
    #[error("{path} is not sidejob: `--version` printed {printed:?}")]
    NotSidejob { path: PathBuf, printed: String },
    #[error("{path} has no {missing} beside it (a daemon run from it would serve no such tool)")]
    MissingPlugins { path: PathBuf, missing: String },
}

impl UpgradeError {
    /// How to fix it, as one clause.
    pub(crate) fn hint(&self) -> String {
        match self {
            UpgradeError::Untrusted { refusal, .. } => refusal.hint(),
            UpgradeError::Missing { .. } => {
                "stage one with deploy/install.sh --from target/release --prefix <state_dir>/upgrade".into()
            }
            UpgradeError::NotExecutable { path, .. } => format!("run chmod 0755 {}", path.display()),
            UpgradeError::Io { .. } => "check the path and that root can open it".into(),
            UpgradeError::DoesNotRun { .. } | UpgradeError::NotSidejob { .. } => {
                "stage a sidejob binary built for this machine".into()
            }
            UpgradeError::MissingPlugins { path, .. } => format!(
                "install them with it: deploy/install.sh --prefix {}",
                path.parent()
                    .and_then(Path::parent)
                    .unwrap_or(Path::new("<prefix>"))
                    .display()
            ),
        }
    }
}

/// Where the binary an upgrade runs comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `<state_dir>/upgrade/bin/sidejob`.
    Staged,
    /// The path the daemon was started from (a package manager may have put a new file there).
    Installed,
    /// The running image itself (`/proc/self/exe`): the installed path is gone or untrusted.
    Running,
}

/// A binary opened and checked, to run by its descriptor.
#[derive(Debug)]
pub(crate) struct Candidate {
    pub file: File,
    pub path: PathBuf,
    pub origin: Origin,
    /// Why the installed path was passed over for the running image, if it was.
    pub passed_over: Option<String>,
}

/// The binary to re-execute: the staged one if there is one (refused, not passed over, when
/// it is not trusted), else the file the daemon was started from if it is trusted, else the
/// running image.
pub(crate) fn choose(state_dir: &Path) -> Result<Candidate, UpgradeError> {
    let staged = state_dir.join(STAGED);
    if let Some(file) = open_trusted(&staged)? {
        return Ok(Candidate {
            file,
            path: staged,
            origin: Origin::Staged,
            passed_over: None,
        });
    }
    let running = Path::new("/proc/self/exe");
    let io = |step, source| UpgradeError::Io {
        step,
        path: running.into(),
        source,
    };
    let link = std::fs::read_link(running).map_err(|e| io("read", e))?;
    // A file replaced after it was executed shows as "<path> (deleted)".
    let installed = link
        .to_str()
        .and_then(|s| s.strip_suffix(" (deleted)"))
        .map_or_else(|| link.clone(), PathBuf::from);
    let passed_over = match open_trusted(&installed) {
        Ok(Some(file)) => {
            return Ok(Candidate {
                file,
                path: installed,
                origin: Origin::Installed,
                passed_over: None,
            })
        }
        Ok(None) => format!("{} does not exist", installed.display()),
        Err(e) => e.to_string(),
    };
    let file = File::open(running).map_err(|e| io("open", e))?;
    Ok(Candidate {
        file,
        path: link,
        origin: Origin::Running,
        passed_over: Some(passed_over),
    })
}

/// Opens `path` if it exists and is trusted (see the module's documentation) and executable;
/// `None` if it does not exist.
pub(crate) fn open_trusted(path: &Path) -> Result<Option<File>, UpgradeError> {
    let untrusted = |refusal: Refusal| UpgradeError::Untrusted {
        path: path.into(),
        refusal,
    };
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(UpgradeError::Missing { path: path.into() });
    };
    let file = match TrustedDir::open(dir).and_then(|d| d.open_file(name)) {
        Ok(f) => f,
        Err(r) if r.is_missing() => return Ok(None),
        // A directory on the way that others could write makes nothing staged below it a
        // refusal: there is nothing to refuse.
        Err(_)
            if std::fs::symlink_metadata(path)
                .is_err_and(|e| e.kind() == io::ErrorKind::NotFound) =>
        {
            return Ok(None)
        }
        Err(r) => return Err(untrusted(r)),
    };
    let mode = file
        .metadata()
        .map_err(|source| UpgradeError::Io {
            step: "inspect",
            path: path.into(),
            source,
        })?
        .mode();
    if mode & 0o100 == 0 {
        return Err(UpgradeError::NotExecutable {
            path: path.into(),
            mode: mode & 0o7777,
        });
    }
    Ok(Some(file))
}

/// Runs the opened binary with `--version` (by its descriptor, so it is the file that was
/// checked) and returns the line it printed, e.g. `sidejob 0.1.0`.
pub(crate) fn probe(file: &File, path: &Path) -> Result<String, UpgradeError> {
    let io = |step, source| UpgradeError::Io {
        step,
        path: path.into(),
        source,
    };
    let does_not_run = |outcome: String| UpgradeError::DoesNotRun {
        path: path.into(),
        outcome,
    };
    // The child opens the descriptor it inherited a copy of; close-on-exec closes it only
    // once the kernel holds the file.
    let program = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let null = File::options()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| io("open /dev/null for", e))?;
    let (out_r, out_w) = sys::pipe().map_err(|e| io("make a pipe for", e))?;
    let pid = sys::spawn::spawn(
        &program,
        &[std::ffi::OsStr::new("--version")],
        &[null.as_fd(), out_w.as_fd(), null.as_fd()],
    )
    .map_err(|e| does_not_run(format!("cannot start: {e}")))?;
    drop(out_w);
    let deadline = Instant::now() + PROBE_TIMEOUT;
    let mut printed = Vec::new();
    let mut buf = [0u8; 512];
    let read = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match sys::poll_readable(&[Some(out_r.as_fd())], left.as_millis() as i32) {
            Ok(ready) if ready.first() == Some(&true) => {}
            Ok(_) => break Err(format!("printed nothing within {PROBE_TIMEOUT:?}")),
            Err(e) => break Err(format!("cannot be read: {e}")),
        }
        match sys::read_fd(&out_r, &mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) if printed.len() < 4096 => printed.extend_from_slice(&buf[..n]),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => break Err(format!("cannot be read: {e}")),
        }
    };
    if read.is_err() {
        let _ = sys::kill(pid, libc::SIGKILL);
    }
    // Its stdout is closed (or it was killed): it is exiting.
    let exit = sys::waitpid(pid, false).ok().flatten().map(|(_, e)| e);
    read.map_err(does_not_run)?;
    match exit {
        Some(sys::Exit::Code(0)) => {}
        Some(sys::Exit::Code(c)) => return Err(does_not_run(format!("exited with {c}"))),
        Some(sys::Exit::Signal(s)) => {
            return Err(does_not_run(format!("was killed by signal {s}")))
        }
        None => return Err(does_not_run("could not be waited for".into())),
    }
    let line = String::from_utf8_lossy(&printed).trim().to_owned();
    if !line.starts_with("sidejob ") {
        return Err(UpgradeError::NotSidejob {
            path: path.into(),
            printed: line,
        });
    }
    Ok(line)
}

/// The shipped plugins a daemon started from `binary` would not find (where `plugin_host`
/// looks: `<prefix>/lib/sidejob/plugins`, the binary's directory, its `deps/`).
pub(crate) fn missing_plugins(binary: &Path) -> Vec<&'static str> {
    let Some(dir) = binary.parent() else {
        return SHIPPED_PLUGINS.to_vec();
    };
    let mut places = vec![dir.to_path_buf(), dir.join("deps")];
    if let Some(prefix) = dir.parent() {
        places.insert(0, prefix.join("lib/sidejob/plugins"));
    }
    SHIPPED_PLUGINS
        .into_iter()
        .filter(|name| !places.iter().any(|p| p.join(name).is_file()))
        .collect()
}

/// Whether an upgrade checks that the shipped plugins are beside the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plugins {
    /// The daemon loads them (`shipped_plugins`, the default): a binary without them would
    /// serve no shipped tool.
    Required,
    /// It loads none.
    NotLoaded,
}

/// Everything an upgrade checks before it runs `candidate`: that it runs and says it is
/// sidejob, and (`Plugins::Required`) that its plugins are beside it. Returns its
/// `--version` line.
pub(crate) fn verify(candidate: &Candidate, plugins: Plugins) -> Result<String, UpgradeError> {
    let version = probe(&candidate.file, &candidate.path)?;
    // The running image's plugins are where they were when it started.
    if plugins == Plugins::Required && candidate.origin != Origin::Running {
        let missing = missing_plugins(&candidate.path);
        if !missing.is_empty() {
            return Err(UpgradeError::MissingPlugins {
                path: candidate.path.clone(),
                missing: missing.join(", "),
            });
        }
    }
    Ok(version)
}
