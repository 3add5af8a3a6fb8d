//! Sandbox profiles as data (sandbox-profiles/README.md): the TOML format of `sandbox-profiles/*.toml`, loaded in
//! two steps. [`parse`] only reads the TOML into [`RawProfile`] (every leaf keeps its span, so
//! a later error can name its line); [`RawProfile::validate`] then checks each field and
//! builds a [`Profile`]. Both steps report `file:line: field: message`.
//!
//! The format is documented for users in `sandbox-profiles/README.md`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use toml::Spanned;

/// The placeholders a path may start with; resolved per run by [`super::resolve`].
pub const PLACEHOLDERS: &[&str] = &["{workspace}", "{session_dir}", "{tmp}", "{home}"];

/// A profile that failed to load: where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub struct ProfileError {
    pub file: String,
    /// 1-based; 0 when the error is about the whole file.
    pub line: usize,
    pub field: String,
    pub message: String,
}

/// How much network a run gets. Ordered from narrowest to widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// No sockets but Unix ones; a fresh network namespace with no interfaces up.
    None,
    /// A fresh network namespace with only `lo` up: the run can talk to itself.
    Loopback,
    /// The host's network.
    Host,
}

impl Network {
    pub fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Loopback => "loopback",
            Network::Host => "host",
        }
    }
}

/// Who the command runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunAs {
    /// The peer's uid/gid when the daemon is root, else the daemon's own (sandbox-profiles/README.md).
    Caller,
    /// A fixed uid/gid.
    Ids { uid: u32, gid: u32 },
}

/// Resource limits; `None` leaves a resource unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Bytes of memory (cgroup).
    pub memory: Option<u64>,
    /// Processes and threads (cgroup).
    pub pids: Option<u64>,
    /// CPU bandwidth in thousandths of a core (cgroup).
    pub cpu_millicores: Option<u64>,
    /// Seconds of CPU time per process (`RLIMIT_CPU`).
    pub cpu_time_s: Option<u64>,
    /// Open descriptors per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// Largest file a process may write (`RLIMIT_FSIZE`).
    pub file_size: Option<u64>,
    /// Head of the output kept in output.log.
    pub output: Option<u64>,
}

impl Limits {
    /// Does the run need a cgroup at all?
    pub fn needs_cgroup(&self) -> bool {
        self.memory.is_some() || self.pids.is_some() || self.cpu_millicores.is_some()
    }
}

/// A validated profile, still with placeholders in its paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub description: String,
    pub best_effort: bool,
    pub run_as: RunAs,
    pub readable: Vec<String>,
    pub executable: Vec<String>,
    pub writable: Vec<String>,
    /// Paths relative to the workspace that stay read-only even when it is writable.
    pub protected: Vec<String>,
    pub network: Network,
    pub limits: Limits,
    /// Variable names (a trailing `*` matches a prefix) passed through from the caller.
    pub env_allow: Vec<String>,
    /// Fixed values, placeholders allowed.
    pub env_set: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
    pub kill_grace_ms: Option<u64>,
}

// ---- step 1: parse --------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProfile {
    #[serde(default)]
    description: Option<Spanned<String>>,
    #[serde(default)]
    best_effort: Option<Spanned<bool>>,
    #[serde(default)]
    run_as: Option<Spanned<String>>,
    #[serde(default)]
    paths: RawPaths,
    #[serde(default)]
    network: Option<Spanned<String>>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    env: RawEnv,
    #[serde(default)]
    deadlines: RawDeadlines,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPaths {
    #[serde(default)]
    readable: Vec<Spanned<String>>,
    #[serde(default)]
    executable: Vec<Spanned<String>>,
    #[serde(default)]
    writable: Vec<Spanned<String>>,
    #[serde(default)]
    protected: Vec<Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    memory: Option<Spanned<toml::Value>>,
    pids: Option<Spanned<i64>>,
    cpu: Option<Spanned<toml::Value>>,
    cpu_time: Option<Spanned<String>>,
    open_files: Option<Spanned<i64>>,
    file_size: Option<Spanned<toml::Value>>,
    output: Option<Spanned<toml::Value>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    #[serde(default)]
    allow: Vec<Spanned<String>>,
    #[serde(default)]
    set: BTreeMap<String, Spanned<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDeadlines {
    timeout: Option<Spanned<String>>,
    kill_grace: Option<Spanned<String>>,
}

/// Step 1: reads the TOML. Unknown fields and wrong types are refused here, with their line.
pub fn parse(file: &str, text: &str) -> Result<RawProfile, ProfileError> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map_or(0, |s| line_of(text, s.start));
        let msg = e.message().to_owned();
        // toml names the offending key in its message ("unknown field `x`"); keep it as the field.
        let field = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field"))
            .unwrap_or("(toml)")
            .to_owned();
        ProfileError {
            file: file.into(),
            line,
            field,
            message: msg,
        }
    })
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

// ---- step 2: validate -----------------------------------------------------------------------

struct Checker<'a> {
    file: &'a str,
    text: &'a str,
}

impl Checker<'_> {
    fn err(
        &self,
        span: std::ops::Range<usize>,
        field: &str,
        message: impl fmt::Display,
    ) -> ProfileError {
        ProfileError {
            file: self.file.into(),
            line: line_of(self.text, span.start),
            field: field.into(),
            message: message.to_string(),
        }
    }

    fn path(&self, field: &str, p: &Spanned<String>) -> Result<String, ProfileError> {
        let s = p.get_ref();
        let bad = |m: &str| Err(self.err(p.span(), field, format!("{s:?}: {m}")));
        if s.contains('\0') {
            return bad("holds a NUL byte");
        }
        if s.split('/').any(|c| c == "..") {
            return bad("\"..\" is not allowed; name the directory itself");
        }
        if let Some(rest) = s.strip_prefix('{') {
            let Some(end) = rest.find('}') else {
                return bad("unclosed placeholder");
            };
            let ph = &s[..end + 2];
            if !PLACEHOLDERS.contains(&ph) {
                return bad(&format!(
                    "unknown placeholder; use one of {}",
                    PLACEHOLDERS.join(", ")
                ));
            }
            let tail = &s[end + 2..];
            if !tail.is_empty() && !tail.starts_with('/') {
                return bad("a placeholder must be followed by '/' or nothing");
            }
        } else if !s.starts_with('/') {
            return bad("must be absolute or start with a placeholder");
        }
        if s[1..].contains('{') {
            return bad("placeholders may only start a path");
        }
        Ok(s.trim_end_matches('/').to_owned().max_or_root())
    }

    fn size(&self, field: &str, v: &Spanned<toml::Value>) -> Result<u64, ProfileError> {
        let n = match v.get_ref() {
            toml::Value::Integer(i) if *i > 0 => Some(*i as u64),
            toml::Value::String(s) => parse_size(s),
            _ => None,
        };
        n.filter(|&n| n > 0).ok_or_else(|| {
            self.err(
                v.span(),
                field,
                "expected a positive size such as 512MiB, 2GiB or a byte count",
            )
        })
    }

    fn duration_ms(&self, field: &str, v: &Spanned<String>) -> Result<u64, ProfileError> {
        humantime::parse_duration(v.get_ref())
            .map(|d| d.as_millis() as u64)
            .map_err(|e| {
                self.err(
                    v.span(),
                    field,
                    format!("{:?}: {e} (e.g. \"30s\", \"10m\", \"24h\")", v.get_ref()),
                )
            })
    }

    fn positive(&self, field: &str, v: &Spanned<i64>) -> Result<u64, ProfileError> {
        match *v.get_ref() {
            n if n > 0 => Ok(n as u64),
            n => Err(self.err(v.span(), field, format!("{n}: must be at least 1"))),
        }
    }
}

trait RootFix {
    fn max_or_root(self) -> String;
}
impl RootFix for String {
    /// `"/"` trimmed of its slash is `""`; keep it as `"/"`.
    fn max_or_root(self) -> String {
        if self.is_empty() {
            "/".into()
        } else {
            self
        }
    }
}

/// `"512MiB"`, `"2GiB"`, `"100k"`, `"4096"` → bytes.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl RawProfile {
    /// Step 2: checks every field and builds the profile.
    pub fn validate(self, name: &str, file: &str, text: &str) -> Result<Profile, ProfileError> {
        let c = Checker { file, text };
        let paths = |field: &str, list: &[Spanned<String>]| -> Result<Vec<String>, ProfileError> {
            list.iter().map(|p| c.path(field, p)).collect()
        };
        let readable = paths("paths.readable", &self.paths.readable)?;
        let executable = paths("paths.executable", &self.paths.executable)?;
        let writable = paths("paths.writable", &self.paths.writable)?;
        let mut protected = Vec::new();
        for p in &self.paths.protected {
            let s = p.get_ref();
            if s.is_empty()
                || s.starts_with('/')
                || s.starts_with('{')
                || s.split('/').any(|c| c == ".." || c == ".")
            {
                return Err(c.err(p.span(), "paths.protected", format!("{s:?}: must be a plain path relative to the workspace, like \".git/hooks\"")));
            }
            protected.push(s.trim_end_matches('/').to_owned());
        }

        let network = match &self.network {
            None => Network::None,
            Some(n) => match n.get_ref().as_str() {
                "none" => Network::None,
                "loopback" => Network::Loopback,
                "host" => Network::Host,
                other => {
                    return Err(c.err(
                        n.span(),
                        "network",
                        format!("{other:?}: use \"none\", \"loopback\" or \"host\""),
                    ))
                }
            },
        };

        let run_as = match &self.run_as {
            None => RunAs::Caller,
            Some(r) => match r.get_ref().as_str() {
                "caller" => RunAs::Caller,
                "nobody" => RunAs::Ids {
                    uid: 65534,
                    gid: 65534,
                },
                s => {
                    let ids = s
                        .split_once(':')
                        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
                    match ids {
                        Some((uid, gid)) => RunAs::Ids { uid, gid },
                        None => {
                            return Err(c.err(
                                r.span(),
                                "run_as",
                                format!("{s:?}: use \"caller\", \"nobody\" or \"UID:GID\""),
                            ))
                        }
                    }
                }
            },
        };

        let l = &self.limits;
        let limits = Limits {
            memory: l
                .memory
                .as_ref()
                .map(|v| c.size("limits.memory", v))
                .transpose()?,
            pids: l
                .pids
                .as_ref()
                .map(|v| c.positive("limits.pids", v))
                .transpose()?,
            cpu_millicores: l
                .cpu
                .as_ref()
                .map(|v| {
                    let cores = match v.get_ref() {
                        toml::Value::Float(f) => Some(*f),
                        toml::Value::Integer(i) => Some(*i as f64),
                        _ => None,
                    };
                    match cores {
                        Some(f) if (0.01..=4096.0).contains(&f) => Ok((f * 1000.0).round() as u64),
                        _ => Err(c.err(
                            v.span(),
                            "limits.cpu",
                            "expected a number of cores between 0.01 and 4096, like 1.5",
                        )),
                    }
                })
                .transpose()?,
            cpu_time_s: l
                .cpu_time
                .as_ref()
                .map(|v| {
                    c.duration_ms("limits.cpu_time", v)
                        .map(|ms| ms.div_ceil(1000).max(1))
                })
                .transpose()?,
            open_files: l
                .open_files
                .as_ref()
                .map(|v| c.positive("limits.open_files", v))
                .transpose()?,
            file_size: l
                .file_size
                .as_ref()
                .map(|v| c.size("limits.file_size", v))
                .transpose()?,
            output: l
                .output
                .as_ref()
                .map(|v| c.size("limits.output", v))
                .transpose()?,
        };
        if let (Some(n), Some(v)) = (limits.open_files, &l.open_files) {
            if n < 16 {
                return Err(c.err(
                    v.span(),
                    "limits.open_files",
                    "at least 16 are needed to start a program",
                ));
            }
        }

        let mut env_allow = Vec::new();
        for a in &self.env.allow {
            let s = a.get_ref();
            if !valid_env_name(s.strip_suffix('*').unwrap_or(s)) && s != "*" {
                return Err(c.err(
                    a.span(),
                    "env.allow",
                    format!("{s:?}: not a variable name (a trailing * matches a prefix)"),
                ));
            }
            if s == "*" {
                return Err(c.err(
                    a.span(),
                    "env.allow",
                    "\"*\" would pass the whole environment through; name the variables",
                ));
            }
            env_allow.push(s.clone());
        }
        let mut env_set = Vec::new();
        for (k, v) in &self.env.set {
            if !valid_env_name(k) {
                return Err(c.err(v.span(), &format!("env.set.{k}"), "not a variable name"));
            }
            if v.get_ref().contains('\0') {
                return Err(c.err(v.span(), &format!("env.set.{k}"), "holds a NUL byte"));
            }
            env_set.push((k.clone(), v.get_ref().clone()));
        }

        let timeout_ms = self
            .deadlines
            .timeout
            .as_ref()
            .map(|v| c.duration_ms("deadlines.timeout", v))
            .transpose()?;
        let kill_grace_ms = self
            .deadlines
            .kill_grace
            .as_ref()
            .map(|v| c.duration_ms("deadlines.kill_grace", v))
            .transpose()?;

        // Executable and writable paths must also be visible: fold them into readable.
        let mut all_readable = readable;
        for p in executable.iter().chain(&writable) {
            if !all_readable.contains(p) {
                all_readable.push(p.clone());
            }
        }
        Ok(Profile {
            name: name.into(),
            description: self.description.map(|d| d.into_inner()).unwrap_or_default(),
            best_effort: self.best_effort.map(|b| b.into_inner()).unwrap_or(false),
            run_as,
            readable: all_readable,
            executable,
            writable,
            protected,
            network,
            limits,
            env_allow,
            env_set,
            timeout_ms,
            kill_grace_ms,
        })
    }
}

/// Parse then validate.
pub fn load(name: &str, file: &str, text: &str) -> Result<Profile, ProfileError> {
    parse(file, text)?.validate(name, file, text)
}

// ---- narrowing ------------------------------------------------------------------------------

/// Is `path` the same as, or below, `root` (both unresolved, placeholders compared literally)?
fn within(path: &str, root: &str) -> bool {
    root == "/"
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

fn covered(path: &str, roots: &[String]) -> bool {
    roots.iter().any(|r| within(path, r))
}

fn limit_narrows(what: &str, call: Option<u64>, session: Option<u64>) -> Result<(), String> {
    match (call, session) {
        (_, None) => Ok(()),
        (Some(c), Some(s)) if c <= s => Ok(()),
        (Some(c), Some(s)) => Err(format!("limits.{what} {c} is above the session's {s}")),
        (None, Some(s)) => Err(format!(
            "limits.{what} is unlimited but the session's is {s}"
        )),
    }
}

impl Profile {
    /// A session owned by `owner_uid` may use this profile only if it does not make that
    /// owner root: `run_as` with uid 0 or gid 0 is for root's own sessions. (`caller` runs as
    /// the owner; any other fixed ids are the profile author's choice.)
    pub fn check_run_as_for(&self, owner_uid: u32) -> Result<(), String> {
        match self.run_as {
            RunAs::Ids { uid, gid } if owner_uid != 0 && (uid == 0 || gid == 0) => Err(format!(
                "profile {:?} runs as {uid}:{gid} (run_as), which only root's sessions may use; \
                 ask an administrator for a profile that runs as \"caller\" or an unprivileged id",
                self.name
            )),
            RunAs::Ids { .. } | RunAs::Caller => Ok(()),
        }
    }

    /// A call may run under a profile only if it is no wider than its session's: it sees no
    /// path the session does not, has no more network, no higher limits, no fewer protected
    /// paths, passes no more of the environment and is not best-effort unless the session is.
    pub fn check_narrows(&self, session: &Profile) -> Result<(), String> {
        if self.name == session.name {
            return Ok(());
        }
        let widen = |m: String| {
            Err(format!(
                "profile {:?} is wider than the session's {:?}: {m}",
                self.name, session.name
            ))
        };
        for p in &self.readable {
            if !covered(p, &session.readable) {
                return widen(format!("it can read {p}"));
            }
        }
        for p in &self.executable {
            if !covered(p, &session.executable) {
                return widen(format!("it can execute {p}"));
            }
        }
        for p in &self.writable {
            if !covered(p, &session.writable) {
                return widen(format!("it can write {p}"));
            }
        }
        for p in &session.protected {
            if !self.protected.contains(p) {
                return widen(format!("it does not protect {p}"));
            }
        }
        if self.network > session.network {
            return widen(format!(
                "network {} is wider than {}",
                self.network.as_str(),
                session.network.as_str()
            ));
        }
        if self.best_effort && !session.best_effort {
            return widen("it is best-effort".into());
        }
        if self.run_as != session.run_as {
            return widen("it runs as another user".into());
        }
        let (a, b) = (&self.limits, &session.limits);
        for (what, c, s) in [
            ("memory", a.memory, b.memory),
            ("pids", a.pids, b.pids),
            ("cpu", a.cpu_millicores, b.cpu_millicores),
            ("cpu_time", a.cpu_time_s, b.cpu_time_s),
            ("open_files", a.open_files, b.open_files),
            ("file_size", a.file_size, b.file_size),
            ("output", a.output, b.output),
            ("deadlines.timeout", self.timeout_ms, session.timeout_ms),
        ] {
            if let Err(m) = limit_narrows(what, c, s) {
                return widen(m);
            }
        }
        for v in &self.env_allow {
            let ok = session.env_allow.iter().any(|s| match s.strip_suffix('*') {
                Some(prefix) => v.strip_suffix('*').unwrap_or(v).starts_with(prefix),
                None => s == v,
            });
            if !ok {
                return widen(format!("it passes {v} through"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
description = "test"
network = "none"
[paths]
readable = ["/usr", "/etc/passwd"]
executable = ["/usr"]
writable = ["{workspace}", "{tmp}"]
protected = [".git/hooks"]
[limits]
memory = "1GiB"
pids = 100
cpu = 1.5
open_files = 256
file_size = "10MiB"
[env]
allow = ["TERM", "LC_*"]
set = { PATH = "/usr/bin", HOME = "{workspace}" }
[deadlines]
timeout = "1h"
"#;

    #[test]
    fn a_good_profile_loads() {
        let p = load("t", "t.toml", GOOD).unwrap();
        assert_eq!(p.limits.memory, Some(1 << 30));
        assert_eq!(p.limits.cpu_millicores, Some(1500));
        assert_eq!(p.timeout_ms, Some(3_600_000));
        assert!(p.readable.contains(&"{workspace}".to_owned()));
        assert_eq!(p.protected, vec![".git/hooks"]);
    }

    #[test]
    fn only_roots_sessions_may_run_as_uid_or_gid_0() {
        for run_as in ["0:0", "0:100", "100:0"] {
            let p = load("rootish", "r.toml", &format!("run_as = \"{run_as}\"\n")).unwrap();
            let e = p.check_run_as_for(65534).unwrap_err();
            assert!(e.contains("only root's sessions"), "{e}");
            p.check_run_as_for(0).unwrap();
        }
        for run_as in ["caller", "nobody", "1000:1000"] {
            let p = load("fine", "f.toml", &format!("run_as = \"{run_as}\"\n")).unwrap();
            p.check_run_as_for(65534).unwrap();
        }
    }

    #[test]
    fn parse_errors_name_file_line_and_field() {
        let e = load("t", "t.toml", "[paths]\nreadable = [\"/usr\"]\nbogus = 1\n").unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.field.as_str()),
            ("t.toml", 3, "bogus"),
            "{e}"
        );
    }

    #[test]
    fn validation_errors_name_file_line_and_field() {
        let cases = [
            (
                "[paths]\nreadable = [\n  \"relative\"]\n",
                3,
                "paths.readable",
            ),
            ("[paths]\nwritable = [\"{nope}/x\"]\n", 2, "paths.writable"),
            ("[paths]\nprotected = [\"../x\"]\n", 2, "paths.protected"),
            ("network = \"wifi\"\n", 1, "network"),
            ("[limits]\nmemory = \"lots\"\n", 2, "limits.memory"),
            ("[limits]\n\npids = 0\n", 3, "limits.pids"),
            ("[limits]\ncpu = 0\n", 2, "limits.cpu"),
            ("[deadlines]\ntimeout = \"soon\"\n", 2, "deadlines.timeout"),
            ("[env]\nallow = [\"*\"]\n", 2, "env.allow"),
            ("run_as = \"root please\"\n", 1, "run_as"),
        ];
        for (text, line, field) in cases {
            let e = load("t", "t.toml", text).unwrap_err();
            assert_eq!((e.line, e.field.as_str()), (line, field), "{text:?} → {e}");
            assert!(
                e.to_string()
                    .starts_with(&format!("t.toml:{line}: {field}: ")),
                "{e}"
            );
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("512MiB"), Some(512 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("x"), None);
    }

    #[test]
    fn a_call_may_narrow_but_not_widen() {
        let session = load("s", "s.toml", GOOD).unwrap();
        let narrower = load(
            "n",
            "n.toml",
            "[paths]\nreadable=[\"/usr/lib\"]\nwritable=[\"{workspace}/sub\"]\nprotected=[\".git/hooks\"]\n[limits]\nmemory=\"512MiB\"\npids=10\ncpu=1\nopen_files=64\nfile_size=\"1MiB\"\n[deadlines]\ntimeout=\"1m\"\n",
        )
        .unwrap();
        narrower.check_narrows(&session).unwrap();
        let wider_net = load(
            "w",
            "w.toml",
            "network = \"host\"\n[paths]\nprotected=[\".git/hooks\"]\n",
        )
        .unwrap();
        assert!(wider_net
            .check_narrows(&session)
            .unwrap_err()
            .contains("network"));
        let wider_path = load("w", "w.toml", "[paths]\nreadable=[\"/etc\"]\n").unwrap();
        assert!(wider_path
            .check_narrows(&session)
            .unwrap_err()
            .contains("/etc"));
        let no_limit = load(
            "w",
            "w.toml",
            "[paths]\nprotected=[\".git/hooks\"]\n[limits]\npids=10\ncpu=1\nopen_files=64\nfile_size=\"1MiB\"\n[deadlines]\ntimeout=\"1m\"\n",
        )
        .unwrap();
        assert!(no_limit
            .check_narrows(&session)
            .unwrap_err()
            .contains("memory"));
    }
}
