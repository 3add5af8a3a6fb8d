//! The `sidejob` command line. Human tables by default, `--json` for scripts, one-line
//! errors that say the fix.

mod args;
mod call;
mod client;
mod commands;
mod doctor;
mod exec;
mod format;
mod hook;
mod integrate;
mod mcp;
mod schedule;
mod upgrade;

pub(crate) use args::Cli;
pub use client::{Client, ClientError};

use std::path::PathBuf;

use clap::Parser;

use args::{Command, Conn, RegistryAction};

/// The socket a client command uses: its own `--socket`, else the one given before the
/// command, else the user's own daemon's, else a shared (system) daemon's.
fn socket(conn: &Conn, top: &Conn) -> PathBuf {
    conn.socket
        .clone()
        .or_else(|| top.socket.clone())
        .unwrap_or_else(crate::config::client_socket_path)
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    // The supervisor must stay single-threaded: dispatch to it before anything else runs.
    if let Command::Supervise { run_dir } = &cli.command {
        return crate::supervisor::main(run_dir);
    }
    // So must `exec` and `doctor`, which run the supervisor in this process.
    let top = cli.conn;
    let command = match cli.command {
        Command::Exec(args) => return exec::exec(args),
        Command::Doctor { json } => return doctor::doctor(json),
        Command::Cache { command } => return doctor::cache(command),
        other => other,
    };
    if !matches!(command, Command::Serve { .. }) {
        crate::sys::default_sigpipe();
    }
    let result = match command {
        Command::Serve {
            conn,
            state_dir,
            config,
            log_format,
            metrics_addr,
            socket_group,
        } => commands::serve(
            conn.socket.or(top.socket),
            state_dir,
            config,
            log_format,
            metrics_addr,
            socket_group,
        ),
        Command::Call(a) => {
            let s = socket(&a.conn, &top);
            call::call(&s, a)
        }
        Command::Tasks {
            conn,
            session,
            all,
            state,
            json,
        } => commands::tasks(
            &socket(&conn, &top),
            commands::TasksArgs {
                session,
                all,
                states: state,
                json,
            },
        ),
        Command::Logs {
            conn,
            task,
            follow,
            tail,
        } => commands::logs(&socket(&conn, &top), &task, follow, tail),
        Command::Wait {
            conn,
            task,
            timeout,
            json,
        } => commands::wait(&socket(&conn, &top), &task, timeout, json),
        Command::Cancel {
            conn,
            tasks,
            grace,
            json,
        } => commands::cancel(&socket(&conn, &top), &tasks, grace, json),
        Command::Status { conn, json, ready } => {
            commands::status(&socket(&conn, &top), commands::StatusOutput { json, ready })
        }
        Command::Replay {
            check: _,
            state_dir,
        } => commands::replay(state_dir),
        Command::Registry { action, state_dir } => match action {
            RegistryAction::Check => commands::registry_check(state_dir),
            RegistryAction::Backup => commands::registry_backup(state_dir),
            RegistryAction::Restore => commands::registry_restore(state_dir),
            RegistryAction::Rebuild { sessions_dir } => {
                commands::registry_rebuild(state_dir, sessions_dir)
            }
        },
        Command::Rpc {
            conn,
            method,
            params,
        } => commands::rpc(&socket(&conn, &top), &method, &params),
        Command::Events {
            conn,
            session,
            since,
            json,
            full,
        } => schedule::events(&socket(&conn, &top), session, since, json, full),
        Command::Inbox {
            conn,
            session,
            unread,
            ack,
            short,
            full: _,
            json,
        } => schedule::inbox(
            &socket(&conn, &top),
            schedule::InboxArgs {
                session,
                unread,
                ack,
                short,
                json,
            },
        ),
        Command::Schedule { conn, command } => schedule::run(&socket(&conn, &top), command),
        Command::Mcp {
            conn,
            session,
            new_session,
            adopt,
            start_daemon,
        } => mcp::run(
            &socket(&conn, &top),
            mcp::McpArgs {
                session,
                new_session,
                adopt,
                start_daemon,
            },
        ),
        Command::Hook {
            conn,
            kind,
            workspace,
            wait,
            json,
        } => hook::run(
            &socket(&conn, &top),
            kind,
            hook::HookArgs {
                workspace,
                wait,
                json,
            },
        ),
        Command::Integrate {
            client,
            workspace,
            print,
        } => integrate::run(client, workspace, print),
        Command::UpgradeCheck { binary, state_dir } => upgrade::upgrade_check(binary, state_dir),
        Command::Upgrade {
            conn,
            state_dir,
            timeout,
        } => upgrade::upgrade(&socket(&conn, &top), state_dir, timeout),
        Command::Completions { shell } => commands::completions(shell),
        Command::Man { dir } => commands::man(dir),
        Command::Supervise { .. }
        | Command::Exec(_)
        | Command::Doctor { .. }
        | Command::Cache { .. } => Ok(0),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("sidejob: {}", one_line(&e));
            1
        }
    }
}

/// An error and its causes on one line, without repeating a cause whose text the line
/// already holds (an OS error quoted by the message above it, for instance).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let text = text.trim();
        if text.is_empty() || line.contains(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line.replace('\n', "; ")
}

/// clap's error, plus the fix for the mistake people make most: a command without `--`.
fn usage_error(e: clap::Error) -> i32 {
    use clap::error::ErrorKind;
    let args: Vec<String> = std::env::args().collect();
    let runs_command = args.iter().any(|a| a == "call" || a == "exec");
    let has_dashes = args.iter().any(|a| a == "--");
    if runs_command && !has_dashes && e.kind() == ErrorKind::UnknownArgument {
        let at = args
            .iter()
            .position(|a| a == "call" || a == "exec")
            .unwrap_or(0);
        let command: Vec<&str> = args[at + 1..]
            .iter()
            .map(String::as_str)
            .skip_while(|a| a.starts_with('-'))
            .collect();
        eprintln!(
            "sidejob: put the command after `--`, so its own flags are not taken for sidejob's: sidejob {} -- {}",
            args[at],
            if command.is_empty() { "echo hi".to_owned() } else { command.join(" ") }
        );
        return 2;
    }
    let _ = e.print();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => 0,
        _ => 2,
    }
}
