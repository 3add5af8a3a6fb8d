//! What the bench binaries share: the busy column (two CPU burners beside the measurement),
//! CPU time per line from a cgroup of its own, medians, and targets that make the bench exit
//! non-zero when one is missed.
//!
//! CPU time is every process's user + system time, read from the `cpu.stat` of a cgroup v2
//! the line's processes run in (the bench moves itself into it before it starts them, so they
//! and whatever they start are born there, the daemon's supervisors included). A cgroup's
//! figure is read once the line's processes are gone, so work a process leaves to the kernel
//! or to a helper after it has been waited for (a memory map torn down later, on another CPU)
//! is counted too. Without a writable cgroup v2 hierarchy the CPU columns say why they are
//! empty.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The two columns every bench prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Load {
    /// Nothing else runs on purpose.
    Idle,
    /// Two processes spin beside the measurement (one per CPU of the 2-core machines these
    /// benches are written for): what a CI host or a busy agent box is like.
    Busy,
}

impl Load {
    pub const BOTH: [Load; 2] = [Load::Idle, Load::Busy];

    pub fn name(self) -> &'static str {
        match self {
            Load::Idle => "idle",
            Load::Busy => "busy",
        }
    }

    /// Starts what makes the machine busy; it stops when the guard is dropped.
    pub fn apply(self) -> Burners {
        let n = match self {
            Load::Idle => 0,
            Load::Busy => 2,
        };
        Burners::start(n)
    }
}

/// Processes that spin until dropped. Each is this binary run with `--burn`, which every bench
/// binary passes to [`burn_if_asked`] first thing.
pub struct Burners(Vec<Child>);

impl Burners {
    fn start(n: usize) -> Burners {
        let exe = std::env::current_exe().expect("the bench's own path");
        Burners(
            (0..n)
                .map(|_| {
                    Command::new(&exe)
                        .arg("--burn")
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start a CPU burner")
                })
                .collect(),
        )
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Call first in `main`: with `--burn` this process is a burner, spinning until killed.
pub fn burn_if_asked() {
    if std::env::args().nth(1).as_deref() == Some("--burn") {
        let mut x: u64 = 1;
        loop {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
}

/// A cgroup v2 directory per measured line, under a `sidejob-bench-<pid>` child of the cgroup
/// this process is in; removed on drop.
pub struct CpuMeter {
    root: PathBuf,
    /// Where this process waits when it is not starting a line's processes.
    home: PathBuf,
    lines: Vec<PathBuf>,
}

impl CpuMeter {
    /// `None`, with the reason, when there is no cgroup v2 hierarchy this process can write.
    pub fn new(lines: usize) -> Result<CpuMeter, String> {
        let mount = cgroup2_mount().ok_or("no cgroup2 file system is mounted")?;
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| format!("/proc/self/cgroup: {e}"))?
            .lines()
            .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
            .ok_or("this process has no cgroup v2 path")?;
        let root = mount
            .join(own.trim_start_matches('/'))
            .join(format!("sidejob-bench-{}", std::process::id()));
        std::fs::create_dir(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let mut meter = CpuMeter {
            home: root.join("home"),
            lines: (0..lines).map(|i| root.join(format!("line-{i}"))).collect(),
            root,
        };
        for d in std::iter::once(&meter.home).chain(&meter.lines) {
            std::fs::create_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        if !meter.home.join("cpu.stat").exists() {
            return Err("the cgroup has no cpu.stat (kernel older than 4.20?)".into());
        }
        meter.enter_home();
        Ok(meter)
    }

    /// Runs `f` with this process in line `i`'s cgroup: whatever it starts is born there.
    pub fn in_line<T>(&mut self, i: usize, f: impl FnOnce() -> T) -> T {
        move_self(&self.lines[i]);
        let r = f();
        self.enter_home();
        r
    }

    fn enter_home(&mut self) {
        move_self(&self.home);
    }

    /// Line `i`'s CPU time so far (user + system of every process that ran in it).
    pub fn used(&self, i: usize) -> Duration {
        usage(&self.lines[i])
    }

    /// Waits (up to 10 s) until no process is left in line `i`, so that `used` is final.
    pub fn settle(&self, i: usize) {
        wait_empty(&self.lines[i]);
    }
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        // Back where this process came from, then the directories (empty once their
        // processes are gone; a line still holding one is left behind, and says so).
        if let Some(parent) = self.root.parent() {
            move_self(parent);
        }
        for d in self.lines.iter().chain(std::iter::once(&self.home)) {
            wait_empty(d);
            if let Err(e) = std::fs::remove_dir(d) {
                eprintln!("bench: could not remove {}: {e}", d.display());
            }
        }
        let _ = std::fs::remove_dir(&self.root);
    }
}

/// A meter of `lines` lines, or `None` after saying why CPU time is not measured.
pub fn meter(lines: usize) -> Option<CpuMeter> {
    CpuMeter::new(lines)
        .map_err(|e| println!("CPU time not measured: {e}"))
        .ok()
}

/// Runs `f` in line `i` of `meter`, or as it is where there is none.
pub fn in_line<T>(meter: &mut Option<CpuMeter>, i: usize, f: impl FnOnce() -> T) -> T {
    match meter {
        Some(m) => m.in_line(i, f),
        None => f(),
    }
}

/// Whether `bwrap` runs here (the lines the benches compare against need it).
pub fn bwrap_installed() -> bool {
    Command::new("bwrap")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The bwrap line: `bwrap --unshare-all --die-with-parent --ro-bind / / --dev /dev --proc
/// /proc /bin/true`, what sidejob's start-up is measured against.
pub fn bwrap_line() -> Command {
    let mut c = Command::new("bwrap");
    c.args([
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
    ]);
    c
}

/// Waits up to 10 s for a cgroup to hold no process (polling: a bench, not the product).
fn wait_empty(d: &Path) {
    let procs = d.join("cgroup.procs");
    for _ in 0..1000 {
        if std::fs::read_to_string(&procs).is_ok_and(|s| s.trim().is_empty()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn move_self(dir: &Path) {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join("cgroup.procs"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    write!(f, "{}", std::process::id()).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
}

fn usage(dir: &Path) -> Duration {
    let stat = std::fs::read_to_string(dir.join("cpu.stat")).expect("cpu.stat");
    let usec = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
        .expect("usage_usec in cpu.stat");
    Duration::from_micros(usec)
}

fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        left.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// The median and the 90th percentile, in milliseconds.
pub fn p50_p90(v: &[Duration]) -> (f64, f64) {
    let mut v = v.to_vec();
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    (
        ms(v[v.len() / 2]),
        ms(v[(v.len() * 9 / 10).min(v.len() - 1)]),
    )
}

/// A percentile (0.0–1.0) of `v`, in milliseconds.
pub fn percentile_ms(v: &[Duration], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort();
    let idx = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[idx].as_secs_f64() * 1000.0
}

/// Targets checked as they are printed; `finish` exits 1 if any was missed.
#[derive(Default)]
pub struct Targets {
    missed: Vec<String>,
    unjudged: usize,
}

impl Targets {
    /// Prints `what`, its figure, and whether it met `≤ limit` (or `≥ limit` with `at_least`).
    pub fn check(
        &mut self,
        what: &str,
        figure: Option<f64>,
        unit: &str,
        limit: f64,
        at_least: bool,
    ) {
        let op = if at_least { ">=" } else { "<=" };
        match figure {
            Some(x) => {
                let met = if at_least { x >= limit } else { x <= limit };
                println!(
                    "  {what:<52} {x:>8.2}{unit:<3} target {op} {limit}{unit}   {}",
                    if met { "met" } else { "MISSED" }
                );
                if !met {
                    self.missed.push(what.to_owned());
                }
            }
            None => {
                println!("  {what:<52} not measured");
                self.unjudged += 1;
            }
        }
    }

    /// The bench's exit status: 1 when a target was missed, 0 otherwise (an unmeasured target
    /// is reported). Returned from `main`, not exited with, so that the daemons and
    /// directories the bench made are dropped first (an exit left them running).
    pub fn finish(self) -> std::process::ExitCode {
        if self.unjudged > 0 {
            println!(
                "{} target(s) could not be judged (see above)",
                self.unjudged
            );
        }
        if self.missed.is_empty() {
            println!("all measured targets met");
            return std::process::ExitCode::SUCCESS;
        }
        println!("MISSED: {}", self.missed.join("; "));
        std::process::ExitCode::FAILURE
    }
}
