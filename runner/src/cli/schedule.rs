//! `sidejob events`, `sidejob inbox` and `sidejob schedule`.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::{json, Value};

use super::Client;

#[derive(Subcommand)]
pub enum ScheduleCommand {
    /// Arm a schedule: a prompt delivered as a wake, or a command started on time
    Add {
        /// Session id [default: this directory's session]
        #[arg(long)]
        session: Option<String>,
        /// Fire once after this many milliseconds
        #[arg(long, value_name = "MS", group = "when")]
        delay: Option<u64>,
        /// Fire once at this RFC 3339 time
        #[arg(long, value_name = "TIME", group = "when")]
        at: Option<String>,
        /// Fire every this many milliseconds
        #[arg(long, value_name = "MS", group = "when")]
        every: Option<u64>,
        /// Fire on a 5-field cron expression ("*/5 * * * *")
        #[arg(long, value_name = "EXPR", group = "when")]
        cron: Option<String>,
        /// Time zone for --cron (IANA name) [default: UTC]
        #[arg(long)]
        timezone: Option<String>,
        /// Stop after this many occurrences
        #[arg(long)]
        max: Option<u32>,
        /// Missed occurrences while the daemon was down: once, all or skip [default: once]
        #[arg(long)]
        catch_up: Option<String>,
        /// Deliver this prompt (instead of running a command)
        #[arg(long, conflicts_with = "command")]
        prompt: Option<String>,
        #[arg(long)]
        json: bool,
        /// The command to run on each occurrence
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List a session's schedules
    List {
        #[arg(long)]
        session: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Disarm a schedule
    Cancel { schedule: String },
}

fn session_or_default(session: Option<String>) -> Result<String> {
    match session {
        Some(s) => Ok(s),
        None => Ok(super::commands::default_session(
            &std::env::current_dir().context("cannot read the current directory")?,
        )),
    }
}

pub fn run(socket: &Path, cmd: ScheduleCommand) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    match cmd {
        ScheduleCommand::Add {
            session,
            delay,
            at,
            every,
            cron,
            timezone,
            max,
            catch_up,
            prompt,
            json: json_out,
            command,
        } => {
            let session = session_or_default(session)?;
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            client.call(
                "session.open",
                json!({"session_id": session, "workspace": cwd}),
            )?;
            let action = match (prompt, command.is_empty()) {
                (Some(p), _) => json!({"prompt": p}),
                (None, false) => {
                    json!({"call": {"tool": "bash", "args": {"command": command.join(" ")}}})
                }
                (None, true) => anyhow::bail!("give --prompt TEXT or -- COMMAND"),
            };
            let mut p = json!({"session_id": session, "action": action});
            for (k, v) in [
                ("delay_ms", delay.map(Value::from)),
                ("at", at.map(Value::from)),
                ("every_ms", every.map(Value::from)),
                ("cron", cron.map(Value::from)),
                ("timezone", timezone.map(Value::from)),
                ("max_occurrences", max.map(Value::from)),
                ("catch_up", catch_up.map(Value::from)),
            ] {
                if let Some(v) = v {
                    p[k] = v;
                }
            }
            let r = client.call("schedule.create", p)?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                println!(
                    "schedule {} armed (monitor task {}), first due {}",
                    r["schedule_id"].as_str().unwrap_or("?"),
                    r["task_id"].as_str().unwrap_or("?"),
                    r["next_due_at"].as_str().unwrap_or("-")
                );
            }
        }
        ScheduleCommand::List {
            session,
            json: json_out,
        } => {
            let session = session_or_default(session)?;
            let r = client.call("schedule.list", json!({"session_id": session}))?;
            if json_out {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                let list = r["schedules"].as_array().cloned().unwrap_or_default();
                if list.is_empty() {
                    println!("no schedules");
                }
                for s in list {
                    println!(
                        "{}  {}  fired {}  next {}  {}",
                        s["schedule_id"].as_str().unwrap_or("?"),
                        if s["enabled"].as_bool().unwrap_or(false) {
                            "armed   "
                        } else {
                            "disarmed"
                        },
                        s["occurrences"],
                        s["next_due_at"].as_str().unwrap_or("-"),
                        s["trigger"]
                    );
                }
            }
        }
        ScheduleCommand::Cancel { schedule } => {
            let r = client.call("schedule.cancel", json!({"schedule_id": schedule}))?;
            println!("{} {}", schedule, r["result"].as_str().unwrap_or("?"));
        }
    }
    Ok(0)
}

pub fn events(
    socket: &Path,
    sessions: Vec<String>,
    since: Option<i64>,
    json_out: bool,
) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let mut p = json!({});
    if !sessions.is_empty() {
        p["session_ids"] = json!(sessions);
    }
    if let Some(s) = since {
        p["since_seq"] = json!(s);
    }
    let r = client.call("events.subscribe", p)?;
    eprintln!("following events after seq {} (Ctrl+C stops)", r["seq"]);
    let mut out = std::io::stdout();
    loop {
        let Some(msg) = client.next_push()? else {
            return Ok(0);
        };
        if json_out {
            writeln!(out, "{msg}")?;
        } else {
            let p = &msg["params"];
            match msg["method"].as_str() {
                Some("task.updated") => writeln!(
                    out,
                    "#{:<6} task {} {} {}",
                    p["seq"],
                    p["task"]["task_id"].as_str().unwrap_or("?"),
                    p["task"]["state"].as_str().unwrap_or("?"),
                    p["task"]["summary"].as_str().unwrap_or("")
                )?,
                Some("notification") => writeln!(
                    out,
                    "#{:<6} {} {}: {}",
                    p["seq"],
                    p["notification"]["severity"].as_str().unwrap_or("?"),
                    p["notification"]["id"].as_str().unwrap_or("?"),
                    p["notification"]["text"]
                        .as_str()
                        .unwrap_or("")
                        .lines()
                        .next()
                        .unwrap_or("")
                )?,
                Some("events.gap") => writeln!(
                    out,
                    "fell behind after seq {}; resubscribe with --since",
                    p["from_seq"]
                )?,
                _ => writeln!(out, "{msg}")?,
            }
        }
        out.flush()?;
    }
}

pub fn inbox(
    socket: &Path,
    session: Option<String>,
    unread: bool,
    ack: bool,
    json_out: bool,
) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let mut p = json!({"unread_only": unread});
    if let Some(s) = session {
        p["session_id"] = json!(s);
    }
    let r = client.call("inbox.list", p)?;
    let list = r["notifications"].as_array().cloned().unwrap_or_default();
    if json_out {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if list.is_empty() {
        println!("inbox is empty");
    } else {
        for n in &list {
            println!(
                "{} {} [{}] {}{}",
                n["id"].as_str().unwrap_or("?"),
                n["created_at"].as_str().unwrap_or(""),
                n["severity"].as_str().unwrap_or("?"),
                if n["acked"].as_bool().unwrap_or(false) {
                    ""
                } else {
                    "(unread) "
                },
                n["text"]
                    .as_str()
                    .unwrap_or("")
                    .lines()
                    .next()
                    .unwrap_or("")
            );
        }
    }
    if ack && !list.is_empty() {
        let ids: Vec<&str> = list.iter().filter_map(|n| n["id"].as_str()).collect();
        let r = client.call("inbox.ack", json!({"ids": ids}))?;
        eprintln!(
            "acked {}",
            r["acked"].as_array().map(|a| a.len()).unwrap_or(0)
        );
    }
    Ok(0)
}
