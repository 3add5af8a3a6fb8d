//! What the run's init and the command's side of its fork tell the supervisor: two typed
//! messages, encoded and decoded here and nowhere else.
//!
//! Both are written once, by our own code (init, or the command's process before `exec`),
//! on a pipe only the supervisor reads; the command never holds either pipe (the status pipe
//! stays in init, the start-failure pipe closes on `exec`). They are small text lines so a
//! supervisor log or a test can show them as they are.

use crate::sys::Exit;

/// Init's report on the status pipe, written once when the run is over (or could not start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InitReport {
    /// The command ended as `exit`; init then killed and reaped `leftovers` processes it had
    /// left behind. `git_repository`: the run made a repository on the `.git` stand-in.
    Ended {
        exit: Exit,
        leftovers: u32,
        git_repository: bool,
    },
    /// Init could not start the run: it is not PID 1 of a new namespace, or the sandbox
    /// could not be built. The text says which step failed.
    Failed(String),
}

/// Written by the command's side of init's fork when it cannot become the command; the pipe
/// closes silently when `exec` succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartFailure {
    /// A confinement step (a sandbox layer) failed: the run's `sandbox_error`.
    Sandbox(String),
    /// `exec` itself failed (not found, not executable): the run's `spawn_error`.
    Exec(String),
}

const ENDED_EXIT: &str = "ended exit ";
const ENDED_SIGNAL: &str = "ended signal ";
const FAILED: &str = "failed ";
const GIT: &str = "git_repository";
const SANDBOX: &str = "sandbox ";
const EXEC: &str = "exec ";

impl InitReport {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            InitReport::Ended {
                exit,
                leftovers,
                git_repository,
            } => {
                let (tag, n) = match exit {
                    Exit::Code(c) => (ENDED_EXIT, c),
                    Exit::Signal(s) => (ENDED_SIGNAL, s),
                };
                let git = if *git_repository {
                    " git_repository"
                } else {
                    ""
                };
                format!("{tag}{n} {leftovers}{git}").into_bytes()
            }
            InitReport::Failed(why) => format!("{FAILED}{why}").into_bytes(),
        }
    }

    /// `None` for anything that is not a whole report (init died while writing it, or
    /// wrote nothing).
    pub(crate) fn decode(bytes: &[u8]) -> Option<InitReport> {
        let text = std::str::from_utf8(bytes).ok()?;
        if let Some(why) = text.strip_prefix(FAILED) {
            return Some(InitReport::Failed(why.to_owned()));
        }
        let (rest, exit): (&str, fn(i32) -> Exit) = if let Some(r) = text.strip_prefix(ENDED_EXIT) {
            (r, Exit::Code)
        } else {
            (text.strip_prefix(ENDED_SIGNAL)?, Exit::Signal)
        };
        let mut words = rest.split(' ');
        let n = words.next()?.parse().ok()?;
        let leftovers = words.next()?.parse().ok()?;
        let git_repository = match words.next() {
            None => false,
            Some(GIT) => true,
            Some(_) => return None,
        };
        if words.next().is_some() {
            return None;
        }
        Some(InitReport::Ended {
            exit: exit(n),
            leftovers,
            git_repository,
        })
    }
}

impl StartFailure {
    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            StartFailure::Sandbox(why) => format!("{SANDBOX}{why}"),
            StartFailure::Exec(why) => format!("{EXEC}{why}"),
        }
        .into_bytes()
    }

    /// `None` when nothing was written (the command started). Anything else that is not a
    /// known message still means the command did not start: it is kept as a sandbox failure.
    pub(crate) fn decode(bytes: &[u8]) -> Option<StartFailure> {
        if bytes.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(bytes);
        Some(if let Some(why) = text.strip_prefix(EXEC) {
            StartFailure::Exec(why.to_owned())
        } else {
            StartFailure::Sandbox(text.strip_prefix(SANDBOX).unwrap_or(&text).to_owned())
        })
    }
}

impl std::fmt::Display for StartFailure {
    /// The run's `error`: the same words the message carries.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartFailure::Sandbox(why) => write!(f, "{SANDBOX}{why}"),
            StartFailure::Exec(why) => write!(f, "{EXEC}{why}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn init_reports_round_trip() {
        for r in [
            InitReport::Ended {
                exit: Exit::Code(0),
                leftovers: 0,
                git_repository: false,
            },
            InitReport::Ended {
                exit: Exit::Code(-1),
                leftovers: 7,
                git_repository: true,
            },
            InitReport::Ended {
                exit: Exit::Signal(9),
                leftovers: 4_000_000_000,
                git_repository: false,
            },
            InitReport::Failed("sandbox: mount /usr: permission denied".into()),
            InitReport::Failed(String::new()),
        ] {
            assert_eq!(InitReport::decode(&r.encode()), Some(r.clone()), "{r:?}");
        }
    }

    #[test]
    fn partial_or_foreign_init_reports_are_no_report() {
        for bad in [
            &b""[..],
            b"ended",
            b"ended exit",
            b"ended exit 0",
            b"ended exit x 0",
            b"ended exit 0 -1",
            b"ended exit 0 0 something_else",
            b"ended exit 0 0 git_repository extra",
            b"ended stopped 0 0",
            b"exit 0 0",
            b"\xff\xfe",
        ] {
            assert_eq!(
                InitReport::decode(bad),
                None,
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn start_failures_round_trip_and_read_as_before() {
        for f in [
            StartFailure::Sandbox("landlock: not supported".into()),
            StartFailure::Exec("/bin/nope: No such file or directory".into()),
        ] {
            assert_eq!(StartFailure::decode(&f.encode()), Some(f.clone()));
        }
        assert_eq!(StartFailure::decode(b""), None);
        // The text shown is the message itself.
        assert_eq!(
            StartFailure::Exec("/x: denied".into()).to_string(),
            "exec /x: denied"
        );
        // Something unexpected still says the command did not start.
        assert_eq!(
            StartFailure::decode(b"garbled"),
            Some(StartFailure::Sandbox("garbled".into()))
        );
    }
}
