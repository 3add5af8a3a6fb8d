//! The egress proxy is new attack surface: a run builds a relay of its own in front of the
//! proxy port, looks for the proxy's Unix socket to talk to it directly, and speaks DNS to its
//! responder itself. None of it gains the run anything its allow-list does not give it. Each
//! attack has the same request, allowed, as its positive control. (What the proxy does with a
//! descriptor that is not an inet socket is a unit test in `egress`: the run cannot reach the
//! socket to pass one.)

use sidejob_tests::net::HttpServer;

use crate::containment::Ws;
use crate::network::{allow_profile, network_violations, run_sh};
use sidejob_tests::{skip_without, Need};

fn setup() -> Option<(Ws, HttpServer, String, String)> {
    let ws = Ws::new()?;
    if skip_without(&[Need::Python3]) {
        return None;
    }
    std::fs::write(
        ws.path().join("attacks.py"),
        include_str!("../../fixtures/egress_attacks.py"),
    )
    .unwrap();
    let srv = HttpServer::start();
    let port = srv.port;
    let p = allow_profile(
        &ws,
        "attacked",
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\", \"evil.test\" = \"127.0.0.1\" }}"
        ),
    );
    let script = ws.path().join("attacks.py").display().to_string();
    Some((ws, srv, p, script))
}

#[test]
fn a_relay_inside_the_sandbox_gains_nothing() {
    let Some((ws, srv, p, py)) = setup() else {
        return;
    };
    let port = srv.port;
    let out = run_sh(
        &ws,
        &p,
        &format!(
            "python3 {py} forwarder models.test {port}
python3 {py} forwarder evil.test {port}
python3 {py} forwarder 127.0.0.2 {port}"
        ),
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    // Control: through the run's own relay, an allowed name is reached.
    assert!(
        lines.contains(&"forwarder: HTTP/1.1 200 Connection established"),
        "{}\n{}",
        out.stderr,
        out.stderr
    );
    assert_eq!(
        lines
            .iter()
            .filter(|l| **l == "forwarder: HTTP/1.1 403 Forbidden")
            .count(),
        2,
        "{}",
        out.stderr
    );
    let v = network_violations(&out.result());
    assert!(
        v.contains(&(
            "evil.test".into(),
            Some(u64::from(port)),
            "not_allowed".into(),
            "connect".into()
        )),
        "{v:?}"
    );
    assert!(
        v.contains(&(
            "127.0.0.2".into(),
            Some(u64::from(port)),
            "ip_literal".into(),
            "connect".into()
        )),
        "{v:?}"
    );
}

#[test]
fn the_proxys_socket_is_not_in_the_runs_view() {
    let Some((ws, srv, p, py)) = setup() else {
        return;
    };
    let out = run_sh(
        &ws,
        &p,
        &format!(
            "python3 {py} find-socket
curl -sS -m 10 http://models.test:{}/still-served",
            srv.port
        ),
    );
    assert!(
        out.stderr
            .contains("sockets: ['No such file or directory']"),
        "{}\n{}",
        out.stderr,
        out.stderr
    );
    // Control: the proxy serves the run all the same, through its loopback port.
    assert!(out.stderr.contains("hello /still-served"), "{}", out.stderr);
}

#[test]
fn the_dns_responder_answers_allowed_names_only_over_udp_and_tcp() {
    let Some((ws, _srv, p, py)) = setup() else {
        return;
    };
    let out = run_sh(
        &ws,
        &p,
        &format!(
            "python3 {py} udp models.test
python3 {py} udp evil.test
python3 {py} tcp-dns models.test
python3 {py} tcp-dns evil.test"
        ),
    );
    let lines: Vec<&str> = out.stderr.lines().collect();
    for want in [
        "udp: models.test rcode 0 answers 1",
        "udp: evil.test rcode 5 answers 0",
        "tcp-dns: models.test rcode 0 answers 1",
        "tcp-dns: evil.test rcode 5 answers 0",
    ] {
        assert!(
            lines.contains(&want),
            "missing {want:?}: {}\n{}",
            out.stderr,
            out.stderr
        );
    }
}

#[test]
fn the_run_holds_no_process_but_its_own() {
    let Some(ws) = Ws::new() else { return };
    let p = ws.profile(
        "relay-user",
        "extends = \"workspace-write\"\nrun_as = \"nobody\"\n[network]\nallow = [\"models.test\"]\n",
    );
    // The relay is the supervisor's loop, outside the run: inside, only init (pid 1) and the
    // command's own processes.
    let out = run_sh(
        &ws,
        &p,
        "for s in /proc/[0-9]*/status; do
  pid=${s#/proc/}; pid=${pid%/status}
  [ \"$pid\" = 1 ] && continue
  grep '^Name:' $s
done",
    );
    let names: Vec<&str> = out
        .stderr
        .lines()
        .filter_map(|l| l.strip_prefix("Name:"))
        .map(str::trim)
        .collect();
    assert!(!names.is_empty(), "{}", out.stderr);
    assert!(!names.contains(&"sidejob"), "{names:?}");
}
