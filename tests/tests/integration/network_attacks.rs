//! The egress proxy is new attack surface: a run talks to its socket itself, builds a relay of
//! its own, passes descriptors it chose, tries to replace the socket, or sends DNS answers
//! somewhere else. None of it gains the run anything its allow-list does not give it. Each
//! attack has the same request, allowed, as its positive control.

use sidejob_tests::net::{have, HttpServer};

use crate::containment::Ws;
use crate::network::{allow_profile, network_violations, run_sh};

fn setup() -> Option<(Ws, HttpServer, String, String)> {
    let ws = Ws::new()?;
    if sidejob_tests::skip_unless(have("python3"), "the attacks are Python scripts") {
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
            "python3 {py} own-socket models.test {port}
python3 {py} own-socket evil.test {port}
python3 {py} forwarder models.test {port}
python3 {py} forwarder evil.test {port}"
        ),
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    for want in [
        "own-socket: HTTP/1.1 200 Connection established",
        "own-socket: HTTP/1.1 403 Forbidden",
        "forwarder: HTTP/1.1 200 Connection established",
        "forwarder: HTTP/1.1 403 Forbidden",
    ] {
        assert!(
            lines.contains(&want),
            "missing {want:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }
    let v = network_violations(&out.result());
    assert_eq!(
        v,
        vec![(
            "evil.test".into(),
            Some(u64::from(port)),
            "not_allowed".into(),
            "connect".into()
        )],
        "{v:?}"
    );
    // Each refusal is counted: two ways in, one entry with count 2.
    let r = out.result();
    let entry = r["violations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["host"] == "evil.test")
        .unwrap()
        .clone();
    assert_eq!(entry["count"], 2, "{entry}");
}

#[test]
fn descriptors_that_are_not_inet_sockets_are_refused_and_the_socket_cannot_be_replaced() {
    let Some((ws, srv, p, py)) = setup() else {
        return;
    };
    let out = run_sh(
        &ws,
        &p,
        &format!(
            "python3 {py} not-inet unix
python3 {py} not-inet file
python3 {py} replace
python3 {py} own-socket models.test {}",
            srv.port
        ),
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines.contains(&"unix-fd: closed"), "{}", out.stdout);
    assert!(lines.contains(&"file-fd: passed"), "{}", out.stdout);
    assert!(
        lines.contains(&"replace: Read-only file system"),
        "{}",
        out.stdout
    );
    // Control: the socket still serves after all that.
    assert!(
        lines.contains(&"own-socket: HTTP/1.1 200 Connection established"),
        "{}",
        out.stdout
    );
}

#[test]
fn dns_answers_go_only_where_the_run_could_send_them_and_only_for_allowed_names() {
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
    let lines: Vec<&str> = out.stdout.lines().collect();
    for want in [
        "udp: models.test rcode 0 answers 1",
        "udp: evil.test rcode 5 answers 0",
        "tcp-dns: models.test rcode 0 answers 1",
        "tcp-dns: evil.test rcode 5 answers 0",
    ] {
        assert!(
            lines.contains(&want),
            "missing {want:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }
}

#[test]
fn the_relay_runs_as_the_run_user_without_capabilities() {
    let Some(ws) = Ws::new() else { return };
    let p = ws.profile(
        "relay-user",
        "extends = \"workspace-write\"\nrun_as = \"nobody\"\n[network]\nallow = [\"models.test\"]\n",
    );
    // The relay is the run's other process besides init (pid 1) and this shell's own.
    let out = run_sh(
        &ws,
        &p,
        "for s in /proc/[0-9]*/status; do
  pid=${s#/proc/}; pid=${pid%/status}
  [ \"$pid\" = 1 ] && continue
  grep -q '^Name:.*sidejob' $s && grep -E '^(Uid|CapEff|CapPrm|CapBnd|NoNewPrivs):' $s
done",
    );
    let text = out.stdout;
    assert!(text.contains("Uid:\t65534\t65534\t65534\t65534"), "{text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("CapPrm:\t0000000000000000"), "{text}");
    assert!(text.contains("CapBnd:\t0000000000000000"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
}
