//! Landlock: which access rights this kernel's ABI can handle, and the ruleset for a run.
//!
//! Every right the ABI knows is handled (so denied unless a rule grants it); rules grant
//! rights beneath the paths of the mount view. A right a newer ABI would add is reported as
//! a missing layer, never silently dropped: the caller decides (best-effort or refuse).

use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use crate::sandbox::profile::Network;
use crate::sys::sandbox as sys;

pub const EXECUTE: u64 = 1 << 0;
pub const WRITE_FILE: u64 = 1 << 1;
pub const READ_FILE: u64 = 1 << 2;
pub const READ_DIR: u64 = 1 << 3;
pub const REMOVE_DIR: u64 = 1 << 4;
pub const REMOVE_FILE: u64 = 1 << 5;
pub const MAKE_CHAR: u64 = 1 << 6;
pub const MAKE_DIR: u64 = 1 << 7;
pub const MAKE_REG: u64 = 1 << 8;
pub const MAKE_SOCK: u64 = 1 << 9;
pub const MAKE_FIFO: u64 = 1 << 10;
pub const MAKE_BLOCK: u64 = 1 << 11;
pub const MAKE_SYM: u64 = 1 << 12;
/// ABI 2: moving and linking files between directories.
pub const REFER: u64 = 1 << 13;
/// ABI 3.
pub const TRUNCATE: u64 = 1 << 14;
/// ABI 5: ioctl on device files.
pub const IOCTL_DEV: u64 = 1 << 15;

/// ABI 4.
pub const NET_BIND_TCP: u64 = 1 << 0;
pub const NET_CONNECT_TCP: u64 = 1 << 1;

/// ABI 6.
pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
pub const SCOPE_SIGNAL: u64 = 1 << 1;

/// The ABI that has everything we use: filesystem (with refer, truncate and device ioctl),
/// TCP, and scoping of abstract sockets and signals.
pub const FULL_ABI: u32 = 6;

pub const READ: u64 = READ_FILE | READ_DIR;
pub const WRITE: u64 = READ
    | WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE;
/// For the device nodes of the minimal `/dev`.
pub const DEVICE: u64 = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV;

/// The filesystem rights `abi` can handle.
pub fn fs_rights(abi: u32) -> u64 {
    let mut r = (1 << 13) - 1;
    if abi >= 2 {
        r |= REFER;
    }
    if abi >= 3 {
        r |= TRUNCATE;
    }
    if abi >= 5 {
        r |= IOCTL_DEV;
    }
    r
}

/// What a ruleset on this ABI enforces, by layer name, and what it cannot.
pub fn coverage(abi: u32, network: Network) -> (Vec<&'static str>, Vec<(&'static str, String)>) {
    let mut active = Vec::new();
    let mut missing = Vec::new();
    if abi == 0 {
        missing.push(("landlock_fs", "landlock is not available".to_owned()));
        return (active, missing);
    }
    if abi >= 5 {
        active.push("landlock_fs");
    } else {
        missing.push((
            "landlock_fs",
            format!(
                "landlock ABI {abi} lacks {} (needs ABI 5)",
                match abi {
                    1 => "refer, truncate and device-ioctl control",
                    2 => "truncate and device-ioctl control",
                    _ => "device-ioctl control",
                }
            ),
        ));
    }
    match network {
        Network::None if abi >= 4 => active.push("landlock_net"),
        Network::None => missing.push((
            "landlock_net",
            format!("landlock ABI {abi} has no TCP rules (needs ABI 4)"),
        )),
        // loopback: the network namespace already isolates; host: the network is allowed.
        Network::Loopback | Network::Host => {}
    }
    if abi >= 6 {
        active.push("landlock_scope");
    } else {
        missing.push((
            "landlock_scope",
            format!("landlock ABI {abi} cannot scope abstract sockets and signals (needs ABI 6)"),
        ));
    }
    (active, missing)
}

/// One rule: a path in the view and the rights granted beneath it.
#[derive(Debug, Clone)]
pub struct PathRule {
    pub path: PathBuf,
    pub access: u64,
}

/// Builds the ruleset (opening each rule's path in the current view). A path that is gone is
/// skipped: it was optional and is not in the view.
pub fn ruleset(
    abi: u32,
    rules: &[PathRule],
    network: Network,
) -> Result<OwnedFd, (PathBuf, io::Error)> {
    let fs = fs_rights(abi);
    let net = match network {
        Network::None if abi >= 4 => NET_BIND_TCP | NET_CONNECT_TCP,
        _ => 0,
    };
    let scoped = if abi >= 6 {
        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
    } else {
        0
    };
    let rs = sys::landlock_create_ruleset(fs, net, scoped, abi)
        .map_err(|e| (PathBuf::from("(ruleset)"), e))?;
    for r in rules {
        let fd = match sys::open_path(&r.path, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err((r.path.clone(), e)),
        };
        let mut access = r.access & fs;
        // Directory-only rights on a file are refused by the kernel.
        if sys::fstat(&fd).map(|i| !i.is_dir()).unwrap_or(false) {
            access &= EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV;
        }
        sys::landlock_allow_path(&rs, &fd, access).map_err(|e| (r.path.clone(), e))?;
    }
    Ok(rs)
}

/// The rules for a view: the profile's mounts plus the fixed parts (`/`, `/proc`, `/dev`).
pub fn rules_for(mounts: &[(PathBuf, bool, bool)]) -> Vec<PathRule> {
    let mut v = vec![
        // Listing directories of the view is harmless: it only holds what the profile names.
        PathRule {
            path: "/".into(),
            access: READ_DIR,
        },
        PathRule {
            path: "/proc".into(),
            access: READ,
        },
        PathRule {
            path: "/dev/pts".into(),
            access: DEVICE | READ_DIR,
        },
        PathRule {
            path: "/dev/shm".into(),
            access: WRITE,
        },
    ];
    for d in super::view::DEVICES {
        v.push(PathRule {
            path: Path::new("/dev").join(d),
            access: DEVICE,
        });
    }
    for (target, exec, write) in mounts {
        let mut access = READ;
        if *exec {
            access |= EXECUTE;
        }
        if *write {
            access |= WRITE;
        }
        v.push(PathRule {
            path: target.clone(),
            access,
        });
    }
    v
}
