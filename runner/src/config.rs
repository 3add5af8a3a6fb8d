//! Daemon configuration: zero-config defaults, optionally overridden by a TOML file.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::sys;

/// Everything the daemon can be configured with. Every field has a default, so `sidejob serve`
/// needs no file at all.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Config {
    /// The control socket.
    pub socket: PathBuf,
    /// The group the control socket is handed to (mode 0660), so that its members — and
    /// only they, besides the daemon's own user — can connect. A name or a numeric gid.
    pub socket_group: Option<String>,
    /// Where `sidejob.db` and the default session directories live.
    pub state_dir: PathBuf,
    /// Where sessions' directories go when `session.open` names none.
    pub sessions_dir: Option<PathBuf>,
    /// Sandbox profile used when a session names none.
    pub default_profile: String,
    /// `tool.call` returns `running` after this long unless the call says otherwise. When
    /// unset, each tool's own default applies (30 s for bash).
    pub default_yield_after_ms: Option<u64>,
    /// A call still in the foreground this long is ended as `failed/timeout`.
    pub interactive_deadline_ms: u64,
    /// The wall-clock cap of a run once it is in the background.
    pub detached_cap_ms: u64,
    /// SIGTERM → SIGKILL grace on cancel.
    pub cancel_grace_ms: u64,
    /// Runs allowed at once, across all sessions and per session; the rest wait as `queued`.
    pub max_running: usize,
    pub max_running_per_session: usize,
    /// `output.log` keeps this many leading bytes (and the last 1 MiB).
    pub max_output_bytes: u64,
    /// How much output `tool.call` returns inline (head and tail); the rest is in `output.log`.
    pub inline_output_bytes: usize,
    /// Directories of third-party plugin libraries (`*.so`), loaded and watched for changes.
    pub plugin_dirs: Vec<PathBuf>,
    /// Where sandbox profiles beyond (or overriding) the shipped ones live [default:
    /// `$SIDEJOB_PROFILES_DIR`, else `/etc/sidejob/sandbox-profiles` for root, else
    /// `$XDG_CONFIG_HOME/sidejob/sandbox-profiles`]. Watched: edits apply without a restart.
    pub profiles_dir: Option<PathBuf>,
    /// Load the plugins shipped with sidejob (`libsidejob_plugin_*.so` next to the binary).
    pub shipped_plugins: bool,
    /// The `subagent` tool.
    pub subagent: SubagentConfig,
    /// How long a schedule claim is leased before another daemon may take it over.
    pub schedule_lease_ms: u64,
    /// Pushes a subscriber may have queued before it gets `events.gap` and is cut off.
    pub push_queue: usize,
    /// Connections open at once, over every user; more are refused with `limit_exceeded`.
    pub max_connections: usize,
    /// Each user's share of the daemon (`[per_user]`): one user at a limit never delays
    /// another's call.
    pub per_user: PerUser,
    /// How often the registry is backed up to `sidejob.db.backup` (when it changed); 0: never.
    pub backup_interval_ms: u64,
    /// A session with nothing live (no run, no armed schedule, no subscriber that named it)
    /// and no activity for this long is closed; opening it again reopens it. 0: never.
    pub session_idle_ms: u64,
    /// Serve Prometheus metrics on this loopback address (e.g. `127.0.0.1:9464`); off when
    /// unset.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// The egress proxy of allow-list runs (`[egress]`).
    pub egress: EgressConfig,
    /// What a caller may grant one call beyond its profile (`[grants]`, `tool.call` `grants`).
    pub grants: GrantsConfig,
}

/// `[per_user]`: what one uid may hold of the daemon at once. A request past a limit is
/// refused with `limit_exceeded` naming the limit (runs past `running` wait as `queued`).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct PerUser {
    /// Runs at once; more wait as `queued`. Keep it below `max_running`, so that one user
    /// cannot take every slot.
    pub running: usize,
    /// Calls waiting as `queued`; more are refused.
    pub queued: usize,
    /// Open connections to the control socket.
    pub connections: usize,
    /// Bytes of request lines received but not yet complete, over all the user's
    /// connections.
    pub buffered_bytes: usize,
    /// A request line must end (newline) within this long of its first byte, or the
    /// connection is closed.
    pub line_timeout_ms: u64,
    /// Open sessions (a subagent's child sessions are counted with its task, not here).
    pub sessions: usize,
    /// Armed schedules.
    pub schedules: usize,
    /// Bytes of output kept in the state directory (runs of sessions whose directory the
    /// daemon chose); `session.close` with `delete: true` frees a session's.
    pub output_bytes: u64,
    /// Connections through the egress proxy open at once, over all the user's runs; more
    /// are closed as they come.
    pub egress_connections: usize,
}

impl Default for PerUser {
    fn default() -> Self {
        PerUser {
            running: 256,
            queued: 1024,
            connections: 64,
            buffered_bytes: 8 << 20,
            line_timeout_ms: 30_000,
            sessions: 256,
            schedules: 256,
            output_bytes: 16 << 30,
            egress_connections: 512,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: default_socket_path(),
            socket_group: None,
            state_dir: default_state_dir(),
            sessions_dir: None,
            default_profile: "workspace-write".into(),
            default_yield_after_ms: None,
            interactive_deadline_ms: 120_000,
            detached_cap_ms: 24 * 3600 * 1000,
            cancel_grace_ms: crate::run::plan::DEFAULT_KILL_GRACE_MS,
            max_running: 2048,
            max_running_per_session: 1024,
            max_output_bytes: crate::run::plan::DEFAULT_MAX_OUTPUT_BYTES,
            inline_output_bytes: 64 * 1024,
            plugin_dirs: Vec::new(),
            profiles_dir: None,
            shipped_plugins: true,
            subagent: SubagentConfig::default(),
            schedule_lease_ms: 30_000,
            push_queue: crate::wake::PUSH_QUEUE,
            max_connections: 4096,
            per_user: PerUser::default(),
            backup_interval_ms: 300_000,
            session_idle_ms: 7 * 24 * 3600 * 1000,
            metrics_addr: None,
            egress: EgressConfig::default(),
            grants: GrantsConfig::default(),
        }
    }
}

/// `[grants]`: what a `tool.call`'s `grants` may add for a non-root caller. Paths need no
/// entry here (each is checked with the caller's own credentials); hosts do, since the
/// proxy reaches them with the daemon's network.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct GrantsConfig {
    /// Hosts a non-root caller may allow for one call, as in a profile's `[network] allow`
    /// (`*.example.org`, `pypi.org:443`, an address or a range). Empty: none. Root callers
    /// may allow any host.
    pub allow: Vec<String>,
}

impl GrantsConfig {
    /// The allow-list as a policy, each entry checked.
    pub(crate) fn policy(&self) -> Result<crate::egress::Policy, CheckError> {
        crate::egress::Policy::allowing(&self.allow).map_err(CheckError::GrantsAllow)
    }
}

/// `[egress]`: how long the proxy of an allow-list run waits for its clients.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct EgressConfig {
    /// A client's whole request head (HTTP, or the SOCKS5 handshake) must arrive this soon
    /// after it connects.
    pub head_timeout_ms: u64,
    /// A tunnel in which neither side sent anything for this long is closed.
    pub idle_timeout_ms: u64,
}

impl Default for EgressConfig {
    fn default() -> Self {
        EgressConfig {
            head_timeout_ms: crate::egress::DEFAULT_HEAD_TIMEOUT_MS,
            idle_timeout_ms: crate::egress::DEFAULT_IDLE_TIMEOUT_MS,
        }
    }
}

impl EgressConfig {
    pub(crate) fn timeouts(&self) -> crate::egress::Timeouts {
        crate::egress::Timeouts::from_ms(self.head_timeout_ms, self.idle_timeout_ms)
    }
}

/// `[subagent]`: the agent command the `subagent` tool runs in a child session, and what the
/// agent's own process may use beyond its profile: its configuration under `{home}` (the
/// session owner's home) and the model API hosts. These grants are the administrator's (this
/// file is trusted); they apply to the agent's process only, never to the jobs it starts,
/// whose ceiling is the agent's profile without them.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SubagentConfig {
    /// The agent's argv. Empty: the tool refuses calls.
    pub command: Vec<String>,
    /// How the prompt reaches the agent (it is in `AGENT_PROMPT` in every case).
    pub prompt: PromptVia,
    /// The profile the agent runs under (it must narrow the caller's); `agent` is shipped.
    pub profile: String,
    /// Paths the agent may also read, e.g. `"{home}/.config/my-agent"`.
    pub readable: Vec<String>,
    /// Paths the agent may also read and execute: where it is installed when that is outside
    /// the profile's view, e.g. `"{home}/.local"` (an npm prefix, `~/.local/bin`, pipx).
    pub executable: Vec<String>,
    /// Paths the agent may also write (its own state, history, logs).
    pub writable: Vec<String>,
    /// Hosts the agent may reach through the egress proxy (the model API), as in a
    /// profile's `[network] allow`.
    pub allow: Vec<String>,
    /// Static names for those hosts, as in a profile's `[network] hosts`.
    pub hosts: std::collections::BTreeMap<String, String>,
    /// Variables set for the agent (placeholders allowed), e.g. `HOME = "{home}"`.
    pub env: std::collections::BTreeMap<String, String>,
}

impl Default for SubagentConfig {
    fn default() -> Self {
        SubagentConfig {
            command: Vec::new(),
            prompt: PromptVia::default(),
            profile: "agent".into(),
            readable: Vec::new(),
            executable: Vec::new(),
            writable: Vec::new(),
            allow: Vec::new(),
            hosts: Default::default(),
            env: Default::default(),
        }
    }
}

impl SubagentConfig {
    /// The grants as a profile fragment, checked like one (`[subagent]` as the file).
    pub(crate) fn grants(&self) -> Result<crate::sandbox::call::Grants, CheckError> {
        let mut toml = String::new();
        let list = |v: &[String]| serde_json::to_string(v).unwrap_or_default();
        toml.push_str(&format!(
            "[paths]\nreadable = {}\nexecutable = {}\nwritable = {}\n",
            list(&self.readable),
            list(&self.executable),
            list(&self.writable)
        ));
        if !self.allow.is_empty() || !self.hosts.is_empty() {
            toml.push_str(&format!("[network]\nallow = {}\n", list(&self.allow)));
            toml.push_str(&format!(
                "hosts = {}\n",
                toml::Value::try_from(&self.hosts).map_err(CheckError::SubagentHosts)?
            ));
        }
        toml.push_str(&format!(
            "[env.set]\n{}",
            self.env
                .iter()
                .map(|(k, v)| format!(
                    "{} = {}\n",
                    toml::Value::String(k.clone()),
                    toml::Value::String(v.clone())
                ))
                .collect::<String>()
        ));
        let p = crate::sandbox::profile::load("subagent", "[subagent]", &toml)
            .map_err(CheckError::Subagent)?;
        Ok(crate::sandbox::call::Grants {
            readable: p.readable,
            executable: p.executable,
            writable: p.writable,
            egress: p.egress,
            env: p.env_set,
        })
    }
}

/// `[subagent] prompt`: where the agent finds the prompt.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PromptVia {
    /// Appended after `--`, as the last argument, so a prompt that starts with `-` is never
    /// read as an option.
    #[default]
    Argument,
    /// On the agent's stdin, not in its argv.
    Stdin,
    /// Only in `AGENT_PROMPT`.
    Env,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid config file {path}: {source}")]
    Check {
        path: PathBuf,
        source: Box<CheckError>,
    },
}

/// A setting that parses but does not hold: its section or key, and why.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CheckError {
    #[error("[grants] allow: {0}")]
    GrantsAllow(crate::egress::policy::RuleError),
    #[error("{0}")]
    SubagentHosts(toml::ser::Error),
    /// The `[subagent]` grants, checked as a profile fragment.
    #[error("{0}")]
    Subagent(crate::sandbox::profile::ProfileError),
    #[error("[subagent] profile = {agent:?}: {source}")]
    SubagentProfile {
        agent: String,
        source: crate::sandbox::catalog::CatalogError,
    },
    #[error("default_profile = {name:?}: {source}")]
    DefaultProfile {
        name: String,
        source: crate::sandbox::catalog::CatalogError,
    },
    #[error(
        "[subagent] profile = {agent:?} cannot narrow default_profile = {ceiling:?} ({why}): \
         an agent never runs under a profile wider than its caller's; keep a \
         profile that narrows it (the shipped \"agent\") and grant the agent what it \
         needs in [subagent]: executable (where it is installed, e.g. \
         \"{{home}}/.local\"), readable and writable (its configuration and state), \
         allow (its model API hosts)"
    )]
    SubagentWider {
        agent: String,
        ceiling: String,
        /// Boxed: it is large, and the other checks' errors are small.
        why: Box<crate::sandbox::profile::Wider>,
    },
}

impl Config {
    /// Reads a TOML config file; fields it leaves out keep their defaults.
    pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let cfg: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: describe_toml_error(&text, &e),
        })?;
        cfg.subagent
            .grants()
            .and_then(|_| cfg.check_subagent_profile())
            .and_then(|()| cfg.grants.policy().map(drop))
            .map_err(|source| ConfigError::Check {
                path: path.into(),
                source: Box::new(source),
            })?;
        Ok(cfg)
    }

    /// `[subagent] profile` must narrow `default_profile`, the profile of a session that
    /// names none: the agent runs under a profile no wider than its caller's, so a wider one
    /// would be replaced by the caller's at every call, and the agent would then miss what
    /// the operator meant to give it. What an agent needs beyond its profile is a grant.
    pub(crate) fn check_subagent_profile(&self) -> Result<(), CheckError> {
        let agent = self.subagent.profile.as_str();
        if agent.is_empty() || agent == self.default_profile {
            return Ok(());
        }
        let catalog = crate::sandbox::Catalog::new(
            self.profiles_dir
                .clone()
                .or_else(crate::sandbox::Catalog::default_dir),
        );
        let profile = catalog
            .get(agent)
            .map_err(|source| CheckError::SubagentProfile {
                agent: agent.to_owned(),
                source,
            })?;
        let ceiling =
            catalog
                .get(&self.default_profile)
                .map_err(|source| CheckError::DefaultProfile {
                    name: self.default_profile.clone(),
                    source,
                })?;
        profile
            .check_narrows(&ceiling)
            .map_err(|why| CheckError::SubagentWider {
                agent: agent.to_owned(),
                ceiling: self.default_profile.clone(),
                why: Box::new(why),
            })
    }

    pub(crate) fn sessions_dir(&self) -> PathBuf {
        self.sessions_dir
            .clone()
            .unwrap_or_else(|| self.state_dir.join("sessions"))
    }

    /// `<state_dir>/runs`: the private halves of runs (`run::dir::RunsDirs`) of a daemon that
    /// keeps none in `/dev/shm`, and of those an older daemon started here. Nothing a caller
    /// can write.
    pub(crate) fn runs_dir(&self) -> PathBuf {
        self.state_dir.join("runs")
    }

    /// The directories only the daemon may use, each with what it is: a workspace that is,
    /// holds or lies inside one of them is refused (a run would see or change them).
    pub(crate) fn daemon_dirs(&self) -> Vec<(&'static str, PathBuf)> {
        let mut dirs = vec![
            ("the daemon's state directory", self.state_dir.clone()),
            ("the directory of sessions", self.sessions_dir()),
            ("the bridge directory", default_bridge_dir()),
        ];
        if let Some(dir) = self.socket.parent() {
            dirs.push(("the control socket's directory", dir.to_path_buf()));
        }
        dirs
    }
}

impl Config {
    /// The directories of the sockets a run must never be handed (the control socket's,
    /// the bridges'), real paths where they exist.
    pub(crate) fn socket_dirs(&self) -> Vec<PathBuf> {
        self.socket
            .parent()
            .map(Path::to_path_buf)
            .into_iter()
            .chain([default_bridge_dir()])
            .map(|d| d.canonicalize().unwrap_or(d))
            .collect()
    }
}

pub(crate) use crate::run::dir::default_bridge_dir;

/// Formats a TOML error as `line N: message`.
pub(crate) fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {}", e.message())
        }
        None => e.message().to_owned(),
    }
}

/// The socket path used when none is given: `/run/sidejob/sidejob.sock` for root, else
/// `$XDG_RUNTIME_DIR/sidejob/sidejob.sock`, else `/tmp/sidejob-<uid>/sidejob.sock`.
/// `SIDEJOB_SOCKET` overrides all of them.
pub(crate) fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("SIDEJOB_SOCKET") {
        return PathBuf::from(p);
    }
    let uid = sys::getuid();
    if uid == 0 {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir).join("sidejob/sidejob.sock"),
        _ => PathBuf::from(format!("/tmp/sidejob-{uid}/sidejob.sock")),
    }
}

/// The socket a root daemon listens on by default: the one a host's users share.
pub(crate) const SYSTEM_SOCKET: &str = "/run/sidejob/sidejob.sock";

/// The socket a client uses when none is given: `SIDEJOB_SOCKET`; for a user who has no
/// daemon of their own (no socket at [`default_socket_path`]) but can see a shared one, the
/// system socket; else the user's own.
pub(crate) fn client_socket_path() -> PathBuf {
    let own = default_socket_path();
    if std::env::var_os("SIDEJOB_SOCKET").is_some() || sys::getuid() == 0 {
        return own;
    }
    let is_socket = |p: &Path| {
        std::fs::symlink_metadata(p)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
    };
    if !is_socket(&own) && is_socket(Path::new(SYSTEM_SOCKET)) {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    own
}

/// The state directory used when none is given: `/var/lib/sidejob` for root, else
/// `$XDG_STATE_HOME/sidejob`, else `$HOME/.local/state/sidejob`. `SIDEJOB_STATE_DIR`
/// overrides all of them.
pub(crate) fn default_state_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("SIDEJOB_STATE_DIR") {
        return PathBuf::from(p);
    }
    if sys::getuid() == 0 {
        return PathBuf::from("/var/lib/sidejob");
    }
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("sidejob");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/sidejob"),
        None => PathBuf::from(format!("/tmp/sidejob-{}/state", sys::getuid())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_file_errors_name_the_line() {
        let dir = crate::scratch::ScratchDir::new("config-test");
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "max_running = 4\nno_such_field = 1\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        assert!(err.contains("no_such_field"), "{err}");
        std::fs::write(&path, "max_running = 4\n").unwrap();
        let cfg = Config::load(&path).unwrap();
        assert_eq!(cfg.max_running, 4);
        assert_eq!(cfg.default_yield_after_ms, None);
    }

    #[test]
    fn subagent_executable_takes_home_placeholders_like_the_other_grants() {
        let dir = crate::scratch::ScratchDir::new("config-test");
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "[subagent]\ncommand = [\"my-agent\"]\nexecutable = [\"{home}/.local\"]\n",
        )
        .unwrap();
        let grants = Config::load(&path).unwrap().subagent.grants().unwrap();
        assert_eq!(grants.executable, ["{home}/.local"]);
        std::fs::write(&path, "[subagent]\nexecutable = [\"relative/bin\"]\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("paths.executable"), "{err}");
    }

    #[test]
    fn a_subagent_profile_wider_than_the_default_is_refused_naming_the_grants() {
        let dir = crate::scratch::ScratchDir::new("config-test");
        let path = dir.path().join("agent.toml");
        for wider in ["network", "python"] {
            std::fs::write(&path, format!("[subagent]\nprofile = \"{wider}\"\n")).unwrap();
            let err = Config::load(&path).unwrap_err().to_string();
            assert!(
                err.contains(&format!("[subagent] profile = \"{wider}\" cannot narrow"))
                    && err.contains("executable")
                    && err.contains("allow"),
                "{err}"
            );
        }
        std::fs::write(&path, "[subagent]\nprofile = \"no-such-profile\"\n").unwrap();
        let err = Config::load(&path).unwrap_err().to_string();
        assert!(err.contains("no-such-profile"), "{err}");
        // Narrower ones, and the same as the default, load.
        for ok in ["agent", "read-only", "workspace-write"] {
            std::fs::write(&path, format!("[subagent]\nprofile = \"{ok}\"\n")).unwrap();
            Config::load(&path).unwrap();
        }
        // A wider default makes room for a wider agent profile.
        std::fs::write(
            &path,
            "default_profile = \"network\"\n[subagent]\nprofile = \"network\"\n",
        )
        .unwrap();
        Config::load(&path).unwrap();
    }
}

#[cfg(test)]
mod readme {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The README's configuration block (the first ```toml block after "### Configuration").
    fn block() -> String {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
            .expect("README.md");
        let section = &readme[readme.find("### Configuration").expect("section")..];
        let start = section.find("```toml\n").expect("toml block") + "```toml\n".len();
        section[start..start + section[start..].find("```").expect("end")].to_owned()
    }

    #[test]
    fn the_readme_config_block_lists_every_key_with_its_real_default() {
        let text = block();
        // Every key that is set there is the real default.
        let parsed: Config = toml::from_str(&text).expect("the README block parses as a config");
        assert_eq!(format!("{parsed:?}"), format!("{:?}", Config::default()));
        // Every key is there (set, or commented out where the default depends on the host).
        let keys: Vec<String> = text
            .lines()
            .map(|l| l.trim_start_matches("# ").trim())
            .filter_map(
                |l| match l.strip_prefix('[').and_then(|t| t.strip_suffix(']')) {
                    Some(table) => Some(table.to_owned()),
                    None => l.split_once(" = ").map(|(k, _)| k.to_owned()),
                },
            )
            .collect();
        // The fields, read from the Debug form of the defaults (`Config { socket: .., .. }`),
        // so a field added later must be documented too.
        let debug = format!("{:?}", Config::default());
        let fields: Vec<&str> = debug
            .split(['{', ','])
            .filter_map(|piece| piece.trim().split_once(": ").map(|(k, _)| k))
            .filter(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        assert!(fields.len() > 15, "{fields:?}");
        for field in fields {
            assert!(keys.iter().any(|k| k == field), "README lacks {field}");
        }
        // And nothing is listed that the config does not know (deny_unknown_fields above).
        let known = format!("{:?}", Config::default());
        for k in &keys {
            assert!(
                known.contains(&format!("{k}:")),
                "README lists {k}, which is not a key"
            );
        }
    }
}
