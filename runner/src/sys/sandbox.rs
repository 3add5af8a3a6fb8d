//! Wrappers for the calls that build a run's sandbox: mounts, seccomp, capabilities, rlimits
//! and the landlock probe (rulesets are built with the `landlock` crate, in
//! `sandbox/linux/landlock.rs`). Thin on purpose: each returns the OS error and the caller
//! names the step.
//!
//! Most calls come from `nix`. The raw ones are the calls nix 0.32 does not have: the new
//! mount API (`open_tree`, `move_mount`, `mount_setattr`), capabilities (`capset`, the
//! bounding and ambient sets), seccomp, the interface-flags ioctl and the landlock ABI probe.
//! Their constants and structs are spelled out here (they are stable kernel ABI) so we do not
//! depend on the libc crate having caught up.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::OFlag;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::resource::Resource;
use nix::sys::socket::{AddressFamily, SockFlag, SockType};
use nix::sys::stat::Mode;

use super::{cvt, cvt_long};

fn cpath(p: &Path) -> io::Result<std::ffi::CString> {
    std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

// ---- mounts ---------------------------------------------------------------------------------

/// `mount(2)`.
pub(crate) fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    nix::mount::mount(
        source,
        target,
        fstype,
        MsFlags::from_bits_retain(flags),
        data,
    )?;
    Ok(())
}

/// Detaches the mount at `target` (and everything below it) lazily.
pub(crate) fn umount_detach(target: &Path) -> io::Result<()> {
    nix::mount::umount2(target, MntFlags::MNT_DETACH)?;
    Ok(())
}

/// `pivot_root(new_root, put_old)`.
pub(crate) fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    nix::unistd::pivot_root(new_root, put_old)?;
    Ok(())
}

pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
pub(crate) const MOUNT_ATTR_NOEXEC: u64 = 0x8;
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
///
/// Raw: nix 0.32 has no `mount_setattr`.
pub(crate) fn mount_setattr(fd: &OwnedFd, set: u64, clear: u64) -> io::Result<()> {
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
///
/// Raw: nix 0.32 has no `mount_setattr`.
pub(crate) fn mount_setattr_path(path: &Path, set: u64, clear: u64) -> io::Result<()> {
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

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

/// `open_tree(fd, "", OPEN_TREE_CLONE | AT_EMPTY_PATH | flags)`: a detached copy of the mount
/// (or the file) at `fd`. Raw: nix 0.32 has no `open_tree`.
fn clone_tree(fd: &OwnedFd, flags: libc::c_uint) -> io::Result<OwnedFd> {
    // SAFETY: a valid descriptor, an empty path and integer flags; returns a new descriptor.
    let r = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            fd.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE
                | flags
                | libc::O_CLOEXEC as libc::c_uint
                | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    })?;
    // SAFETY: the kernel returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as RawFd) })
}

/// `move_mount(from, "", to_dir, to_path, MOVE_MOUNT_F_EMPTY_PATH | flags)`: attaches the
/// detached mount `from`. Raw: nix 0.32 has no `move_mount`.
fn attach_tree(
    from: &OwnedFd,
    to_dir: RawFd,
    to_path: &CStr,
    flags: libc::c_uint,
) -> io::Result<()> {
    // SAFETY: a valid descriptor with an empty path, a directory descriptor (or AT_FDCWD)
    // with a NUL-terminated path, and integer flags.
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            from.as_raw_fd(),
            c"".as_ptr(),
            to_dir,
            to_path.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | flags,
        )
    })?;
    Ok(())
}

/// Attaches the detached mount `from` on top of the file or directory `to` (both descriptors,
/// so no path is looked up again between the check and the mount).
pub(crate) fn move_mount(from: &OwnedFd, to: &OwnedFd) -> io::Result<()> {
    attach_tree(from, to.as_raw_fd(), c"", MOVE_MOUNT_T_EMPTY_PATH)
}

/// A detached copy of what `fd` is (a file or a directory), with every mount below it when
/// `recursive`. It can be attached ([`attach`]) in another mount namespace than the one it
/// was copied from: the view's sources are copied while the host's tree is in reach.
pub(crate) fn copy_tree(fd: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
    clone_tree(fd, if recursive { AT_RECURSIVE } else { 0 })
}

/// Attaches the detached copy `tree` at `target`: a bind mount of what was copied, as
/// `mount(2)` would make with `/proc/self/fd/N` as its source, without the walk through
/// `/proc` that name costs.
pub(crate) fn attach(tree: &OwnedFd, target: &Path) -> io::Result<()> {
    attach_tree(tree, libc::AT_FDCWD, &cpath(target)?, 0)
}

/// `chroot(path)`.
pub(crate) fn chroot(path: &Path) -> io::Result<()> {
    nix::unistd::chroot(path)?;
    Ok(())
}

/// Opens `path` as an `O_PATH` descriptor (no read or write access, just a handle on the
/// inode); with `nofollow`, a symlink in the last component is opened itself.
pub(crate) fn open_path(path: &Path, nofollow: bool) -> io::Result<OwnedFd> {
    let mut flags = OFlag::O_PATH | OFlag::O_CLOEXEC;
    flags.set(OFlag::O_NOFOLLOW, nofollow);
    Ok(nix::fcntl::open(path, flags, Mode::empty())?)
}

/// What `fstat` says about a descriptor: its type bits and link count.
pub(crate) struct FileInfo {
    pub mode: u32,
    pub nlink: u64,
}

impl FileInfo {
    pub(crate) fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub(crate) fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    pub(crate) fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
}

pub(crate) fn fstat(fd: &OwnedFd) -> io::Result<FileInfo> {
    let st = nix::sys::stat::fstat(fd)?;
    Ok(FileInfo {
        mode: st.st_mode,
        nlink: st.st_nlink,
    })
}

pub(crate) fn sethostname(name: &str) -> io::Result<()> {
    nix::unistd::sethostname(name)?;
    Ok(())
}

/// Brings the loopback interface of the current network namespace up.
///
/// Raw (the ioctls only): nix has no call that sets an interface's flags.
pub(crate) fn loopback_up() -> io::Result<()> {
    let sock = nix::sys::socket::socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data, so zeroed is a valid value; SIOCGIFFLAGS and
    // SIOCSIFFLAGS read the name and read or write `ifru_flags` (the union member both
    // define) of the ifreq we own, on a socket descriptor that is open for the calls.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
            *dst = *src as libc::c_char;
        }
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        cvt(libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req))?;
    }
    Ok(())
}

// ---- process attributes ---------------------------------------------------------------------

pub(crate) fn set_no_new_privs() -> io::Result<()> {
    nix::sys::prctl::set_no_new_privs()?;
    Ok(())
}

/// A non-dumpable process's `/proc/<pid>` entries (environ, mem, fd, root…) are root-owned
/// and need `CAP_SYS_PTRACE`, so a sandboxed command cannot look into its init.
pub(crate) fn set_dumpable(on: bool) -> io::Result<()> {
    nix::sys::prctl::set_dumpable(on)?;
    Ok(())
}

pub(crate) fn setrlimit(resource: Resource, soft: u64, hard: u64) -> io::Result<()> {
    nix::sys::resource::setrlimit(resource, soft, hard)?;
    Ok(())
}

/// The highest capability number this kernel knows.
pub(crate) fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Removes every capability from the bounding set (so no exec can regain one) and clears
/// the ambient set. Needs `CAP_SETPCAP`, so it runs before the uid changes.
///
/// Raw: nix's prctl module has neither `PR_CAPBSET_DROP` nor `PR_CAP_AMBIENT`.
pub(crate) fn drop_bounding_and_ambient_caps(last: u32) -> io::Result<()> {
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
///
/// Raw: nix has no `capset`.
pub(crate) fn clear_caps() -> io::Result<()> {
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

// ---- landlock -------------------------------------------------------------------------------

const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;

/// The landlock ABI version the kernel offers; an error if landlock is unavailable
/// (`EOPNOTSUPP`: disabled at boot; `ENOSYS`: not built in).
///
/// Raw: the `landlock` crate keeps its probe private on purpose (a program should ask for
/// rights and read the `RulesetStatus`, not branch on versions), but `sidejob doctor` and the
/// coverage report name the ABI and say why landlock is missing. Rulesets themselves are
/// built with the crate.
pub(crate) fn landlock_abi() -> io::Result<u32> {
    // SAFETY: NULL attr with size 0 and the VERSION flag is the documented probe; no memory
    // is read or written.
    let r = cvt_long(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    })?;
    Ok(r as u32)
}

// ---- seccomp --------------------------------------------------------------------------------

/// Is seccomp filtering compiled into this kernel?
///
/// Raw: nix's prctl module has no `PR_GET_SECCOMP`.
pub(crate) fn seccomp_available() -> bool {
    // SAFETY: integer arguments only; EINVAL means no CONFIG_SECCOMP.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) != -1 }
}

/// Installs a classic-BPF seccomp filter on this process (inherited by its children and kept
/// across exec). Needs `no_new_privs` (or `CAP_SYS_ADMIN`).
///
/// Raw: neither nix nor the landlock crate installs seccomp filters.
pub(crate) fn seccomp_install(filter: &[libc::sock_filter]) -> io::Result<()> {
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
