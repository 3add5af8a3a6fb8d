//! What some tests change on the host itself (the system socket's paths, a local account):
//! an exclusive lock per such thing, held for the test, so that two tests never change it at
//! once; and a uid-1000 account, made for the test when the host has none.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;

/// An exclusive lock named `name` (a file in the temporary directory), held until dropped.
pub struct HostLock {
    _held: std::fs::File,
}

impl HostLock {
    /// Blocks until no other test holds `name`.
    pub fn take(name: &str) -> HostLock {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(std::env::temp_dir().join(format!("sidejob-tests-{name}.lock")))
            .expect("lock file");
        // SAFETY: flock on a descriptor this function owns; it blocks until the lock is
        // free and touches no memory.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
        HostLock { _held: f }
    }
}

/// A user's account from the password database: uid, gid, home.
pub fn account(uid: u32) -> Option<(u32, u32, PathBuf)> {
    let out = Command::new("getent")
        .args(["passwd", &uid.to_string()])
        .output()
        .ok()?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 7 {
        return None;
    }
    Some((uid, f[3].parse().ok()?, PathBuf::from(f[5])))
}

/// The host's uid-1000 account (the first user of most distributions; its home may be
/// missing, which the caller checks), for the test's length: the lock `uid-1000` is held meanwhile, and when the host has no such account one
/// is made (`useradd -u 1000 -m`) and removed when this is dropped. Root only.
pub struct User1000 {
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    made: Option<String>,
    _lock: HostLock,
}

impl User1000 {
    pub fn take() -> User1000 {
        let lock = HostLock::take("uid-1000");
        let mut made = None;
        if account(1000).is_none() {
            let name = format!("sjt1000-{}", std::process::id());
            let out = Command::new("useradd")
                .args(["-m", "-U", "-u", "1000", &name])
                .output()
                .expect("useradd");
            assert!(out.status.success(), "useradd -u 1000: {out:?}");
            made = Some(name);
        }
        let (uid, gid, home) = account(1000).expect("the uid-1000 account");
        User1000 {
            uid,
            gid,
            home,
            made,
            _lock: lock,
        }
    }
}

impl Drop for User1000 {
    fn drop(&mut self) {
        if let Some(name) = &self.made {
            let _ = Command::new("userdel").args(["-r", name]).output();
        }
    }
}
