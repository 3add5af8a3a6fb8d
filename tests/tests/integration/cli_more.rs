//! The rest of the command line: id prefixes, durations, status, tasks filters, logs --tail,
//! cancel of several ids, inbox texts, one-line errors, completions and the man page.

use std::process::Command;

use serde_json::Value;
use sidejob_tests::{sidejob_bin, Daemon};

use super::cli_call::{describe, stderr, stdout};

fn background(d: &Daemon, command: &str) -> String {
    let o = d.cli(&["call", "--background", "--", command]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    stdout(&o).trim().to_owned()
}

#[test]
fn task_ids_may_be_given_as_any_unique_prefix() {
    let d = Daemon::start();
    let a = background(&d, "echo from-a");
    let b = background(&d, "sleep 300");
    let o = d.cli(&["wait", &a[..13]]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let o = d.cli(&["logs", &a[..13].to_lowercase()]);
    assert_eq!(stdout(&o), "from-a\n", "{}", describe(&o));
    // "0" starts both ids.
    let o = d.cli(&["logs", "0"]);
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(stderr(&o).contains("ambiguous"), "{}", describe(&o));
    let o = d.cli(&["logs", "ZZZZ"]);
    assert!(
        stderr(&o).contains("no task id starts with ZZZZ"),
        "{}",
        describe(&o)
    );
    let o = d.cli(&["cancel", "--grace", "100ms", &b[..12]]);
    assert_eq!(
        stdout(&o).trim(),
        format!("{b} canceled"),
        "{}",
        describe(&o)
    );
}

#[test]
fn cancel_takes_several_ids_and_already_terminal_reads_as_a_sentence() {
    let d = Daemon::start();
    let a = background(&d, "sleep 300");
    let b = background(&d, "sleep 300");
    let o = d.cli(&["cancel", "--grace", "100ms", &a, &b]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&format!("{a} canceled")) && out.contains(&format!("{b} canceled")),
        "{out}"
    );
    let o = d.cli(&["cancel", &a]);
    assert_eq!(
        stdout(&o).trim(),
        format!("{a} had already finished (canceled); nothing to cancel")
    );
}

#[test]
fn tasks_filters_by_state_and_session_and_shows_short_ids() {
    let d = Daemon::start();
    let done = background(&d, "true");
    d.cli(&["wait", &done]);
    let live = background(&d, "sleep 300");
    let o = d.cli(&["tasks", "--state", "running", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    let ids: Vec<&str> = v["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["task_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, [live.as_str()], "{v}");
    let o = d.cli(&["tasks", "--state", "sleeping"]);
    assert!(stderr(&o).contains("unknown state"), "{}", describe(&o));
    let table = stdout(&d.cli(&["tasks", "--all"]));
    assert!(
        table.contains(&live[..12]) && table.contains(&done[..12]) && !table.contains(&live),
        "short ids in the table: {table}"
    );
    let o = d.cli(&["tasks", "--session", "nobody-here", "--json"]);
    assert_ne!(o.status.code(), Some(0), "{}", describe(&o));
    d.cli(&["cancel", "--grace", "100ms", &live]);
}

#[test]
fn logs_tail_prints_the_last_lines() {
    let d = Daemon::start();
    let id = background(&d, "for i in 1 2 3 4 5; do echo line$i; done");
    d.cli(&["wait", &id]);
    let o = d.cli(&["logs", "--tail", "2", &id]);
    assert_eq!(stdout(&o), "line4\nline5\n", "{}", describe(&o));
    let o = d.cli(&["logs", "-n", "9", &id]);
    assert_eq!(stdout(&o).lines().count(), 5, "{}", describe(&o));
}

#[test]
fn durations_are_human_and_a_past_at_is_refused() {
    let d = Daemon::start();
    let o = d.cli(&["schedule", "add", "--every", "600000", "--prompt", "x"]);
    assert_eq!(o.status.code(), Some(2), "{}", describe(&o));
    assert!(stderr(&o).contains("no unit"), "{}", describe(&o));
    let o = d.cli(&["schedule", "add", "--every", "1h30m", "--prompt", "check"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let o = d.cli(&[
        "schedule",
        "add",
        "--at",
        "2001-01-01T00:00:00Z",
        "--prompt",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", describe(&o));
    assert!(stderr(&o).contains("in the past"), "{}", describe(&o));
    let o = d.cli(&["schedule", "add", "--delay", "10m", "--", "make", "report"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let listed = stdout(&d.cli(&["schedule", "list"]));
    assert!(
        listed.contains("every 1h30m") && listed.contains("prompt: check"),
        "{listed}"
    );
    assert!(
        listed.contains("once at") && listed.contains("bash: make report"),
        "{listed}"
    );
    assert!(!listed.contains("every_ms"), "no raw JSON: {listed}");
}

#[test]
fn inbox_shows_whole_texts_and_the_state_after_ack() {
    let d = Daemon::start();
    let id = background(&d, "echo one; echo two");
    d.client().wait_settled_quietly(&id);
    let listed = stdout(&d.cli(&["inbox", "--unread"]));
    assert!(
        listed.contains("(unread)")
            && listed.contains("Last 2 lines of output")
            && listed.contains("two"),
        "the whole text: {listed}"
    );
    let o = d.cli(&["inbox", "--ack"]);
    let out = stdout(&o);
    assert!(out.contains("(read)") && !out.contains("(unread)"), "{out}");
    assert_eq!(stderr(&o).trim(), "acked 1");
    let short = stdout(&d.cli(&["inbox", "--short"]));
    assert_eq!(short.lines().count(), 1, "{short}");
}

#[test]
fn status_names_the_daemon_its_tools_and_counters() {
    let d = Daemon::start();
    let o = d.cli(&["call", "--", "exit 3"]);
    assert_eq!(o.status.code(), Some(3));
    let o = d.cli(&["status"]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let out = stdout(&o);
    assert!(
        out.contains(&d.socket.display().to_string())
            && out.contains(&d.state_dir.display().to_string()),
        "{out}"
    );
    assert!(
        out.contains("bash") && out.contains("libsidejob_plugin_bash.so"),
        "{out}"
    );
    let o = d.cli(&["status", "--json"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(v["tasks"]["failed"], 1, "{v}");
    assert_eq!(v["tasks"]["running"], 0, "{v}");
    assert_eq!(v["queue_depth"], 0, "{v}");
    assert_eq!(v["socket_activated"], false, "{v}");
    assert!(
        v["uptime_ms"].as_u64().is_some() && v["wakes_pushed"].is_u64(),
        "{v}"
    );
    assert_eq!(v["violations"], 0, "{v}");
    // A run stopped by its timeout is a violation, and exits 124.
    let o = d.cli(&["call", "--timeout", "300ms", "--", "sleep 30"]);
    assert_eq!(o.status.code(), Some(124), "{}", describe(&o));
    let v: Value = serde_json::from_slice(&d.cli(&["status", "--json"]).stdout).expect("JSON");
    assert_eq!(v["violations"], 1, "{v}");
    assert_eq!(v["tasks"]["failed"], 2, "{v}");
}

#[test]
fn errors_are_one_line_with_the_fix() {
    let d = Daemon::start();
    let missing = d.root.path().join("nowhere.sock");
    let o = Command::new(sidejob_bin())
        .arg("--socket")
        .arg(&missing)
        .arg("status")
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("sidejob serve"), "{err}");
    assert!(
        !err.contains("os error 2") || err.matches("os error").count() == 1,
        "{err}"
    );
    let o = d.cli(&["wait", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
    assert_eq!(stderr(&o).lines().count(), 1, "{}", describe(&o));
    let o = d.cli(&["rpc", "task.get", "{not json"]);
    assert_eq!(stderr(&o).lines().count(), 1, "{}", describe(&o));
}

#[test]
fn completions_and_the_man_page_come_from_the_same_definitions() {
    let d = Daemon::start();
    for shell in ["bash", "zsh", "fish"] {
        let o = d.cli(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
        let script = stdout(&o);
        assert!(
            script.contains("yield-after") && script.contains("completions"),
            "{shell}"
        );
    }
    // The bash script is valid bash.
    let script = d.root.path().join("sidejob.bash");
    std::fs::write(&script, d.cli(&["completions", "bash"]).stdout).expect("write");
    let o = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash");
    assert!(o.status.success(), "{}", describe(&o));

    let o = d.cli(&["man"]);
    assert!(
        stdout(&o).starts_with(".ie") || stdout(&o).contains(".TH sidejob"),
        "{}",
        describe(&o)
    );
    let dir = d.root.path().join("man");
    let o = d.cli(&["man", "--dir", dir.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    let call = std::fs::read_to_string(dir.join("sidejob-call.1")).expect("sidejob-call.1");
    assert!(call.contains("yield\\-after"), "{call}");
    // Each command's own description, in its page and its --help (a command's arguments are
    // built only when it runs; nothing built then may take its description's place).
    assert!(call.contains("Run a command through the daemon"), "{call}");
    let help = stdout(&d.cli(&["call", "--help"]));
    assert!(
        help.starts_with("Run a command through the daemon"),
        "{help}"
    );
    // `sidejob help schedule <TAB>` offers schedule's own commands.
    let fish = stdout(&d.cli(&["completions", "fish"]));
    assert!(
        fish.lines()
            .any(|l| l.contains("__fish_sidejob_using_subcommand help")
                && l.contains("__fish_seen_subcommand_from schedule")
                && l.contains("-a \"add\"")),
        "{fish}"
    );
}

#[test]
fn every_flag_has_help_text() {
    let d = Daemon::start();
    let top = stdout(&d.cli(&["--help"]));
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .filter(|c| c != "help")
        .collect();
    assert!(commands.len() > 10, "{top}");
    for c in &commands {
        let help = stdout(&d.cli(&[c, "--help"]));
        for line in help.lines().filter(|l| l.trim_start().starts_with('-')) {
            let flag = line.trim();
            // A flag line is the flag and its help on one line, or the help on the next.
            let described = flag.contains("  ") || help.contains(&format!("{flag}\n          "));
            assert!(described, "sidejob {c}: {flag} has no help text:\n{help}");
        }
        if c != "serve"
            && c != "exec"
            && c != "doctor"
            && c != "replay"
            && c != "completions"
            && c != "man"
        {
            continue;
        }
        assert!(
            c == "serve" || !help.contains("--socket"),
            "sidejob {c} does not talk to a daemon, so --socket means nothing there:\n{help}"
        );
    }
}

#[test]
fn status_lists_profiles_that_do_not_load() {
    let dir = sidejob_tests::TempDir::new("profiles");
    std::fs::write(dir.path().join("broken.toml"), "extends = 42\n").expect("write");
    let d = Daemon::start_with_config(&format!(
        "profiles_dir = {:?}\n",
        dir.path().display().to_string()
    ));
    let v: Value = serde_json::from_slice(&d.cli(&["status", "--json"]).stdout).expect("JSON");
    let errors = v["profile_errors"].as_array().expect("profile_errors");
    assert!(
        errors.len() == 1 && errors[0].as_str().unwrap_or("").contains("broken"),
        "{v}"
    );
    let human = stdout(&d.cli(&["status"]));
    assert!(human.contains("profile error: profile broken"), "{human}");
}
