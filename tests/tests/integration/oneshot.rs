//! A `bash` call of one plain simple command skips bash's start-up: the run execs the program
//! as bash would have (see `runner/src/sandbox/linux/oneshot.rs`). These check, through a real
//! daemon and sandbox, that nothing a command can see changes, and that bash still handles
//! every file it would treat its own way.

use std::os::unix::fs::PermissionsExt;

use serde_json::json;
use sidejob_tests::{Client, Daemon};

/// The sorted lines a call printed (its task id left out), after checking it exited 0.
fn lines_of(c: &mut Client, session: &str, command: &str) -> Vec<String> {
    let r = c.bash(session, command, json!({}));
    assert_eq!(r["exit_code"], 0, "{command}: {r}");
    let mut lines: Vec<String> = r["output"]
        .as_str()
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.starts_with("SIDEJOB_TASK_ID="))
        .map(String::from)
        .collect();
    lines.sort();
    lines
}

#[test]
fn a_plain_command_sees_the_environment_bash_would_have_given_it() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    // Quoted, the same command goes through bash, which execs it in its own place.
    let direct = lines_of(&mut c, &s, "env");
    let via_bash = lines_of(&mut c, &s, "'env'");
    assert_eq!(direct, via_bash);
    assert!(direct.iter().any(|l| l == "_=/usr/bin/env"), "{direct:?}");
    assert!(direct.iter().any(|l| l == "SHLVL=0"), "{direct:?}");
    let pwd = format!("PWD={}", d.workspace.display());
    assert!(direct.contains(&pwd), "{direct:?}");
    // The program is the run's command itself, as after bash's exec: its parent is init.
    let parent = lines_of(&mut c, &s, "grep -E ^PPid: /proc/self/status");
    assert_eq!(parent, ["PPid:\t1"]);
}

#[test]
fn a_file_bash_treats_its_own_way_is_still_left_to_bash() {
    let d = Daemon::start();
    let mut c = d.client();
    let s = d.open_session(&mut c);
    let (first, second) = (d.workspace.join("first"), d.workspace.join("second"));
    std::fs::create_dir_all(&first).unwrap();
    std::fs::create_dir_all(&second).unwrap();
    let exe = |p: std::path::PathBuf, text: &str| {
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    exe(first.join("noshebang"), "echo from-script\n");
    exe(first.join("badinterp"), "#!/nonexistent/interp\necho no\n");
    for name in ["noshebang", "badinterp"] {
        exe(second.join(name), "#!/bin/sh\necho second\n");
    }
    let path = format!("{}:{}:/usr/bin:/bin", first.display(), second.display());
    let call = |c: &mut Client, command: &str| {
        c.ok(
            "tool.call",
            json!({"session_id": s, "tool": "bash",
                   "args": {"command": command, "env": {"PATH": path}}}),
        )
    };
    // bash runs a file without `#!` as a script of its own.
    let r = call(&mut c, "noshebang");
    assert_eq!(
        (r["exit_code"].as_i64(), r["output"].as_str()),
        (Some(0), Some("from-script\n")),
        "{r}"
    );
    // A missing interpreter is bash's error, not a reason to run the next file of that name.
    // (bash 5.2 says "cannot execute: required file not found" and exits 127; older bash
    // says "bad interpreter" and exits 126.)
    let r = call(&mut c, "badinterp");
    assert!(matches!(r["exit_code"].as_i64(), Some(126 | 127)), "{r}");
    let out = r["output"].as_str().unwrap_or_default();
    assert!(out.contains("badinterp") && !out.contains("second"), "{r}");
    // Nothing of that name: bash's own words and code.
    let r = call(&mut c, "no-such-program-here");
    assert_eq!(r["exit_code"], 127, "{r}");
    assert!(
        r["output"]
            .as_str()
            .unwrap_or_default()
            .contains("command not found"),
        "{r}"
    );
}
