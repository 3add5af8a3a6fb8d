//! Network allow-lists through `sidejob exec`: the egress proxy (HTTP, `CONNECT`, SOCKS5) and
//! the DNS responder inside the run. Only loopback is used: a server of this test on
//! 127.0.0.1, reached by names the profile maps there (`hosts`). Every refusal has its
//! positive control (the same request allowed), and the server's own record shows what
//! reached it.

use serde_json::Value;
use sidejob_tests::net::{have, HttpServer, TlsServer};

use crate::containment::{exec, Out, Ws};

/// A profile like workspace-write with this `[network]` table.
pub fn allow_profile(ws: &Ws, name: &str, network: &str) -> String {
    ws.profile(
        name,
        &format!("extends = \"workspace-write\"\n[network]\n{network}\n"),
    )
}

/// Runs `sh -c script` under `profile` with `--json`.
pub fn run_sh(ws: &Ws, profile: &str, script: &str) -> Out {
    exec(ws, &["--profile", profile, "--json"], &["sh", "-c", script])
}

/// The network violations of a run, as `(host, port, reason, via)`.
pub fn network_violations(result: &Value) -> Vec<(String, Option<u64>, String, String)> {
    result["violations"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .filter(|v| v["kind"] == "network")
        .map(|v| {
            (
                v["host"].as_str().unwrap_or("").to_owned(),
                v["port"].as_u64(),
                v["reason"].as_str().unwrap_or("").to_owned(),
                v["via"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn refused(result: &Value, host: &str, port: Option<u64>, reason: &str, via: &str) -> bool {
    network_violations(result).contains(&(host.into(), port, reason.into(), via.into()))
}

#[test]
fn an_allowed_name_is_reached_by_curl_python_getent_and_node() {
    let Some(ws) = Ws::new() else { return };
    let srv = HttpServer::start();
    let port = srv.port;
    let p = allow_profile(
        &ws,
        "allow",
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}"
        ),
    );
    let node = if have("node") {
        "node -e 'require(\"dns\").lookup(\"models.test\", {family: 4}, (e, a) => console.log(\"node\", e ? e.code : a))'"
    } else {
        "echo node 127.0.0.1"
    };
    let script = format!(
        "curl -sS -m 10 http://models.test:{port}/curl
curl -sS -m 10 --proxytunnel http://models.test:{port}/tunnel
python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://models.test:{port}/python\", timeout=10).read().decode(), end=\"\")'
getent hosts models.test
{node}"
    );
    let out = run_sh(&ws, &p, &script);
    for want in [
        format!("hello /curl via models.test:{port}"),
        format!("hello /tunnel via models.test:{port}"),
        format!("hello /python via models.test:{port}"),
        "127.0.0.1       models.test".to_owned(),
        "node 127.0.0.1".to_owned(),
    ] {
        assert!(
            out.stdout.contains(&want),
            "missing {want:?}: {}\n{}",
            out.stdout,
            out.stderr
        );
    }
    let r = out.result();
    assert_eq!(r["state"], "succeeded", "{r}");
    assert!(network_violations(&r).is_empty(), "{r}");
    assert!(r["sandbox_layers"]
        .as_array()
        .unwrap()
        .contains(&"egress_proxy".into()));
    // The server saw each request once, for the name the run asked for.
    let seen = srv.seen();
    for path in ["/curl", "/tunnel", "/python"] {
        assert!(
            seen.contains(&format!("GET {path} host=models.test:{port}")),
            "{seen:?}"
        );
    }
}

#[test]
fn https_goes_through_connect_to_an_allowed_name() {
    let Some(ws) = Ws::new() else { return };
    if sidejob_tests::skip_without(&[sidejob_tests::Need::Python3])
        || sidejob_tests::skip_unless(have("openssl"), "openssl makes the TLS server's key")
    {
        return;
    }
    let Some(tls) = TlsServer::start(ws.path(), "models.test") else {
        eprintln!("SKIPPED: the TLS server did not start");
        return;
    };
    let port = tls.port;
    let cert = ws.path().join("cert.pem");
    let p = allow_profile(
        &ws,
        "tls",
        &format!("allow = [\"models.test:{port}\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}"),
    );
    let script = format!(
        "curl -sS -m 10 --cacert {} https://models.test:{port}/secure",
        cert.display()
    );
    let out = run_sh(&ws, &p, &script);
    assert!(
        out.stdout.contains("tls hello /secure"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    // Control for the port: the same name on another port is not allowed.
    let other = run_sh(
        &ws,
        &p,
        &format!(
            "curl -sS -m 10 --cacert {} https://models.test:{}/x",
            cert.display(),
            port.wrapping_add(1).max(1)
        ),
    );
    assert!(!other.stdout.contains("tls hello"), "{}", other.stdout);
    assert!(
        refused(
            &other.result(),
            "models.test",
            Some(u64::from(port.wrapping_add(1).max(1))),
            "not_allowed",
            "connect"
        ),
        "{}",
        other.result()
    );
}

#[test]
fn a_name_not_allowed_or_denied_is_refused_clearly_and_recorded() {
    let Some(ws) = Ws::new() else { return };
    let srv = HttpServer::start();
    let port = srv.port;
    let p = allow_profile(
        &ws,
        "deny",
        &format!(
            "allow = [\"*.models.test\", \"127.0.0.1:{port}\"]
deny = [\"bad.models.test\"]
hosts = {{ \"ok.models.test\" = \"127.0.0.1\", \"bad.models.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}"
        ),
    );
    let script = format!(
        "curl -sS -m 10 http://ok.models.test:{port}/ok
curl -sS -m 10 -D - http://bad.models.test:{port}/bad
curl -sS -m 10 http://other.test:{port}/other
curl -sS -m 10 --proxytunnel http://other.test:{port}/tunnel; echo \"tunnel exit $?\"
getent hosts other.test || echo 'getent refused'"
    );
    let out = run_sh(&ws, &p, &script);
    // Control: the allowed name works.
    assert!(
        out.stdout
            .contains(&format!("hello /ok via ok.models.test:{port}")),
        "{}",
        out.stdout
    );
    // Refusals: a 403 with a one-line reason, the refusal in a header too.
    assert!(
        out.stdout.contains("HTTP/1.1 403 Forbidden"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("X-Sidejob-Refusal: denied"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!(
            "sidejob: bad.models.test:{port}: on the profile's network.deny list"
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains(&format!(
            "sidejob: other.test:{port}: not on the profile's network.allow list"
        )),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("tunnel exit 56"),
        "curl reports the refused CONNECT: {}",
        out.stdout
    );
    assert!(out.stdout.contains("getent refused"), "{}", out.stdout);
    // Nothing refused reached the server.
    assert_eq!(
        srv.seen(),
        vec![format!("GET /ok host=ok.models.test:{port}")]
    );
    // Recorded in result.json, and summed up on stderr.
    let r = out.result();
    let p = Some(u64::from(port));
    assert!(refused(&r, "bad.models.test", p, "denied", "http"), "{r}");
    assert!(refused(&r, "other.test", p, "not_allowed", "http"), "{r}");
    assert!(
        refused(&r, "other.test", p, "not_allowed", "connect"),
        "{r}"
    );
    assert!(refused(&r, "other.test", None, "not_allowed", "dns"), "{r}");
    let v = r["violations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["host"] == "bad.models.test")
        .unwrap();
    assert!(v["at"].as_str().unwrap().ends_with('Z'), "{v}");
    let plain = exec(
        &ws,
        &[
            "--profile",
            &crate::network::allow_profile(
                &ws,
                "deny2",
                &format!("allow = [\"127.0.0.1:{port}\"]"),
            ),
        ],
        &["curl", "-sS", "-m", "10", "http://nowhere.test/"],
    );
    assert!(
        plain
            .stderr
            .contains("network refused: nowhere.test:80 (not_allowed)")
            && plain.stderr.contains("--allow HOST"),
        "{}",
        plain.stderr
    );
}

#[test]
fn an_allowed_name_on_a_private_address_is_refused_unless_the_address_is_allowed() {
    let Some(ws) = Ws::new() else { return };
    let srv = HttpServer::start();
    let port = srv.port;
    let hosts = "hosts = { \"models.test\" = \"127.0.0.1\", \"meta.test\" = \"169.254.169.254\" }";
    let name_only = allow_profile(
        &ws,
        "nameonly",
        &format!("allow = [\"models.test\", \"meta.test\"]\n{hosts}"),
    );
    let script = format!(
        "curl -sS -m 10 http://models.test:{port}/x
curl -sS -m 10 http://meta.test/latest/meta-data
getent hosts models.test || echo 'getent refused'"
    );
    let out = run_sh(&ws, &name_only, &script);
    assert!(
        out.stdout
            .contains("resolves to a loopback address that is not on network.allow"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("resolves to a cloud metadata address that is not on network.allow"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("getent refused"), "{}", out.stdout);
    let r = out.result();
    assert!(
        refused(
            &r,
            "models.test",
            Some(port.into()),
            "loopback_address",
            "http"
        ),
        "{r}"
    );
    assert!(
        refused(&r, "meta.test", Some(80), "metadata_address", "http"),
        "{r}"
    );
    assert!(
        refused(&r, "models.test", None, "loopback_address", "dns"),
        "{r}"
    );
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
    // Control: with the address itself allowed (on that port), the same name works.
    let with_addr = allow_profile(
        &ws,
        "withaddr",
        &format!("allow = [\"models.test\", \"127.0.0.1:{port}\"]\n{hosts}"),
    );
    let ok = run_sh(&ws, &with_addr, &script);
    assert!(
        ok.stdout
            .contains(&format!("hello /x via models.test:{port}")),
        "{}",
        ok.stdout
    );
    assert!(
        ok.stdout.contains("127.0.0.1       models.test"),
        "{}",
        ok.stdout
    );
}

#[test]
fn ip_literals_pass_only_when_listed() {
    let Some(ws) = Ws::new() else { return };
    let srv = HttpServer::start();
    let port = srv.port;
    let script = format!(
        "curl -sS -m 10 http://127.0.0.1:{port}/v4 --noproxy ''
curl -sS -m 10 'http://[::ffff:127.0.0.1]:{port}/mapped' --noproxy ''
curl -sS -m 10 --noproxy '' --proxy socks5://127.0.0.1:3128 http://127.0.0.1:{port}/socks; echo \"socks exit $?\""
    );
    let unlisted = allow_profile(&ws, "unlisted", "allow = [\"models.test\"]");
    let out = run_sh(&ws, &unlisted, &script);
    assert!(
        out.stdout
            .contains("an address given directly must itself be on network.allow"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("socks exit 97"), "{}", out.stdout);
    let r = out.result();
    let p = Some(u64::from(port));
    assert!(refused(&r, "127.0.0.1", p, "ip_literal", "http"), "{r}");
    assert!(refused(&r, "127.0.0.1", p, "ip_literal", "socks5"), "{r}");
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
    // Control: listed, the literal is reached (the mapped form is the same address).
    let listed = allow_profile(&ws, "listed", &format!("allow = [\"127.0.0.1:{port}\"]"));
    let ok = run_sh(&ws, &listed, &script);
    for path in ["/v4", "/mapped", "/socks"] {
        assert!(
            ok.stdout.contains(&format!("hello {path} via")),
            "{path}: {}",
            ok.stdout
        );
    }
}

#[test]
fn socks5_with_names_is_decided_on_the_name() {
    let Some(ws) = Ws::new() else { return };
    let srv = HttpServer::start();
    let port = srv.port;
    let p = allow_profile(
        &ws,
        "socks",
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\", \"other.test\" = \"127.0.0.1\" }}"
        ),
    );
    // ALL_PROXY is socks5h: curl sends the name.
    let script = format!(
        "curl -sS -m 10 --proxy \"$ALL_PROXY\" http://models.test:{port}/s
curl -sS -m 10 --proxy \"$ALL_PROXY\" http://other.test:{port}/t; echo \"socks exit $?\"
echo \"ALL_PROXY=$ALL_PROXY\""
    );
    let out = run_sh(&ws, &p, &script);
    assert!(
        out.stdout.contains("ALL_PROXY=socks5h://127.0.0.1:3128"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains(&format!("hello /s via models.test:{port}")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("socks exit 97"), "{}", out.stdout);
    assert!(
        refused(
            &out.result(),
            "other.test",
            Some(port.into()),
            "not_allowed",
            "socks5"
        ),
        "{}",
        out.result()
    );
}

#[test]
fn direct_connections_that_ignore_the_proxy_fail() {
    let Some(ws) = Ws::new() else { return };
    let srv = HttpServer::start();
    let port = srv.port;
    let p = allow_profile(
        &ws,
        "direct",
        &format!(
            "allow = [\"models.test\", \"127.0.0.1:{port}\"]\nhosts = {{ \"models.test\" = \"127.0.0.1\" }}"
        ),
    );
    // The name resolves (the run's DNS answers it) but a connection that skips the proxy
    // lands on the run's own loopback, where nothing listens.
    let out = run_sh(
        &ws,
        &p,
        &format!(
            "curl -sS -m 10 --noproxy '*' http://models.test:{port}/direct; echo \"direct exit $?\"
{} tcp 127.0.0.1:{port}",
            ws.probe()
        ),
    );
    assert!(out.stdout.contains("direct exit 7"), "{}", out.stdout);
    assert!(
        out.stdout
            .contains(&format!("\"errno\":{}", libc::ECONNREFUSED)),
        "{}",
        out.stdout
    );
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
    // Control: the same through the proxy is reached.
    let ok = run_sh(
        &ws,
        &p,
        &format!("curl -sS -m 10 http://models.test:{port}/proxied"),
    );
    assert!(ok.stdout.contains("hello /proxied"), "{}", ok.stdout);
}
