//! An opt-in Prometheus endpoint (`metrics_addr`, loopback only): `daemon.status`'s counters
//! in the text exposition format, over a minimal HTTP/1.1 responder.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use super::{Daemon, ServeError};
use crate::protocol::{DaemonStatusResult, TaskState};

/// Binds the endpoint (before the control socket, so the address is logged by the time a
/// client can connect). Only loopback: the counters cover every user's runs.
pub(super) fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let io = |source| ServeError::Io {
        step: "serve metrics on",
        path: addr.to_string().into(),
        source,
    };
    if !addr.ip().is_loopback() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "metrics_addr must be a loopback address: the counters cover every user's runs",
        )));
    }
    let listener = std::net::TcpListener::bind(addr).map_err(io)?;
    listener.set_nonblocking(true).map_err(io)?;
    let listener = TcpListener::from_std(listener).map_err(io)?;
    if let Ok(local) = listener.local_addr() {
        info!(metrics_addr = %local, "serving Prometheus metrics on http://{local}/metrics");
    }
    Ok(listener)
}

pub(super) fn serve(d: Arc<Daemon>, listener: TcpListener) {
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let d = d.clone();
            tokio::spawn(async move {
                if let Err(e) = respond(&d, stream).await {
                    debug!("metrics request: {e}");
                }
            });
        }
    });
}

async fn respond(d: &Daemon, mut stream: TcpStream) -> std::io::Result<()> {
    // Read the request head (whatever it asks, the answer is the metrics).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "slow request"))??;
    let (status, body) = match super::status::collect(d, 0) {
        Ok(s) => ("200 OK", render(&s)),
        Err(e) => ("500 Internal Server Error", format!("{}\n", e.message)),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The Prometheus text format of a status.
pub(super) fn render(s: &DaemonStatusResult) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "{name}{labels} {value}");
        }
    };
    let state = |st: &str| format!("{{state=\"{st}\"}}");
    let count = |st: &TaskState| {
        let n = s.tasks.get(st.as_str()).copied().unwrap_or(0);
        (state(st.as_str()), n as f64)
    };
    let (settled, live): (Vec<&TaskState>, Vec<&TaskState>) =
        TaskState::ALL.iter().partition(|st| st.is_terminal());
    let live: Vec<(String, f64)> = live.into_iter().map(count).collect();
    metric("sidejob_tasks", "gauge", "Live tasks by state.", &live);
    let settled: Vec<(String, f64)> = settled.into_iter().map(count).collect();
    metric(
        "sidejob_runs_settled_total",
        "counter",
        "Runs settled since the daemon started, by terminal state.",
        &settled,
    );
    // One sample each, no labels.
    let single: [(&str, &str, &str, f64); 8] = [
        (
            "sidejob_queue_depth",
            "gauge",
            "Calls waiting for a run slot.",
            s.queue_depth as f64,
        ),
        (
            "sidejob_sessions_open",
            "gauge",
            "Open sessions.",
            s.sessions as f64,
        ),
        (
            "sidejob_wakes_pushed_total",
            "counter",
            "Notifications pushed to at least one subscribed host.",
            s.wakes_pushed as f64,
        ),
        (
            "sidejob_waits",
            "gauge",
            "task.wait calls waiting for a live run.",
            s.waits as f64,
        ),
        (
            "sidejob_violations_total",
            "counter",
            "Resource limits hit by runs (timeout, output cap, memory, ...).",
            s.violations as f64,
        ),
        (
            "sidejob_tools_loaded",
            "gauge",
            "Tools loaded from plugins.",
            s.tools.len() as f64,
        ),
        (
            "sidejob_plugin_errors",
            "gauge",
            "Plugin files refused at the last (re)load.",
            s.plugin_errors.len() as f64,
        ),
        (
            "sidejob_uptime_seconds",
            "gauge",
            "Seconds since the daemon started.",
            s.uptime_ms as f64 / 1000.0,
        ),
    ];
    for (name, kind, help, value) in single {
        metric(name, kind, help, &[(String::new(), value)]);
    }
    out
}
