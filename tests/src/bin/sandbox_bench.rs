//! `sidejob-sandbox-bench`: the sandbox's start-up cost, a benchmark and not a timed test.
//!
//! Runs, interleaved round by round so background noise hits all of them alike:
//! bare `/bin/true`; `sidejob exec -- /bin/true` (default profile); the bubblewrap line
//! `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc /proc /bin/true`
//! (when `bwrap` is installed); and a foreground `true` round trip over the daemon's socket
//! (default profile, the daemon logging at `warn` as it would in use), and the same round trip
//! for `/bin/true`, which the bash tool runs without starting bash (its one-shot path): the
//! difference between the two is bash's own start-up. Prints medians, p90
//! and the ratios to bare and to bwrap side by side, then each figure against its target:
//! `sidejob exec` p50 ≤ 0.9× the bwrap line, the round trip p50 ≤ 1.0× the bwrap line.
//!
//! With `SIDEJOB_BENCH_BASELINE=<another sidejob binary>` the same two rows are measured for
//! that build too, in the same rounds, and the cost of one build over the other is printed
//! (a change's before/after, free of the machine's drift between two runs).
//!
//! `cargo build --release --workspace && target/release/sidejob-sandbox-bench [ROUNDS]`

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::{sidejob_bin, Client, Daemon, TempDir};

/// `sidejob exec -- /bin/true` p50, as a multiple of the bwrap line's p50.
const EXEC_TARGET: f64 = 0.9;
/// A foreground `true` round trip over the socket, p50, as a multiple of the bwrap line's.
const ROUND_TRIP_TARGET: f64 = 1.0;

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

/// `sidejob exec -- /bin/true` with `sidejob` binary `bin`, the workspace `ws`.
fn exec_true(bin: &std::path::Path, ws: &std::path::Path) {
    run(Command::new(bin)
        .args(["exec", "--workspace"])
        .arg(ws)
        .args(["--", "/bin/true"]));
}

/// A foreground call of the bash tool over the daemon's socket, which must succeed.
fn round_trip(client: &mut Client, session: &str, command: &str) {
    let r = client.bash(session, command, json!({}));
    assert_eq!(r["state"], "succeeded", "{command}: {r}");
}

/// (p50, p90) in milliseconds.
fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (ms(v[v.len() / 2]), ms(v[v.len() * 9 / 10]))
}

fn main() {
    let rounds: usize = match std::env::args().nth(1) {
        None => 200,
        Some(a) => match a.parse::<usize>() {
            Ok(n) if n > 0 => n,
            _ => {
                let usage = "usage: sidejob-sandbox-bench [ROUNDS]   (default 200)\n\
                     SIDEJOB_BIN: the sidejob binary to measure [default: the one beside this bench]\n\
                     SIDEJOB_BENCH_BASELINE: another sidejob binary, measured in the same rounds";
                if a == "-h" || a == "--help" {
                    println!("{usage}");
                    std::process::exit(0);
                }
                eprintln!("sidejob-sandbox-bench: {a:?} is not a number of rounds\n{usage}");
                std::process::exit(2);
            }
        },
    };
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
    let daemon = Daemon::start_with_log("", "warn");
    let mut client = daemon.client();
    let session = daemon.open_session(&mut client);
    // The baseline build's daemon, started from its own binary (the harness reads SIDEJOB_BIN).
    let baseline = std::env::var_os("SIDEJOB_BENCH_BASELINE").map(std::path::PathBuf::from);
    let base_daemon = baseline.as_ref().map(|b| {
        let ours = std::env::var_os("SIDEJOB_BIN");
        std::env::set_var("SIDEJOB_BIN", b);
        let d = Daemon::start_with_log("", "warn");
        if let Some(o) = ours {
            std::env::set_var("SIDEJOB_BIN", o);
        }
        d
    });
    let mut base_client = base_daemon.as_ref().map(|d| {
        let mut c = d.client();
        let s = d.open_session(&mut c);
        (c, s)
    });

    let names = [
        "bare /bin/true",
        "sidejob exec -- /bin/true",
        "bwrap --unshare-all … /bin/true",
        "daemon tool.call `true` round trip",
        "baseline: sidejob exec",
        "baseline: daemon round trip",
        "round trip `/bin/true` (no bash)",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    // One warm-up round, then the measured ones.
    for round in 0..=rounds {
        let mut t = [None; 7];
        t[0] = Some(time(&mut || run(&mut Command::new("/bin/true"))));
        t[1] = Some(time(&mut || exec_true(&sidejob, ws.path())));
        if bwrap {
            t[2] = Some(time(&mut || {
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
            }));
        }
        t[3] = Some(time(&mut || {
            round_trip(&mut client, &session, "true");
        }));
        t[6] = Some(time(&mut || {
            round_trip(&mut client, &session, "/bin/true");
        }));
        if let (Some(b), Some((bc, bs))) = (&baseline, base_client.as_mut()) {
            t[4] = Some(time(&mut || exec_true(b, ws.path())));
            t[5] = Some(time(&mut || {
                round_trip(bc, bs, "true");
            }));
        }
        if round > 0 {
            for (i, d) in t.iter().enumerate() {
                if let Some(d) = d {
                    samples[i].push(*d);
                }
            }
        }
    }
    let measured: Vec<Option<(f64, f64)>> = samples
        .iter()
        .map(|s| (!s.is_empty()).then(|| stats(s.clone())))
        .collect();
    let bare = measured[0].map(|m| m.0);
    let line = measured[2].map(|m| m.0);
    println!(
        "{rounds} rounds, interleaved; sidejob = {}",
        sidejob.display()
    );
    println!(
        "{:<36} {:>9} {:>9} {:>9} {:>9}",
        "", "p50 ms", "p90 ms", "x bare", "x bwrap"
    );
    let ratio = |p50: f64, base: Option<f64>| match base {
        Some(b) => format!("{:>9.2}", p50 / b),
        None => format!("{:>9}", "-"),
    };
    for (i, name) in names.iter().enumerate() {
        if (4..6).contains(&i) && baseline.is_none() {
            continue;
        }
        match measured[i] {
            Some((p50, p90)) => println!(
                "{name:<36} {p50:>9.2} {p90:>9.2} {} {}",
                ratio(p50, bare),
                ratio(p50, line)
            ),
            None => println!(
                "{name:<36} not measured: bwrap is not installed (apt-get install bubblewrap)"
            ),
        }
    }
    if let Some(b) = &baseline {
        println!("this build against the baseline ({}), p50:", b.display());
        for (ours, theirs, what) in [(1, 4, "sidejob exec"), (3, 5, "daemon round trip")] {
            if let (Some((a, _)), Some((z, _))) = (measured[ours], measured[theirs]) {
                println!("  {what:<34} {:>6.2}x ({:+.2} ms)", a / z, a - z);
            }
        }
    }
    println!("targets (p50 as a multiple of the bwrap line's p50):");
    for (i, what, limit) in [
        (1, "sidejob exec -- /bin/true", EXEC_TARGET),
        (3, "daemon round trip", ROUND_TRIP_TARGET),
    ] {
        match (measured[i], line) {
            (Some((p50, _)), Some(b)) => println!(
                "  {what:<34} {:>6.2}x   target <= {limit}x   {}",
                p50 / b,
                if p50 / b <= limit { "met" } else { "MISSED" }
            ),
            _ => println!(
                "  {what:<34} cannot be judged: the bwrap line was not measured (install bubblewrap)"
            ),
        }
    }
}
