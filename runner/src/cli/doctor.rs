//! `sidejob doctor`: which sandbox layers this host can apply, and why not, plus a live
//! check that runs `/bin/true` under the default profile through the real supervisor.

use std::os::fd::AsFd;
use std::time::{Instant, SystemTime};

use serde_json::json;

use crate::protocol::TaskState;
use crate::sandbox::call::CallSandbox;
use crate::sandbox::linux::Availability;
use crate::sandbox::resolve::Context;
use crate::sandbox::Catalog;

/// Runs `sidejob doctor`; returns 0 when every layer the default profile needs is here.
pub(super) fn doctor(json_out: bool) -> i32 {
    let a = Availability::probe();
    let mut layers = a.report();
    // Found is not writable (a read-only cgroupfs in a container): try what a run does.
    let cgroups = a.try_cgroups();
    if let Err(why) = &cgroups {
        for l in layers.iter_mut().filter(|l| l.layer.starts_with("cgroup_")) {
            if l.active {
                l.active = false;
                l.detail = format!("found but not usable: {why}");
            }
        }
    }
    let catalog = Catalog::new(Catalog::default_dir());
    let mut profiles = Vec::new();
    for name in catalog.names() {
        let status = match catalog.get(&name) {
            Err(e) => json!({"name": name, "usable": false, "detail": e.to_string()}),
            Ok(p) => {
                let missing = a.missing_when_tried(p.network, &p.limits, &cgroups);
                let usable = missing.is_empty() || p.best_effort;
                let detail = if missing.is_empty() {
                    "all layers available".to_owned()
                } else {
                    format!(
                        "{}: {}",
                        if p.best_effort {
                            "best effort without"
                        } else {
                            "refused, missing"
                        },
                        crate::sandbox::linux::describe_missing(&missing)
                    )
                };
                json!({"name": name, "usable": usable, "detail": detail})
            }
        };
        profiles.push(status);
    }
    let trial = trial_run();
    let state_dir = crate::config::default_state_dir();
    let caches = crate::sandbox::caches::list(&state_dir);
    let ok = profiles
        .iter()
        .any(|p| p["name"] == "workspace-write" && p["usable"] == true)
        && trial["ok"] == true;
    if json_out {
        let out = json!({
            "kernel": a.kernel,
            "root": a.root,
            "landlock_abi": a.landlock_abi.as_ref().ok(),
            "cgroup": match a.cgroup() {
                Ok(h) => json!({"version": match h.version {
                    crate::sandbox::linux::cgroup::Version::V1 => "v1",
                    crate::sandbox::linux::cgroup::Version::V2 => "v2",
                }, "controllers": h.bases.iter().map(|(c, b)| json!({"controller": c.name(), "dir": b})).collect::<Vec<_>>()}),
                Err(e) => json!({"error": e.to_string()}),
            },
            "layers": layers,
            "profiles": profiles,
            "egress": {
                "proxy": format!("127.0.0.1:{} in the run (HTTP CONNECT, absolute-form HTTP, SOCKS5)", crate::egress::PROXY_PORT),
                "dns": format!("127.0.0.1:{} in the run (UDP and TCP)", crate::egress::DNS_PORT),
            },
            "caches": {"dir": crate::sandbox::caches::root(&state_dir), "entries": caches},
            "trial": trial,
            "ok": ok,
        });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!(
            "kernel {}, {}",
            a.kernel,
            if a.root {
                "running as root"
            } else {
                "not root"
            }
        );
        println!(
            "landlock: {}",
            match &a.landlock_abi {
                Ok(v) => format!("ABI {v}"),
                Err(e) => e.to_string(),
            }
        );
        println!();
        let width = layers.iter().map(|l| l.layer.len()).max().unwrap_or(10);
        for l in &layers {
            println!(
                "  {:width$}  {:7}  {}",
                l.layer,
                if l.active { "active" } else { "MISSING" },
                l.detail
            );
        }
        println!("\nprofiles:");
        for p in &profiles {
            println!(
                "  {:16} {:9} {}",
                p["name"].as_str().unwrap_or(""),
                if p["usable"] == true {
                    "usable"
                } else {
                    "REFUSED"
                },
                p["detail"].as_str().unwrap_or("")
            );
        }
        println!(
            "\nnetwork allow-lists: an egress proxy at 127.0.0.1:{} and a DNS responder at 127.0.0.1:{} in each such run",
            crate::egress::PROXY_PORT,
            crate::egress::DNS_PORT
        );
        print_caches(&state_dir, &caches);
        println!(
            "\ntrial: /bin/true under workspace-write: {}",
            trial["detail"].as_str().unwrap_or("")
        );
    }
    if ok {
        0
    } else {
        1
    }
}

/// `/bin/true` under the default profile, through the supervisor, in a scratch workspace.
fn trial_run() -> serde_json::Value {
    let catalog = Catalog::new(Catalog::default_dir());
    let run = || -> Result<String, String> {
        let profile = catalog.get("workspace-write").map_err(|e| e.to_string())?;
        // A fresh directory of our own (mode 0700, never one that exists), as `exec` makes;
        // not under /dev, which the view replaces with its own.
        let base =
            super::exec::make_private_dir(&std::env::temp_dir()).map_err(|e| e.to_string())?;
        let ws = base.join("workspace");
        let run_dir = base.join("run");
        std::fs::create_dir(&ws).map_err(|e| e.to_string())?;
        std::fs::create_dir(&run_dir).map_err(|e| e.to_string())?;
        let plan = CallSandbox::resolve(
            &profile,
            &Context {
                workspace: &ws,
                session_dir: None,
                home: &crate::sandbox::Home::known(None),
                caller_env: &[],
                caches: None,
            },
        )
        .map_err(|e| e.to_string())?
        .plan(
            "doctor",
            vec!["/bin/true".into()],
            ws.clone(),
            run_dir.clone(),
        )
        .timeout_ms(Some(10_000))
        .kill_grace_ms(Some(1_000))
        .max_output_bytes(Some(1 << 20))
        .build();
        let t = Instant::now();
        let res = crate::sys::dirfd::open_dir(&run_dir)
            .map_err(|e| crate::supervisor::SuperviseError::Output {
                path: run_dir.clone(),
                source: e,
            })
            .and_then(|dir| crate::supervisor::supervise(&plan, SystemTime::now(), dir.as_fd()));
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        let _ = std::fs::remove_dir_all(&base);
        match res {
            Ok(r) if r.state == TaskState::Succeeded => Ok(format!(
                "ok in {ms:.1} ms with {}",
                r.sandbox_layers.join(", ")
            )),
            Ok(r) => Err(r
                .error
                .unwrap_or_else(|| format!("{:?} {:?}", r.state, r.reason))),
            Err(e) => Err(e.to_string()),
        }
    };
    match run() {
        Ok(d) => json!({"ok": true, "detail": d}),
        Err(e) => json!({"ok": false, "detail": format!("failed: {e}")}),
    }
}

fn print_caches(state_dir: &std::path::Path, caches: &[crate::sandbox::caches::CacheInfo]) {
    println!(
        "\ncaches ({}):",
        crate::sandbox::caches::root(state_dir).display()
    );
    if caches.is_empty() {
        println!("  none");
    }
    for c in caches {
        println!(
            "  uid {:<6} {:16} {:12} {:>10}  {}  ({})",
            c.uid,
            c.profile,
            c.name,
            human_bytes(c.bytes),
            c.path.display(),
            c.workspace.as_ref().map_or_else(
                || "unused: kept before caches were per workspace".to_owned(),
                |w| format!("workspace {}", w.display())
            )
        );
    }
}

fn human_bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / (1u64 << 30) as f64),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / (1u64 << 10) as f64),
        n => format!("{n} B"),
    }
}

// `sidejob cache`: the persistent caches of profiles (`[caches]`). (A comment, not a doc
// comment, which would replace the command's own `about`.)
#[derive(Debug, clap::Subcommand)]
pub(crate) enum CacheCommand {
    /// List the caches kept under the state directory, with their sizes
    List {
        #[arg(long, env = "SIDEJOB_STATE_DIR")]
        state_dir: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Remove caches: yours (root: everyone's, or --uid's), of every profile or of --profile
    Clear {
        #[arg(long)]
        profile: Option<String>,
        /// Root only: whose caches [default: everyone's]
        #[arg(long)]
        uid: Option<u32>,
        #[arg(long, env = "SIDEJOB_STATE_DIR")]
        state_dir: Option<std::path::PathBuf>,
    },
}

/// Runs `sidejob cache ...`; returns the exit code.
pub(super) fn cache(cmd: CacheCommand) -> i32 {
    use crate::sandbox::caches;
    match cmd {
        CacheCommand::List { state_dir, json } => {
            let dir = state_dir.unwrap_or_else(crate::config::default_state_dir);
            let list = caches::list(&dir);
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&list).unwrap_or_default()
                );
            } else {
                print_caches(&dir, &list);
            }
            0
        }
        CacheCommand::Clear {
            profile,
            uid,
            state_dir,
        } => {
            let dir = state_dir.unwrap_or_else(crate::config::default_state_dir);
            let me = crate::sys::getuid();
            let whose = match (me, uid) {
                (0, u) => u,
                (_, Some(u)) if u != me => {
                    eprintln!("sidejob cache clear: only root may clear another user's caches");
                    return 1;
                }
                (_, _) => Some(me),
            };
            // Each cache on its own: one that cannot be removed is named, and the rest are
            // still removed.
            let cleared = caches::clear(&dir, whose, profile.as_deref());
            if cleared.is_empty() {
                println!("no cache to remove");
            }
            let mut code = 0;
            for c in &cleared {
                match &c.error {
                    None => println!(
                        "removed {} ({})",
                        c.cache.path.display(),
                        human_bytes(c.cache.bytes)
                    ),
                    Some(e) => {
                        eprintln!(
                            "sidejob cache clear: cannot remove {}: {e}",
                            c.cache.path.display()
                        );
                        code = 1;
                    }
                }
            }
            code
        }
    }
}
