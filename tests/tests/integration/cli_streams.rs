//! The command's stderr stays on the caller's stderr when that is a different file from its
//! stdout (`sidejob exec`, and `sidejob call` through `tool.call`'s `stderr: "separate"`),
//! machine output (`--json`) is alone on stdout, and `output.log` stays the one interleaved
//! log, with `output.streams` beside it saying which ranges came from stderr.

use std::fs::File;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use sidejob_tests::{sidejob_bin, Client, Daemon, TempDir};

use super::cli_call::describe;
use super::containment::{exec_command, Ws};

/// What writes to each stream, in an order a log read from two pipes at once would not keep.
const BOTH: &str = "echo out; echo err >&2";
const ALTERNATING: &str = "echo 1; echo 2 >&2; echo 3";

/// Runs `cmd` with its stdout and stderr to two files (`same`: to one), returning the code
/// and what each file holds.
fn to_files(mut cmd: Command, same: bool) -> (Option<i32>, String, String) {
    let dir = TempDir::new("streams");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let out_file = File::create(&out).expect("out file");
    let err_file = if same {
        out_file.try_clone().expect("dup")
    } else {
        File::create(&err).expect("err file")
    };
    let status = cmd
        .stdout(Stdio::from(out_file))
        .stderr(Stdio::from(err_file))
        .status()
        .expect("run sidejob");
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (status.code(), read(&out), read(&err))
}

#[test]
fn exec_keeps_the_commands_stderr_on_stderr_when_stdout_and_stderr_are_different_files() {
    let Some(ws) = Ws::new() else { return };
    let (code, out, err) = to_files(exec_command(&ws, &[], &["sh", "-c", BOTH]), false);
    assert_eq!(code, Some(0), "stdout {out:?} stderr {err:?}");
    assert_eq!(out, "out\n", "stdout has stdout only (stderr {err:?})");
    assert_eq!(err, "err\n", "stderr has stderr only (stdout {out:?})");
}

#[test]
fn exec_with_stdout_and_stderr_on_one_file_keeps_them_one_stream_in_order() {
    let Some(ws) = Ws::new() else { return };
    let (code, out, err) = to_files(exec_command(&ws, &[], &["sh", "-c", ALTERNATING]), true);
    assert_eq!(code, Some(0), "{out:?}");
    assert_eq!(err, "", "one file");
    assert_eq!(out, "1\n2\n3\n", "one pipe: the order written");
}

#[test]
fn exec_json_is_alone_on_stdout_with_both_streams_on_stderr() {
    let Some(ws) = Ws::new() else { return };
    let o = exec_command(&ws, &["--json"], &["sh", "-c", BOTH])
        .output()
        .expect("run sidejob exec");
    // What `| jq` would do with it.
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON alone ({e}): {}", describe(&o)));
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("out\n") && err.contains("err\n"),
        "{}",
        describe(&o)
    );
}

/// The run directories of a daemon's runs (`.background/<task_id>/`), found under its state
/// directory.
fn run_dirs(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                if p.join("output.log").is_file() {
                    found.push(p.clone());
                }
                todo.push(p);
            }
        }
    }
    found
}

/// The only run a daemon has made: its task id and its run directory.
fn only_run(d: &Daemon) -> (String, PathBuf) {
    let runs = run_dirs(&d.state_dir);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let dir = runs[0].clone();
    let id = dir
        .file_name()
        .and_then(|n| n.to_str())
        .expect("task id")
        .to_owned();
    (id, dir)
}

/// `task.output` by stream: the page's segments as `(stream, text)`.
fn segments(d: &Daemon, task_id: &str) -> (String, Vec<(String, String)>) {
    let mut c = Client::connect(&d.socket);
    let page = c.ok(
        "task.output",
        json!({"task_id": task_id, "offset": 0, "streams": true}),
    );
    let segs = page["segments"]
        .as_array()
        .unwrap_or_else(|| panic!("no segments: {page}"))
        .iter()
        .map(|s| {
            (
                s["stream"].as_str().unwrap_or("?").to_owned(),
                s["text"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    (page["data"].as_str().unwrap_or("").to_owned(), segs)
}

fn call_command(d: &Daemon, command: &str) -> Command {
    let mut c = Command::new(sidejob_bin());
    c.arg("--socket")
        .arg(&d.socket)
        .args(["call", "--", command])
        .current_dir(&d.workspace)
        .stdin(Stdio::null());
    c
}

fn pair(stream: &str, text: &str) -> (String, String) {
    (stream.to_owned(), text.to_owned())
}

#[test]
fn call_keeps_the_commands_stderr_on_stderr_and_output_log_stays_interleaved() {
    let d = Daemon::start();
    let (code, out, err) = to_files(call_command(&d, BOTH), false);
    assert_eq!(code, Some(0), "stdout {out:?} stderr {err:?}");
    assert_eq!(out, "out\n", "stdout has stdout only (stderr {err:?})");
    assert_eq!(err, "err\n", "stderr has stderr only (stdout {out:?})");
    // The log is the one interleaved log, as before; the index says which part was which.
    let (id, dir) = only_run(&d);
    assert_eq!(
        std::fs::read_to_string(dir.join("output.log")).expect("output.log"),
        "out\nerr\n"
    );
    assert!(dir.join("output.streams").is_file(), "{}", dir.display());
    let (data, segs) = segments(&d, &id);
    assert_eq!(data, "out\nerr\n");
    assert_eq!(segs, [pair("stdout", "out\n"), pair("stderr", "err\n")]);
}

#[test]
fn call_with_stdout_and_stderr_on_one_file_keeps_them_one_stream_in_order() {
    let d = Daemon::start();
    let (code, out, err) = to_files(call_command(&d, ALTERNATING), true);
    assert_eq!(code, Some(0), "{out:?}");
    assert_eq!(out, "1\n2\n3\n", "one pipe: the order written");
    assert_eq!(err, "");
    // Nothing asked for a second pipe: no index, and every segment is stdout's.
    let (id, dir) = only_run(&d);
    assert!(!dir.join("output.streams").exists());
    let (_, segs) = segments(&d, &id);
    assert_eq!(segs, [pair("stdout", "1\n2\n3\n")]);
}

#[test]
fn call_json_is_alone_on_stdout() {
    let d = Daemon::start();
    let o = d.cli(&["call", "--json", "--", BOTH]);
    let v: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON alone ({e}): {}", describe(&o)));
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["output"], "out\nerr\n", "{v}");
}

/// A crash can tear the index's last record (or leave zeros where the file grew): reading
/// stops there, and what came before still says which part was which.
#[test]
fn the_stream_index_survives_a_torn_tail() {
    let d = Daemon::start();
    let (code, out, err) = to_files(call_command(&d, ALTERNATING), false);
    assert_eq!(
        (code, out.as_str(), err.as_str()),
        (Some(0), "1\n3\n", "2\n")
    );
    let (id, dir) = only_run(&d);
    let index = dir.join("output.streams");
    let whole = std::fs::read(&index).expect("index");
    assert!(
        whole.len() >= 32 && whole.len() % 16 == 0,
        "{}",
        whole.len()
    );
    let (_, before) = segments(&d, &id);

    // Half a record, then a block of zeros and a good record after it: all ignored.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&index)
        .expect("index");
    f.write_all(&[7; 9]).expect("append");
    drop(f);
    assert_eq!(segments(&d, &id).1, before, "a torn last record is ignored");
    let mut zeroed = whole.clone();
    zeroed.extend_from_slice(&[0; 16]);
    zeroed.extend_from_slice(&whole[whole.len() - 16..]);
    std::fs::write(&index, &zeroed).expect("rewrite");
    assert_eq!(segments(&d, &id).1, before, "zeros stop the reading");

    // Only the first record left whole: the rest of the log reads as stdout, and the log
    // itself is untouched.
    std::fs::write(&index, &whole[..16 + 5]).expect("tear");
    let (data, segs) = segments(&d, &id);
    assert_eq!(
        std::fs::read_to_string(dir.join("output.log")).expect("output.log"),
        data
    );
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert_eq!(segs[0].0, "stdout");
    assert_eq!(segs[0].1, data);
}

/// On a terminal (stdout and stderr the same pseudo-terminal) both streams are one, in the
/// order written, for `call` and for `exec`.
#[test]
fn on_a_terminal_both_streams_are_one_in_order() {
    let d = Daemon::start();
    let o = d.cli_on_a_terminal(&[], &["call", "--", ALTERNATING]);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).replace('\r', ""),
        "1\n2\n3\n",
        "{}",
        describe(&o)
    );
    let (_, dir) = only_run(&d);
    assert!(
        !dir.join("output.streams").exists(),
        "one pipe on a terminal"
    );
    let Some(ws) = Ws::new() else { return };
    let mut args = vec!["exec", "--workspace"];
    let path = ws.path().display().to_string();
    args.push(&path);
    args.extend(["--", "sh", "-c", ALTERNATING]);
    let o = d.cli_on_a_terminal(&[], &args);
    assert_eq!(o.status.code(), Some(0), "{}", describe(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).replace('\r', ""),
        "1\n2\n3\n",
        "{}",
        describe(&o)
    );
}

/// A daemon from before `stderr` refuses the parameter as invalid; `call` calls again
/// without it. Played by a stand-in that answers as such a daemon would.
#[test]
fn call_asks_an_older_daemon_again_without_stderr() {
    let dir = TempDir::new("old-daemon");
    let socket = dir.path().join("old.sock");
    let listener = UnixListener::bind(&socket).expect("bind");
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<Value>::new()));
    let log = seen.clone();
    let server = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader};
        let (conn, _) = listener.accept().expect("accept");
        let mut w = conn.try_clone().expect("clone");
        for line in BufReader::new(conn).lines() {
            let Ok(line) = line else { break };
            let req: Value = serde_json::from_str(&line).expect("JSON-RPC");
            log.lock().unwrap().push(req.clone());
            let id = req["id"].clone();
            let reply = match req["method"].as_str() {
                Some("tool.call") if req["params"].get("stderr").is_some() => json!({
                    "jsonrpc": "2.0", "id": id,
                    "error": {"code": -32602, "message": "tool.call: unknown field `stderr`"}
                }),
                Some("tool.call") => json!({"jsonrpc": "2.0", "id": id, "result": {
                    "status": "completed", "task_id": "01M8MR3A0TN9KQ05938VNEWNRF",
                    "state": "succeeded", "exit_code": 0, "output": "out\nerr\n",
                    "output_truncated": false, "duration_ms": 1,
                    "output_path": "/nowhere/output.log", "result_path": "/nowhere/result.json"
                }}),
                _ => json!({"jsonrpc": "2.0", "id": id, "result": {}}),
            };
            let mut bytes = serde_json::to_vec(&reply).expect("encode");
            bytes.push(b'\n');
            if w.write_all(&bytes).is_err() {
                break;
            }
        }
    });
    let mut cmd = Command::new(sidejob_bin());
    cmd.arg("--socket")
        .arg(&socket)
        .args(["call", "--", BOTH])
        .current_dir(dir.path())
        .stdin(Stdio::null());
    let (code, out, err) = to_files(cmd, false);
    let _ = server.join();
    assert_eq!(code, Some(0), "stdout {out:?} stderr {err:?}");
    assert_eq!(out, "out\nerr\n", "one stream from an older daemon");
    let calls: Vec<Value> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r["method"] == "tool.call")
        .cloned()
        .collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0]["params"]["stderr"], "separate");
    assert!(calls[1]["params"].get("stderr").is_none(), "{:?}", calls[1]);
}
