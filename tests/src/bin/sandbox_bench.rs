//! `sidejob-sandbox-bench`: what the sandbox costs, a benchmark and not a timed test.
//!
//! Two sections, each measured twice: on an idle machine and with two CPU burners beside it
//! (a busy CI host), and with CPU time (user + system of every process, from a cgroup per
//! line) beside wall time, since a gain that only moves work onto an idle CPU is none on a
//! busy host.
//!
//! - `start`: rounds interleaved so background noise hits every line alike: bare `/bin/true`;
//!   `sidejob exec -- /bin/true` (default profile); the bubblewrap line `bwrap --unshare-all
//!   --die-with-parent --ro-bind / / --dev /dev --proc /proc /bin/true`; a foreground `true`
//!   round trip over a daemon's socket (default profile, logging at `warn`), and the same for
//!   `/bin/true`, which the bash tool runs without starting bash. Targets, in both columns:
//!   `sidejob exec` wall p50 and CPU per run ≤ 1.0× the bwrap line's, the round trip's wall
//!   p50 ≤ 1.0× the bwrap line's.
//! - `work`: the same work inside `sidejob exec` and outside it, interleaved: a fork/exec loop
//!   (`for i in $(seq 2000); do /bin/true; done`), a syscall-heavy Python test run
//!   (`tests/fixtures/bench/syscall_suite.py`) and a `cargo build` of a small crate (profile
//!   `rust`). Target: wall and CPU ≤ 1.03× outside.
//!
//! Exits 1 when a target is missed. With `SIDEJOB_BENCH_BASELINE=<another sidejob binary>`
//! the `start` lines are measured for that build too, in the same rounds (a change's
//! before/after, free of the machine's drift between two runs).
//!
//! `cargo build --release --workspace && target/release/sidejob-sandbox-bench [start|work]...
//! [--rounds N]`

#![allow(clippy::expect_used, clippy::unwrap_used)] // a benchmark fails by panicking

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::bench::{
    burn_if_asked, bwrap_installed, bwrap_line, in_line, meter, p50_p90, CpuMeter, Load, Targets,
};
use sidejob_tests::{sidejob_bin, Client, Daemon, TempDir};

/// `sidejob exec -- /bin/true` and the round trip, as multiples of the bwrap line.
const START_TARGET: f64 = 1.0;
/// Work inside the sandbox, as a multiple of the same work outside it.
const WORK_TARGET: f64 = 1.03;

const USAGE: &str = "usage: sidejob-sandbox-bench [start|work]... [--rounds N]\n  \
    start: the sandbox's start-up against bare and bwrap (default 200 rounds)\n  \
    work:  work inside the sandbox against outside it (default 5 rounds)\n\
    SIDEJOB_BIN: the sidejob binary to measure [default: the one beside this bench]\n\
    SIDEJOB_BENCH_BASELINE: another sidejob binary, measured in the same rounds";

fn run(cmd: &mut Command) {
    let s = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(s.success(), "{cmd:?} failed: {s}");
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

/// A foreground call of the bash tool over the daemon's socket, which must succeed.
fn round_trip(client: &mut Client, session: &str, command: &str) {
    let r = client.bash(session, command, json!({}));
    assert_eq!(r["state"], "succeeded", "{command}: {r}");
}

/// One measured line of a column: wall samples and the CPU time of all its rounds.
#[derive(Default, Clone)]
struct Line {
    wall: Vec<Duration>,
    cpu: Option<Duration>,
}

impl Line {
    fn p50(&self) -> Option<f64> {
        (!self.wall.is_empty()).then(|| p50_p90(&self.wall).0)
    }

    /// CPU per round, in milliseconds.
    fn cpu_ms(&self) -> Option<f64> {
        let n = self.wall.len();
        self.cpu
            .filter(|_| n > 0)
            .map(|c| c.as_secs_f64() * 1000.0 / n as f64)
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

fn fmt(x: Option<f64>) -> String {
    x.map_or_else(|| format!("{:>8}", "-"), |x| format!("{x:>8.2}"))
}

/// Prints a column's table: wall p50/p90, CPU per run, and both as multiples of `base`.
fn print_table(title: &str, names: &[&str], lines: &[Line], base: usize, base_name: &str) {
    println!("{title}");
    println!(
        "  {:<38} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "",
        "p50 ms",
        "p90 ms",
        format!("x {base_name}"),
        "CPU ms",
        format!("x {base_name}")
    );
    for (name, l) in names.iter().zip(lines) {
        if l.wall.is_empty() {
            continue;
        }
        let (p50, p90) = p50_p90(&l.wall);
        println!(
            "  {name:<38} {p50:>8.2} {p90:>8.2} {} {} {}",
            fmt(ratio(Some(p50), lines[base].p50())),
            fmt(l.cpu_ms()),
            fmt(ratio(l.cpu_ms(), lines[base].cpu_ms())),
        );
    }
}

/// A daemon whose processes all live in one cgroup line, and a session in it.
struct LineDaemon {
    _daemon: Daemon,
    client: Client,
    session: String,
}

fn start_daemon(meter: &mut Option<CpuMeter>, line: usize, bin: &Path) -> LineDaemon {
    let start = || {
        let ours = std::env::var_os("SIDEJOB_BIN");
        std::env::set_var("SIDEJOB_BIN", bin);
        let d = Daemon::start_with_log("", "warn");
        if let Some(o) = ours {
            std::env::set_var("SIDEJOB_BIN", o);
        }
        d
    };
    let daemon = in_line(meter, line, start);
    let mut client = daemon.client();
    let session = daemon.open_session(&mut client);
    LineDaemon {
        _daemon: daemon,
        client,
        session,
    }
}

fn start_section(rounds: usize, sidejob: &Path, baseline: Option<&PathBuf>, targets: &mut Targets) {
    const NAMES: [&str; 8] = [
        "bare /bin/true",
        "sidejob exec -- /bin/true",
        "bwrap --unshare-all … /bin/true",
        "daemon round trip `true`",
        "daemon round trip `/bin/true` (no bash)",
        "baseline: sidejob exec",
        "baseline: daemon round trip `true`",
        "sidejob exec, 20 000-file workspace",
    ];
    const BWRAP: usize = 2;
    const BIG: usize = 7;
    let ws = TempDir::new("bench-ws");
    // A root run's start looks at every file of its writable paths for set-id bits
    // (docs/security.md): a workspace the size of a small project with its build tree.
    let big = TempDir::new("bench-big-ws");
    big_workspace(big.path(), 20_000);
    let bwrap = bwrap_installed();
    let mut meter = meter(NAMES.len());
    let mut rt_true = start_daemon(&mut meter, 3, sidejob);
    let mut rt_bin = start_daemon(&mut meter, 4, sidejob);
    let mut rt_base = baseline.map(|b| start_daemon(&mut meter, 6, b));
    let exec_in = |bin: &Path, ws: &Path| {
        run(Command::new(bin)
            .args(["exec", "--workspace"])
            .arg(ws)
            .args(["--", "/bin/true"]))
    };
    let exec_true = |bin: &Path| exec_in(bin, ws.path());
    println!(
        "start: {rounds} rounds per column, interleaved; sidejob = {}",
        sidejob.display()
    );
    let mut columns = Vec::new();
    for load in Load::BOTH {
        let _burners = load.apply();
        let mut lines = vec![Line::default(); NAMES.len()];
        let mut cpu0 = vec![Duration::ZERO; NAMES.len()];
        // One warm-up round, then the measured ones.
        for round in 0..=rounds {
            if round == 1 {
                if let Some(m) = &meter {
                    for (i, c) in cpu0.iter_mut().enumerate() {
                        *c = m.used(i);
                    }
                }
            }
            let mut t: [Option<Duration>; NAMES.len()] = [None; NAMES.len()];
            let mut measure = |i: usize, f: &mut dyn FnMut()| {
                t[i] = Some(in_line(&mut meter, i, || time(f)));
            };
            // This build and the baseline take turns going first: a line pays for what the
            // line before it left to the kernel (deferred frees, RCU callbacks run in
            // whichever process is current), which made the first of the two measure about
            // 5 % more CPU whichever build it was.
            let this_first = round % 2 == 0;
            measure(0, &mut || run(&mut Command::new("/bin/true")));
            for this in [this_first, !this_first] {
                match (this, baseline) {
                    (true, _) => measure(1, &mut || exec_true(sidejob)),
                    (false, Some(b)) => measure(5, &mut || exec_true(b)),
                    (false, None) => {}
                }
            }
            if bwrap {
                measure(BWRAP, &mut || run(&mut bwrap_line()));
            }
            for this in [this_first, !this_first] {
                match (this, rt_base.as_mut()) {
                    (true, _) => measure(3, &mut || {
                        round_trip(&mut rt_true.client, &rt_true.session, "true")
                    }),
                    (false, Some(d)) => {
                        measure(6, &mut || round_trip(&mut d.client, &d.session, "true"))
                    }
                    (false, None) => {}
                }
            }
            measure(4, &mut || {
                round_trip(&mut rt_bin.client, &rt_bin.session, "/bin/true")
            });
            measure(BIG, &mut || exec_in(sidejob, big.path()));
            if round > 0 {
                for (l, d) in lines.iter_mut().zip(t) {
                    l.wall.extend(d);
                }
            }
        }
        drop(_burners);
        if let Some(m) = &meter {
            // What the runs left to finish after they were waited for is theirs too.
            for i in [0, 1, BWRAP, 5, BIG] {
                m.settle(i);
            }
            std::thread::sleep(Duration::from_millis(200));
            for (i, l) in lines.iter_mut().enumerate() {
                l.cpu = Some(m.used(i).saturating_sub(cpu0[i]));
            }
        }
        print_table(
            &format!(
                "{} (CPU: user + system of every process of the line)",
                load.name()
            ),
            &NAMES,
            &lines,
            BWRAP,
            "bwrap",
        );
        columns.push((load, lines));
    }
    if baseline.is_some() {
        println!("this build against the baseline, p50 wall and CPU per run:");
        for (load, lines) in &columns {
            for (ours, theirs, what) in [(1, 5, "sidejob exec"), (3, 6, "daemon round trip")] {
                println!(
                    "  {:<5} {what:<20} wall {}x   CPU {}x",
                    load.name(),
                    fmt(ratio(lines[ours].p50(), lines[theirs].p50())),
                    fmt(ratio(lines[ours].cpu_ms(), lines[theirs].cpu_ms())),
                );
            }
        }
    }
    println!("targets (as multiples of the bwrap line):");
    for (load, lines) in &columns {
        let l = load.name();
        let line = &lines[BWRAP];
        targets.check(
            &format!("{l}: sidejob exec wall p50"),
            ratio(lines[1].p50(), line.p50()),
            "x",
            START_TARGET,
            false,
        );
        targets.check(
            &format!("{l}: sidejob exec CPU per run"),
            ratio(lines[1].cpu_ms(), line.cpu_ms()),
            "x",
            START_TARGET,
            false,
        );
        targets.check(
            &format!("{l}: daemon round trip wall p50"),
            ratio(lines[3].p50(), line.p50()),
            "x",
            START_TARGET,
            false,
        );
    }
}

/// `files` small files in directories of 100, as a source and build tree has them.
fn big_workspace(dir: &Path, files: usize) {
    for i in 0..files {
        let sub = dir.join(format!("d{}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&sub).expect("workspace dir");
        }
        std::fs::write(sub.join(format!("f{i}")), b"x").expect("workspace file");
    }
}

/// A small crate with no dependencies, for the `cargo build` line.
fn small_crate(dir: &Path) {
    std::fs::create_dir_all(dir.join("src")).expect("crate dir");
    std::fs::write(
        dir.join("Cargo.toml"),
        "[package]\nname = \"bench-crate\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .expect("Cargo.toml");
    let mut main = String::from("mod m;\nfn main() { println!(\"{}\", m::total()); }\n");
    let mut m = String::new();
    for i in 0..60 {
        m.push_str(&format!(
            "#[derive(Debug, Clone, PartialEq)]\npub struct S{i} {{ pub a: Vec<String>, pub b: std::collections::HashMap<u32, String> }}\n\
             impl S{i} {{ pub fn new() -> Self {{ let mut b = std::collections::HashMap::new(); b.insert({i}, format!(\"{{}}\", {i})); S{i} {{ a: vec![\"x\".repeat({i})], b }} }} }}\n"
        ));
    }
    m.push_str("pub fn total() -> usize { 0");
    for i in 0..60 {
        m.push_str(&format!(
            " + S{i}::new().a[0].len() + format!(\"{{:?}}\", S{i}::new()).len()"
        ));
    }
    m.push_str(" }\n");
    main.push('\n');
    std::fs::write(dir.join("src/main.rs"), main).expect("main.rs");
    std::fs::write(dir.join("src/m.rs"), m).expect("m.rs");
}

fn work_section(rounds: usize, sidejob: &Path, targets: &mut Targets) {
    let ws = TempDir::new("bench-work");
    let suite = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bench/syscall_suite.py");
    std::fs::copy(&suite, ws.path().join("syscall_suite.py")).expect("copy the suite");
    let krate = ws.path().join("crate");
    small_crate(&krate);
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let cargo_path = format!("{home}/.cargo/bin:/usr/local/bin:/usr/bin:/bin");
    let has_cargo = Command::new(format!("{home}/.cargo/bin/cargo"))
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // Each workload: a name, a profile, and the command run in the workspace.
    let mut works: Vec<(&str, &str, String)> = vec![
        (
            "fork/exec: 2000 x /bin/true",
            "workspace-write",
            "for i in $(seq 2000); do /bin/true; done".into(),
        ),
        (
            "python: syscall_suite.py",
            "workspace-write",
            "/usr/bin/python3 syscall_suite.py -q".into(),
        ),
    ];
    if has_cargo {
        works.push((
            "cargo build (small crate, offline)",
            "rust",
            "cd crate && rm -rf target && cargo build --offline -q".into(),
        ));
    } else {
        println!("cargo build not measured: no {home}/.cargo/bin/cargo");
    }
    let mut meter = meter(works.len() * 2);
    println!(
        "work: {rounds} rounds per column, interleaved; sidejob = {}",
        sidejob.display()
    );
    for load in Load::BOTH {
        let _burners = load.apply();
        let mut lines = vec![Line::default(); works.len() * 2];
        let mut cpu0 = vec![Duration::ZERO; lines.len()];
        for round in 0..=rounds {
            if round == 1 {
                if let Some(m) = &meter {
                    for (i, c) in cpu0.iter_mut().enumerate() {
                        *c = m.used(i);
                    }
                }
            }
            for (w, (_, profile, cmd)) in works.iter().enumerate() {
                let outside = || {
                    run(Command::new("/bin/bash")
                        .args(["-c", cmd])
                        .current_dir(ws.path())
                        .env("PATH", &cargo_path))
                };
                let inside = || {
                    run(Command::new(sidejob)
                        .args(["exec", "--profile", profile, "--workspace"])
                        .arg(ws.path())
                        .args(["--", "/bin/bash", "-c", cmd])
                        .current_dir(ws.path()))
                };
                for (i, f) in [(2 * w, &outside as &dyn Fn()), (2 * w + 1, &inside)] {
                    let d = in_line(&mut meter, i, || time(f));
                    if round > 0 {
                        lines[i].wall.push(d);
                    }
                }
            }
        }
        drop(_burners);
        if let Some(m) = &meter {
            for (i, l) in lines.iter_mut().enumerate() {
                m.settle(i);
                l.cpu = Some(m.used(i).saturating_sub(cpu0[i]));
            }
        }
        let names: Vec<String> = works
            .iter()
            .flat_map(|(n, _, _)| [format!("{n}, outside"), format!("{n}, in sidejob exec")])
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        println!(
            "{} (x outside: each workload against its own outside line)",
            load.name()
        );
        for (w, (name, _, _)) in works.iter().enumerate() {
            let pair = [lines[2 * w].clone(), lines[2 * w + 1].clone()];
            print_table(
                &format!("  {name}"),
                &names[2 * w..2 * w + 2],
                &pair,
                0,
                "out",
            );
            let l = load.name();
            targets.check(
                &format!("{l}: {name}: wall"),
                ratio(pair[1].p50(), pair[0].p50()),
                "x",
                WORK_TARGET,
                false,
            );
            targets.check(
                &format!("{l}: {name}: CPU"),
                ratio(pair[1].cpu_ms(), pair[0].cpu_ms()),
                "x",
                WORK_TARGET,
                false,
            );
        }
    }
}

fn main() -> std::process::ExitCode {
    burn_if_asked();
    let mut sections = Vec::new();
    let mut rounds: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-h" | "--help" => {
                println!("{USAGE}");
                return std::process::ExitCode::SUCCESS;
            }
            "--rounds" => match args.next().and_then(|n| n.parse().ok()) {
                Some(n) if n > 0 => rounds = Some(n),
                _ => {
                    eprintln!("sidejob-sandbox-bench: --rounds takes a positive number\n{USAGE}");
                    std::process::exit(2);
                }
            },
            "start" | "work" => sections.push(a),
            _ => {
                eprintln!("sidejob-sandbox-bench: unknown argument {a:?}\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    if sections.is_empty() {
        sections = vec!["start".into(), "work".into()];
    }
    // The bench binary sits next to `sidejob` (the harness expects a test's deps/ dir).
    if std::env::var_os("SIDEJOB_BIN").is_none() {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(Path::to_path_buf))
        {
            std::env::set_var("SIDEJOB_BIN", dir.join("sidejob"));
        }
    }
    let sidejob = sidejob_bin();
    let baseline = std::env::var_os("SIDEJOB_BENCH_BASELINE").map(PathBuf::from);
    // `sidejob exec` keeps a profile's caches in its state directory (root's is
    // /var/lib/sidejob): the bench's go to one of its own, removed at the end.
    let state = std::env::var_os("SIDEJOB_STATE_DIR")
        .is_none()
        .then(|| TempDir::new("bench-state"));
    if let Some(dir) = &state {
        std::env::set_var("SIDEJOB_STATE_DIR", dir.path());
    }
    let mut targets = Targets::default();
    for s in &sections {
        match s.as_str() {
            "start" => start_section(
                rounds.unwrap_or(200),
                &sidejob,
                baseline.as_ref(),
                &mut targets,
            ),
            _ => work_section(rounds.unwrap_or(5), &sidejob, &mut targets),
        }
    }
    targets.finish()
}
