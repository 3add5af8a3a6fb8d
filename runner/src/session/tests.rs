//! Session ids, ownership and directories, on real directories in a scratch directory (as
//! root, the ones handed to another uid too).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::dirs::{check_workspace, make_session_dir};
use super::*;
use crate::registry::fixtures::session as row;
use crate::scratch::ScratchDir;

fn root() -> Creds {
    Creds {
        uid: 0,
        gid: 0,
        groups: Vec::new(),
    }
}

fn config(state_dir: &Path) -> Config {
    let cfg = Config {
        state_dir: state_dir.to_path_buf(),
        ..Config::default()
    };
    std::fs::create_dir_all(cfg.sessions_dir()).unwrap();
    cfg
}

#[test]
fn derived_ids_are_reserved_for_their_uid() {
    assert_eq!(reserved_for("cli-1000-0badcafe"), Some(1000));
    assert_eq!(reserved_for("mcp-0-1"), Some(0));
    assert_eq!(reserved_for("cli-x-1"), None);
    assert_eq!(reserved_for("cli-1000"), None);
    assert_eq!(reserved_for("build-1000-1"), None);
}

#[test]
fn a_session_is_its_owners_and_roots() {
    assert!(may_access(1000, 1000));
    assert!(may_access(0, 1000));
    assert!(!may_access(1001, 1000));
    let dir = ScratchDir::new("sessions");
    let registry = Registry::open(dir.path()).unwrap();
    registry.insert_session(&row("s1", 1000, None)).unwrap();
    assert_eq!(get_for(&registry, 1000, "s1").unwrap().owner_uid, 1000);
    assert_eq!(get_for(&registry, 0, "s1").unwrap().owner_uid, 1000);
    assert!(matches!(
        get_for(&registry, 1001, "s1"),
        Err(SessionError::PermissionDenied(m)) if m.contains("uid 1000")
    ));
    assert!(matches!(
        get_for(&registry, 1000, "s2"),
        Err(SessionError::NotFound(_))
    ));
    assert!(matches!(
        get_for(&registry, 1000, "../s1"),
        Err(SessionError::InvalidParams(_))
    ));
}

#[test]
fn a_workspace_is_a_plain_absolute_real_directory_apart_from_the_daemons() {
    let dir = ScratchDir::new("workspace");
    let cfg = config(&dir.path().join("state"));
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let real = ws.canonicalize().unwrap();
    let check = |p: &str| check_workspace(&cfg, &root(), p);
    assert_eq!(check(ws.to_str().unwrap()).unwrap(), real);
    // Through a symlink: the real directory is the one used.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&ws, &link).unwrap();
    assert_eq!(check(link.to_str().unwrap()).unwrap(), real);
    let refused = |p: &str, why: &str| match check(p) {
        Err(SessionError::InvalidParams(m)) => assert!(m.contains(why), "{p}: {m}"),
        other => panic!("{p}: {other:?}"),
    };
    refused("relative/path", "absolute");
    refused(&format!("{}/../ws", ws.display()), "\"..\"");
    refused(&format!("{}/./x", dir.path().display()), "\"..\"");
    refused(
        &format!("{}/missing", dir.path().display()),
        "does not exist",
    );
    refused("/proc/self", "replaces");
    refused(cfg.sessions_dir().to_str().unwrap(), "daemon");
    // Holding the state directory is as bad as lying in it.
    refused(dir.path().to_str().unwrap(), "holds");
}

#[test]
fn the_daemons_session_directory_is_handed_to_its_owner_only() {
    if crate::sys::getuid() != 0 {
        eprintln!("skipped: handing a directory to another uid needs root");
        return;
    }
    let dir = ScratchDir::new("session-dir");
    let cfg = config(&dir.path().join("state"));
    let user = Creds {
        uid: 1000,
        gid: 1000,
        groups: Vec::new(),
    };
    let made = make_session_dir(&cfg, &user, "s1", None, Path::new("/w")).unwrap();
    assert_eq!(made, cfg.sessions_dir().join("s1"));
    for d in [made.clone(), made.join(dirs::BACKGROUND)] {
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1000), "{}", d.display());
        assert_eq!(m.permissions().mode() & 0o777, 0o700, "{}", d.display());
    }
    // Made again for the same owner: the same directory.
    assert_eq!(
        make_session_dir(&cfg, &user, "s1", None, Path::new("/w")).unwrap(),
        made
    );
    // Another uid never gets a directory left by an earlier session of that id.
    let other = Creds {
        uid: 1001,
        gid: 1001,
        groups: Vec::new(),
    };
    assert!(matches!(
        make_session_dir(&cfg, &other, "s1", None, Path::new("/w")),
        Err(SessionError::PermissionDenied(m)) if m.contains("uid 1000")
    ));
}

#[test]
fn a_callers_session_directory_lies_outside_the_workspace_and_is_theirs() {
    let dir = ScratchDir::new("callers-dir");
    let cfg = config(&dir.path().join("state"));
    let ws = dir.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let inside = ws.join("s");
    assert!(matches!(
        make_session_dir(&cfg, &root(), "s1", inside.to_str(), &ws),
        Err(SessionError::InvalidParams(m)) if m.contains("inside the workspace")
    ));
    let beside = dir.path().join("mine");
    let made = make_session_dir(&cfg, &root(), "s1", beside.to_str(), &ws).unwrap();
    assert_eq!(made, beside);
    assert!(beside.join(dirs::BACKGROUND).is_dir());
    // A symlink on the way is refused, not followed.
    let link = dir.path().join("via");
    std::os::unix::fs::symlink(dir.path(), &link).unwrap();
    let through = link.join("other");
    assert!(matches!(
        make_session_dir(&cfg, &root(), "s2", through.to_str(), &ws),
        Err(SessionError::InvalidParams(m)) if m.contains("symlink")
    ));
    assert!(!dir.path().join("other").exists());
}

#[test]
fn the_tree_is_walked_to_its_root_and_its_depth_counted() {
    let dir = ScratchDir::new("tree");
    let registry = Registry::open(dir.path()).unwrap();
    let child = child_session_id("01HZXTASK");
    assert_eq!(child, "sub-01hzxtask");
    registry.insert_session(&row("top", 1000, None)).unwrap();
    registry
        .insert_session(&row("mid", 1000, Some("top")))
        .unwrap();
    registry
        .insert_session(&row(&child, 1000, Some("mid")))
        .unwrap();
    let leaf = registry.get_session(&child).unwrap().unwrap();
    assert_eq!(depth_of(&registry, &leaf), 2);
    assert_eq!(root_session(&registry, &child), "top");
    assert_eq!(root_session(&registry, "top"), "top");
    // A parent that is gone ends the walk.
    registry
        .insert_session(&row("orphan", 1000, Some("gone")))
        .unwrap();
    assert_eq!(root_session(&registry, "orphan"), "gone");
}
