//! `sidejob-egress-bench`: what a network allow-list costs, not a timed test.
//!
//! - `sidejob exec -- /bin/true` under a profile with `network = "none"` and under the same
//!   profile with an allow-list (the relay is bound and started, the proxy process forked);
//! - a foreground `true` round trip over the daemon's socket, in a session of each profile;
//! - a 1 GiB download from a loopback server by curl: from a run whose network is the host's
//!   (direct), and from an allow-list run through the relay and the proxy, on an idle machine
//!   and with two CPU burners beside it; curl's own `time_total` is used, so the sandbox's
//!   start-up is not in it. Target: through the proxy ≥ 0.8× direct. The CPU per GiB of every
//!   process of each line is printed beside it (what the relay and the proxy add). Exits 1
//!   when the target is missed;
//! - the same download through a bare relay (this binary with `--relay`: two loopback
//!   connections joined by `splice(2)`, deciding nothing), from a run on the host's network:
//!   what any proxy costs on this machine for the second connection alone, so that the
//!   proxy's own part (proxy ÷ bare relay) is told apart from the hop every proxy adds.
//!
//! Rounds are interleaved so background noise hits both sides alike. Prints medians and p90.
//!
//! `cargo build --release -p sidejob -p sidejob-tests && target/release/sidejob-egress-bench [ROUNDS]`

#![allow(clippy::expect_used)] // a benchmark fails by panicking

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::bench::{burn_if_asked, in_line, meter, CpuMeter, Load, Targets};
use sidejob_tests::net::HttpServer;
use sidejob_tests::{sidejob_bin, Daemon, TempDir};

const DOWNLOAD: u64 = 1 << 30;

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[v.len() * 9 / 10])
}

/// The three routes of the download: straight to the server, through sidejob's egress proxy,
/// and through the bare relay.
#[derive(Clone, Copy)]
enum Route {
    Direct,
    Proxy,
    Relay,
}

impl Route {
    const ALL: [Route; 3] = [Route::Direct, Route::Proxy, Route::Relay];
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn exec(profile: &str, ws: &std::path::Path, cmd: &[&str]) -> (Duration, String) {
    let t = Instant::now();
    let out = Command::new(sidejob_bin())
        .args(["exec", "--profile", profile, "--workspace"])
        .arg(ws)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("sidejob exec");
    let took = t.elapsed();
    assert!(out.status.success(), "{cmd:?} under {profile} failed");
    (took, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `--relay PORT`: accepts one connection on a loopback port it prints, connects it to
/// `127.0.0.1:PORT`, moves the bytes both ways with `splice(2)` through a 1 MiB pipe (as the
/// egress proxy does, without its policy or its event loop) and exits when both ends are done.
fn relay_if_asked() {
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() != Some("--relay") {
        return;
    }
    let upstream: u16 = args
        .next()
        .and_then(|p| p.parse().ok())
        .expect("--relay PORT");
    // A bench that fails before the download connects must not leave the relay waiting.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).expect("parent-death signal");
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
    println!("{}", listener.local_addr().expect("relay address").port());
    let (client, _) = listener.accept().expect("accept");
    let server = TcpStream::connect(("127.0.0.1", upstream)).expect("connect upstream");
    let (c, s) = (
        client.try_clone().expect("dup"),
        server.try_clone().expect("dup"),
    );
    let up = std::thread::spawn(move || pump(&c, &s));
    pump(&server, &client);
    up.join().expect("the relay's other direction");
    std::process::exit(0);
}

fn pump(from: &TcpStream, to: &TcpStream) {
    use nix::fcntl::{fcntl, splice, FcntlArg, SpliceFFlags};
    const PIPE: usize = 1 << 20;
    let (r, w) = nix::unistd::pipe().expect("pipe");
    let _ = fcntl(&w, FcntlArg::F_SETPIPE_SZ(PIPE as i32));
    let flags = SpliceFFlags::SPLICE_F_MOVE;
    while let Ok(n @ 1..) = splice(from, None, &w, None, PIPE, flags) {
        let mut left = n;
        while left > 0 {
            match splice(&r, None, to, None, left, flags) {
                Ok(k @ 1..) => left -= k,
                _ => return,
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

const USAGE: &str = "usage: sidejob-egress-bench [ROUNDS]   (default 100)
Measures what a network allow-list costs: exec and round trip with and without one, and a
1 GiB loopback download direct, through the egress proxy and through a bare relay, idle and
with two CPU burners (target: through the proxy >= 0.8x direct). Exits 1 on a missed target.
SIDEJOB_BIN: the sidejob binary to measure [default: the one beside this bench]";

fn main() -> std::process::ExitCode {
    burn_if_asked();
    relay_if_asked();
    let rounds: usize = match std::env::args().nth(1).as_deref() {
        None => 100,
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Some(a) => match a.parse() {
            Ok(n) if n > 0 => n,
            _ => {
                eprintln!("sidejob-egress-bench: {a:?} is not a number of rounds\n{USAGE}");
                return std::process::ExitCode::from(2);
            }
        },
    };
    if std::env::var_os("SIDEJOB_BIN").is_none() {
        if let Some(dir) = std::env::current_exe()
            .ok()
            .and_then(|e| e.parent().map(|p| p.to_path_buf()))
        {
            std::env::set_var("SIDEJOB_BIN", dir.join("sidejob"));
        }
    }
    let srv = HttpServer::start();
    let port = srv.port;
    let profiles = TempDir::new("bench-profiles");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(profiles.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let write = |name: &str, body: &str| {
        let p = profiles.path().join(format!("{name}.toml"));
        std::fs::write(&p, body).expect("profile");
        p.display().to_string()
    };
    let none = write(
        "bench-none",
        "extends = \"workspace-write\"\nnetwork = \"none\"\n",
    );
    let allow = write(
        "bench-allow",
        &format!("extends = \"workspace-write\"\n[network]\nallow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}\n"),
    );
    let host = write(
        "bench-host",
        "extends = \"workspace-write\"\nnetwork = \"host\"\n",
    );
    let ws = TempDir::new("bench-ws");

    // exec: start-up with and without the allow-list.
    let (mut e_none, mut e_allow) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        e_none.push(ms(exec(&none, ws.path(), &["/bin/true"]).0));
        e_allow.push(ms(exec(&allow, ws.path(), &["/bin/true"]).0));
    }

    // The first request of a run through the proxy (for exec, this includes starting it).
    let mut first = Vec::new();
    for _ in 0..rounds.min(50) {
        let (_, out) = exec(
            &allow,
            ws.path(),
            &[
                "sh",
                "-c",
                &format!(
                    "curl -sS -o /dev/null -w '%{{time_total}}' http://models.test:{port}/first"
                ),
            ],
        );
        first.push(out.trim().parse::<f64>().expect("time_total") * 1000.0);
    }

    // Round trips through the daemon.
    let daemon = Daemon::start_with_config(&format!(
        "profiles_dir = \"{}\"\n",
        profiles.path().display()
    ));
    let mut c = daemon.client();
    let open = |c: &mut sidejob_tests::Client, p: &str| {
        c.ok(
            "session.open",
            json!({"workspace": daemon.workspace, "profile": p}),
        )["session_id"]
            .as_str()
            .expect("session")
            .to_owned()
    };
    let s_none = open(&mut c, "bench-none");
    let s_allow = open(&mut c, "bench-allow");
    let (mut r_none, mut r_allow) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (s, v) in [(&s_none, &mut r_none), (&s_allow, &mut r_allow)] {
            let t = Instant::now();
            let r = c.bash(s, "true", json!({"yield_after_ms": 60_000}));
            v.push(ms(t.elapsed()));
            assert_eq!(r["state"], "succeeded", "{r}");
        }
    }

    // Throughput: 1 GiB from the loopback server, direct, through the proxy and through the
    // bare relay, idle and busy, with the CPU of every process of each line (curl, the run's
    // relay, the proxy or the bare relay, sidejob exec; and the bench's own server, which is
    // in the line being measured while it serves).
    let mut meter = meter(3);
    let curl = |meter: &mut Option<CpuMeter>, route: Route| {
        let get = |url: String, profile: &str| {
            let script =
                format!("curl -sS -o /dev/null -w '%{{time_total}} %{{size_download}}' {url}");
            exec(profile, ws.path(), &["sh", "-c", &script]).1
        };
        let out = in_line(meter, route as usize, || match route {
            Route::Direct => get(format!("http://127.0.0.1:{port}/bytes/{DOWNLOAD}"), &host),
            Route::Proxy => get(
                format!("http://models.test:{port}/bytes/{DOWNLOAD}"),
                &allow,
            ),
            Route::Relay => {
                let mut relay = Command::new(std::env::current_exe().expect("own path"))
                    .args(["--relay", &port.to_string()])
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("start the bare relay");
                let mut line = String::new();
                BufReader::new(relay.stdout.take().expect("relay stdout"))
                    .read_line(&mut line)
                    .expect("the relay's port");
                let out = get(
                    format!("http://127.0.0.1:{}/bytes/{DOWNLOAD}", line.trim()),
                    &host,
                );
                assert!(
                    relay.wait().expect("relay").success(),
                    "the bare relay failed"
                );
                out
            }
        });
        let mut it = out.split_whitespace();
        let secs: f64 = it.next().and_then(|s| s.parse().ok()).expect("time_total");
        let bytes: u64 = it.next().and_then(|s| s.parse().ok()).expect("size");
        assert_eq!(bytes, DOWNLOAD, "short download");
        DOWNLOAD as f64 / (1 << 20) as f64 / secs
    };
    let downloads = 3;
    let mut throughput = Vec::new();
    for load in Load::BOTH {
        let _burners = load.apply();
        let cpu0 = meter
            .as_ref()
            .map(|m| Route::ALL.map(|p| m.used(p as usize)));
        let mut speed = Route::ALL.map(|_| Vec::new());
        for _ in 0..downloads {
            for p in Route::ALL {
                speed[p as usize].push(curl(&mut meter, p));
            }
        }
        drop(_burners);
        // CPU seconds per GiB of each line.
        let cpu = meter.as_ref().zip(cpu0).map(|(m, before)| {
            Route::ALL.map(|p| {
                m.settle(p as usize);
                (m.used(p as usize) - before[p as usize]).as_secs_f64() / downloads as f64
            })
        });
        throughput.push((load, speed.map(|v| stats(v).0), cpu));
    }

    let (en, en90) = stats(e_none);
    let (ea, ea90) = stats(e_allow);
    let (rn, rn90) = stats(r_none);
    let (ra, ra90) = stats(r_allow);
    let (f50, f90) = stats(first);
    println!("sidejob-egress-bench: {rounds} rounds, {downloads} downloads of 1 GiB per column");
    println!("  exec /bin/true, network none      median {en:7.2} ms  p90 {en90:7.2} ms");
    println!("  exec /bin/true, allow-list        median {ea:7.2} ms  p90 {ea90:7.2} ms   added {:+.2} ms", ea - en);
    println!("  round trip true, network none     median {rn:7.2} ms  p90 {rn90:7.2} ms");
    println!("  round trip true, allow-list       median {ra:7.2} ms  p90 {ra90:7.2} ms   added {:+.2} ms", ra - rn);
    println!("  first request of an exec run      median {f50:7.2} ms  p90 {f90:7.2} ms   (curl's time_total, proxy start included)");
    let mut targets = Targets::default();
    for (load, [dd, dp, dr], cpu) in throughput {
        let l = load.name();
        println!("  {l}: 1 GiB download, direct        median {dd:8.1} MiB/s");
        println!(
            "  {l}: 1 GiB download, through proxy median {dp:8.1} MiB/s   ratio {:.2}",
            dp / dd
        );
        println!(
            "  {l}: 1 GiB download, bare relay    median {dr:8.1} MiB/s   ratio {:.2}   proxy / bare relay {:.2}",
            dr / dd,
            dp / dr
        );
        if let Some([cd, cp, cr]) = cpu {
            println!(
                "  {l}: CPU per GiB: direct {cd:.2} s, through the proxy {cp:.2} s (the proxy path adds {:.2} s), bare relay {cr:.2} s",
                cp - cd
            );
        }
        targets.check(
            &format!("{l}: download through the proxy / direct"),
            Some(dp / dd),
            "x",
            0.8,
            true,
        );
    }
    targets.finish()
}
