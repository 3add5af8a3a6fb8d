//! Class 3 of issue 8: the permissions above the workspace count. The workspace is opened
//! with the caller's credentials — at `session.open` and again by every run's launch — and
//! one that is, holds or lies inside the daemon's directories is refused.

use std::path::Path;

use serde_json::json;
use sidejob_tests::TempDir;

use super::{as_nobody, daemon, kind, nobody, present, refused, set_mode, NobodyDir, NOBODY};

const SECRET: &str = "only root may read this\n";

/// `<root-owned dir, mode>/pub` where `pub` is world-writable and holds a world-readable
/// secret: reachable by uid 65534 only if the parent lets them through.
fn private_parent(mode: u32) -> (TempDir, std::path::PathBuf) {
    let parent = TempDir::new("private-parent");
    let public = parent.path().join("pub");
    std::fs::create_dir(&public).expect("mkdir pub");
    set_mode(&public, 0o777);
    std::fs::write(public.join("secret"), SECRET).expect("secret");
    set_mode(&public.join("secret"), 0o644);
    set_mode(parent.path(), mode);
    (parent, public)
}

#[test]
fn attack_workspace_below_a_directory_the_caller_cannot_search_is_refused() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (_hidden, hidden_pub) = private_parent(0o700);
    // The premise: on the host, uid 65534 cannot reach it.
    let o = sidejob_tests::sh_as(
        NOBODY,
        NOBODY,
        &format!("cat {}/secret", hidden_pub.display()),
    );
    assert!(
        !o.status.success(),
        "uid {NOBODY} reads the secret on the host"
    );

    refused(
        &mut n,
        "session.open",
        json!({"workspace": hidden_pub}),
        "permission_denied",
    );

    // Positive control: the same layout under a parent they may search opens and runs.
    let (_open, open_pub) = private_parent(0o755);
    let s = n.open_session_in(&open_pub);
    let r = n.bash(&s, "cat secret", json!({}));
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], SECRET, "{r}");
}

#[test]
fn attack_workspace_at_or_around_the_daemons_directories_is_refused() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let mut c = d.client();
    let socket_dir = d.socket.parent().expect("socket dir").to_path_buf();
    let sessions = d.state_dir.join("sessions");
    // Root can open all of these, so what refuses them is the overlap rule itself.
    for ws in [&d.state_dir, &sessions, d.root.path(), &socket_dir] {
        refused(
            &mut c,
            "session.open",
            json!({"workspace": ws}),
            "invalid_params",
        );
    }
    // uid 65534 can search the state dir's parent (it holds the socket's directory): the
    // rule refuses it, and the state dir itself (whether as the rule or as a directory
    // they cannot enter).
    refused(
        &mut n,
        "session.open",
        json!({"workspace": d.root.path()}),
        "invalid_params",
    );
    for ws in [&d.state_dir, &sessions] {
        match n.call("session.open", json!({"workspace": ws})) {
            Ok(r) => panic!("uid {NOBODY} opened a session on {}: {r}", ws.display()),
            Err(e) => assert!(
                matches!(kind(&e), "invalid_params" | "permission_denied"),
                "{e}"
            ),
        }
    }
    refused(
        &mut n,
        "session.open",
        json!({"workspace": "/"}),
        "invalid_params",
    );
}

/// A parent closed after `session.open`: the next run's launch opens the workspace as the
/// caller again, so it fails instead of running with a view the caller could not have.
#[test]
fn attack_parent_closed_after_session_open_fails_the_next_run() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let (parent, public) = private_parent(0o755);
    let s = n.open_session_in(&public);
    // Positive control: while the parent is passable the run reads the secret.
    let r = n.bash(&s, "cat secret", json!({}));
    assert_eq!(r["output"], SECRET, "{r}");

    set_mode(parent.path(), 0o700);
    let r = n.bash(&s, "cat secret; touch ran-after-close", json!({}));
    assert_ne!(r["state"], "succeeded", "the run went ahead: {r}");
    assert!(
        !r["output"].as_str().unwrap_or("").contains(SECRET.trim()),
        "the run read the secret: {r}"
    );
    assert!(!present(&public.join("ran-after-close")), "the command ran");
}

/// The workspace swapped for a symlink (to a directory the caller cannot reach) after
/// `session.open`: the launch refuses the symlink.
#[test]
fn attack_workspace_swapped_for_a_symlink_fails_the_run() {
    let Some(d) = daemon() else { return };
    let mut n = nobody(&d);
    let home = NobodyDir::new("home");
    let ws = home.join("ws");
    as_nobody(&format!("mkdir {}", ws.display()));
    let s = n.open_session_in(&ws);
    let r = n.bash(&s, "echo ok", json!({}));
    assert_eq!(r["output"], "ok\n", "{r}");

    let (_hidden, hidden_pub) = private_parent(0o700);
    as_nobody(&format!(
        "mv {ws} {ws}.real && ln -s {target} {ws}",
        ws = ws.display(),
        target = hidden_pub.display()
    ));
    let r = n.bash(&s, "cat secret; touch ran-after-swap", json!({}));
    assert_ne!(r["state"], "succeeded", "the run went ahead: {r}");
    assert!(
        !r["output"].as_str().unwrap_or("").contains(SECRET.trim()),
        "the run read the secret through the symlink: {r}"
    );
    assert!(!present(&hidden_pub.join("ran-after-swap")));
    assert!(!present(
        &Path::new(&format!("{}.real", ws.display())).join("ran-after-swap")
    ));

    // The same to a directory they can reach (so only the symlink rule stands in the way):
    // the run's view would hold a host directory the session was never opened on.
    let reachable = TempDir::new("reachable");
    set_mode(reachable.path(), 0o777);
    as_nobody(&format!(
        "rm {ws} && ln -s {target} {ws}",
        ws = ws.display(),
        target = reachable.path().display()
    ));
    let r = n.bash(&s, "touch ran-through-link", json!({}));
    assert_ne!(r["state"], "succeeded", "the run went ahead: {r}");
    assert!(
        !present(&reachable.path().join("ran-through-link")),
        "the run wrote through the workspace symlink: {r}"
    );
}
