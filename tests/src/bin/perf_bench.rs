//! `sidejob-perf-bench`: the daemon under pressure, a benchmark and not a timed test. Each
//! section prints its figures beside the target it is for, `met` or `MISSED`:
//!
//! - `spawn`: 1 000 detached `sleep 60` runs submitted at once: the time until all are
//!   `running`, on an idle machine (target ≤ 1.5 s) and with two CPU burners beside it (≤ 3 s),
//!   with the CPU per run of every process, in all and by process (supervisor, init, command,
//!   spawner, daemon); the daemon's memory per running task (≤ 64 KiB) and the supervisor +
//!   init memory per run, PSS (≤ 150 KiB);
//! - `output`: 1 GiB through `output.log` against the same command writing a file inside the
//!   sandbox (≥ 0.9× as fast);
//! - `push`: 64 clients × 60 calls while one subscriber reads: settle → `task.updated`
//!   latency (p99 ≤ 50 ms) and how many final updates never came (none);
//! - `conns`: RSS after opening and closing 5 000 idle connections, six times (back within
//!   2 MiB of idle);
//! - `cycles`: RSS after each of 10 cycles of 1 000 runs then cancel (flat; idle ≤ 16 MiB).
//!
//! `cargo build --release --workspace && target/release/sidejob-perf-bench [SECTION...]`
//! (all sections when none is named). Exits 1 when a target is missed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails by panicking

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sidejob_tests::bench::{burn_if_asked, in_line, meter, Load};
use sidejob_tests::{Daemon, TempDir};

/// A raw connection: requests may be pipelined, replies and pushes read as they come.
struct Conn {
    r: BufReader<UnixStream>,
    w: UnixStream,
    id: u64,
    /// Replies read while waiting for another (handlers answer in any order).
    early: HashMap<u64, Value>,
}

impl Conn {
    fn open(d: &Daemon) -> Conn {
        let s = UnixStream::connect(&d.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
            id: 0,
            early: HashMap::new(),
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

    fn read(&mut self) -> Value {
        let mut line = String::new();
        let n = self.r.read_line(&mut line).unwrap_or_else(|e| {
            panic!(
                "no message from the daemon within 120 s ({e}); a run that cannot settle \
                 waits, so check the space left under TMPDIR"
            )
        });
        assert!(n > 0, "connection closed");
        serde_json::from_str(&line).unwrap()
    }

    /// The reply to `id` (pushes on the way are dropped; other replies kept).
    fn reply(&mut self, id: u64) -> Value {
        let m = match self.early.remove(&id) {
            Some(m) => m,
            None => loop {
                let m = self.read();
                match m["id"].as_u64() {
                    Some(got) if got == id => break m,
                    Some(other) => {
                        self.early.insert(other, m);
                    }
                    None => {}
                }
            },
        };
        assert!(m.get("error").is_none(), "{m}");
        m["result"].clone()
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params);
        self.reply(id)
    }
}

/// How many targets were missed: the bench exits 1 when any was.
static MISSED: AtomicUsize = AtomicUsize::new(0);

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        MISSED.fetch_add(1, Ordering::Relaxed);
        "MISSED"
    }
}

fn kib(path: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn rss_kib(pid: u32) -> u64 {
    kib(&format!("/proc/{pid}/status"), "VmRSS:").unwrap_or(0)
}

/// The anonymous part of the RSS (heap, stacks): what grows if memory leaks or creeps; the
/// rest is the binary's and libraries' pages, shared and read from disk.
fn anon_kib(pid: u32) -> u64 {
    kib(&format!("/proc/{pid}/status"), "RssAnon:").unwrap_or(0)
}

fn pss_kib(pid: i32) -> u64 {
    kib(&format!("/proc/{pid}/smaps_rollup"), "Pss:").unwrap_or(0)
}

/// `/proc/PID/stat` after the command name (which may hold spaces and parentheses itself).
fn stat_after_name(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.to_owned())
}

/// The CPU time `pid` has used so far (user and system), from `/proc/PID/stat`.
fn cpu_time(pid: u32) -> Duration {
    let ticks = stat_after_name(pid as i32)
        .and_then(|s| {
            let mut f = s.split_whitespace();
            // After the name: state is field 3, utime 14 and stime 15.
            let utime: u64 = f.nth(11)?.parse().ok()?;
            let stime: u64 = f.next()?.parse().ok()?;
            Some(utime + stime)
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    #[allow(unsafe_code)]
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// The time `pid` (one thread) has run on a CPU, in nanoseconds, from `/proc/PID/schedstat`.
fn run_time(pid: i32) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// [`run_time`] summed over `pids`, in milliseconds.
fn total_ms(pids: &[i32]) -> f64 {
    pids.iter()
        .map(|&p| run_time(p))
        .sum::<Duration>()
        .as_secs_f64()
        * 1000.0
}

/// The mean CPU time of `sleep 60` started bare (200 times), up to its sleep: what the
/// command's own start-up costs outside any sandbox, beside the command's share of a run.
fn bare_sleep_ms() -> f64 {
    let mut total = Duration::ZERO;
    for _ in 0..200 {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .expect("sleep 60");
        let pid = child.id() as i32;
        let wchan = format!("/proc/{pid}/wchan");
        while !std::fs::read_to_string(&wchan).is_ok_and(|w| w.contains("nanosleep")) {
            std::thread::sleep(Duration::from_micros(200));
        }
        total += run_time(pid);
        let _ = child.kill();
        let _ = child.wait();
    }
    total.as_secs_f64() * 1000.0 / 200.0
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn open_session(c: &mut Conn, ws: &std::path::Path) -> String {
    c.call("session.open", json!({ "workspace": ws }))["session_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// Submits `n` background runs of `command` at once (pipelined) and returns their ids.
fn submit(c: &mut Conn, session: &str, command: &str, n: usize) -> Vec<String> {
    let ids: Vec<u64> = (0..n)
        .map(|_| {
            c.send(
                "tool.call",
                json!({"session_id": session, "tool": "bash", "args": {"command": command},
                       "background": true, "wake": "silent"}),
            )
        })
        .collect();
    ids.into_iter()
        .map(|id| c.reply(id)["task_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Waits until `session` has `n` runs in `field` (`running`, …) per `session.status`.
fn wait_status(c: &mut Conn, session: &str, field: &str, n: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let st = c.call("session.status", json!({ "session_id": session }));
        if st[field].as_u64() == Some(n) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

fn many_runs_config() -> &'static str {
    "max_running = 4096\nmax_running_per_session = 4096\nmax_connections = 20000\n[per_user]\nrunning = 4096\nqueued = 4096\nconnections = 20000\n"
}

/// 1 000 detached sleeps all running, on an idle machine and a busy one.
fn spawn_section() {
    // Each column's daemon is stopped when it is done, but its state (3 000 files and
    // directories) is removed only after both: on a filesystem slow to allocate inodes
    // after a mass deletion (ext4 without a journal skips every inode freed in the last
    // minutes), removing the idle column's state made the busy column pay for it
    // (docs/performance.md).
    let mut done = Vec::new();
    for load in Load::BOTH {
        let limit = match load {
            Load::Idle => Duration::from_millis(1500),
            Load::Busy => Duration::from_secs(3),
        };
        let mut meter = meter(1);
        let d = in_line(&mut meter, 0, || {
            Daemon::start_with_log(many_runs_config(), "warn")
        });
        let ws = TempDir::new("perf-ws");
        let mut c = Conn::open(&d);
        let s = open_session(&mut c, ws.path());
        let idle = rss_kib(d.pid());
        let cpu_before = cpu_time(d.pid());
        let all_before = meter.as_ref().map(|m| m.used(0));
        let _burners = load.apply();
        let t = Instant::now();
        let ids = submit(&mut c, &s, "sleep 60", 1000);
        let all = wait_status(&mut c, &s, "running", 1000, Duration::from_secs(120));
        let took = t.elapsed();
        drop(_burners);
        let daemon_cpu = cpu_time(d.pid()).saturating_sub(cpu_before);
        let all_cpu = meter
            .as_ref()
            .zip(all_before)
            .map(|(m, b)| m.used(0).saturating_sub(b));
        let busy = rss_kib(d.pid());
        let tree = sidejob_tests::children_by_parent();
        let none = Vec::new();
        // The daemon's children: the supervisors (`sidejob-run`) and the spawner.
        let (supervisors, spawner): (Vec<i32>, Vec<i32>) = tree
            .get(&(d.pid() as i32))
            .unwrap_or(&none)
            .iter()
            .partition(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim_end() == "sidejob-run")
            });
        let mut pss = 0;
        let mut counted = 0;
        let (mut inits, mut commands) = (Vec::new(), Vec::new());
        for sup in &supervisors {
            pss += pss_kib(*sup);
            for init in tree.get(sup).unwrap_or(&none) {
                pss += pss_kib(*init);
                inits.push(*init);
                commands.extend(tree.get(init).unwrap_or(&none));
            }
            counted += 1;
        }
        // Every supervisor, init and command was born in the burst and has slept since, so
        // what each has run is its share; the spawner (the daemon's other child) started
        // with the first run.
        let runs = ids.len() as f64;
        let by_process = format!(
            "supervisor {:.2} · init {:.2} · command {:.2} · spawner {:.2} · daemon {:.2}",
            total_ms(&supervisors) / supervisors.len().max(1) as f64,
            total_ms(&inits) / inits.len().max(1) as f64,
            total_ms(&commands) / commands.len().max(1) as f64,
            total_ms(&spawner) / runs,
            daemon_cpu.as_secs_f64() * 1000.0 / runs,
        );
        let per_run = pss as f64 / counted.max(1) as f64;
        let per_task = busy.saturating_sub(idle) as f64 / 1000.0;
        println!("spawn ({}): 1000 detached `sleep 60`", load.name());
        println!(
            "  all running after        {:>8.2} s     target <= {} s      {}",
            took.as_secs_f64(),
            limit.as_secs_f64(),
            verdict(all && took <= limit)
        );
        // Over 1 000 runs, seconds in all are milliseconds per run.
        println!(
            "  CPU per run              {:>8.2} ms    daemon alone {:.2} ms (of the machine's {:.2} ms per run)",
            all_cpu.map_or(f64::NAN, |c| c.as_secs_f64()),
            daemon_cpu.as_secs_f64(),
            took.as_secs_f64() * cores() as f64
        );
        println!("  CPU per run by process   {by_process} ms");
        if load == Load::Idle {
            println!(
                "  `sleep 60` started bare  {:>8.2} ms    to its sleep, outside any sandbox (the command's own part of its share)",
                bare_sleep_ms()
            );
            println!(
                "  daemon memory per task   {per_task:>8.1} KiB   target <= 64 KiB     {}",
                verdict(per_task <= 64.0)
            );
            println!(
                "  supervisor+init per run  {per_run:>8.1} KiB   target <= 150 KiB    {}  (PSS, {counted} runs)",
                verdict(per_run <= 150.0)
            );
        }
        c.call("session.close", json!({"session_id": s}));
        let _ = ids;
        assert!(wait_status(
            &mut c,
            &s,
            "running",
            0,
            Duration::from_secs(120)
        ));
        drop(c);
        let mut d = d;
        d.kill9();
        done.push((d, ws));
    }
}

fn output_section() {
    let d = Daemon::start_with_log("", "warn");
    let ws = TempDir::new("perf-ws");
    let mut c = Conn::open(&d);
    let s = open_session(&mut c, ws.path());
    let run = |c: &mut Conn, command: &str| -> f64 {
        let r = c.call(
            "tool.call",
            json!({"session_id": s, "tool": "bash", "args": {"command": command},
                   "yield_after_ms": 600000}),
        );
        assert_eq!(r["state"], "succeeded", "{r}");
        r["duration_ms"].as_f64().unwrap()
    };
    let mut log = Vec::new();
    let mut file = Vec::new();
    for _ in 0..3 {
        log.push(run(&mut c, "head -c 1073741824 /dev/zero"));
        file.push(run(
            &mut c,
            "head -c 1073741824 /dev/zero > /tmp/out; rm /tmp/out",
        ));
    }
    let (l, f) = (percentile(&mut log, 0.5), percentile(&mut file, 0.5));
    let ratio = f / l;
    println!("output: 1 GiB, median of 3");
    println!(
        "  through output.log {:>8.0} ms ({:.0} MiB/s); to a file in the sandbox {:>6.0} ms",
        l,
        1024.0 / (l / 1000.0),
        f
    );
    println!(
        "  output.log speed / file speed {ratio:>6.2}x   target >= 0.9x       {}",
        verdict(ratio >= 0.9)
    );
}

fn push_section() {
    let d = Daemon::start_with_log(many_runs_config(), "warn");
    let ws = TempDir::new("perf-ws");
    let mut sub = Conn::open(&d);
    sub.call("events.subscribe", json!({}));
    // task id → when its terminal task.updated arrived.
    let arrived: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let gaps = Arc::new(Mutex::new(0u32));
    let reader = {
        let arrived = arrived.clone();
        let gaps = gaps.clone();
        std::thread::spawn(move || loop {
            let mut line = String::new();
            match sub.r.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let m: Value = serde_json::from_str(&line).unwrap();
            match m["method"].as_str() {
                Some("task.updated") => {
                    let t = &m["params"]["task"];
                    if matches!(
                        t["state"].as_str(),
                        Some("succeeded" | "failed" | "canceled")
                    ) {
                        arrived
                            .lock()
                            .unwrap()
                            .entry(t["task_id"].as_str().unwrap().to_owned())
                            .or_insert_with(Instant::now);
                    }
                }
                Some("events.gap") => *gaps.lock().unwrap() += 1,
                _ => {}
            }
        })
    };
    let replied: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let clients: Vec<_> = (0..64)
        .map(|_| {
            let mut c = Conn::open(&d);
            let s = open_session(&mut c, ws.path());
            let replied = replied.clone();
            std::thread::spawn(move || {
                for _ in 0..60 {
                    let r = c.call(
                        "tool.call",
                        json!({"session_id": s, "tool": "bash", "args": {"command": "true"}}),
                    );
                    let id = r["task_id"].as_str().unwrap().to_owned();
                    replied.lock().unwrap().insert(id, Instant::now());
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let expected: HashSet<String> = replied.lock().unwrap().keys().cloned().collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline
        && !expected
            .iter()
            .all(|id| arrived.lock().unwrap().contains_key(id))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let arrived = arrived.lock().unwrap();
    let replied = replied.lock().unwrap();
    let mut lat: Vec<f64> = replied
        .iter()
        .filter_map(|(id, t)| {
            let a = arrived.get(id)?;
            Some(a.saturating_duration_since(*t).as_secs_f64() * 1000.0)
        })
        .collect();
    let missing = expected.len() - lat.len();
    let (p50, p99) = (percentile(&mut lat, 0.5), percentile(&mut lat, 0.99));
    println!("push: 64 clients x 60 calls, one subscriber reading");
    println!(
        "  settle -> task.updated p50 {p50:>7.1} ms, p99 {p99:>7.1} ms   target p99 <= 50 ms   {}",
        verdict(p99 <= 50.0)
    );
    println!(
        "  final updates missing {missing} of {}, events.gap {}   target none   {}",
        expected.len(),
        gaps.lock().unwrap(),
        verdict(missing == 0)
    );
    drop(reader);
}

fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to an rlimit we own.
    #[allow(unsafe_code)]
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

fn conns_section() {
    raise_fd_limit();
    let d = Daemon::start_with_log(many_runs_config(), "warn");
    // Warm: one connection and call, so what is allocated once is there before idle.
    Conn::open(&d).call("initialize", json!({}));
    std::thread::sleep(Duration::from_millis(200));
    let idle = rss_kib(d.pid());
    let mut after = Vec::new();
    for _ in 0..6 {
        let mut open: Vec<Conn> = Vec::with_capacity(5000);
        for _ in 0..5000 {
            open.push(Conn::open(&d));
        }
        // Every one of them is served (the daemon has accepted them all).
        let mut last = open.pop().unwrap();
        last.call("initialize", json!({}));
        drop(open);
        drop(last);
        std::thread::sleep(Duration::from_millis(500));
        Conn::open(&d).call("initialize", json!({}));
        after.push(rss_kib(d.pid()));
    }
    let worst = after.iter().max().copied().unwrap_or(0);
    println!("conns: 5000 idle connections opened and closed, six times");
    println!(
        "  RSS idle {:.1} MiB; after each cycle {:?} MiB",
        idle as f64 / 1024.0,
        after
            .iter()
            .map(|k| (*k as f64 / 1024.0 * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "  worst over idle {:>6.1} MiB   target <= 2 MiB       {}",
        worst.saturating_sub(idle) as f64 / 1024.0,
        verdict(worst.saturating_sub(idle) <= 2048)
    );
}

fn cycles_section() {
    let d = Daemon::start_with_log(many_runs_config(), "warn");
    let ws = TempDir::new("perf-ws");
    let mut c = Conn::open(&d);
    let mut after = Vec::new();
    let mut anon = Vec::new();
    for _ in 0..10 {
        let s = open_session(&mut c, ws.path());
        submit(&mut c, &s, "sleep 600", 1000);
        assert!(wait_status(
            &mut c,
            &s,
            "running",
            1000,
            Duration::from_secs(120)
        ));
        c.call("session.close", json!({"session_id": s}));
        assert!(wait_status(
            &mut c,
            &s,
            "running",
            0,
            Duration::from_secs(120)
        ));
        std::thread::sleep(Duration::from_millis(300));
        after.push(rss_kib(d.pid()));
        anon.push(anon_kib(d.pid()));
    }
    let first = after[0];
    let last = *after.last().unwrap();
    println!("cycles: 1000 runs then cancel, ten times");
    println!(
        "  anonymous RSS after each cycle {:?} MiB",
        anon.iter()
            .map(|k| (*k as f64 / 1024.0 * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "  RSS after each cycle {:?} MiB",
        after
            .iter()
            .map(|k| (*k as f64 / 1024.0 * 10.0).round() / 10.0)
            .collect::<Vec<_>>()
    );
    println!(
        "  growth first -> last {:>6.1} MiB   target flat (<= 1 MiB)   {}",
        last.saturating_sub(first) as f64 / 1024.0,
        verdict(last.saturating_sub(first) <= 1024)
    );
    println!(
        "  idle after ten cycles {:>6.1} MiB   target <= 16 MiB        {}",
        last as f64 / 1024.0,
        verdict(last <= 16 * 1024)
    );
}

fn main() {
    burn_if_asked();
    // The bench binary sits next to `sidejob` (the harness expects a test's deps/ dir).
    if std::env::var_os("SIDEJOB_BIN").is_none() {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|p| p.to_path_buf()))
        {
            std::env::set_var("SIDEJOB_BIN", dir.join("sidejob"));
        }
    }
    let asked: Vec<String> = std::env::args().skip(1).collect();
    let all = ["spawn", "output", "push", "conns", "cycles"];
    if asked.iter().any(|a| a == "-h" || a == "--help") {
        println!(
            "usage: sidejob-perf-bench [SECTION...]   (all sections when none is named)\n\
             sections: spawn, output, push, conns, cycles (see the source's header for what each measures)\n\
             SIDEJOB_BIN: the sidejob binary to measure [default: the one beside this bench]"
        );
        return;
    }
    if let Some(a) = asked.iter().find(|a| !all.contains(&a.as_str())) {
        eprintln!("sidejob-perf-bench: unknown section {a:?}; sections: {all:?}");
        std::process::exit(2);
    }
    for section in all {
        if asked.is_empty() || asked.iter().any(|a| a == section) {
            match section {
                "spawn" => spawn_section(),
                "output" => output_section(),
                "push" => push_section(),
                "conns" => conns_section(),
                "cycles" => cycles_section(),
                _ => unreachable!(),
            }
        }
    }
    let missed = MISSED.load(Ordering::Relaxed);
    if missed > 0 {
        println!("MISSED: {missed} target(s)");
        std::process::exit(1);
    }
    println!("all targets met");
}
