//! The command line's definitions (clap). Completions and the man page are generated from
//! these same definitions (`sidejob completions`, `sidejob man`).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::format::parse_duration;
use super::schedule::ScheduleCommand;

#[derive(Parser)]
#[command(
    name = "sidejob",
    version,
    about = "A process-runner sidecar: sandboxed foreground and background runs for agent hosts and CI",
    long_about = "sidejob runs shell work for agent hosts and CI. `sidejob serve` starts the daemon; \
                  hosts talk JSON-RPC to its Unix socket (see docs/protocol.md). Most other commands \
                  are clients of a running daemon; `exec` and `doctor` need none.",
    after_help = "Examples:\n  sidejob serve                      start the daemon (no configuration needed)\n  \
                  sidejob call -- make test           run a command, stream its output, exit with its code\n  \
                  T=$(sidejob call --background -- ./long-job.sh)\n  sidejob tasks                      list tasks\n  \
                  sidejob logs -f $T                 follow a task's output (any unique prefix of its id)\n  \
                  sidejob status                     what the daemon runs and has loaded"
)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub conn: Conn,
    #[command(subcommand)]
    pub command: Command,
}

// How a client command reaches the daemon. (A comment, not a doc comment: a flattened
// struct's doc would become the `about` of every command it is flattened into.)
#[derive(Args, Clone, Default)]
pub(crate) struct Conn {
    /// The daemon's control socket [default: /run/sidejob/sidejob.sock for root, else
    /// $XDG_RUNTIME_DIR/sidejob/sidejob.sock]
    #[arg(long, env = "SIDEJOB_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines (colored on a terminal)
    Text,
    /// One JSON object per line (tracing-subscriber's JSON format)
    Json,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum HookKindArg {
    /// Claude Code's Stop, SessionStart and UserPromptSubmit hook (JSON on stdin)
    Claude,
    /// Wait while background jobs run (up to --wait), then print what finished
    Wait,
    /// Print what finished and is unread
    Unread,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
}

// Each command's arguments are built only when that command runs: building every command's
// took a quarter of a millisecond, about 5% of a whole `sidejob exec -- /bin/true`.
#[derive(Subcommand)]
#[command(defer = true)]
pub(crate) enum Command {
    /// Start the daemon (zero configuration; SIGTERM stops it and leaves runs running)
    Serve {
        #[command(flatten)]
        conn: Conn,
        /// State directory for sidejob.db and sessions [default: /var/lib/sidejob for root,
        /// else $XDG_STATE_HOME/sidejob]
        #[arg(long, env = "SIDEJOB_STATE_DIR", value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// A TOML file overriding the defaults (see README)
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// How the daemon logs to stderr (SIDEJOB_LOG sets the level, e.g. debug)
        #[arg(long, value_enum, default_value = "text", env = "SIDEJOB_LOG_FORMAT")]
        log_format: LogFormat,
        /// Serve Prometheus metrics on this loopback address, e.g. 127.0.0.1:9464 (the
        /// config's metrics_addr)
        #[arg(long, value_name = "ADDR")]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Hand the socket (mode 0660) to this group, so its members may connect; each
        /// still sees only their own sessions (the config's socket_group)
        #[arg(long, value_name = "GROUP")]
        socket_group: Option<String>,
    },
    /// Run a command through the daemon: streams its output and exits with its exit code
    #[command(after_help = "Examples:\n  sidejob call -- make test\n  \
                  sidejob call -- 'cd src && cargo build 2>&1 | tail'\n  \
                  T=$(sidejob call --background -- ./deploy.sh)   # the task id alone on stdout\n  \
                  sidejob call --yield-after 30s -- ./slow-tests.sh\n  \
                  sidejob call --read /srv/data --write out -- ./train.sh   # paths of yours, this run only\n  \
                  sidejob call --allow api.example.org:443 -- ./fetch-fixtures.sh\n  \
                  sidejob call --tool code --args '{\"language\": \"python\", \"code\": \"print(1)\"}'\n\n\
                  Ctrl+C cancels the run; a second Ctrl+C (within the cancel's grace) leaves it running and prints its id.\n\
                  Exit code: the command's; 128+N if signal N ended it; 124 on timeout; 130 if canceled; 75 if left running.")]
    Call(CallArgs),
    /// List tasks: live ones and the most recent finished ones
    Tasks {
        #[command(flatten)]
        conn: Conn,
        /// Only this session
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Every task the daemon still lists (the 25 most recent finished ones per session,
        /// closed sessions included), not only the 10 most recent finished ones
        #[arg(long, short)]
        all: bool,
        /// Only tasks in this state (repeatable): queued, running, awaiting_input, scheduled,
        /// succeeded, failed, canceled
        #[arg(long, value_name = "STATE", value_delimiter = ',')]
        state: Vec<String>,
        /// Print JSON ({"tasks": [...]}) with full ids
        #[arg(long)]
        json: bool,
    },
    /// Print a task's output
    Logs {
        #[command(flatten)]
        conn: Conn,
        /// The task id, or any unique prefix of it
        task: String,
        /// Keep printing as the output grows, until the task settles
        #[arg(short, long)]
        follow: bool,
        /// Start with only the last N lines
        #[arg(long, short = 'n', value_name = "N")]
        tail: Option<usize>,
    },
    /// Wait for a task to settle; exits with its exit code
    Wait {
        #[command(flatten)]
        conn: Conn,
        /// The task id, or any unique prefix of it
        task: String,
        /// Give up after this long (e.g. 30s, 10m); exit code 124
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        timeout: Option<Duration>,
        /// Print the Task as JSON
        #[arg(long)]
        json: bool,
    },
    /// Cancel tasks: SIGTERM to the whole run, SIGKILL after the grace
    Cancel {
        #[command(flatten)]
        conn: Conn,
        /// Task ids, or unique prefixes of them
        #[arg(required = true, value_name = "TASK")]
        tasks: Vec<String>,
        /// Time between SIGTERM and SIGKILL (e.g. 500ms, 10s) [default: 5s]
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        grace: Option<Duration>,
        /// Print one JSON result per task
        #[arg(long)]
        json: bool,
    },
    /// Show the daemon: version, uptime, socket, tools and their plugins, errors, counts.
    /// Exits 0 whenever the daemon answers, degraded or not (a liveness probe), 1 when it
    /// does not
    Status {
        #[command(flatten)]
        conn: Conn,
        /// Print the daemon.status result as JSON (counters for monitoring)
        #[arg(long)]
        json: bool,
        /// A readiness probe: exit 1, naming what is missing, unless every shipped tool
        /// (bash, code, subagent) is loaded
        #[arg(long)]
        ready: bool,
    },
    /// Rebuild the registry's rows from its event log and compare
    Replay {
        /// Compare and exit non-zero on any difference (the only mode)
        #[arg(long, required = true)]
        check: bool,
        /// The daemon's state directory
        #[arg(long, env = "SIDEJOB_STATE_DIR", value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Check, back up, restore or rebuild the registry (sidejob.db)
    Registry {
        #[command(subcommand)]
        action: RegistryAction,
        /// The daemon's state directory [default: as `serve`]
        #[arg(long, env = "SIDEJOB_STATE_DIR", value_name = "DIR", global = true)]
        state_dir: Option<PathBuf>,
    },
    /// Send one raw JSON-RPC request and print the result
    Rpc {
        #[command(flatten)]
        conn: Conn,
        /// The method, e.g. tool.list
        method: String,
        /// Parameters as a JSON object
        #[arg(default_value = "{}")]
        params: String,
    },
    /// Follow the live stream of task changes and notifications (Ctrl+C stops)
    Events {
        #[command(flatten)]
        conn: Conn,
        /// Only this session (repeatable) [default: every session you own]
        #[arg(long, value_name = "ID")]
        session: Vec<String>,
        /// Also replay the changes after this seq
        #[arg(long, value_name = "SEQ")]
        since: Option<i64>,
        /// Print each push as the JSON-RPC message the daemon sent
        #[arg(long)]
        json: bool,
        /// Print the whole text of each notification, not only its first line
        #[arg(long)]
        full: bool,
    },
    /// List the inbox: wakes and notices of background work
    Inbox {
        #[command(flatten)]
        conn: Conn,
        /// Only this session
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Only notifications not yet acked
        #[arg(long)]
        unread: bool,
        /// Ack what is listed (it is shown as read)
        #[arg(long)]
        ack: bool,
        /// One line per notification instead of the whole text
        #[arg(long, conflicts_with = "full")]
        short: bool,
        /// The whole text of each notification (the default)
        #[arg(long)]
        full: bool,
        /// Print the inbox.list result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Arm, list and cancel durable schedules
    Schedule {
        #[command(flatten)]
        conn: Conn,
        #[command(subcommand)]
        command: ScheduleCommand,
    },
    /// Run one command in the sandbox, without a daemon (for CI): output to the terminal
    /// (its stderr to stderr when that is not where stdout goes), the command's exit code
    /// passed through (128+N on signal N, 124 on timeout, 125 when
    /// the sandbox cannot be built)
    #[command(
        after_help = "Examples:\n  sidejob exec -- make test\n  sidejob exec --profile ci --timeout 30m -- ./build.sh\n  \
                  sidejob exec --profile ./my-profile.toml --env TOKEN=x --json -- cargo test"
    )]
    Exec(ExecArgs),
    /// Show which sandbox layers this host can apply, and why a missing one is missing
    Doctor {
        /// Print the report as JSON
        #[arg(long)]
        json: bool,
    },
    /// List or clear the persistent caches profiles keep (`[caches]`)
    Cache {
        #[command(subcommand)]
        command: super::doctor::CacheCommand,
    },
    /// Serve the daemon's tools to an MCP client on stdin/stdout, in this user's session of
    /// the current directory (so the next agent run here finds what the last left unread)
    #[command(
        after_help = "Examples:\n  claude mcp add sidejob -- sidejob mcp\n  sidejob integrate claude     configure Claude Code here: the server and its hooks\n\n\
                      See docs/mcp.md for every client's configuration."
    )]
    Mcp {
        #[command(flatten)]
        conn: Conn,
        /// Work in this session [default: mcp-<uid>-<hash of the current directory>]
        #[arg(long, value_name = "ID", conflicts_with = "new_session")]
        session: Option<String>,
        /// Work in a fresh session of its own (mcp-<uid>-<ulid>), shared with no other run
        #[arg(long)]
        new_session: bool,
        /// As root, act in a session another uid owns (sends adopt: true)
        #[arg(long)]
        adopt: bool,
        /// Start a daemon (`sidejob serve` with the default configuration) when none is
        /// listening
        #[arg(long)]
        start_daemon: bool,
    },
    /// Hand a workspace's finished background jobs to an agent client's hook or plugin
    /// (acked, so each reaches the model once); see integrations/
    #[command(
        after_help = "Examples:\n  sidejob hook claude          as Claude Code's Stop, SessionStart and UserPromptSubmit hook\n  \
                      sidejob hook wait --json     wait while background jobs run, then print what finished\n  \
                      sidejob hook unread          print what finished and is unread\n\n\
                      The session is the one `sidejob mcp` uses for this user and directory."
    )]
    Hook {
        #[command(flatten)]
        conn: Conn,
        /// claude (Claude Code's Stop, SessionStart and UserPromptSubmit hook, its JSON on
        /// stdin), wait (wait while background jobs run, then print what finished) or unread
        /// (print what finished and is unread)
        #[arg(value_enum, hide_possible_values = true)]
        kind: HookKindArg,
        /// The workspace whose session it reads [default: the hook's project directory
        /// (Claude Code), else the current directory]
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// The longest wait for a running background job (`claude` at Stop, `wait`)
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "9m")]
        wait: Duration,
        /// Print JSON: {"completions": [{id, task_id, text}], "text": "..."} (`wait`, `unread`)
        #[arg(long)]
        json: bool,
    },
    /// Configure an agent client to use sidejob in a workspace: its MCP server, and the hook
    /// or plugin that hands it finished background jobs after its turn ends
    #[command(
        after_help = "Examples:\n  sidejob integrate claude             write .mcp.json and .claude/settings.json here\n  \
                      sidejob integrate codex --print      print the ~/.codex/config.toml section\n  \
                      sidejob integrate opencode           write opencode.json and .opencode/plugin/sidejob.js here"
    )]
    Integrate {
        /// claude (.mcp.json and hooks in .claude/settings.json), codex (the
        /// [mcp_servers.sidejob] section of $CODEX_HOME/config.toml) or opencode (opencode.json
        /// and .opencode/plugin/sidejob.js)
        #[arg(value_enum, hide_possible_values = true)]
        client: super::integrate::AgentClient,
        /// The project to configure [default: the current directory]
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Print what would be written instead of writing it
        #[arg(long)]
        print: bool,
    },
    /// Print a shell completion script (e.g. sidejob completions bash > /etc/bash_completion.d/sidejob)
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Print the man page (roff), or write one page per command into a directory
    Man {
        /// Write sidejob.1 and sidejob-<command>.1 here instead of printing sidejob.1
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Check the binary an in-place upgrade (SIGHUP) would run: trusted (root's, writable by
    /// no one else, nor any directory above it, no symlink on the way), runs (`--version`), and
    /// has the shipped plugins beside it. Exits 0 when the daemon would run it, 1 (saying why)
    /// when it would refuse it
    #[command(
        after_help = "An in-place upgrade keeps the daemon's pid, its socket and every run:\n  \
                  1. stage the new build where the daemon looks first (a prefix, as install.sh lays one out):\n     \
                     deploy/install.sh --from target/release --prefix /var/lib/sidejob/upgrade\n     \
                     (or install it over the file the daemon was started from, e.g. /usr/local/bin/sidejob)\n  \
                  2. sidejob upgrade-check            check what the daemon would run\n  \
                  3. sidejob upgrade                  SIGHUP, then wait until the daemon serves again\n     \
                     (systemctl reload sidejob runs it; or kill -HUP <daemon pid>; in a container: kill -HUP 1)\n\n\
                  The daemon runs <state_dir>/upgrade/bin/sidejob if it is there (and refuses the upgrade if that\n\
                  file is not trusted), else the file it was started from. It logs the binary it runs, or why it\n\
                  refused one and serves on. Runs settle with their own exit codes; open connections close\n\
                  (`sidejob wait` and `call` reconnect). A staged binary runs at every SIGHUP while it is\n\
                  there; a plain restart runs the installed one."
    )]
    UpgradeCheck {
        /// The binary to check [default: the one staged at <state_dir>/upgrade/bin/sidejob,
        /// else this command's own file]
        binary: Option<PathBuf>,
        /// The daemon's state directory [default: as `serve`]
        #[arg(long, env = "SIDEJOB_STATE_DIR", value_name = "DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Upgrade the daemon in place and wait for it: check the binary it would run (as
    /// upgrade-check), send it SIGHUP, and exit 0 once it serves again from the new image (the
    /// same pid, its runs kept), 1 (saying why) if it would refuse the binary or is not back in
    /// time. sidejob.service's ExecReload= runs it, so `systemctl reload sidejob` returns when
    /// the upgrade is done
    Upgrade {
        #[command(flatten)]
        conn: Conn,
        /// The daemon's state directory, where a staged binary is looked for [default: as `serve`]
        #[arg(long, env = "SIDEJOB_STATE_DIR", value_name = "DIR")]
        state_dir: Option<PathBuf>,
        /// How long the daemon may take to serve again (e.g. 30s, 2m)
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
        timeout: Duration,
    },
    /// (internal) Supervise one run; started by the daemon
    #[command(hide = true)]
    Supervise { run_dir: PathBuf },
}

#[derive(Args)]
pub(crate) struct CallArgs {
    #[command(flatten)]
    pub conn: Conn,
    /// Session id [default: cli-<uid>-<hash of the current directory>]
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// As root, act in a session another uid owns (sends adopt: true)
    #[arg(long)]
    pub adopt: bool,
    /// Start it in the background and print only its task id on stdout
    #[arg(long, short = 'd', visible_alias = "detach")]
    pub background: bool,
    /// Stream output for at most this long (e.g. 30s), then leave the run in the background
    /// and print its id [default: wait until it ends]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with = "background")]
    pub yield_after: Option<Duration>,
    /// Stop the run after this long (e.g. 90s, 1h30m); exit code 124
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Run under this sandbox profile (e.g. python, rust, node, or one of your own): in
    /// this directory's session of that profile; with --session, it may only narrow that
    /// session's profile
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
    /// Pass a variable to the command (repeatable): NAME takes its value from your
    /// environment, NAME=VALUE sets it
    #[arg(long = "env", value_name = "NAME[=VALUE]")]
    pub env: Vec<String>,
    /// Also let this run read PATH, a file or directory you can read yourself (repeatable;
    /// relative to the current directory; this run only). The daemon checks it with your
    /// credentials before it starts anything, e.g. --read ~/datasets/train
    #[arg(long = "read", value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// Also let this run write PATH, a file or directory you can write yourself (repeatable;
    /// relative to the current directory; this run only), e.g. --write ../build-cache
    #[arg(long = "write", value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Also let this run reach HOST through the egress proxy, e.g. pypi.org:443 or
    /// *.example.org (repeatable; this run only). Root may allow any host; other users
    /// only hosts the daemon's [grants] allow lists
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    pub allow: Vec<String>,
    /// Forward this terminal's stdin to the command (it gets /dev/null otherwise)
    #[arg(long)]
    pub stdin: bool,
    /// Call this tool instead of bash (with --args)
    #[arg(
        long,
        value_name = "NAME",
        requires = "args",
        conflicts_with = "command"
    )]
    pub tool: Option<String>,
    /// The tool's arguments as a JSON object (with --tool)
    #[arg(long, value_name = "JSON", requires = "tool")]
    pub args: Option<String>,
    /// Print the result as JSON alone on stdout instead of streaming the output
    #[arg(long)]
    pub json: bool,
    /// The command, after `--` (one argument is run by bash as is; several are quoted)
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Subcommand)]
pub(crate) enum RegistryAction {
    /// Check the file (SQLite's quick_check) and that its event log rebuilds its rows;
    /// exits non-zero on damage
    Check,
    /// Take a backup now (sidejob.db.backup in the state directory; safe while the daemon
    /// runs, which also takes one every few minutes)
    Backup,
    /// Replace the registry with its backup; the current file is kept beside it as
    /// sidejob.db.damaged-<time>. Stop the daemon first
    Restore,
    /// Make a new registry from the runs' result.json files, when no backup is left: each
    /// session directory the daemon made becomes a closed session, each finished run a task.
    /// Stop the daemon first
    Rebuild {
        /// Where the daemon keeps sessions [default: <state-dir>/sessions]
        #[arg(long, value_name = "DIR")]
        sessions_dir: Option<PathBuf>,
    },
}

// (A comment, not a doc comment: a struct's doc would become `exec`'s about.)
#[derive(Args)]
pub(crate) struct ExecArgs {
    /// A profile name (read-only, workspace-write, ci, network, or one from the profile
    /// directory) or a profile file [default: workspace-write]
    #[arg(long, value_name = "NAME|FILE")]
    pub profile: Option<String>,
    /// The directory the command may write [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Stop the command after this long (e.g. 90s, 10m); exit code 124
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Set a variable in the command's environment, or pass your own value with NAME
    /// alone (repeatable); nothing else of yours is passed but what the profile allows
    #[arg(long = "env", value_name = "K=V|NAME")]
    pub env: Vec<String>,
    /// Also let the command read this path (repeatable; this run only)
    #[arg(long = "read", value_name = "PATH")]
    pub read: Vec<PathBuf>,
    /// Also let the command write this path (repeatable; this run only)
    #[arg(long = "write", value_name = "PATH")]
    pub write: Vec<PathBuf>,
    /// Also let the command reach this host through the egress proxy, e.g.
    /// crates.io:443 or *.example.org (repeatable; this run only)
    #[arg(long = "allow", value_name = "HOST[:PORT]")]
    pub allow: Vec<String>,
    /// Print result.json on stdout, alone (the command's output then goes to stderr, so `| jq` works)
    #[arg(long)]
    pub json: bool,
    /// Give the command this process's standard input, through a pipe (never the
    /// terminal itself) [default: the command's stdin is /dev/null]
    #[arg(long)]
    pub stdin: bool,
    /// The command and its arguments
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}
