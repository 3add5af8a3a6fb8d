//! `cargo bench -p sidejob --bench roundtrip`: the daemon's hot paths against a bare spawn.
//!
//! - bare: `/bin/true` spawned and reaped from this process (the floor);
//! - the bwrap line, `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc
//!   /proc /bin/true`, when bwrap is installed (what the round trip is measured against);
//! - round trip: `tool.call bash "true"` over the socket, answered inline (target: p50 ≤ 1.0×
//!   the bwrap line);
//! - exit → wait: the time from a command's last instruction to `task.wait` returning.
//!
//! Prints medians and p99 (ms) with the ratios beside them, then the target. A benchmark,
//! not a test: machines are noisy. `sidejob-sandbox-bench` measures the same against
//! `sidejob exec`, interleaved. `SIDEJOB_BIN=<path>` measures another build of the daemon.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark fails by panicking

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;
use sidejob::cli::Client;
use sidejob_tests::bench::{bwrap_installed, bwrap_line};

const N: usize = 300;

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx]
}

/// The round trip's p50 as a multiple of the bwrap line's.
const ROUND_TRIP_TARGET: f64 = 1.0;

/// One line: p50, p99 and the p50's ratio to bare and to the bwrap line.
fn report(name: &str, samples: &mut [f64], bare: f64, bwrap: Option<f64>) -> f64 {
    let p50 = percentile(samples, 0.5);
    let p99 = percentile(samples, 0.99);
    let x_bwrap = bwrap.map_or("     -".to_owned(), |b| format!("{:>6.2}", p50 / b));
    println!(
        "{name:<40} p50 {p50:>7.3} ms   p99 {p99:>7.3} ms   {:>6.2}x bare   {x_bwrap}x bwrap   (n = {})",
        p50 / bare,
        samples.len()
    );
    p50
}

struct Daemon {
    child: Child,
    root: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        sidejob_tests::remove_memory_runs_dir(&self.root.join("state"));
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn main() {
    // `SIDEJOB_BIN` measures another build (plugins beside it), for a before/after.
    let bin = std::env::var_os("SIDEJOB_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sidejob")));
    let root = std::env::temp_dir().join(format!("sidejob-bench-{}", std::process::id()));
    let socket = root.join("run").join("sidejob.sock");
    let workspace = root.join("ws");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let child = Command::new(&bin)
        .args(["serve", "--socket"])
        .arg(&socket)
        .arg("--state-dir")
        .arg(root.join("state"))
        .env("SIDEJOB_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the daemon");
    let _daemon = Daemon {
        child,
        root: root.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut client = loop {
        if let Ok(c) = Client::connect(&socket) {
            break c;
        }
        assert!(Instant::now() < deadline, "daemon did not start");
        std::thread::sleep(Duration::from_millis(5));
    };

    let mut bare: Vec<f64> = (0..N)
        .map(|_| {
            let t = Instant::now();
            Command::new("/bin/true").status().expect("spawn /bin/true");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();

    let mut bwrap: Vec<f64> = if bwrap_installed() {
        (0..N)
            .map(|_| {
                let t = Instant::now();
                let s = bwrap_line().status().expect("spawn bwrap");
                assert!(s.success(), "bwrap failed: {s}");
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect()
    } else {
        Vec::new()
    };

    let session = client
        .call(
            "session.open",
            json!({"session_id": "bench", "workspace": workspace}),
        )
        .expect("session.open")["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let call = json!({"session_id": session, "tool": "bash", "args": {"command": "true"}});
    for _ in 0..20 {
        client.call("tool.call", call.clone()).expect("warm-up");
    }
    let mut round_trip: Vec<f64> = (0..N)
        .map(|_| {
            let t = Instant::now();
            let r = client.call("tool.call", call.clone()).expect("tool.call");
            assert_eq!(r["state"], "succeeded", "{r}");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();

    // The command prints the wall clock as its last act; the wait returns after it exits.
    let mut exit_to_wait: Vec<f64> = (0..N / 3)
        .map(|_| {
            let cmd = "sleep 0.02; exec date +%s%N";
            let r = client
                .call("tool.call", json!({"session_id": session, "tool": "bash", "args": {"command": cmd}, "background": true}))
                .expect("tool.call");
            let task = r["task_id"].as_str().expect("task id").to_owned();
            let t = client.call("task.wait", json!({"task_id": task, "timeout_ms": 10_000})).expect("task.wait");
            let returned = SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_nanos() as f64;
            assert_eq!(t["state"], "succeeded", "{t}");
            let out = client.call("task.output", json!({"task_id": task})).expect("task.output");
            let printed: f64 = out["data"].as_str().expect("data").trim().parse().expect("timestamp");
            (returned - printed) / 1e6
        })
        .collect();

    println!("sidejob daemon benchmark ({N} samples each)");
    let b = percentile(&mut bare, 0.5);
    let line = (!bwrap.is_empty()).then(|| percentile(&mut bwrap, 0.5));
    report("bare /bin/true spawn", &mut bare, b, line);
    if !bwrap.is_empty() {
        report("bwrap --unshare-all ... /bin/true", &mut bwrap, b, line);
    }
    let r = report(
        "tool.call bash \"true\" round trip",
        &mut round_trip,
        b,
        line,
    );
    report(
        "process exit -> task.wait return",
        &mut exit_to_wait,
        b,
        line,
    );
    println!("target:");
    match line {
        Some(l) => println!(
            "  round trip p50 {:.2}x the bwrap line   target <= {ROUND_TRIP_TARGET}x   {}",
            r / l,
            if r / l <= ROUND_TRIP_TARGET {
                "met"
            } else {
                "MISSED"
            }
        ),
        None => println!(
            "  round trip p50 cannot be judged: bwrap is not installed (apt-get install bubblewrap)"
        ),
    }
}
