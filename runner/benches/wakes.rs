//! `cargo bench -p sidejob --bench wakes`: how fast completions and schedules reach a host.
//!
//! - exit → notification: a background command prints the wall clock as its last act; the
//!   time until its `notification` push arrives on a subscribed socket, on an idle machine
//!   (target: p99 ≤ 3 ms) and with two CPU burners beside it (p99 ≤ 5 ms), n = 250 each;
//! - 10 000 prompt occurrences due at the same instant: the time from that instant until the
//!   last one is pushed (target: ≤ 2 s), and a count proving each was delivered exactly once.
//!
//! Timings are reported against their targets; a missed target, or a broken property (a wake
//! or an occurrence lost or delivered twice), makes the bench exit 1.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails by panicking

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use sidejob_tests::bench::{burn_if_asked, percentile_ms, Load, Targets};

struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
    id: u64,
}

impl Conn {
    fn open(path: &std::path::Path) -> Conn {
        let s = UnixStream::connect(path).unwrap();
        // A push that never comes fails the bench instead of hanging it.
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
            id: 0,
        }
    }
    fn send(&mut self, method: &str, params: Value) -> u64 {
        self.id += 1;
        let mut line = serde_json::to_vec(
            &json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params}),
        )
        .unwrap();
        line.push(b'\n');
        self.w.write_all(&line).unwrap();
        self.id
    }
    fn next(&mut self) -> Value {
        let mut buf = String::new();
        // A panic, not an exit: the daemon is stopped as it unwinds.
        if let Err(e) = self.r.read_line(&mut buf) {
            panic!("FAILED: nothing arrived within 60 s ({e}): a wake or an occurrence was lost");
        }
        serde_json::from_str(&buf).unwrap()
    }
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        loop {
            let m = self.next();
            if m["id"] == id {
                assert!(m.get("error").is_none(), "{method}: {m}");
                return m["result"].clone();
            }
        }
    }
}

fn now_ns() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as f64
}

struct Daemon(Child, std::path::PathBuf);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        sidejob_tests::remove_memory_runs_dir(&self.1.join("state"));
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn main() -> std::process::ExitCode {
    burn_if_asked();
    let root = std::env::temp_dir().join(format!("sidejob-bench-wakes-{}", std::process::id()));
    let socket = root.join("run").join("s.sock");
    let ws = root.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    // 10 000 armed schedules for one user is the point of the burst, not a share to enforce.
    let config = root.join("config.toml");
    std::fs::write(&config, "[per_user]\nschedules = 20000\n").unwrap();
    // `SIDEJOB_BIN` measures another build (plugins beside it), for a before/after.
    let bin =
        std::env::var_os("SIDEJOB_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_sidejob").into());
    let child = Command::new(bin)
        .arg("serve")
        .arg("--config")
        .arg(&config)
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(root.join("state"))
        .env("SIDEJOB_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _d = Daemon(child, root.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&socket).is_err() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut host = Conn::open(&socket);
    let mut ctl = Conn::open(&socket);
    let s = ctl.call(
        "session.open",
        json!({"session_id": "bench", "workspace": ws}),
    )["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    host.call("events.subscribe", json!({"session_ids": [s]}));

    // exit → notification, idle and with two CPU burners beside it.
    let mut targets = Targets::default();
    let mut exit_lines = Vec::new();
    for load in Load::BOTH {
        let _burners = load.apply();
        let mut lat = Vec::new();
        for _ in 0..EXIT_SAMPLES {
            let r = ctl.call("tool.call", json!({"session_id": s, "tool": "bash", "args": {"command": "exec date +%s%N"}, "background": true}));
            let task = r["task_id"].as_str().unwrap().to_owned();
            let received = loop {
                let m = host.next();
                if m["method"] == "notification"
                    && m["params"]["notification"]["task_id"] == task.as_str()
                {
                    break now_ns();
                }
            };
            let out = ctl.call("task.output", json!({"task_id": task}));
            let printed: f64 = out["data"].as_str().unwrap().trim().parse().unwrap();
            lat.push(Duration::from_secs_f64(
                ((received - printed) / 1e9).max(0.0),
            ));
            let id = host_last_id(&mut ctl, &task);
            ctl.call("inbox.ack", json!({"ids": [id]}));
        }
        let (p50, p99) = (percentile_ms(&lat, 0.5), percentile_ms(&lat, 0.99));
        println!(
            "{:<5} process exit -> notification pushed   p50 {p50:>7.3} ms   p99 {p99:>7.3} ms   (n = {})",
            load.name(),
            lat.len()
        );
        exit_lines.push((load, p99));
    }

    // 10 000 occurrences due at once: armed while no host is subscribed (so they stay due),
    // then a host subscribes and they all become deliverable at that instant.
    drop(host);
    const N: usize = 10_000;
    let at = humantime::format_rfc3339_millis(SystemTime::now() + Duration::from_millis(500))
        .to_string();
    let t0 = Instant::now();
    for _ in 0..N {
        ctl.send(
            "schedule.create",
            json!({"session_id": s, "at": at, "action": {"prompt": "tick"}}),
        );
    }
    for _ in 0..N {
        let m = ctl.next();
        assert!(m.get("result").is_some(), "{m}");
    }
    println!(
        "armed {N} schedules in {:.2} s (pipelined)",
        t0.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_millis(600));
    let mut host = Conn::open(&socket);
    let due = SystemTime::now();
    host.call("events.subscribe", json!({"session_ids": [s]}));
    let due_ns = due.duration_since(UNIX_EPOCH).unwrap().as_nanos() as f64;
    // Schedule → the distinct notification ids seen for it (a re-push after a gap repeats an id;
    // a second occurrence would be a new id).
    let mut per_schedule: HashMap<String, HashSet<String>> = HashMap::new();
    let mut delivered = 0;
    let mut last_ns = 0.0;
    let mut last_seq = 0;
    let mut gaps = 0;
    while delivered < N {
        let m = host.next();
        if let Some(seq) = m["params"]["seq"].as_i64() {
            last_seq = last_seq.max(seq);
        }
        if m["method"] == "events.gap" {
            // Fell behind: resume from the last seq seen, as a host would. Unacked prompts are
            // pushed again, so count each schedule once below.
            gaps += 1;
            host.send(
                "events.subscribe",
                json!({"session_ids": [s], "since_seq": last_seq}),
            );
            continue;
        }
        if let Some(sid) = schedule_of(&m) {
            let id = m["params"]["notification"]["id"]
                .as_str()
                .unwrap()
                .to_owned();
            let ids = per_schedule.entry(sid).or_default();
            if ids.is_empty() {
                delivered += 1;
            }
            ids.insert(id);
            last_ns = now_ns();
        }
    }
    let all_in = (last_ns - due_ns) / 1e9;
    // Read on to a sentinel armed after everything else: a second occurrence of any schedule
    // would be pushed before it.
    let sentinel = ctl.call(
        "schedule.create",
        json!({"session_id": s, "delay_ms": 0, "action": {"prompt": "sentinel"}}),
    )["schedule_id"]
        .as_str()
        .unwrap()
        .to_owned();
    loop {
        let m = host.next();
        let Some(sid) = schedule_of(&m) else {
            continue;
        };
        if sid == sentinel {
            break;
        }
        per_schedule.entry(sid).or_default().insert(
            m["params"]["notification"]["id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // And the registry's own count: every one-shot fired once and is disarmed.
    let listed = ctl.call("schedule.list", json!({"session_id": s}));
    let counted_twice = listed["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["schedule_id"] != sentinel.as_str() && x["occurrences"] != 1)
        .count();
    let duplicates = per_schedule.values().filter(|ids| ids.len() > 1).count();
    let once = per_schedule.len() == N && duplicates == 0 && counted_twice == 0;
    println!(
        "{N} occurrences due at once: all delivered {all_in:.3} s after a host subscribed ({gaps} events.gap, resubscribed); \
         {} schedules pushed, {duplicates} pushed twice, {counted_twice} not fired exactly once in the registry: {}",
        per_schedule.len(),
        if once { "each exactly once" } else { "NOT exactly once" }
    );
    println!("targets:");
    for (load, p99) in exit_lines {
        let limit = match load {
            Load::Idle => EXIT_P99_IDLE_MS,
            Load::Busy => EXIT_P99_BUSY_MS,
        };
        targets.check(
            &format!("{}: exit -> notification p99", load.name()),
            Some(p99),
            "ms",
            limit,
            false,
        );
    }
    targets.check(
        "idle: 10 000 occurrences, all delivered",
        Some(all_in),
        "s",
        BURST_TARGET_S,
        false,
    );
    if !once {
        eprintln!("FAILED: an occurrence was lost or delivered twice");
        return std::process::ExitCode::FAILURE;
    }
    targets.finish()
}

/// exit → notification on a subscribed socket, p99, on an idle machine and a busy one.
const EXIT_P99_IDLE_MS: f64 = 3.0;
const EXIT_P99_BUSY_MS: f64 = 5.0;
/// Samples per column of exit → notification.
const EXIT_SAMPLES: usize = 250;
/// 10 000 schedule occurrences due at once, all delivered.
const BURST_TARGET_S: f64 = 2.0;

/// The id of the wake of `task` (to ack it, keeping the inbox small).
fn host_last_id(ctl: &mut Conn, task: &str) -> String {
    let list = ctl.call(
        "inbox.list",
        json!({"session_id": "bench", "unread_only": true}),
    );
    list["notifications"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["task_id"] == task)
        .map(|n| n["id"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// The schedule a `notification` push of kind `schedule` is from (its text names it as
/// "(schedule <id>, ..."); `None` for any other message.
fn schedule_of(m: &Value) -> Option<String> {
    let n = &m["params"]["notification"];
    if m["method"] != "notification" || n["kind"] != "schedule" {
        return None;
    }
    let text = n["text"].as_str().unwrap();
    let sid = text
        .split("(schedule ")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .unwrap_or_else(|| panic!("a schedule's wake that names no schedule: {text}"));
    Some(sid.to_owned())
}
