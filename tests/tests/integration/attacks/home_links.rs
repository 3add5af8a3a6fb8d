//! Issue 32, item 1: a symlink in the caller's home is the caller's to make, so a `{home}`
//! path of a profile is resolved as the caller, never followed as root. As a user of their
//! own (home in a fresh directory under /tmp, as the issue's second attacker had it), the
//! caller points `~/link` at a directory only root may enter, at `/proc` and at `/`; the host
//! then finds that none of what root alone could reach came out in the run's output, beside
//! a control: the same link to a directory of the caller's own is read through.

use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sidejob_tests::{skip_without, Client, Need, TempDir};

use super::{daemon_with, set_mode, unique, NOBODY};

/// The profile the attacks run under: the default one, plus `~/link`.
const PROFILE: &str = r#"
extends = "workspace-write"
[paths]
readable = ["{home}/link"]
"#;

/// A local user made for one test (primary group 65534, which the daemon's socket is open
/// to), whose home is a fresh directory of theirs; removed when dropped.
struct HomeUser {
    name: String,
    uid: u32,
    home: PathBuf,
    _parent: TempDir,
}

impl HomeUser {
    fn new() -> HomeUser {
        let parent = TempDir::new("home-user");
        set_mode(parent.path(), 0o755);
        let home = parent.path().join("home");
        std::fs::create_dir(&home).expect("mkdir home");
        // A uid that is free here: from this process's id, the next one on a clash.
        for n in 0..200 {
            let uid = 61_000 + (std::process::id() + n) % 3_000;
            let name = format!("sjhome{uid}");
            let made = Command::new("useradd")
                .args([
                    "-M",
                    "-N",
                    "-g",
                    &NOBODY.to_string(),
                    "-s",
                    "/usr/sbin/nologin",
                ])
                .arg("-u")
                .arg(uid.to_string())
                .arg("-d")
                .arg(&home)
                .arg(&name)
                .output()
                .expect("useradd");
            if made.status.success() {
                chown(&home, Some(uid), Some(NOBODY)).expect("chown home");
                set_mode(&home, 0o755);
                return HomeUser {
                    name,
                    uid,
                    home,
                    _parent: parent,
                };
            }
        }
        panic!("no free uid for a test user");
    }

    /// Runs `script` as this user on the host; its output, whether it succeeded.
    fn sh(&self, script: &str) -> (bool, String) {
        let o = sidejob_tests::sh_as(self.uid, NOBODY, script);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        (o.status.success(), text)
    }

    /// Points `~/link` at `target` (as the user, on the host).
    fn link_to(&self, target: &Path) {
        let link = self.home.join("link");
        let (ok, out) = self.sh(&format!(
            "ln -sfn '{}' '{}'",
            target.display(),
            link.display()
        ));
        assert!(ok, "make {}: {out}", link.display());
    }

    fn link(&self) -> PathBuf {
        self.home.join("link")
    }
}

impl Drop for HomeUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// A root daemon with [`PROFILE`], a session of `user`'s in a workspace of theirs.
struct Setup {
    _profiles: TempDir,
    d: sidejob_tests::Daemon,
    c: Client,
    session: String,
    _ws: TempDir,
}

fn setup(user: &HomeUser) -> Option<Setup> {
    let profiles = TempDir::new("home-profiles");
    std::fs::write(profiles.path().join("home-link.toml"), PROFILE).expect("profile");
    let d = daemon_with(&format!("profiles_dir = {:?}\n", profiles.path()))?;
    let ws = TempDir::new("home-ws");
    set_mode(ws.path(), 0o755);
    chown(ws.path(), Some(user.uid), Some(NOBODY)).expect("chown workspace");
    let mut c = Client::connect_as(&d.socket, user.uid, NOBODY);
    let r = c.ok(
        "session.open",
        json!({"workspace": ws.path(), "profile": "home-link"}),
    );
    let session = r["session_id"].as_str().expect("session_id").to_owned();
    Some(Setup {
        _profiles: profiles,
        d,
        c,
        session,
        _ws: ws,
    })
}

/// Everything a run told its caller: its output and its error.
fn said(r: &Value) -> String {
    format!("{}\n{}", r["output"].as_str().unwrap_or(""), r["error"])
}

/// The control: `~/link` to a directory of the caller's own, outside the view, is read
/// through (the symlink is resolved as the caller).
fn own_file_is_read_through_the_link(user: &HomeUser, s: &mut Setup) {
    let theirs = user.home.parent().expect("parent").join("theirs");
    let _ = std::fs::remove_dir_all(&theirs);
    std::fs::create_dir(&theirs).expect("mkdir");
    chown(&theirs, Some(user.uid), Some(NOBODY)).expect("chown");
    set_mode(&theirs, 0o700);
    let (ok, out) = user.sh(&format!(
        "echo own-bytes-1f3a > '{}/file'",
        theirs.display()
    ));
    assert!(ok, "{out}");
    user.link_to(&theirs);
    let r = s.c.bash(
        &s.session,
        &format!("cat {}/file", user.link().display()),
        json!({}),
    );
    assert_eq!(r["output"], "own-bytes-1f3a\n", "{r}");
}

#[test]
fn attack_home_symlink_to_a_root_only_dir_is_not_followed_as_root() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let user = HomeUser::new();
    let Some(mut s) = setup(&user) else { return };
    own_file_is_read_through_the_link(&user, &mut s);

    // A file in a directory only root may enter, readable itself.
    let root_only = TempDir::new("root-only");
    set_mode(root_only.path(), 0o755);
    let private = root_only.path().join("private");
    std::fs::create_dir_all(private.join("pub")).expect("mkdir");
    set_mode(&private, 0o700);
    let secret = unique("secret");
    std::fs::write(private.join("pub/secret"), &secret).expect("secret");
    set_mode(&private.join("pub/secret"), 0o644);
    // On the host, the caller cannot read it.
    let (ok, out) = user.sh(&format!("cat '{}/pub/secret'", private.display()));
    assert!(
        !ok && out.contains("Permission denied"),
        "the caller reads it on the host: {out}"
    );

    user.link_to(&private.join("pub"));
    let r = s.c.bash(
        &s.session,
        &format!("cat {}/secret; echo ran", user.link().display()),
        json!({}),
    );
    let told = said(&r);
    assert!(
        !told.contains(&secret),
        "the run read a file its caller may not: {r}\nlog:\n{}",
        s.d.log()
    );
    assert!(!s.d.log().contains(&secret), "the daemon logged the secret");
    // Refused as the caller: the run is failed, saying so.
    assert_eq!(r["state"], "failed", "{r}");
    assert!(told.contains("ermission denied"), "{r}");
}

#[test]
fn attack_home_symlink_to_proc_or_root_shows_no_host_process() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let user = HomeUser::new();
    let Some(mut s) = setup(&user) else { return };
    own_file_is_read_through_the_link(&user, &mut s);
    let me = std::process::id();
    let probe = |s: &mut Setup, dir: &str| {
        s.c.bash(
            &s.session,
            &format!(
                "ls {l}{dir} | grep -qx {me} && echo saw-host-pid; \
                 cat {l}{dir}/{me}/cmdline 2>/dev/null | tr '\\0' ' '; echo ran",
                l = user.link().display()
            ),
            json!({}),
        )
    };

    // ~/link -> /proc: the host's processes, their roots and environments.
    user.link_to(Path::new("/proc"));
    let r = probe(&mut s, "");
    let told = said(&r);
    assert!(
        !told.contains("saw-host-pid") && !told.contains("integration"),
        "the run saw the host's processes: {r}"
    );
    assert_eq!(r["state"], "failed", "{r}");
    assert!(told.contains("kernel filesystem"), "{r}");

    // ~/link -> /: bound without the mounts below it, so no host /proc; but this daemon's
    // socket lies on the root filesystem (under /tmp), so / would hand the run the control
    // socket: refused, naming why.
    user.link_to(Path::new("/"));
    let r = probe(&mut s, "/proc");
    let told = said(&r);
    assert!(
        !told.contains("saw-host-pid") && !told.contains("integration"),
        "the run saw the host's processes: {r}"
    );
    assert!(told.contains("sidejob's own sockets"), "{r}");
}

#[test]
fn attack_home_symlink_to_the_control_sockets_directory_hands_the_run_no_socket() {
    if skip_without(&[Need::Root]) {
        return;
    }
    let user = HomeUser::new();
    let Some(mut s) = setup(&user) else { return };
    own_file_is_read_through_the_link(&user, &mut s);
    // The caller may reach the socket on the host (it connected); its run may not, through
    // its home: the run would be served outside its bridge's scope and profile.
    let sock_dir = s.d.socket.parent().unwrap().to_path_buf();
    user.link_to(&sock_dir);
    let r = s.c.bash(
        &s.session,
        &format!(
            "ls {l}; test -S {l}/sidejob.sock && echo socket-in-view; echo ran",
            l = user.link().display()
        ),
        json!({}),
    );
    let told = said(&r);
    assert!(
        !told.contains("socket-in-view"),
        "the run was handed the control socket: {r}"
    );
    assert_eq!(r["state"], "failed", "{r}");
    assert!(told.contains("sidejob's own sockets"), "{r}");
}
