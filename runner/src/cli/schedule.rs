//! `sidejob events`, `sidejob inbox` and `sidejob schedule`.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::Subcommand;
use serde_json::{json, Value};

use std::time::Duration;

use super::format::{format_ms, parse_duration, print_table};
use super::Client;
use crate::protocol::Notification;

#[derive(Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Arm a schedule: a prompt delivered as a wake, or a command started on time
    #[command(
        after_help = "Examples:\n  sidejob schedule add --every 10m --prompt 'check the nightly build'\n  \
                  sidejob schedule add --at 2030-01-01T09:00:00Z -- ./release.sh\n  \
                  sidejob schedule add --cron '0 6 * * 1-5' --timezone Europe/Paris -- make report"
    )]
    Add {
        /// Session id [default: this directory's session, cli-<uid>-<hash>]
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Fire once after this long (e.g. 90s, 10m, 1h30m)
        #[arg(long, value_name = "DURATION", group = "when", value_parser = parse_duration)]
        delay: Option<Duration>,
        /// Fire once at this time (RFC 3339, e.g. 2030-01-01T09:00:00Z); must be in the future
        #[arg(long, value_name = "TIME", group = "when")]
        at: Option<String>,
        /// Fire every this long (e.g. 10m, 1h)
        #[arg(long, value_name = "DURATION", group = "when", value_parser = parse_duration)]
        every: Option<Duration>,
        /// Fire on a 5-field cron expression ("*/5 * * * *")
        #[arg(long, value_name = "EXPR", group = "when")]
        cron: Option<String>,
        /// Time zone for --cron (IANA name) [default: UTC]
        #[arg(long, value_name = "ZONE")]
        timezone: Option<String>,
        /// Stop after this many occurrences
        #[arg(long, value_name = "N")]
        max: Option<u32>,
        /// Missed occurrences while the daemon was down: once, all or skip [default: once]
        #[arg(long, value_name = "MODE")]
        catch_up: Option<String>,
        /// Deliver this prompt (instead of running a command)
        #[arg(long, conflicts_with = "command")]
        prompt: Option<String>,
        /// Print the schedule.create result as JSON
        #[arg(long)]
        json: bool,
        /// The command to run on each occurrence, after `--`
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// List a session's schedules
    List {
        /// Session id [default: this directory's session]
        #[arg(long, value_name = "ID")]
        session: Option<String>,
        /// Print the schedule.list result as JSON
        #[arg(long)]
        json: bool,
    },
    /// Disarm a schedule
    Cancel {
        /// The schedule id
        schedule: String,
    },
}

fn session_or_default(session: Option<String>) -> Result<String> {
    match session {
        Some(s) => Ok(s),
        None => Ok(super::call::default_session(
            crate::sys::getuid(),
            &std::env::current_dir().context("cannot read the current directory")?,
        )),
    }
}

/// A schedule's trigger as a person reads it: "every 10m", "once at …", "cron … (UTC)".
fn describe_trigger(t: &Value) -> String {
    match t["kind"].as_str() {
        Some("every") => format!("every {}", format_ms(t["every_ms"].as_u64().unwrap_or(0))),
        Some("cron") => format!(
            "cron {} ({})",
            t["expr"].as_str().unwrap_or("?"),
            t["timezone"].as_str().unwrap_or("UTC")
        ),
        Some("once") => match t["due_ms"]
            .as_i64()
            .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        {
            Some(at) => format!("once at {}", at.strftime("%Y-%m-%dT%H:%M:%SZ")),
            None => "once".into(),
        },
        _ => t.to_string(),
    }
}

pub(super) fn run(socket: &Path, cmd: ScheduleCommand) -> Result<i32> {
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
                    let command = if command.len() == 1 {
                        command[0].clone()
                    } else {
                        command.join(" ")
                    };
                    json!({"call": {"tool": "bash", "args": {"command": command}}})
                }
                (None, true) => anyhow::bail!("give --prompt TEXT or -- COMMAND"),
            };
            if let Some(at) = &at {
                let when: jiff::Timestamp = at.parse().with_context(|| {
                    format!("--at {at}: not an RFC 3339 time; write e.g. 2030-01-01T09:00:00Z")
                })?;
                if when <= jiff::Timestamp::now() {
                    anyhow::bail!(
                        "--at {at} is in the past; give a future time, or --delay DURATION"
                    );
                }
            }
            let mut p = json!({"session_id": session, "action": action});
            for (k, v) in [
                ("delay_ms", delay.map(|d| Value::from(d.as_millis() as u64))),
                ("at", at.map(Value::from)),
                ("every_ms", every.map(|d| Value::from(d.as_millis() as u64))),
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
                    return Ok(0);
                }
                let rows: Vec<[String; 6]> = list
                    .iter()
                    .map(|s| {
                        let action = match (&s["action"]["prompt"], &s["action"]["call"]) {
                            (Value::String(p), _) => {
                                format!("prompt: {}", p.lines().next().unwrap_or(""))
                            }
                            (_, call) if call.is_object() => format!(
                                "{}: {}",
                                call["tool"].as_str().unwrap_or("?"),
                                call["args"]["command"]
                                    .as_str()
                                    .map(str::to_owned)
                                    .unwrap_or_else(|| call["args"].to_string())
                            ),
                            _ => s["action"].to_string(),
                        };
                        [
                            s["schedule_id"].as_str().unwrap_or("?").to_owned(),
                            if s["enabled"].as_bool().unwrap_or(false) {
                                "armed"
                            } else {
                                "disarmed"
                            }
                            .to_owned(),
                            describe_trigger(&s["trigger"]),
                            s["occurrences"].to_string(),
                            s["next_due_at"].as_str().unwrap_or("-").to_owned(),
                            action,
                        ]
                    })
                    .collect();
                print_table(
                    &["SCHEDULE", "STATE", "TRIGGER", "FIRED", "NEXT", "ACTION"],
                    &rows,
                );
            }
        }
        ScheduleCommand::Cancel { schedule } => {
            let r = client.call("schedule.cancel", json!({"schedule_id": schedule}))?;
            match r["result"].as_str().unwrap_or("?") {
                "already_terminal" => {
                    println!("{schedule} was not armed any more; nothing to disarm")
                }
                "cancellation_pending" => println!("{schedule} disarmed; its last run is stopping"),
                other => println!("{schedule} {other}"),
            }
        }
    }
    Ok(0)
}

pub(super) fn events(
    socket: &Path,
    sessions: Vec<String>,
    since: Option<i64>,
    json_out: bool,
    full: bool,
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
                Some("notification") => {
                    let text = p["notification"]["text"].as_str().unwrap_or("");
                    writeln!(
                        out,
                        "#{:<6} {} {}: {}",
                        p["seq"],
                        p["notification"]["severity"].as_str().unwrap_or("?"),
                        p["notification"]["id"].as_str().unwrap_or("?"),
                        if full { indent(text) } else { first_line(text) }
                    )?
                }
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

pub(super) struct InboxArgs {
    pub session: Option<String>,
    pub unread: bool,
    pub ack: bool,
    pub short: bool,
    pub json: bool,
}

fn first_line(text: &str) -> String {
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("").to_owned();
    if lines.next().is_some() {
        format!("{first} …")
    } else {
        first
    }
}

/// The whole text, continuation lines indented under the first.
fn indent(text: &str) -> String {
    text.trim_end().replace('\n', "\n    ")
}

pub(super) fn inbox(socket: &Path, a: InboxArgs) -> Result<i32> {
    let mut client = Client::connect(socket)?;
    let mut p = json!({ "unread_only": a.unread });
    if let Some(s) = &a.session {
        p["session_id"] = json!(s);
    }
    let r = client.call("inbox.list", p)?;
    let mut list: Vec<Notification> = serde_json::from_value(r["notifications"].clone())
        .context("unexpected inbox.list result")?;
    let mut acked_now = 0;
    if a.ack {
        let ids: Vec<&str> = list
            .iter()
            .filter(|n| !n.acked)
            .map(|n| n.id.as_str())
            .collect();
        if !ids.is_empty() {
            let r = client.call("inbox.ack", json!({ "ids": ids }))?;
            let acked: Vec<String> = serde_json::from_value(r["acked"].clone()).unwrap_or_default();
            acked_now = acked.len();
            // Show what is true now: these are read.
            for n in list.iter_mut().filter(|n| acked.contains(&n.id)) {
                n.acked = true;
            }
        }
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "notifications": list }))?
        );
    } else if list.is_empty() {
        println!("inbox is empty");
    } else {
        for n in &list {
            let head = format!(
                "{} {} {}{} {}",
                n.id,
                n.created_at,
                n.severity,
                n.task_id
                    .as_deref()
                    .map(|t| format!(" task {t}"))
                    .unwrap_or_default(),
                if n.acked { "(read)" } else { "(unread)" },
            );
            if a.short {
                println!("{head}: {}", first_line(&n.text));
            } else {
                println!("{head}\n    {}\n", indent(&n.text));
            }
        }
    }
    if a.ack {
        eprintln!("acked {acked_now}");
    }
    Ok(0)
}
