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

use super::layer::{Layer, NetworkLayer};
use crate::egress::policy::Policy;

/// The placeholders a path may start with; resolved per run by [`super::resolve`].
pub(crate) const PLACEHOLDERS: &[&str] = &["{workspace}", "{session_dir}", "{tmp}", "{home}"];

/// A profile that failed to load: where, which field, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {field}: {message}")]
pub(crate) struct ProfileError {
    pub file: String,
    /// 1-based; 0 when the error is about the whole file.
    pub line: usize,
    pub field: String,
    pub message: String,
}

/// How much network a run gets. Ordered from narrowest to widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Network {
    /// No sockets but Unix ones; a fresh network namespace with no interfaces up.
    None,
    /// A fresh network namespace with only `lo` up: the run can talk to itself.
    Loopback,
    /// The host's network.
    Host,
}

impl Network {
    pub(crate) fn as_str(self) -> &'static str {
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
pub(crate) enum RunAs {
    /// The peer's uid/gid when the daemon is root, else the daemon's own (sandbox-profiles/README.md).
    Caller,
    /// A fixed uid/gid.
    Ids { uid: u32, gid: u32 },
}

/// Resource limits; `None` leaves a resource unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Limits {
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

impl Limits {}

/// A validated profile, still with placeholders in its paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Profile {
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
    /// The profile this one extends, if any (already folded in).
    pub extends: Option<String>,
    /// A network allow-list (`[network] allow/deny/hosts`): the run gets its own network
    /// namespace (`network` is `Loopback`) and reaches the hosts it allows through the egress
    /// proxy.
    pub egress: Option<Policy>,
    /// Persistent caches: a name and where the run sees it (placeholders allowed). Kept per
    /// owner, profile and workspace under the state directory (see `sandbox::caches`).
    pub caches: Vec<(String, String)>,
}

impl Profile {
    /// A profile with nothing in it: what a profile without `extends` is built on.
    pub(crate) fn empty(name: &str) -> Profile {
        Profile {
            name: name.into(),
            description: String::new(),
            best_effort: false,
            run_as: RunAs::Caller,
            readable: Vec::new(),
            executable: Vec::new(),
            writable: Vec::new(),
            protected: Vec::new(),
            network: Network::None,
            limits: Limits::default(),
            env_allow: Vec::new(),
            env_set: Vec::new(),
            timeout_ms: None,
            kill_grace_ms: None,
            extends: None,
            egress: None,
            caches: Vec::new(),
        }
    }

    /// How far the network reaches, for narrowing: none < loopback < allow-list < host.
    fn network_reach(&self) -> u8 {
        match (self.network, &self.egress) {
            (Network::None, _) => 0,
            (Network::Loopback, None) => 1,
            (Network::Loopback, Some(_)) => 2,
            (Network::Host, _) => 3,
        }
    }

    /// `none`, `loopback`, `allow-list` or `host`.
    pub(crate) fn network_name(&self) -> &'static str {
        match (self.network, &self.egress) {
            (Network::Loopback, Some(_)) => "allow-list",
            (n, _) => n.as_str(),
        }
    }
}

// ---- step 1: parse --------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawProfile {
    #[serde(default)]
    extends: Option<Spanned<String>>,
    #[serde(default)]
    description: Option<Spanned<String>>,
    #[serde(default)]
    best_effort: Option<Spanned<bool>>,
    #[serde(default)]
    run_as: Option<Spanned<String>>,
    #[serde(default)]
    paths: RawPaths,
    #[serde(default)]
    network: Option<Spanned<RawNetwork>>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    env: RawEnv,
    #[serde(default)]
    deadlines: RawDeadlines,
    #[serde(default)]
    caches: BTreeMap<String, Spanned<String>>,
}

/// `network = "none" | "loopback" | "host"`, or a `[network]` table (an allow-list).
#[derive(Debug)]
enum RawNetwork {
    Mode(String),
    Table(RawNetworkTable),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNetworkTable {
    #[serde(default)]
    pub(super) allow: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) deny: Vec<Spanned<String>>,
    #[serde(default)]
    pub(super) hosts: BTreeMap<String, Spanned<String>>,
}

impl<'de> Deserialize<'de> for RawNetwork {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawNetwork;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("\"none\", \"loopback\", \"host\", or a [network] table with allow, deny and hosts")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<RawNetwork, E> {
                Ok(RawNetwork::Mode(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<RawNetwork, A::Error> {
                // Straight through to the table's fields, so their spans (lines) survive.
                RawNetworkTable::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(RawNetwork::Table)
            }
        }
        d.deserialize_any(V)
    }
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
pub(crate) fn parse(file: &str, text: &str) -> Result<RawProfile, ProfileError> {
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

pub(super) struct Checker<'a> {
    file: &'a str,
    text: &'a str,
}

impl Checker<'_> {
    pub(super) fn err(
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
pub(crate) fn parse_size(s: &str) -> Option<u64> {
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
    /// Step 2: checks every field and builds the profile. A profile that `extends` another
    /// needs the catalog ([`super::Catalog`]) to find it; here it is an error.
    pub(crate) fn validate(
        self,
        name: &str,
        file: &str,
        text: &str,
    ) -> Result<Profile, ProfileError> {
        let layer = self.layer(file, text)?;
        if let Some((parent, line)) = &layer.extends {
            return Err(ProfileError {
                file: file.into(),
                line: *line,
                field: "extends".into(),
                message: format!(
                    "{parent:?}: only profiles loaded through a catalog can extend another"
                ),
            });
        }
        Ok(layer.onto(Profile::empty(name), name))
    }

    /// Step 2 without the base: checks every field this file sets.
    pub(crate) fn layer(self, file: &str, text: &str) -> Result<Layer, ProfileError> {
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

        let extends = match &self.extends {
            None => None,
            Some(e) => {
                let parent = e.get_ref();
                let ok = !parent.is_empty()
                    && parent.len() <= 64
                    && parent
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !ok {
                    return Err(c.err(
                        e.span(),
                        "extends",
                        format!("{parent:?}: name a profile (letters, digits, '-' and '_')"),
                    ));
                }
                Some((parent.clone(), line_of(text, e.span().start)))
            }
        };

        let network = match &self.network {
            None => None,
            Some(n) => Some(match n.get_ref() {
                RawNetwork::Mode(m) => NetworkLayer::Mode(match m.as_str() {
                    "none" => Network::None,
                    "loopback" => Network::Loopback,
                    "host" => Network::Host,
                    other => {
                        return Err(c.err(
                            n.span(),
                            "network",
                            format!("{other:?}: use \"none\", \"loopback\", \"host\", or a [network] table with an allow list"),
                        ))
                    }
                }),
                RawNetwork::Table(t) => NetworkLayer::AllowList(c.network_table(n.span(), t)?),
            }),
        };

        let run_as = match &self.run_as {
            None => None,
            Some(r) => Some(match r.get_ref().as_str() {
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
            }),
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

        let mut caches = Vec::new();
        for (name, at) in &self.caches {
            let field = format!("caches.{name}");
            let ok_name = !name.is_empty()
                && name.len() <= 64
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok_name {
                return Err(c.err(
                    at.span(),
                    &field,
                    "a cache's name is letters, digits, '-' and '_'",
                ));
            }
            let target = c.path(&field, at)?;
            if target == "/" || target.starts_with("{tmp}") || target.starts_with("{workspace}") {
                return Err(c.err(
                    at.span(),
                    &field,
                    format!("{target:?}: a cache needs a place of its own, like \"/cache/{name}\" or \"{{home}}/.cache/{name}\""),
                ));
            }
            caches.push((name.clone(), target));
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

        Ok(Layer {
            extends,
            description: self.description.map(|d| d.into_inner()),
            best_effort: self.best_effort.map(|b| b.into_inner()),
            run_as,
            readable,
            executable,
            writable,
            protected,
            network,
            limits,
            env_allow,
            env_set,
            timeout_ms,
            kill_grace_ms,
            caches,
        })
    }
}

/// Parse then validate.
pub(crate) fn load(name: &str, file: &str, text: &str) -> Result<Profile, ProfileError> {
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

fn limit_narrows(
    what: &'static str,
    call: Option<u64>,
    session: Option<u64>,
) -> Result<(), Widening> {
    match (call, session) {
        (_, None) => Ok(()),
        (Some(c), Some(s)) if c <= s => Ok(()),
        (Some(call), Some(session)) => Err(Widening::Limit {
            what,
            call,
            session,
        }),
        (None, Some(session)) => Err(Widening::Unlimited { what, session }),
    }
}

/// Why a session owned by a uid may not use a profile ([`Profile::check_run_as_for`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RunAsRefused {
    #[error(
        "profile {profile:?} runs as {uid}:{gid} (run_as), which only root's sessions may use; \
         ask an administrator for a profile that runs as \"caller\" or an unprivileged id"
    )]
    RootIds { profile: String, uid: u32, gid: u32 },
    #[error(
        "profile {profile:?} runs as {uid}:{gid} (run_as), a uid the daemon would share between \
         callers: any process of uid {uid} (another caller's runs, or that user on the \
         host) could read this run's environment, memory and files through /proc and \
         ptrace, and its caches; use a profile with run_as = \"caller\" (each caller's \
         runs then run as that caller)"
    )]
    SharedIds { profile: String, uid: u32, gid: u32 },
}

/// A profile wider than the session's ([`Profile::check_narrows`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("profile {profile:?} is wider than the session's {session:?}: {how}")]
pub(crate) struct Wider {
    pub profile: String,
    pub session: String,
    pub how: Widening,
}

/// The first way a profile is wider than another.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Widening {
    #[error("it can read {0}")]
    Reads(String),
    #[error("it can execute {0}")]
    Executes(String),
    #[error("it can write {0}")]
    Writes(String),
    #[error("it does not protect {0}")]
    Unprotected(String),
    #[error("network {call} is wider than {session}")]
    Network {
        call: &'static str,
        session: &'static str,
    },
    #[error(transparent)]
    Egress(#[from] crate::egress::PolicyWidening),
    #[error("it keeps a cache {name} at {at}")]
    Cache { name: String, at: String },
    #[error("it is best-effort")]
    BestEffort,
    #[error("it runs as another user")]
    RunAs,
    #[error("limits.{what} {call} is above the session's {session}")]
    Limit {
        what: &'static str,
        call: u64,
        session: u64,
    },
    #[error("limits.{what} is unlimited but the session's is {session}")]
    Unlimited { what: &'static str, session: u64 },
    #[error("it passes {0} through")]
    Env(String),
}

impl Profile {
    /// A daemon session owned by `owner_uid` may use this profile only if its runs run as
    /// that owner. Fixed `run_as` ids are one uid for every caller of the profile, and for
    /// whatever else runs as that uid on the host (for `nobody`, anyone's daemons and NFS):
    /// any process of a uid may ptrace the others and read their `/proc/<pid>/environ`,
    /// `mem` and `root`, and their runs would write each other's caches. The daemon cannot
    /// know who else holds a uid, so it shares none: fixed ids are the owner's own or refused.
    /// `sidejob exec` has one caller, who chose its `run_as`, and does not ask this.
    pub(crate) fn check_run_as_for(&self, owner_uid: u32) -> Result<(), RunAsRefused> {
        let profile = || self.name.clone();
        match self.run_as {
            RunAs::Ids { uid, gid } if owner_uid != 0 && (uid == 0 || gid == 0) => {
                Err(RunAsRefused::RootIds {
                    profile: profile(),
                    uid,
                    gid,
                })
            }
            RunAs::Ids { uid, gid } if uid != owner_uid => Err(RunAsRefused::SharedIds {
                profile: profile(),
                uid,
                gid,
            }),
            RunAs::Ids { .. } | RunAs::Caller => Ok(()),
        }
    }

    /// A call may run under a profile only if it is no wider than its session's: it sees no
    /// path the session does not, has no more network, no higher limits, no fewer protected
    /// paths, passes no more of the environment and is not best-effort unless the session is.
    pub(crate) fn check_narrows(&self, session: &Profile) -> Result<(), Wider> {
        if self.name == session.name {
            return Ok(());
        }
        self.widening(session).map_err(|how| Wider {
            profile: self.name.clone(),
            session: session.name.clone(),
            how,
        })
    }

    fn widening(&self, session: &Profile) -> Result<(), Widening> {
        for p in &self.readable {
            if !covered(p, &session.readable) {
                return Err(Widening::Reads(p.clone()));
            }
        }
        for p in &self.executable {
            if !covered(p, &session.executable) {
                return Err(Widening::Executes(p.clone()));
            }
        }
        for p in &self.writable {
            if !covered(p, &session.writable) {
                return Err(Widening::Writes(p.clone()));
            }
        }
        for p in &session.protected {
            if !self.protected.contains(p) {
                return Err(Widening::Unprotected(p.clone()));
            }
        }
        if self.network_reach() > session.network_reach() {
            return Err(Widening::Network {
                call: self.network_name(),
                session: session.network_name(),
            });
        }
        if let (Some(call), Some(sess)) = (&self.egress, &session.egress) {
            if self.network_reach() == session.network_reach() {
                call.check_narrows(sess)?;
            }
        }
        for (name, at) in &self.caches {
            let kept = session.caches.iter().any(|(n, a)| n == name && a == at)
                || covered(at, &session.writable);
            if !kept {
                return Err(Widening::Cache {
                    name: name.clone(),
                    at: at.clone(),
                });
            }
        }
        if self.best_effort && !session.best_effort {
            return Err(Widening::BestEffort);
        }
        if self.run_as != session.run_as {
            return Err(Widening::RunAs);
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
            limit_narrows(what, c, s)?;
        }
        for v in &self.env_allow {
            let ok = session.env_allow.iter().any(|s| match s.strip_suffix('*') {
                Some(prefix) => v.strip_suffix('*').unwrap_or(v).starts_with(prefix),
                None => s == v,
            });
            if !ok {
                return Err(Widening::Env(v.clone()));
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
            assert!(e.to_string().contains("only root's sessions"), "{e}");
        }
        for run_as in ["0:0", "0:100"] {
            let p = load("rootish", "r.toml", &format!("run_as = \"{run_as}\"\n")).unwrap();
            p.check_run_as_for(0).unwrap();
        }
    }

    #[test]
    fn fixed_run_as_ids_are_never_shared_between_callers() {
        // Root's runs as nobody (readable by every process of uid 65534), one user's runs as
        // another's uid, and a uid handed to anyone but its own user.
        for (run_as, owner) in [
            ("nobody", 0),
            ("1000:1000", 65534),
            ("nobody", 1000),
            ("100:0", 0),
        ] {
            let p = load("shared", "s.toml", &format!("run_as = \"{run_as}\"\n")).unwrap();
            let e = p.check_run_as_for(owner).unwrap_err();
            assert!(
                e.to_string().contains("share between callers"),
                "{run_as} for {owner}: {e}"
            );
        }
        for (run_as, owner) in [
            ("caller", 65534),
            ("caller", 0),
            ("nobody", 65534),
            ("1000:1000", 1000),
        ] {
            let p = load("own", "o.toml", &format!("run_as = \"{run_as}\"\n")).unwrap();
            p.check_run_as_for(owner).unwrap();
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
            (
                "[network]\nallow = [\n  \"ok.example\",\n  \"*\"]\n",
                4,
                "network.allow",
            ),
            ("[network]\n\ndeny = [\"a..b\"]\n", 3, "network.deny"),
            (
                "[network]\nallow = [\"a.test\"]\nhosts = { \"a.test\" = \"not-an-ip\" }\n",
                3,
                "network.hosts.a.test",
            ),
            ("[network]\n", 1, "network"),
            ("extends = \"../x\"\n", 1, "extends"),
            ("[caches]\nx = \"relative\"\n", 2, "caches.x"),
            ("[caches]\n\"a b\" = \"/cache/x\"\n", 2, "caches.a b"),
            ("[caches]\nx = \"{tmp}/x\"\n", 2, "caches.x"),
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
    fn network_is_a_mode_or_an_allow_list_table() {
        let p = load("t", "t.toml", "network = \"loopback\"\n").unwrap();
        assert_eq!((p.network, p.egress.is_none()), (Network::Loopback, true));
        let p = load(
            "t",
            "t.toml",
            "[network]\nallow = [\"api.example.com:443\", \"*.example.org\", \"127.0.0.1:8080\"]\ndeny = [\"internal.example.org\"]\nhosts = { \"models.test\" = \"127.0.0.1\" }\n",
        )
        .unwrap();
        assert_eq!(p.network, Network::Loopback);
        assert_eq!(p.network_name(), "allow-list");
        let e = p.egress.unwrap();
        assert_eq!(e.allow.len(), 3);
        assert_eq!(
            e.hosts["models.test"],
            "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
        );
        // `extends` needs a catalog.
        let err = load("t", "t.toml", "extends = \"ci\"\n").unwrap_err();
        assert_eq!((err.line, err.field.as_str()), (1, "extends"));
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
            .to_string()
            .contains("network"));
        let wider_path = load("w", "w.toml", "[paths]\nreadable=[\"/etc\"]\n").unwrap();
        assert!(wider_path
            .check_narrows(&session)
            .unwrap_err()
            .to_string()
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
            .to_string()
            .contains("memory"));
    }
}
