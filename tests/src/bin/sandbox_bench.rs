//! `sidejob-sandbox-bench`: the sandbox's start-up cost (README.md, Benchmarks), not a timed test.
//!
//! Runs, interleaved round by round so background noise hits all of them alike:
//! bare `/bin/true`; `sidejob exec -- /bin/true` (default profile); the bubblewrap line
//! `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc /bin/true`
//! (when `bwrap` is installed); and a foreground `true` round trip over the daemon's socket
//! (default profile). Prints medians, p90 and ratios.
//!
//! `cargo build --release -p sidejob -p sidejob-tests && target/release/sidejob-sandbox-bench [ROUNDS]`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::{sidejob_bin, Daemon, TempDir};

fn time(f: &mut dyn FnMut()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn run(cmd: &mut Command) {
    let s = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(s.success(), "{cmd:?} failed: {s}");
}

fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(v[v.len() / 2]), ms(v[v.len() * 9 / 10]))
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    // The bench binary sits next to `sidejob` (the harness expects a test's deps/ dir).
    if std::env::var_os("SIDEJOB_BIN").is_none() {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|p| p.to_path_buf()))
        {
            std::env::set_var("SIDEJOB_BIN", dir.join("sidejob"));
        }
    }
    let sidejob = sidejob_bin();
    let ws = TempDir::new("bench-ws");
    let bwrap = Command::new("bwrap")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let daemon = Daemon::start();
    let mut client = daemon.client();
    let session = daemon.open_session(&mut client);

    let names = [
        "bare /bin/true",
        "sidejob exec -- /bin/true",
        "bwrap --unshare-all … /bin/true",
        "daemon tool.call `true`",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    // One warm-up round, then the measured ones.
    for round in 0..=rounds {
        let mut t = [Duration::ZERO; 4];
        t[0] = time(&mut || run(&mut Command::new("/bin/true")));
        t[1] = time(&mut || {
            run(Command::new(&sidejob)
                .args(["exec", "--workspace"])
                .arg(ws.path())
                .args(["--", "/bin/true"]))
        });
        if bwrap {
            t[2] = time(&mut || {
                run(Command::new("bwrap").args([
                    "--unshare-all",
                    "--die-with-parent",
                    "--ro-bind",
                    "/",
                    "/",
                    "--dev",
                    "/dev",
                    "--proc",
                    "/proc",
                    "/bin/true",
                ]))
            });
        }
        t[3] = time(&mut || {
            let r = client.ok(
                "tool.call",
                json!({"session_id": session, "tool": "bash", "args": {"command": "true"}}),
            );
            assert_eq!(r["state"], "succeeded", "{r}");
        });
        if round > 0 {
            for (i, d) in t.iter().enumerate() {
                samples[i].push(*d);
            }
        }
    }
    let med: Vec<(f64, f64)> = samples
        .iter()
        .map(|s| {
            if s.iter().all(|d| d.is_zero()) {
                (f64::NAN, f64::NAN)
            } else {
                stats(s.clone())
            }
        })
        .collect();
    println!(
        "{rounds} rounds, interleaved; sidejob = {}",
        sidejob.display()
    );
    println!(
        "{:<34} {:>9} {:>9} {:>9} {:>9}",
        "", "p50 ms", "p90 ms", "× bare", "× bwrap"
    );
    for (i, name) in names.iter().enumerate() {
        let (p50, p90) = med[i];
        println!(
            "{name:<34} {p50:>9.2} {p90:>9.2} {:>9.2} {:>9.2}",
            p50 / med[0].0,
            p50 / med[2].0
        );
    }
}
