//! Set-id files already in a root run's writable paths (an extracted root filesystem, a
//! build tree): bound read-only over themselves in the view.
//!
//! A run cannot make a set-id file (seccomp), and a `write`, `truncate`, `fallocate` or
//! `copy_file_range` by a process without `CAP_FSETID` clears the bits of one it changes.
//! A store through a shared mapping (`mmap(MAP_SHARED)`) clears nothing, though: a root run
//! could rewrite a root-owned 4755 file and leave it set-uid on the host. A non-root run
//! may write only files its uid owns (or that anyone may write), whose set-uid bit grants
//! nothing beyond what the writer had; so only root runs need this.
//!
//! Each such file becomes a read-only mount of itself: no write route opens it for writing
//! (`EROFS`), it cannot be renamed, removed or replaced (`EBUSY`), nor hard-linked under a
//! writable name (`EXDEV`), and `chmod` is refused (`EROFS`). It stays readable and
//! executable (without its bits: `nosuid`, `no_new_privs`).

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::dir::Type;
use nix::fcntl::OFlag;

use super::view::{err as fail, in_view, Source};
use super::LaunchError;
use crate::sys::dirfd;
use crate::sys::sandbox::{self as sys, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

/// Binds every set-id regular file under the view's writable directories read-only over
/// itself. Runs once the writable paths are mounted in the view at `staging`.
pub(super) fn pin(staging: &Path, sources: &[Source]) -> Result<(), LaunchError> {
    for s in sources {
        let Source::Bind {
            target,
            write: true,
            ..
        } = s
        else {
            continue;
        };
        let path = in_view(staging, target);
        let fd = dirfd::open_path_no_symlinks(&path).map_err(fail("open", &path))?;
        let st = dirfd::stat_fd(fd.as_fd()).map_err(fail("stat", &path))?;
        if dirfd::is_dir(&st) {
            walk(fd.as_fd(), &path)?;
        } else if is_setid_file(&st) {
            bind_read_only(&fd, &path)?;
        }
    }
    Ok(())
}

/// Pins the set-id files beneath `dir` (at `path` in the view), never following a symlink.
fn walk(dir: BorrowedFd<'_>, path: &Path) -> Result<(), LaunchError> {
    let entries = match dirfd::entries(dir) {
        Ok(e) => e,
        // What root cannot read here (a FUSE mount of another user's), the run cannot
        // reach either.
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => return Ok(()),
        Err(e) => return Err(fail("read", path)(e)),
    };
    for (name, kind) in entries {
        let child = path.join(&name);
        let is_dir = match kind {
            Some(Type::Directory) => true,
            Some(Type::File) | None => {
                let Some(st) = present(dirfd::stat_at(dir, &name)).map_err(fail("stat", &child))?
                else {
                    continue;
                };
                if is_setid_file(&st) {
                    pin_entry(dir, &name, &child)?;
                }
                dirfd::is_dir(&st)
            }
            Some(_) => false,
        };
        if is_dir {
            let sub =
                present(dirfd::open_subdir(dir, Path::new(&name))).map_err(fail("open", &child))?;
            if let Some(sub) = sub {
                walk(sub.as_fd(), &child)?;
            }
        }
    }
    Ok(())
}

/// `None` for an entry that went between the listing and the look at it (other runs and the
/// host change the tree while a run starts): what is not there needs no pin. A directory
/// replaced by a file (`ENOTDIR`) is the same entry gone.
fn present<T>(r: std::io::Result<T>) -> std::io::Result<Option<T>> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn is_setid_file(st: &nix::sys::stat::FileStat) -> bool {
    dirfd::is_file(st) && st.st_mode & (libc::S_ISUID | libc::S_ISGID) != 0
}

/// Opens `name` in `dir` as itself (no symlink) and, still a set-id file, pins it.
fn pin_entry(dir: BorrowedFd<'_>, name: &OsStr, path: &Path) -> Result<(), LaunchError> {
    let fd = present(dirfd::open_at(dir, Path::new(name), OFlag::O_PATH, 0))
        .map_err(fail("open", path))?;
    let Some(fd) = fd else {
        return Ok(());
    };
    let st = dirfd::stat_fd(fd.as_fd()).map_err(fail("stat", path))?;
    if is_setid_file(&st) {
        bind_read_only(&fd, path)?;
    }
    Ok(())
}

/// A read-only mount of the file `fd` over itself.
fn bind_read_only(fd: &OwnedFd, path: &Path) -> Result<(), LaunchError> {
    let tree = sys::copy_tree(fd, false).map_err(fail("clone mount", path))?;
    sys::mount_setattr(
        &tree,
        MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        0,
    )
    .map_err(fail("make a set-id file read-only", path))?;
    sys::move_mount(&tree, fd).map_err(fail("mount a set-id file read-only", path))
}
