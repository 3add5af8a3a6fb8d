//! Acting in directories a caller controls without being tricked into acting elsewhere.
//!
//! Two tools, used together wherever the daemon or a supervisor touches a path that a caller
//! named or can write:
//! - descriptor-relative opens that never follow a symlink or leave the directory they start
//!   from (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), so a directory swapped for a
//!   symlink, or a planted `output.log -> /etc/shadow`, fails instead of redirecting root;
//! - [`as_caller`]: a short-lived thread whose *filesystem* credentials (fsuid, fsgid and
//!   supplementary groups) are the caller's, so every permission check on the way — search
//!   permission on each parent included — is the caller's, never root's.
//!
//! Safe code only: the calls come from `nix` (the per-thread credentials from
//! [`super::set_thread_fs_creds`]).
#![deny(unsafe_code)]

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::{self, OFlag, OpenHow, ResolveFlag, AT_FDCWD};
use nix::sys::stat::{self, FileStat, Mode};
use nix::unistd::{self, Gid, Uid, UnlinkatFlags};

/// Who a caller is, as far as the filesystem is concerned.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Creds {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (`SO_PEERGROUPS` for a socket peer).
    #[serde(default)]
    pub groups: Vec<u32>,
}

impl Creds {
    /// This process's own credentials.
    pub(crate) fn own() -> Creds {
        Creds {
            uid: unistd::geteuid().as_raw(),
            gid: unistd::getegid().as_raw(),
            groups: unistd::getgroups()
                .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
        }
    }
}

fn errno(e: nix::Error) -> io::Error {
    io::Error::from(e)
}

/// How every open here resolves: never through a symlink (magic links included), never
/// above the directory it starts from.
fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS
}

/// Opens an absolute directory path for use as a `*at` base, refusing any symlink on the
/// way (each component must be a real directory). The descriptor is `O_PATH`: it grants
/// nothing by itself, it only names the directory.
pub(crate) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path must be absolute",
        ));
    }
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    fcntl::openat2(AT_FDCWD, path, how).map_err(errno)
}

/// Opens `rel` beneath `dir` without following symlinks (`O_NOFOLLOW` on the last component
/// too, so a symlink there is `ELOOP`). `mode` applies when `flags` create a file.
///
/// `O_NONBLOCK` unless `O_PATH` (which takes no other flags): a FIFO (or a device) planted
/// under a name we open must not make the open — or a read — wait forever for a writer that
/// never comes; the caller checks what it opened. On regular files and directories
/// `O_NONBLOCK` changes nothing.
pub(crate) fn open_at(
    dir: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlag,
    mode: u32,
) -> io::Result<OwnedFd> {
    let mut flags = flags | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW;
    if !flags.contains(OFlag::O_PATH) {
        flags |= OFlag::O_NONBLOCK;
    }
    let mut how = OpenHow::new().flags(flags).resolve(beneath());
    if flags.intersects(OFlag::O_CREAT | OFlag::O_TMPFILE) {
        how = how.mode(Mode::from_bits_truncate(mode));
    }
    fcntl::openat2(dir, rel, how).map_err(errno)
}

/// A subdirectory of `dir` as an `O_PATH` base, without following symlinks.
pub(crate) fn open_subdir(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<OwnedFd> {
    open_at(dir, rel, OFlag::O_PATH | OFlag::O_DIRECTORY, 0)
}

/// Creates the file `name` in `dir`: it must not exist (`O_EXCL`), so whatever a caller
/// planted under that name — a symlink, a hard link, a file — makes this fail.
pub(crate) fn create_at(dir: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<OwnedFd> {
    open_at(
        dir,
        Path::new(name),
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY,
        mode,
    )
}

/// `mkdirat`; an existing entry is `AlreadyExists`.
pub(crate) fn mkdir_at(dir: BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<()> {
    stat::mkdirat(dir, name, Mode::from_bits_truncate(mode)).map_err(errno)
}

/// Makes the directory `name` in `dir` (or takes the one there) and opens it. With
/// `owner`, a directory this call made is handed to that uid/gid.
pub(crate) fn ensure_subdir(
    dir: BorrowedFd<'_>,
    name: &str,
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<OwnedFd> {
    let made = match mkdir_at(dir, name, mode) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(e),
    };
    let fd = open_subdir(dir, Path::new(name))?;
    if let (true, Some((uid, gid))) = (made, owner) {
        chown_fd(fd.as_fd(), uid, gid)?;
    }
    Ok(fd)
}

/// `fchownat(fd, "", AT_EMPTY_PATH)`: works on `O_PATH` descriptors too.
pub(crate) fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    unistd::fchownat(
        fd,
        "",
        Some(Uid::from_raw(uid)),
        Some(Gid::from_raw(gid)),
        fcntl::AtFlags::AT_EMPTY_PATH,
    )
    .map_err(errno)
}

/// The entries of the directory `dir` (not `.` and `..`) with their types as the directory
/// reports them (`None`: it does not say; `fstatat` them), read from a descriptor of their
/// own (`dir` may be `O_PATH`).
pub(crate) fn entries(
    dir: BorrowedFd<'_>,
) -> io::Result<Vec<(std::ffi::OsString, Option<nix::dir::Type>)>> {
    use std::os::unix::ffi::OsStringExt;
    let mut out = Vec::new();
    let mut d = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)?;
    for entry in d.iter() {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push((
                std::ffi::OsString::from_vec(name.to_vec()),
                entry.file_type(),
            ));
        }
    }
    Ok(out)
}

/// `fstatat` of `name` in `dir`, not following a symlink.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<FileStat> {
    stat::fstatat(dir, name, fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).map_err(errno)
}

/// `fstat` of any descriptor (`O_PATH` included).
pub(crate) fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    stat::fstat(fd).map_err(errno)
}

/// Is this a directory, a regular file?
pub(crate) fn is_dir(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

pub(crate) fn is_file(st: &FileStat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFREG
}

/// Renames within one directory; whatever is at `to` (a symlink included) is replaced, not
/// followed.
pub(crate) fn rename_at(dir: BorrowedFd<'_>, from: &str, to: &str) -> io::Result<()> {
    fcntl::renameat(dir, from, dir, to).map_err(errno)
}

/// Removes the file `name` from `dir` (never what a symlink points to).
pub(crate) fn unlink_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(errno)
}

/// Removes the empty directory `name` from `dir`.
pub(crate) fn rmdir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir).map_err(errno)
}

/// Removes the directory `name` in `parent` and everything in it, however deep, holding at
/// most three descriptors and never following a link (each is removed as itself).
///
/// A directory found inside is not entered where it is (that would hold a descriptor per
/// level, or resolve `..`, which a concurrent rename could point elsewhere): it is moved up
/// into the top directory under a fresh name (`renameat2` with `RENAME_NOREPLACE`) and
/// emptied from there, so every open is one name beneath the top. Something that changes
/// under the walk makes it fail with that step's error, never act outside the tree.
pub(crate) fn remove_tree_at(parent: BorrowedFd<'_>, name: &str) -> io::Result<()> {
    let top = open_at(
        parent,
        Path::new(name),
        OFlag::O_RDONLY | OFlag::O_DIRECTORY,
        0,
    )?;
    let mut fresh = 0u64;
    // The top's own subdirectories are emptied where they are; the deeper ones join them.
    let mut pending = empty_dir(top.as_fd(), None, &mut fresh)?;
    while let Some(d) = pending.pop() {
        let dir = open_at(
            top.as_fd(),
            Path::new(&d),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY,
            0,
        )?;
        pending.extend(empty_dir(dir.as_fd(), Some(top.as_fd()), &mut fresh)?);
        drop(dir);
        unistd::unlinkat(top.as_fd(), d.as_os_str(), UnlinkatFlags::RemoveDir).map_err(errno)?;
    }
    drop(top);
    rmdir_at(parent, name)
}

/// Removes every entry of `dir` but its subdirectories, which it moves into `top` under fresh
/// names (`None`: `dir` is the top, and they stay); returns their names in the top.
fn empty_dir(
    dir: BorrowedFd<'_>,
    top: Option<BorrowedFd<'_>>,
    fresh: &mut u64,
) -> io::Result<Vec<std::ffi::OsString>> {
    use nix::dir::{Dir, Type};
    use std::os::unix::ffi::OsStringExt;
    let mut names = Vec::new();
    // A descriptor of its own (`.` reopened), read to the end before anything is removed.
    let mut listing = Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(errno)?;
    for entry in listing.iter() {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push((
                std::ffi::OsString::from_vec(name.to_vec()),
                entry.file_type(),
            ));
        }
    }
    drop(listing);
    let mut subdirs = Vec::new();
    for (name, kind) in names {
        let is_dir = match kind {
            Some(Type::Directory) => true,
            Some(_) => false,
            // A file system that does not say: ask, without following a link.
            None => stat::fstatat(dir, name.as_os_str(), fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
                .map(|st| is_dir(&st))
                .map_err(errno)?,
        };
        if !is_dir {
            unistd::unlinkat(dir, name.as_os_str(), UnlinkatFlags::NoRemoveDir).map_err(errno)?;
            continue;
        }
        let Some(top) = top else {
            subdirs.push(name);
            continue;
        };
        loop {
            let to = std::ffi::OsString::from(format!(".sidejob-removing-{fresh}"));
            *fresh += 1;
            match fcntl::renameat2(
                dir,
                name.as_os_str(),
                top,
                to.as_os_str(),
                fcntl::RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => {
                    subdirs.push(to);
                    break;
                }
                Err(nix::errno::Errno::EEXIST) => continue,
                Err(e) => return Err(errno(e)),
            }
        }
    }
    Ok(subdirs)
}

/// Makes what was written through `fd` durable.
pub(crate) fn fsync(fd: BorrowedFd<'_>) -> io::Result<()> {
    unistd::fsync(fd).map_err(errno)
}

/// Makes the entries of the directory `dir` durable (a rename in it, a file made in it).
/// `dir` may be an `O_PATH` descriptor, on which `fsync` itself is refused (`EBADF`): the
/// directory is opened for reading through it first.
pub(crate) fn fsync_dir(dir: BorrowedFd<'_>) -> io::Result<()> {
    let readable = open_at(dir, Path::new("."), OFlag::O_RDONLY | OFlag::O_DIRECTORY, 0)?;
    fsync(readable.as_fd())
}

/// Reads the whole of a (small) file beneath `dir`, at most `limit` bytes: more is an error,
/// so a caller cannot make the daemon allocate without bound.
pub(crate) fn read_at(dir: BorrowedFd<'_>, rel: &Path, limit: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let fd = open_at(dir, rel, OFlag::O_RDONLY, 0)?;
    let st = stat_fd(fd.as_fd())?;
    if !is_file(&st) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    let mut out = Vec::new();
    std::fs::File::from(fd)
        .take(limit + 1)
        .read_to_end(&mut out)?;
    if out.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(out)
}

/// Writes `data` to `dir/name` through a fresh temporary file (`O_EXCL`, never one a caller
/// planted) renamed over `name`, handed to `owner` before it appears: every reader sees no
/// file or the whole of it at once, and the caller makes it durable later (`sync_all` on the
/// returned file, then [`fsync_dir`]) — after telling someone it is there, say.
pub(crate) fn write_visible_at(
    dir: BorrowedFd<'_>,
    name: &str,
    data: &[u8],
    mode: u32,
    owner: Option<(u32, u32)>,
) -> io::Result<std::fs::File> {
    use std::io::Write;
    let tmp = format!(".{name}.tmp");
    // A leftover (ours from a crash, or planted) is removed first; if something is put back
    // before the create, the create fails rather than write through it.
    match unlink_at(dir, &tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let fd = create_at(dir, &tmp, mode)?;
    if let Some((uid, gid)) = owner {
        chown_fd(fd.as_fd(), uid, gid)?;
    }
    let mut f = std::fs::File::from(fd);
    f.write_all(data)?;
    rename_at(dir, &tmp, name)?;
    Ok(f)
}

/// Runs `f` with `creds` as the filesystem credentials.
///
/// Linux keeps credentials per thread: `f` runs on a short-lived thread whose fsuid, fsgid
/// and supplementary groups are set with the raw system calls (glibc's `setgroups` would
/// change every thread of the process), so no other thread of the daemon is affected and
/// nothing needs restoring. With an fsuid other than 0 the kernel also drops that thread's
/// file capabilities (`CAP_DAC_OVERRIDE`, `CAP_FOWNER`, …): every check is the caller's.
///
/// `None`, or credentials that are this process's own, run `f` here. An unprivileged process
/// cannot take on another user's credentials: that is refused.
pub(crate) fn as_caller<T: Send>(
    creds: Option<&Creds>,
    f: impl FnOnce() -> io::Result<T> + Send,
) -> io::Result<T> {
    let Some(c) = creds else { return f() };
    let euid = unistd::geteuid().as_raw();
    if c.uid == euid && (euid != 0 || c.gid == unistd::getegid().as_raw()) {
        return f();
    }
    if euid != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "an unprivileged daemon (uid {euid}) cannot act with the credentials of uid {}",
                c.uid
            ),
        ));
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            super::set_thread_fs_creds(c.uid, c.gid, &c.groups)?;
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("a thread acting as the caller panicked")))
    })
}

/// Runs `f` with `creds` as this thread's filesystem credentials and restores root's after:
/// for the single-threaded run init, which must stay single-threaded to fork (a helper thread
/// could still be counted when it forks). `None`, or a process that is not root, runs `f` as
/// it is.
pub(crate) fn with_creds_here<T>(
    creds: Option<&Creds>,
    f: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    let Some(c) = creds else { return f() };
    if unistd::geteuid().as_raw() != 0 || c.uid == 0 {
        return f();
    }
    let own = Creds::own();
    super::set_thread_fs_creds(c.uid, c.gid, &c.groups)?;
    let out = f();
    // Back to root's: the kernel gives the file capabilities back with fsuid 0.
    super::set_thread_fs_creds(own.uid, own.gid, &own.groups)?;
    out
}

/// Opens a path a caller named (a `{workspace}`) as an `O_PATH` descriptor with no symlink
/// on the way; a symlink as the last component is returned as itself (`O_NOFOLLOW`), for the
/// caller to refuse or recreate.
pub(crate) fn open_path_no_symlinks(path: &Path) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    fcntl::openat2(AT_FDCWD, path, how).map_err(errno)
}

/// Opens a path the caller owns or named (under `{home}`) as an `O_PATH` descriptor the way
/// the caller's own `open` would, symlinks followed, but never through a magic link
/// (`/proc/<pid>/root`, `/proc/self/fd/N`: `ELOOP`), which would lead where no path the
/// caller can name leads. With `O_NOFOLLOW` in `flags`, a symlink as the last component is
/// opened as itself (to read with [`read_link`]). Call it with the caller's credentials
/// ([`with_creds_here`]), so every directory on the way, a symlink's target included, is
/// searched as them.
pub(crate) fn open_path_no_magiclinks(path: &Path, flags: OFlag) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | flags)
        .resolve(ResolveFlag::RESOLVE_NO_MAGICLINKS);
    fcntl::openat2(AT_FDCWD, path, how).map_err(errno)
}

/// The text of the symlink `fd` is (an `O_PATH | O_NOFOLLOW` descriptor of it).
pub(crate) fn read_link(fd: BorrowedFd<'_>) -> io::Result<std::path::PathBuf> {
    fcntl::readlinkat(fd, "")
        .map(std::path::PathBuf::from)
        .map_err(errno)
}

/// The path the kernel names for what `fd` is now (the target of its `/proc/self/fd`
/// entry: a link of this process's own, read, not followed).
pub(crate) fn fd_path(fd: BorrowedFd<'_>) -> io::Result<std::path::PathBuf> {
    std::fs::read_link(proc_fd_path(fd))
}

/// The path of a descriptor under `/proc/self/fd`, for calls that only take paths (a bind
/// mount's source): the magic link resolves to the descriptor's file, whatever its path is
/// now.
pub(crate) fn proc_fd_path(fd: BorrowedFd<'_>) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// A name that is a single path component (no `/`, not `.` or `..`, not empty).
pub(crate) fn is_plain_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writes_work_through_a_path_only_directory_and_refuse_planted_names() {
        let scratch = crate::scratch::ScratchDir::new("dirfd");
        let base = scratch.path();
        let dir = open_dir(base).unwrap();
        write_visible_at(dir.as_fd(), "r.json", b"one", 0o600, None).unwrap();
        write_visible_at(dir.as_fd(), "r.json", b"two", 0o600, None).unwrap();
        assert_eq!(std::fs::read(base.join("r.json")).unwrap(), b"two");
        // A symlink planted under a name to create is never written through.
        std::os::unix::fs::symlink("/etc/hostname", base.join("planted")).unwrap();
        assert!(create_at(dir.as_fd(), "planted", 0o600).is_err());
        assert!(read_at(dir.as_fd(), Path::new("planted"), 1024).is_err());
    }
}
