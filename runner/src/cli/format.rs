//! How the command line reads and shows things: durations, short task ids, tables, the
//! waiting spinner.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A human duration: `500ms`, `90s`, `10m`, `1h30m`, `2d`. A bare number is refused rather
/// than guessed (milliseconds or seconds?).
pub(super) fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return Err(DurationError::NoUnit(t.to_owned()));
    }
    humantime::parse_duration(t).map_err(|source| DurationError::Invalid {
        text: t.to_owned(),
        source,
    })
}

/// Why [`parse_duration`] refuses a duration (clap shows it after the flag's name).
#[derive(Debug, thiserror::Error)]
pub(super) enum DurationError {
    #[error("{0:?} has no unit; write it as {0}s, {0}ms or {0}m (units: ms, s, m, h, d)")]
    NoUnit(String),
    #[error("{text:?} is not a duration ({source}); write e.g. 500ms, 90s, 10m or 1h30m")]
    Invalid {
        text: String,
        source: humantime::DurationError,
    },
}

/// `1h30m`, `2m05s`, `4.2s`, `350ms`.
pub(super) fn format_duration(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..=59 => format!("{:.1}s", ms as f64 / 1000.0),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A duration given in milliseconds on the wire.
pub(super) fn format_ms(ms: u64) -> String {
    format_duration(Duration::from_millis(ms))
}

/// The shortest prefix of each id (at least 12 characters, as docker shows) that tells it
/// apart from every other id listed.
pub(super) fn short_ids(ids: &[&str]) -> Vec<String> {
    const MIN: usize = 12;
    ids.iter()
        .map(|id| {
            let mut n = MIN.min(id.len());
            while n < id.len()
                && ids
                    .iter()
                    .any(|other| other != id && other.len() >= n && other[..n] == id[..n])
            {
                n += 1;
            }
            id[..n].to_owned()
        })
        .collect()
}

/// Prints a left-aligned table; the last column is not padded.
pub(super) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == N {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = widths[i]));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// Elapsed time on stderr while the CLI waits, when stderr is a terminal.
pub(super) struct Spinner {
    stop: Option<std::sync::mpsc::Sender<()>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Spinner {
    pub(super) fn start(enabled: bool, what: &str) -> Spinner {
        if !enabled || !std::io::stderr().is_terminal() {
            return Spinner {
                stop: None,
                handle: None,
            };
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let what = what.to_owned();
        let handle = std::thread::spawn(move || {
            let frames = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
            let start = Instant::now();
            // Stay quiet for short waits.
            if rx.recv_timeout(Duration::from_millis(500)).is_ok() {
                return;
            }
            for i in 0.. {
                eprint!(
                    "\r{} {what} {} ",
                    frames[i % frames.len()],
                    format_duration(Duration::from_secs(start.elapsed().as_secs()))
                );
                if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
                    break;
                }
            }
            eprint!("\r\x1b[2K");
        });
        Spinner {
            stop: Some(tx),
            handle: Some(handle),
        }
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// A path named on the command line (`--read`, `--write` of `exec` and `call`) as the
/// absolute path a sandbox takes: a relative one from `cwd` (the physical working
/// directory), where leading `..` climb it; a `..` after a name is refused, since only the
/// kernel knows where it leads when that name is a symlink. `.`, repeated and trailing
/// slashes are dropped.
pub(super) fn absolute_path(flag: &str, cwd: &Path, p: &Path) -> Result<String, String> {
    use std::path::Component;
    let mut out = if p.is_absolute() {
        PathBuf::from("/")
    } else {
        cwd.to_path_buf()
    };
    let mut named = p.is_absolute();
    for c in p.components() {
        match c {
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
            Component::ParentDir if !named => {
                out.pop();
            }
            Component::ParentDir => {
                return Err(format!(
                    "{flag} {}: a \"..\" after a name may lead anywhere; name the path without it",
                    p.display()
                ))
            }
            Component::Normal(n) => {
                named = true;
                out.push(n);
            }
        }
    }
    match out.to_str() {
        Some(s) if !s.contains('\0') => Ok(s.to_owned()),
        _ => Err(format!("{flag} {}: not a UTF-8 path", p.display())),
    }
}

/// A task's profile as `sidejob tasks` shows it: with what its call was granted, kind by
/// kind, the first of each and how many more (`--json` has them all), e.g.
/// `workspace-write+read:/srv/data,+1+allow:pypi.org:443`.
pub(super) fn profile_with_grants(
    profile: &str,
    grants: Option<&crate::protocol::CallGrants>,
) -> String {
    let mut out = profile.to_owned();
    if let Some(g) = grants {
        for (kind, list) in [
            ("read", &g.readable),
            ("write", &g.writable),
            ("allow", &g.allow),
        ] {
            match list.as_slice() {
                [] => {}
                [one] => out.push_str(&format!("+{kind}:{one}")),
                [first, rest @ ..] => out.push_str(&format!("+{kind}:{first},+{}", rest.len())),
            }
        }
    }
    out
}

/// What to do about a refused host, after `call` names it.
pub(super) const NETWORK_HINT_PROFILE: &str = "a profile allows a host with [network] allow = [\"HOST\"] (docs/network.md); run under it with sidejob call --profile NAME, or allow it for one run with sidejob call --allow HOST if the daemon's [grants] allow lists it";

/// What to do about a refused host, after `exec` names it.
pub(super) const NETWORK_HINT_EXEC: &str = "--allow HOST allows a host for this run; a profile allows it with [network] allow = [\"HOST\"] (docs/network.md)";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        let e = parse_duration("600000").unwrap_err();
        assert_eq!(
            e.to_string(),
            "\"600000\" has no unit; write it as 600000s, 600000ms or 600000m (units: ms, s, m, h, d)"
        );
        assert!(parse_duration("soon").is_err());
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(format_duration(Duration::from_millis(350)), "350ms");
        assert_eq!(format_duration(Duration::from_millis(4200)), "4.2s");
        assert_eq!(format_duration(Duration::from_secs(125)), "2m05s");
    }

    #[test]
    fn command_line_paths_are_made_absolute_from_the_working_directory() {
        let cwd = Path::new("/home/u/proj");
        let abs = |p: &str| absolute_path("--read", cwd, Path::new(p));
        assert_eq!(abs(".").unwrap(), "/home/u/proj");
        assert_eq!(abs("out/").unwrap(), "/home/u/proj/out");
        assert_eq!(abs("../cache").unwrap(), "/home/u/cache");
        assert_eq!(abs("/srv//data/.").unwrap(), "/srv/data");
        assert_eq!(abs("/").unwrap(), "/");
        assert!(abs("link/../x").unwrap_err().contains("link/../x"));
    }

    #[test]
    fn the_profile_column_names_each_grant_by_kind() {
        let g = crate::protocol::CallGrants {
            readable: vec!["/srv/data".into()],
            writable: vec!["/srv/out".into(), "/srv/log".into()],
            allow: vec![],
        };
        assert_eq!(
            profile_with_grants("workspace-write", Some(&g)),
            "workspace-write+read:/srv/data+write:/srv/out,+1"
        );
        assert_eq!(profile_with_grants("ci", None), "ci");
    }

    #[test]
    fn short_ids_are_unique_and_at_least_twelve_characters() {
        let ids = [
            "01KAAAAAAAAAAAAAAAAAAAAAAA",
            "01KAAAAAAAAAAAAAB000000000",
            "01KBBBBBBBBBBBBBBBBBBBBBBB",
        ];
        assert_eq!(
            short_ids(&ids),
            ["01KAAAAAAAAAAAAAA", "01KAAAAAAAAAAAAAB", "01KBBBBBBBBB"]
        );
    }
}
