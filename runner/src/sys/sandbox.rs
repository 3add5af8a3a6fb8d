//! Wrappers for the calls that build a run's sandbox: mounts, landlock, seccomp, capabilities,
//! rlimits. Thin on purpose: each returns the OS error and the caller names the step.
//!
//! Constants and structs of the landlock and mount APIs are spelled out here (they are stable
//! kernel ABI) so we do not depend on the libc crate having caught up.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{cvt, cvt_long};

fn cpath(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

// ---- mounts ---------------------------------------------------------------------------------

/// `mount(2)`.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let src = source.map(cpath).transpose()?;
    let tgt = cpath(target)?;
    // SAFETY: every pointer is either NULL (allowed for source, fstype and data) or a
    // NUL-terminated string that outlives the call.
    cvt(unsafe {
        libc::mount(
            src.as_ref().map_or(std::ptr::null(), |s| s.as_ptr()),
            tgt.as_ptr(),
            fstype.map_or(std::ptr::null(), |s| s.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    })?;
    Ok(())
}

/// Detaches the mount at `target` (and everything below it) lazily.
pub fn umount_detach(target: &Path) -> io::Result<()> {
    let tgt = cpath(target)?;
    // SAFETY: a NUL-terminated path and an integer flag.
    cvt(unsafe { libc::umount2(tgt.as_ptr(), libc::MNT_DETACH) })?;
    Ok(())
}

/// `pivot_root(new_root, put_old)`.
pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let (a, b) = (cpath(new_root)?, cpath(put_old)?);
    // SAFETY: two NUL-terminated paths that outlive the call.
    cvt_long(unsafe { libc::syscall(libc::SYS_pivot_root, a.as_ptr(), b.as_ptr()) })?;
    Ok(())
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;
const AT_RECURSIVE: libc::c_uint = 0x8000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE)`: sets `set` and clears `clear` on the
/// mount at `fd` and every mount below it, in one call.
pub fn mount_setattr(fd: &OwnedFd, set: u64, clear: u64) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: the descriptor is valid, the path is an empty NUL-terminated string, and `attr`
    // is a correctly laid out `struct mount_attr` whose size we pass.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// Like [`mount_setattr`], on the mount at `path` (and every mount below it).
pub fn mount_setattr_path(path: &Path, set: u64, clear: u64) -> io::Result<()> {
    let p = cpath(path)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: a NUL-terminated path relative to the working directory, and a correctly laid
    // out `struct mount_attr` whose size we pass.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            p.as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })?;
    Ok(())
}

/// `open_tree(fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH)`: a detached copy of the mount (or
/// the file) at `fd`, ready to be attached elsewhere with [`move_mount`].
pub fn open_tree_clone(fd: &OwnedFd) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    // SAFETY: a valid descriptor, an empty path and integer flags; returns a new descriptor.
    let r = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    })?;
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// Attaches the detached mount `from` on top of the file or directory `to` (both descriptors,
/// so no path is looked up again between the check and the mount).
pub fn move_mount(from: &OwnedFd, to: &OwnedFd) -> io::Result<()> {
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: two valid descriptors with empty paths and integer flags.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            c"".as_ptr(),
            to.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Opens `path` as an `O_PATH` descriptor (no read or write access, just a handle on the
/// inode); with `nofollow`, a symlink in the last component is opened itself.
pub fn open_path(path: &Path, nofollow: bool) -> io::Result<OwnedFd> {
    let p = cpath(path)?;
    let mut flags = libc::O_PATH | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    // SAFETY: a NUL-terminated path and integer flags; returns a new descriptor.
    let fd = cvt(unsafe { libc::open(p.as_ptr(), flags) })?;
    // SAFETY: fresh descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What `fstat` says about a descriptor: its type bits and link count.
pub struct FileInfo {
    pub mode: u32,
    pub nlink: u64,
}

impl FileInfo {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
}

pub fn fstat(fd: &OwnedFd) -> io::Result<FileInfo> {
    // SAFETY: `stat` is plain old data; zeroed is a valid value for the kernel to overwrite.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor (O_PATH descriptors support fstat) and a writable struct.
    cvt(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) })?;
    Ok(FileInfo {
        mode: st.st_mode,
        nlink: st.st_nlink,
    })
}

/// The `/proc/self/fd/N` path of a descriptor, which mount(2) follows to exactly that inode.
pub fn fd_path(fd: &OwnedFd) -> std::path::PathBuf {
    format!("/proc/self/fd/{}", fd.as_raw_fd()).into()
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// Brings the loopback interface of the current network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes integers and returns a new descriptor.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fresh descriptor, owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; zeroed is valid.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq we own; the union member
    // used is ifru_flags, which both ioctls define.
    unsafe {
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req))?;
    }
    Ok(())
}

// ---- process attributes ---------------------------------------------------------------------

pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) })?;
    Ok(())
}

/// A non-dumpable process's `/proc/<pid>` entries (environ, mem, fd, root…) are root-owned
/// and need `CAP_SYS_PTRACE`, so a sandboxed command cannot look into its init.
pub fn set_dumpable(on: bool) -> io::Result<()> {
    // SAFETY: integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong, 0, 0, 0) })?;
    Ok(())
}

pub fn setrlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: a valid resource id and a pointer to an initialised rlimit.
    cvt(unsafe { libc::setrlimit(resource, &lim) })?;
    Ok(())
}

/// The highest capability number this kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Removes every capability from the bounding set (so no exec can regain one) and clears
/// the ambient set. Needs `CAP_SETPCAP`, so it runs before the uid changes.
pub fn drop_bounding_and_ambient_caps(last: u32) -> io::Result<()> {
    for cap in 0..=last {
        // SAFETY: integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r == -1 {
            let e = io::Error::last_os_error();
            // EINVAL: a capability this kernel does not have.
            if e.raw_os_error() != Some(libc::EINVAL) {
                return Err(e);
            }
        }
    }
    // SAFETY: integer arguments only.
    cvt(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;
    Ok(())
}

/// Empties the effective, permitted and inheritable sets (a uid-0 run keeps none).
pub fn clear_caps() -> io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x20080522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset v3 reads one header and two data structs, laid out as the kernel expects.
    cvt_long(unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) })?;
    Ok(())
}

/// True when the effective set is empty (read from `/proc/self/status`).
pub fn has_no_effective_caps() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("CapEff:")
                    .map(|v| v.trim().trim_start_matches('0').is_empty())
            })
        })
        .unwrap_or(false)
}

// ---- landlock -------------------------------------------------------------------------------

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

#[repr(C)]
struct NetPortAttr {
    allowed_access: u64,
    port: u64,
}

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
const LANDLOCK_RULE_PATH_BENEATH: u32 = 1;
const LANDLOCK_RULE_NET_PORT: u32 = 2;

/// The landlock ABI version the kernel offers; an error if landlock is unavailable.
pub fn landlock_abi() -> io::Result<u32> {
    // SAFETY: NULL attr with size 0 and the VERSION flag is the documented probe.
    let r = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })?;
    Ok(r as u32)
}

/// Creates a ruleset handling these access rights (a right handled and not granted by any
/// rule is denied). `size` lets older ABIs (without `scoped` or `net`) take a shorter struct.
pub fn landlock_create_ruleset(fs: u64, net: u64, scoped: u64, abi: u32) -> io::Result<OwnedFd> {
    let attr = RulesetAttr {
        handled_access_fs: fs,
        handled_access_net: net,
        scoped,
    };
    let size = match abi {
        0..=3 => 8,
        4 | 5 => 16,
        _ => std::mem::size_of::<RulesetAttr>(),
    };
    // SAFETY: `attr` is laid out as `struct landlock_ruleset_attr` and `size` does not exceed
    // it; returns a new descriptor.
    let fd = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size,
            0u32,
        )
    })?;
    // SAFETY: fresh descriptor, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Grants `access` beneath the file or directory open at `parent`.
pub fn landlock_allow_path(ruleset: &OwnedFd, parent: &OwnedFd, access: u64) -> io::Result<()> {
    let attr = PathBeneathAttr {
        allowed_access: access,
        parent_fd: parent.as_raw_fd(),
    };
    // SAFETY: valid descriptors and a packed `struct landlock_path_beneath_attr`.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    })?;
    Ok(())
}

/// Grants TCP `access` (bind and/or connect) on `port`.
pub fn landlock_allow_port(ruleset: &OwnedFd, port: u16, access: u64) -> io::Result<()> {
    let attr = NetPortAttr {
        allowed_access: access,
        port: port as u64,
    };
    // SAFETY: a valid descriptor and a `struct landlock_net_port_attr`.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            LANDLOCK_RULE_NET_PORT,
            &attr as *const NetPortAttr,
            0u32,
        )
    })?;
    Ok(())
}

/// Enforces the ruleset on this process and its future children. Needs `no_new_privs`.
pub fn landlock_restrict_self(ruleset: &OwnedFd) -> io::Result<()> {
    // SAFETY: a valid ruleset descriptor and zero flags.
    cvt_long(unsafe {
        libc::syscall(libc::SYS_landlock_restrict_self, ruleset.as_raw_fd(), 0u32)
    })?;
    Ok(())
}

// ---- seccomp --------------------------------------------------------------------------------

/// Is seccomp filtering compiled into this kernel?
pub fn seccomp_available() -> bool {
    // SAFETY: integer arguments only; EINVAL means no CONFIG_SECCOMP.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) != -1 }
}

/// Installs a classic-BPF seccomp filter on this process (inherited by its children and kept
/// across exec). Needs `no_new_privs` (or `CAP_SYS_ADMIN`).
pub fn seccomp_install(filter: &[libc::sock_filter]) -> io::Result<()> {
    let prog = libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `prog` points at `filter`, which outlives the call; the kernel copies it.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0u32,
            &prog as *const libc::sock_fprog,
        )
    })?;
    Ok(())
}
