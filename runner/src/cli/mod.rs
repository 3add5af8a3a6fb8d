//! The `sidejob` command line (SPEC §12). Human tables by default, `--json` for scripts.

mod client;
mod commands;
mod doctor;
pub mod exec;
mod mcp;
mod schedule;

pub use client::{Client, ClientError};

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "sidejob",
    version,
    about = "A process-runner sidecar: sandboxed foreground and background runs for agent hosts and CI",
    long_about = "sidejob runs shell work for agent hosts and CI. `sidejob serve` starts the daemon; \
                  hosts talk JSON-RPC to its Unix socket (see docs/protocol.md). The other commands \
                  are clients of a running daemon.",
    after_help = "Examples:\n  sidejob serve                      start the daemon (no configuration needed)\n  \
                  sidejob call -- make test           run a command in this directory's session\n  \
                  sidejob call --background -- ./long-job.sh\n  sidejob tasks                      list tasks\n  \
                  sidejob logs -f TASK               follow a task's output\n  sidejob wait TASK                  block until a task settles"
)]
pub struct Cli {
    /// The daemon's control socket [default: /run/sidejob/sidejob.sock for root,
    /// else $XDG_RUNTIME_DIR/sidejob/sidejob.sock]
    #[arg(long, global = true, env = "SIDEJOB_SOCKET")]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the daemon (zero configuration; SIGTERM stops it and leaves runs running)
    Serve {
        /// State directory for sidejob.db and sessions [default: /var/lib/sidejob for root,
        /// else $XDG_STATE_HOME/sidejob]
        #[arg(long, env = "SIDEJOB_STATE_DIR")]
        state_dir: Option<PathBuf>,
        /// A TOML file overriding the defaults (see README)
        #[arg(long)]
        config: Option<PathBuf>,
        /// Hand the socket (mode 0660) to this group, so its members may connect; each
        /// still sees only their own sessions [config: socket_group]
        #[arg(long, value_name = "GROUP")]
        socket_group: Option<String>,
    },
    /// Run a command through the daemon in this directory's session and print its output
    Call {
        /// Session id [default: one per working directory]
        #[arg(long)]
        session: Option<String>,
        /// Return at once with the task id; the run goes on in the background
        #[arg(long)]
        background: bool,
        /// Move to the background after this many milliseconds [default: 30000]
        #[arg(long, value_name = "MS")]
        yield_after: Option<u64>,
        /// Stop the run after this many milliseconds
        #[arg(long, value_name = "MS")]
        timeout: Option<u64>,
        /// Print the JSON result instead of the output
        #[arg(long)]
        json: bool,
        /// The command (one argument is passed to bash as is; several are quoted)
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// List tasks (live ones and the 25 most recent finished ones per session)
    Tasks {
        /// Only this session
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Print a task's output
    Logs {
        task: String,
        /// Keep printing as the output grows, until the task settles
        #[arg(short, long)]
        follow: bool,
    },
    /// Wait for a task to settle; exits with its exit code
    Wait {
        task: String,
        /// Give up after this many milliseconds
        #[arg(long, value_name = "MS")]
        timeout: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Cancel a task: SIGTERM to the whole run, SIGKILL after the grace
    Cancel {
        task: String,
        /// Milliseconds between SIGTERM and SIGKILL [default: 5000]
        #[arg(long, value_name = "MS")]
        grace: Option<u64>,
        #[arg(long)]
        json: bool,
    },
    /// Rebuild the registry's rows from its event log and compare
    Replay {
        /// Compare and exit non-zero on any difference (the only mode)
        #[arg(long, required = true)]
        check: bool,
        #[arg(long, env = "SIDEJOB_STATE_DIR")]
        state_dir: Option<PathBuf>,
    },
    /// Send one raw JSON-RPC request and print the result
    Rpc {
        method: String,
        /// Parameters as a JSON object
        #[arg(default_value = "{}")]
        params: String,
    },
    /// Follow the live stream of task changes and notifications (Ctrl+C stops)
    Events {
        /// Only this session (repeatable) [default: every session you own]
        #[arg(long)]
        session: Vec<String>,
        /// Also replay the changes after this seq
        #[arg(long)]
        since: Option<i64>,
        #[arg(long)]
        json: bool,
    },
    /// List the inbox: wakes and notices of background work
    Inbox {
        #[arg(long)]
        session: Option<String>,
        /// Only unacked notifications
        #[arg(long)]
        unread: bool,
        /// Ack what is listed
        #[arg(long)]
        ack: bool,
        #[arg(long)]
        json: bool,
    },
    /// Arm, list and cancel durable schedules
    Schedule {
        #[command(subcommand)]
        command: schedule::ScheduleCommand,
    },
    /// Run one command in the sandbox, without a daemon (for CI): output to the terminal,
    /// the command's exit code passed through (128+N on signal N, 124 on timeout, 125 when
    /// the sandbox cannot be built)
    #[command(
        after_help = "Examples:\n  sidejob exec -- make test\n  sidejob exec --profile ci --timeout 30m -- ./build.sh\n  \
                  sidejob exec --profile ./my-profile.toml --env TOKEN=x --json -- cargo test"
    )]
    Exec {
        /// A profile name (read-only, workspace-write, ci, network, or one from the profile
        /// directory) or a profile file [default: workspace-write]
        #[arg(long, value_name = "NAME|FILE")]
        profile: Option<String>,
        /// The directory the command may write [default: the current directory]
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Stop the command after this long (e.g. 90s, 10m); exit code 124
        #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
        timeout: Option<std::time::Duration>,
        /// Set a variable in the command's environment, or pass your own value with NAME
        /// alone (repeatable); nothing else of yours is passed but what the profile allows
        #[arg(long = "env", value_name = "K=V|NAME")]
        env: Vec<String>,
        /// Also let the command read this path (repeatable; this run only)
        #[arg(long = "read", value_name = "PATH")]
        read: Vec<PathBuf>,
        /// Also let the command write this path (repeatable; this run only)
        #[arg(long = "write", value_name = "PATH")]
        write: Vec<PathBuf>,
        /// Also let the command reach this host through the egress proxy, e.g.
        /// crates.io:443 or *.example.org (repeatable; this run only)
        #[arg(long = "allow", value_name = "HOST[:PORT]")]
        allow: Vec<String>,
        /// Print result.json at the end
        #[arg(long)]
        json: bool,
        /// Give the command this process's standard input, through a pipe (never the
        /// terminal itself) [default: the command's stdin is /dev/null]
        #[arg(long)]
        stdin: bool,
        /// The command and its arguments
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Show which sandbox layers this host can apply, and why a missing one is missing
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// List or clear the persistent caches profiles keep (`[caches]`)
    Cache {
        #[command(subcommand)]
        command: doctor::CacheCommand,
    },
    /// Serve the daemon's tools to an MCP client on stdin/stdout (e.g. as a coding agent's
    /// MCP server); finished background jobs are reported in later tool results
    Mcp {
        /// Session id [default: one per working directory]
        #[arg(long)]
        session: Option<String>,
    },
    /// (internal) Supervise one run; started by the daemon
    #[command(hide = true)]
    Supervise { run_dir: PathBuf },
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // The supervisor must stay single-threaded: dispatch to it before anything else runs.
    if let Command::Supervise { run_dir } = &cli.command {
        return crate::supervisor::main(run_dir);
    }
    // So must `exec` and `doctor`, which run the supervisor in this process.
    match cli.command {
        Command::Exec {
            profile,
            workspace,
            timeout,
            env,
            read,
            write,
            allow,
            json,
            stdin,
            command,
        } => {
            return exec::exec(exec::ExecArgs {
                profile,
                workspace,
                timeout,
                env,
                read,
                write,
                allow,
                json,
                stdin,
                command,
            })
        }
        Command::Doctor { json } => return doctor::doctor(json),
        Command::Cache { command } => return doctor::cache(command),
        _ => {}
    }
    if !matches!(cli.command, Command::Serve { .. }) {
        crate::sys::default_sigpipe();
    }
    let socket = cli
        .socket
        .clone()
        .unwrap_or_else(crate::config::default_socket_path);
    let result = match cli.command {
        Command::Serve {
            state_dir,
            config,
            socket_group,
        } => commands::serve(cli.socket, state_dir, config, socket_group),
        Command::Call {
            session,
            background,
            yield_after,
            timeout,
            json,
            command,
        } => commands::call(
            &socket,
            session,
            background,
            yield_after,
            timeout,
            json,
            command,
        ),
        Command::Tasks { session, json } => commands::tasks(&socket, session, json),
        Command::Logs { task, follow } => commands::logs(&socket, &task, follow),
        Command::Wait {
            task,
            timeout,
            json,
        } => commands::wait(&socket, &task, timeout, json),
        Command::Cancel { task, grace, json } => commands::cancel(&socket, &task, grace, json),
        Command::Replay {
            check: _,
            state_dir,
        } => commands::replay(state_dir),
        Command::Rpc { method, params } => commands::rpc(&socket, &method, &params),
        Command::Events {
            session,
            since,
            json,
        } => schedule::events(&socket, session, since, json),
        Command::Inbox {
            session,
            unread,
            ack,
            json,
        } => schedule::inbox(&socket, session, unread, ack, json),
        Command::Schedule { command } => schedule::run(&socket, command),
        Command::Mcp { session } => mcp::run(&socket, session),
        Command::Supervise { .. }
        | Command::Exec { .. }
        | Command::Doctor { .. }
        | Command::Cache { .. } => Ok(0),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sidejob: {e:#}");
            1
        }
    }
}
