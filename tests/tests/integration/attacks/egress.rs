//! Attacks on the egress proxy of a root daemon (issue 32): uid 65534's allow-list runs
//! trickle a request head, and make the refusals the proxy used to leave out of
//! `result.json`. The side effects are checked on the host: what the allowed server was
//! asked and when, the run's `result.json`.

use std::time::{Duration, Instant};

use serde_json::json;
use sidejob_tests::net::HttpServer;
use sidejob_tests::{skip_without, Client, Daemon, Need, TempDir};

use super::{daemon_with, nobody, result_json, set_mode, NobodyDir};
use crate::network::network_violations;

/// A root daemon serving group 65534, with one profile, `net`: workspace-write with this
/// `[network]` table; `extra` is more configuration. `None` (skipped) without root or a
/// python3 for the sandbox.
fn daemon_net(network: &str, extra: &str) -> Option<(Daemon, TempDir)> {
    if skip_without(&[Need::Root, Need::Python3]) {
        return None;
    }
    let profiles = TempDir::new("profiles");
    set_mode(profiles.path(), 0o755);
    std::fs::write(
        profiles.path().join("net.toml"),
        format!("extends = \"workspace-write\"\n[network]\n{network}\n"),
    )
    .expect("write the profile");
    let d = daemon_with(&format!(
        "profiles_dir = \"{}\"\n{extra}",
        profiles.path().display()
    ))?;
    Some((d, profiles))
}

/// A workspace of uid 65534's holding the attack script, and their session there under
/// `net`; returns the workspace, the session and the script's path.
fn nobody_net_session(n: &mut Client) -> (NobodyDir, String, String) {
    let ws = NobodyDir::new("egress-ws");
    let script = ws.join("attacks.py");
    std::fs::write(&script, include_str!("../../../fixtures/egress_attacks.py"))
        .expect("write the script");
    let s = n.ok(
        "session.open",
        json!({"workspace": ws.path(), "profile": "net"}),
    )["session_id"]
        .as_str()
        .expect("session_id")
        .to_owned();
    (ws, s, script.display().to_string())
}

#[test]
fn a_request_head_trickled_byte_by_byte_was_served_long_after_the_head_timeout() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_net(
        &format!("allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}"),
        "[egress]\nhead_timeout_ms = 1500\n",
    ) else {
        return;
    };
    let mut n = nobody(&d);
    let (_ws, s, py) = nobody_net_session(&mut n);
    let t0 = Instant::now();
    // About 55 bytes, 0.2 s apart: 11 s for the head, each read well within 1.5 s.
    let r = n.bash(
        &s,
        &format!(
            "python3 {py} trickle {port} /trickled 0.2; python3 {py} trickle {port} /quick 0.01; curl -sS -m 10 http://models.test:{port}/normal"
        ),
        json!({"yield_after_ms": 60_000}),
    );
    let took = t0.elapsed();
    let out = r["output"].as_str().unwrap_or("");
    assert_eq!(r["status"], "completed", "{r}");
    let seen = srv.seen();
    assert!(
        !seen.iter().any(|l| l.contains("/trickled")),
        "the trickled head was served: {seen:?}\n{out}"
    );
    assert!(out.contains("trickle /trickled: closed"), "{out}");
    assert!(
        took < Duration::from_secs(8),
        "the run took {took:?}\n{out}"
    );
    // Controls: a head trickled within the deadline, and a plain one, are served.
    assert!(
        seen.iter().any(|l| l.contains("GET /quick")),
        "{seen:?}\n{out}"
    );
    assert!(out.contains("hello /normal"), "{out}");
}

#[test]
fn refusals_of_requests_the_proxy_cannot_serve_were_missing_from_result_json() {
    let srv = HttpServer::start();
    let port = srv.port;
    let Some((d, _p)) = daemon_net(
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\", \"evil.test\" = \"127.0.0.1\" }}"
        ),
        "",
    ) else {
        return;
    };
    let mut n = nobody(&d);
    let (_ws, s, py) = nobody_net_session(&mut n);
    let r = n.bash(
        &s,
        &format!("python3 {py} refusals models.test evil.test {port}"),
        json!({"yield_after_ms": 60_000}),
    );
    let out = r["output"].as_str().unwrap_or("").to_owned();
    assert_eq!(r["status"], "completed", "{r}");
    // Each was refused, as before.
    for line in [
        "http: models.test@evil.test:443 HTTP/1.1 400 Bad Request",
        "http: http://models.test@evil.test/ HTTP/1.1 400 Bad Request",
        "socks5 bind: 05070001000000000000",
        "socks5 udp: 05070001000000000000",
        "socks4: 005b000000000000",
        "dns txt evil.test: rcode 5 answers 0",
        "dns mx evil.test: rcode 5 answers 0",
        "dns ptr: rcode 5 answers 0",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
    // Controls: the allowed forms are answered.
    for line in [
        "dns a models.test: rcode 0 answers 1",
        "dns txt models.test: rcode 0 answers 0",
        "connect allowed: HTTP/1.1 200 Connection established",
        "socks5 connect allowed: 0500",
    ] {
        assert!(out.contains(line), "{line:?} not in\n{out}");
    }
    // On the host: every refusal is in result.json, and nothing allowed is.
    let task = n.task(r["task_id"].as_str().expect("task_id"));
    let result = result_json(&task);
    let v = network_violations(&result);
    let s = |h: &str| h.to_owned();
    for want in [
        (
            s("models.test@evil.test:443"),
            None,
            s("bad_request"),
            s("connect"),
        ),
        (
            s("http://models.test@evil.test/"),
            None,
            s("bad_request"),
            s("http"),
        ),
        (
            s("evil.test"),
            Some(80),
            s("unsupported_command"),
            s("socks5"),
        ),
        (
            s("evil.test"),
            Some(53),
            s("unsupported_command"),
            s("socks5"),
        ),
        (
            s("evil.test"),
            Some(80),
            s("unsupported_protocol"),
            s("socks4"),
        ),
        (s("evil.test"), None, s("not_allowed"), s("dns")),
        (
            s("1.0.0.127.in-addr.arpa"),
            None,
            s("not_allowed"),
            s("dns"),
        ),
    ] {
        assert!(v.contains(&want), "{want:?} not in {v:?}");
    }
    assert!(
        !v.iter().any(|(h, ..)| h == "models.test"),
        "an allowed request was recorded: {v:?}"
    );
    let txt_and_mx = result["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .find(|x| x["host"] == "evil.test" && x["via"] == "dns")
        .expect("the dns refusals of evil.test");
    assert_eq!(txt_and_mx["count"], 2, "{txt_and_mx}");
}
