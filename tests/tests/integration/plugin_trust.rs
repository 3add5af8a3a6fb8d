//! What the plugin loader trusts, attacked for real by a second user (uid 65534): a library
//! swapped in through a symlink, a plugin directory below that user's directory, a plugin
//! made writable after it loaded, and the daemon's private copies. Each test also shows that a
//! legitimate plugin still loads. Needs root (to act as another uid); skipped otherwise.

use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sidejob_tests::{wait_until, Client, Daemon, TempDir};

use crate::isolation::NOBODY;
use crate::plugins::{built_plugin, daemon_with_plugin_dir, install, tool_names};
use sidejob_tests::{skip_without, Need};

/// A directory that belongs to uid `NOBODY` (mode 0755).
fn nobodys_dir(tag: &str) -> TempDir {
    let dir = TempDir::new(tag);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("chown");
    dir
}

/// Runs `sh -c script` as uid `NOBODY` and checks that it succeeded.
fn as_nobody(script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .output()
        .expect("run sh as nobody");
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Installs a file that is not a plugin, named `junk-<n>.so`, and waits until a rescan has
/// judged it: one complete reload of every plugin directory.
fn force_a_rescan(d: &Daemon, dir: &Path, n: usize) {
    let name = format!("junk-{n}.so");
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, b"not a library").expect("write junk");
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::fs::rename(&tmp, dir.join(&name)).expect("install junk");
    assert!(
        wait_until(Duration::from_secs(30), || d.log().contains(&name)),
        "no rescan judged {name}:\n{}",
        d.log()
    );
}

fn greet_description(c: &mut Client) -> Option<String> {
    c.ok("tool.list", json!({}))["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|t| t["name"] == "greet")
        .map(|t| t["description"].as_str().unwrap_or("").to_owned())
}

/// Swaps `a` and `b` with renameat2(RENAME_EXCHANGE) as fast as it can, until SIGTERM; then
/// prints how many swaps it made. Touches `started` first.
const SWAPPER: &str = r#"
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
d = sys.argv[1]
a, b = os.path.join(d, "lib.so").encode(), os.path.join(d, "mine.so").encode()
n = 0
def stop(*_):
    print(n, flush=True)
    os._exit(0)
signal.signal(signal.SIGTERM, stop)
open(os.path.join(d, "started"), "w").close()
while True:
    if libc.renameat2(-100, a, -100, b, 2) != 0:
        sys.exit("renameat2: " + os.strerror(ctypes.get_errno()))
    n += 1
"#;

#[test]
fn a_library_swapped_in_through_a_symlink_by_another_user_is_never_loaded() {
    if skip_without(&[Need::Root]) || skip_without(&[Need::Python3]) {
        return;
    }
    // The administrator's plugin directory holds a symlink to a library in a directory that
    // another user can write. That user keeps exchanging the administrator's library with
    // its own, so that whatever checks the path sees the first and whatever reads it gets the
    // second.
    let theirs = nobodys_dir("nobody-libs");
    std::fs::copy(
        built_plugin("sidejob_testplugin_greet_v1"),
        theirs.path().join("lib.so"),
    )
    .expect("copy");
    std::fs::set_permissions(
        theirs.path().join("lib.so"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    std::fs::copy(
        built_plugin("sidejob_testplugin_greet_v2"),
        theirs.path().join("mine.so"),
    )
    .expect("copy");
    chown(theirs.path().join("mine.so"), Some(NOBODY), Some(NOBODY)).expect("chown");

    let (d, dir) = daemon_with_plugin_dir("");
    // The positive control: a plugin installed as a file of its own loads.
    install(
        &built_plugin("sidejob_testplugin_panicky"),
        dir.path(),
        "panicky.so",
        0o644,
    );
    let link = dir.path().join("greet.so");
    symlink(theirs.path().join("lib.so"), &link).expect("symlink");

    let swapper = Command::new("python3")
        .arg("-c")
        .arg(SWAPPER)
        .arg(theirs.path())
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the swapper");
    assert!(
        wait_until(Duration::from_secs(20), || theirs
            .path()
            .join("started")
            .exists()),
        "the swapper did not start"
    );
    let mut c = d.client();
    for n in 0..30 {
        force_a_rescan(&d, dir.path(), n);
        let greet = greet_description(&mut c);
        assert!(
            !greet.as_deref().unwrap_or("").contains("v2"),
            "uid {NOBODY}'s library was loaded after {} rescans: {greet:?}",
            n + 1
        );
    }
    sidejob_tests::signal(swapper.id() as i32, libc::SIGTERM);
    let out = swapper.wait_with_output().expect("swapper");
    let swaps: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(swaps > 1000, "the swapper barely ran: {swaps} swaps");

    let log = d.log();
    assert!(
        !log.lines()
            .any(|l| l.contains("plugin=greet") && l.contains("version=2.0.0")),
        "uid {NOBODY}'s library was loaded:\n{log}"
    );
    // The link is refused in one line, with the fix.
    let refusal = log
        .lines()
        .find(|l| l.contains(&format!("refusing plugin {}", link.display())))
        .unwrap_or_else(|| panic!("no refusal of {}:\n{log}", link.display()));
    assert!(
        refusal.contains("is a symbolic link") && refusal.contains("install -m 0644"),
        "{refusal}"
    );
    assert!(tool_names(&mut c).contains(&"panicky".into()), "{log}");
}

#[test]
fn a_plugin_directory_below_another_users_directory_is_refused() {
    if skip_without(&[Need::Root]) {
        return;
    }
    // The configured directory is root's, but it lives in a directory uid 65534 owns, so that
    // user can put anything in its place: here, a link to a root-owned directory holding a
    // library root never meant to load.
    let theirs = nobodys_dir("nobody-parent");
    let configured = theirs.path().join("plugins");
    std::fs::create_dir(&configured).expect("mkdir");
    std::fs::set_permissions(&configured, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        &configured,
        "greet.so",
        0o644,
    );
    let unmeant = TempDir::new("root-libs");
    std::fs::set_permissions(unmeant.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    install(
        &built_plugin("sidejob_testplugin_greet_v2"),
        unmeant.path(),
        "other.so",
        0o644,
    );
    let trusted = TempDir::new("plugins");
    std::fs::set_permissions(trusted.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod");
    install(
        &built_plugin("sidejob_testplugin_panicky"),
        trusted.path(),
        "panicky.so",
        0o644,
    );
    let d = Daemon::start_with_config(&format!(
        "plugin_dirs = [{:?}, {:?}]\n",
        trusted.path().display().to_string(),
        configured.display().to_string()
    ));
    let mut c = d.client();
    // Refused from the start, naming the directory and its owner.
    let expected = format!(
        "refusing plugin {}: the directory {} on its path is owned by uid {NOBODY}",
        configured.join("greet.so").display(),
        theirs.path().display()
    );
    assert!(
        wait_until(Duration::from_secs(30), || d.log().contains(&expected)),
        "{}",
        d.log()
    );
    assert_eq!(greet_description(&mut c), None);

    // The owner swaps the configured directory for a link.
    as_nobody(&format!(
        "mv {0}/plugins {0}/old && ln -s {1} {0}/plugins",
        theirs.path().display(),
        unmeant.path().display()
    ));
    force_a_rescan(&d, trusted.path(), 0);
    assert_eq!(greet_description(&mut c), None, "{}", d.log());
    assert!(
        tool_names(&mut c).contains(&"panicky".into()),
        "{}",
        d.log()
    );
}

#[test]
fn a_plugin_made_group_writable_after_it_loaded_is_unloaded_at_the_next_scan() {
    let (d, dir) = daemon_with_plugin_dir("");
    let greet = install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        dir.path(),
        "greet.so",
        0o644,
    );
    install(
        &built_plugin("sidejob_testplugin_panicky"),
        dir.path(),
        "panicky.so",
        0o644,
    );
    let mut c = d.client();
    assert!(
        wait_until(Duration::from_secs(30), || {
            let names = tool_names(&mut c);
            names.contains(&"greet".into()) && names.contains(&"panicky".into())
        }),
        "{}",
        d.log()
    );
    std::fs::set_permissions(&greet, std::fs::Permissions::from_mode(0o664)).expect("chmod");
    assert!(
        wait_until(Duration::from_secs(30), || !tool_names(&mut c)
            .contains(&"greet".into())),
        "a group-writable plugin stayed loaded:\n{}",
        d.log()
    );
    let log = d.log();
    assert!(
        log.lines().any(|l| l.contains(&format!(
            "refusing plugin {}: the file is group-writable",
            greet.display()
        ))),
        "{log}"
    );
    assert!(tool_names(&mut c).contains(&"panicky".into()), "{log}");
}

#[test]
fn a_tampered_private_copy_is_replaced_and_partial_copies_are_removed() {
    let (mut d, dir) = daemon_with_plugin_dir("");
    install(
        &built_plugin("sidejob_testplugin_greet_v1"),
        dir.path(),
        "greet.so",
        0o644,
    );
    let mut c = d.client();
    assert!(
        wait_until(Duration::from_secs(30), || greet_description(&mut c)
            .is_some()),
        "{}",
        d.log()
    );
    d.terminate();
    // While the daemon is down, the copy it will reuse is replaced with other contents under
    // the same name, and a copy cut short left its temporary file.
    let copies = d.state_dir.join("plugins");
    let copy = std::fs::read_dir(&copies)
        .expect("copies")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("greet-"))
        })
        .expect("greet's copy");
    std::fs::remove_file(&copy).expect("rm");
    std::fs::copy(built_plugin("sidejob_testplugin_greet_v2"), &copy).expect("tamper");
    let partial = copies.join(".greet-0123.so.99999.tmp");
    std::fs::write(&partial, b"half a libr").expect("partial");

    d.launch();
    let mut c = d.client();
    assert!(
        wait_until(Duration::from_secs(30), || greet_description(&mut c)
            .is_some()),
        "{}",
        d.log()
    );
    let description = greet_description(&mut c).unwrap_or_default();
    assert!(description.contains("v1"), "{description}\n{}", d.log());
    assert!(!partial.exists(), "the partial copy is still there");
    // The copy under greet's name is greet's again.
    assert_eq!(
        std::fs::read(&copy).expect("copy"),
        std::fs::read(dir.path().join("greet.so")).expect("greet")
    );
}
