//! Opening what the daemon trusts (plugin libraries, sandbox profiles, its private plugin
//! copies) by descriptor, so that what is checked is what is read.
//!
//! A file that decides what the privileged daemon runs must be one that only root or the
//! daemon's own user could have written. Checking a path and then opening it are two lookups,
//! and anyone who can write a directory on the way, or a directory a symlink points into, can
//! swap the file in between. So [`TrustedDir::open`] walks from `/` one component at a time,
//! opening each relative to the descriptor of the directory before it with `O_NOFOLLOW` (a
//! symlink anywhere is refused, never followed), and checks each directory on its own
//! descriptor (`fstat`) before going through it; [`TrustedDir::open_file`] then opens the file
//! the same way and checks the descriptor it is read from. No path is resolved twice.
//!
//! The rule, for the file and every directory: owned by root or by the daemon's uid, and
//! writable by neither group nor others. A directory *above* the last one may be writable by
//! others if it is sticky (`/tmp`): in a sticky directory only an entry's owner (or the
//! directory's) can rename or remove it, and the entry the walk goes through next is itself
//! checked to be root's or the daemon's, so nobody else can replace it.
//!
//! Safe code only: the calls come from `nix`.
#![deny(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag, AT_FDCWD};
use nix::sys::stat::{self, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

/// Which part of what was asked for a refusal is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// The file itself.
    File,
    /// The directory that holds it (or the directory that was asked for).
    Directory,
    /// A directory further up the path.
    Ancestor,
}

/// What is wrong with it.
#[derive(Debug)]
pub(crate) enum Problem {
    /// It does not exist (not a refusal: callers treat a missing file as absent).
    Missing,
    /// It is a symlink, which is not followed.
    Symlink {
        target: Option<PathBuf>,
    },
    NotAFile,
    NotADirectory,
    /// Owned by someone other than root or the daemon's uid.
    Owner {
        uid: u32,
    },
    /// Writable by group or others (`mode` is the permission bits).
    Writable {
        mode: u32,
    },
    /// The path cannot be used (relative, or with a component that is not a plain name).
    BadPath,
    /// Opening or inspecting it failed.
    Io(io::Error),
}

/// Why a path is not trusted: the part of it, its own path, and what is wrong.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub part: Part,
    /// The file or directory the problem is about (for an ancestor, the ancestor).
    pub path: PathBuf,
    pub problem: Problem,
}

impl Refusal {
    /// The file (or a directory on its path) does not exist.
    pub(crate) fn is_missing(&self) -> bool {
        matches!(self.problem, Problem::Missing)
    }

    /// How to fix it, as one clause.
    pub(crate) fn hint(&self) -> String {
        let p = self.path.display();
        match &self.problem {
            Problem::Missing => format!("create {p} or change the configuration"),
            Problem::Symlink { target } => match (&self.part, target) {
                (Part::File, Some(t)) => format!(
                    "install the file itself in its place, e.g. install -m 0644 {} {p}",
                    t.display()
                ),
                (Part::File, None) => format!("install the file itself at {p}"),
                (_, Some(t)) => format!(
                    "name the real directory ({}) in the configuration instead",
                    t.display()
                ),
                (_, None) => "name the real directory in the configuration instead".into(),
            },
            Problem::NotAFile => format!("replace {p} with a regular file"),
            Problem::NotADirectory => format!("{p} must be a directory"),
            Problem::Owner { .. } => {
                format!("chown root {p}, or move it to a directory that only root can write")
            }
            Problem::Writable { .. } => format!("run chmod go-w {p}"),
            Problem::BadPath => "use an absolute path without '..'".into(),
            Problem::Io(_) => format!("check that the user sidejob runs as can open {p}"),
        }
    }
}

impl fmt::Display for Refusal {
    /// `<subject> <problem>`, e.g. "its directory is group-writable (mode 775)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.part {
            Part::File => write!(f, "the file ")?,
            Part::Directory => write!(f, "its directory ")?,
            Part::Ancestor => write!(f, "the directory {} on its path ", self.path.display())?,
        }
        match &self.problem {
            Problem::Missing => write!(f, "does not exist"),
            Problem::Symlink { target } => {
                write!(f, "is a symbolic link")?;
                if let Some(t) = target {
                    write!(f, " (to {})", t.display())?;
                }
                write!(f, ", and links are not followed here")
            }
            Problem::NotAFile => write!(f, "is not a regular file"),
            Problem::NotADirectory => write!(f, "is not a directory"),
            Problem::Owner { uid } => {
                let me = super::getuid();
                if me == 0 {
                    write!(f, "is owned by uid {uid}, not by root")
                } else {
                    write!(
                        f,
                        "is owned by uid {uid}, not by root or the daemon's uid {me}"
                    )
                }
            }
            Problem::Writable { mode } => write!(
                f,
                "is {} (mode {:o})",
                if mode & 0o002 != 0 {
                    "world-writable"
                } else {
                    "group-writable"
                },
                mode & 0o7777
            ),
            Problem::BadPath => write!(f, "is not an absolute, plain path"),
            Problem::Io(e) => write!(f, "cannot be opened: {e}"),
        }
    }
}

impl std::error::Error for Refusal {}

/// What [`TrustedDir::open_private`] had to do to a private directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// Nothing: it was as the daemon left it (or new).
    No,
    /// It was open to others (`mode`, its permission bits then): emptied of `removed`
    /// entries and closed again.
    Emptied { mode: u32, removed: usize },
}

/// A directory that only root or the daemon's uid can change, held open. Files are opened,
/// created, renamed and removed relative to its descriptor.
#[derive(Debug)]
pub(crate) struct TrustedDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl TrustedDir {
    /// Opens the directory `path`, checking it and every directory above it, without
    /// following a symlink anywhere. A relative path is taken from the current directory.
    pub(crate) fn open(path: &Path) -> Result<TrustedDir, Refusal> {
        let path = absolute(path)?;
        let names: Vec<&OsStr> = path
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        let root_part = if names.is_empty() {
            Part::Directory
        } else {
            Part::Ancestor
        };
        let root = Path::new("/");
        let fd = fcntl::openat(AT_FDCWD, "/", dir_flags(), Mode::empty())
            .map_err(|e| refusal(root_part.clone(), root, Problem::Io(e.into())))?;
        check(&fd, root_part, root, SFlag::S_IFDIR)?;
        let mut dir = TrustedDir {
            fd,
            path: root.to_path_buf(),
        };
        for (i, name) in names.iter().enumerate() {
            let part = if i + 1 == names.len() {
                Part::Directory
            } else {
                Part::Ancestor
            };
            dir = dir.child(name, part)?;
        }
        Ok(dir)
    }

    /// Opens `parent/name`, a directory private to this process (its plugin copies),
    /// creating it (mode `mode`) if it is missing. One that this process's uid owns but that
    /// others may write is taken back rather than refused: an orchestrator re-owned it
    /// (Kubernetes' `fsGroup` adds group read and write and set-gid to every directory of a
    /// volume at each mount). Anything in it may have been written while it was open, so it
    /// is emptied, then set to `mode`, before it is checked and used; what it held (plugin
    /// copies, named by their hash) is made again from the trusted sources.
    pub(crate) fn open_private(
        parent: &Path,
        name: &str,
        mode: u32,
    ) -> Result<(TrustedDir, Reclaimed), Refusal> {
        let dir = TrustedDir::open(parent)?;
        let path = dir.path.join(name);
        match stat::mkdirat(&dir.fd, name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(refusal(Part::Directory, &path, Problem::Io(e.into()))),
        }
        let fd = fcntl::openat(
            &dir.fd,
            name,
            dir_flags() | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| {
            open_error(
                &dir.fd,
                OsStr::new(name),
                Part::Directory,
                &path,
                e,
                SFlag::S_IFDIR,
            )
        })?;
        let st =
            stat::fstat(&fd).map_err(|e| refusal(Part::Directory, &path, Problem::Io(e.into())))?;
        let mut reclaimed = Reclaimed::No;
        // Only a directory of our own uid is taken back: one of root's, seen by a daemon of
        // another uid, or anyone else's, is refused by the check below as before.
        if file_type(st.st_mode) == SFlag::S_IFDIR
            && st.st_uid == super::getuid()
            && st.st_mode & 0o022 != 0
        {
            let private = TrustedDir {
                fd,
                path: path.clone(),
            };
            // Closed first, so nobody adds an entry while it is emptied.
            stat::fchmod(&private.fd, Mode::from_bits_truncate(mode))
                .map_err(|e| refusal(Part::Directory, &path, Problem::Io(e.into())))?;
            let names = private
                .names()
                .map_err(|e| refusal(Part::Directory, &path, Problem::Io(e)))?;
            for entry in &names {
                private
                    .remove(entry)
                    .map_err(|e| refusal(Part::File, &path.join(entry), Problem::Io(e)))?;
            }
            reclaimed = Reclaimed::Emptied {
                mode: st.st_mode & 0o7777,
                removed: names.len(),
            };
            check(&private.fd, Part::Directory, &path, SFlag::S_IFDIR)?;
            return Ok((private, reclaimed));
        }
        check(&fd, Part::Directory, &path, SFlag::S_IFDIR)?;
        Ok((TrustedDir { fd, path }, reclaimed))
    }

    /// Opens the directory `name` in this one without following a symlink, and checks it.
    fn child(&self, name: &OsStr, part: Part) -> Result<TrustedDir, Refusal> {
        let path = self.path.join(name);
        let fd = fcntl::openat(
            &self.fd,
            name,
            dir_flags() | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )
        .map_err(|e| open_error(&self.fd, name, part.clone(), &path, e, SFlag::S_IFDIR))?;
        check(&fd, part, &path, SFlag::S_IFDIR)?;
        Ok(TrustedDir { fd, path })
    }

    /// The directory's path, as it was checked (absolute, without `.` or `..`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the regular file `name` in this directory for reading, without following a
    /// symlink, and checks its owner and mode on the descriptor that is returned.
    pub(crate) fn open_file(&self, name: &OsStr) -> Result<File, Refusal> {
        let path = self.path.join(name);
        if !super::dirfd::is_plain_name(name) {
            return Err(refusal(Part::File, &path, Problem::BadPath));
        }
        // O_NONBLOCK: opening a FIFO someone left here must not hang the daemon (it is
        // refused below as not a regular file); reads from a regular file ignore it.
        let flags = OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC;
        let fd = fcntl::openat(&self.fd, name, flags, Mode::empty())
            .map_err(|e| open_error(&self.fd, name, Part::File, &path, e, SFlag::S_IFREG))?;
        check(&fd, Part::File, &path, SFlag::S_IFREG)?;
        Ok(File::from(fd))
    }

    /// The names in this directory (not `.` and `..`), read from its descriptor.
    pub(crate) fn names(&self) -> io::Result<Vec<OsString>> {
        let mut out = Vec::new();
        // A descriptor of its own (`.` reopened), so reading moves no offset of ours.
        let mut dir = Dir::openat(
            &self.fd,
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        for entry in dir.iter() {
            let name = entry?.file_name().to_bytes().to_vec();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name));
            }
        }
        Ok(out)
    }

    /// Writes `bytes` to `name` so that `name` is either absent or complete: a temporary file
    /// (`.<name>.<pid>.tmp`) written and fsynced, then renamed over `name`, then the
    /// directory fsynced. On failure the temporary file is removed.
    pub(crate) fn write_atomically(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        let tmp = temp_name(name);
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let mode = Mode::from_bits_truncate(mode);
        let fd = match fcntl::openat(&self.fd, tmp.as_str(), flags, mode) {
            // Left by an earlier daemon with our pid that died mid-copy.
            Err(Errno::EEXIST) => {
                self.remove(OsStr::new(&tmp))?;
                fcntl::openat(&self.fd, tmp.as_str(), flags, mode)?
            }
            other => other?,
        };
        let mut file = File::from(fd);
        let written = file
            .write_all(bytes)
            .and_then(|()| file.sync_all())
            .and_then(|()| Ok(fcntl::renameat(&self.fd, tmp.as_str(), &self.fd, name)?))
            .and_then(|()| Ok(unistd::fsync(&self.fd)?));
        if written.is_err() {
            let _ = self.remove(OsStr::new(&tmp));
        }
        written
    }

    /// Removes the file (or symlink) `name`.
    pub(crate) fn remove(&self, name: &OsStr) -> io::Result<()> {
        Ok(unistd::unlinkat(
            &self.fd,
            name,
            UnlinkatFlags::NoRemoveDir,
        )?)
    }
}

/// Is `name` a temporary file of [`TrustedDir::write_atomically`]?
pub(crate) fn is_temp_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    b.starts_with(b".") && b.ends_with(b".tmp")
}

fn temp_name(name: &str) -> String {
    format!(".{name}.{}.tmp", std::process::id())
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC
}

/// The type bits of a mode (`S_IFDIR`, `S_IFREG`, `S_IFLNK`, …).
fn file_type(mode: libc::mode_t) -> SFlag {
    SFlag::from_bits_truncate(mode) & SFlag::S_IFMT
}

fn refusal(part: Part, path: &Path, problem: Problem) -> Refusal {
    Refusal {
        part,
        path: path.to_path_buf(),
        problem,
    }
}

/// An absolute path without `.` and `..`. `..` is resolved by dropping the component before
/// it, which is what the kernel does when that component is not a symlink; a symlink
/// anywhere is refused by the walk, so the two agree.
fn absolute(path: &Path) -> Result<PathBuf, Refusal> {
    let joined = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| refusal(Part::Directory, path, Problem::Io(e)))?
            .join(path)
    };
    let mut out = PathBuf::from("/");
    for c in joined.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            Component::Prefix(_) => return Err(refusal(Part::Directory, path, Problem::BadPath)),
        }
    }
    Ok(out)
}

/// Turns a failed `openat(…, O_NOFOLLOW)` into a refusal that says what is there.
fn open_error(
    dir: &OwnedFd,
    name: &OsStr,
    part: Part,
    path: &Path,
    e: Errno,
    want: SFlag,
) -> Refusal {
    let problem = match e {
        Errno::ENOENT => Problem::Missing,
        // O_NOFOLLOW on a symlink is ELOOP; O_DIRECTORY on a non-directory is ENOTDIR.
        Errno::ELOOP | Errno::ENOTDIR => {
            match stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) if file_type(st.st_mode) == SFlag::S_IFLNK => {
                    let target = fcntl::readlinkat(dir, name).ok().map(PathBuf::from);
                    Problem::Symlink { target }
                }
                Ok(_) if want == SFlag::S_IFDIR => Problem::NotADirectory,
                Ok(_) => Problem::NotAFile,
                Err(e) => Problem::Io(e.into()),
            }
        }
        e => Problem::Io(e.into()),
    };
    refusal(part, path, problem)
}

/// Checks what `fd` is: its type, its owner, and who can write it.
fn check(fd: &OwnedFd, part: Part, path: &Path, want: SFlag) -> Result<(), Refusal> {
    let st = stat::fstat(fd).map_err(|e| refusal(part.clone(), path, Problem::Io(e.into())))?;
    let mode = st.st_mode;
    if file_type(st.st_mode) != want {
        let problem = if want == SFlag::S_IFDIR {
            Problem::NotADirectory
        } else {
            Problem::NotAFile
        };
        return Err(refusal(part, path, problem));
    }
    let uid = st.st_uid;
    if uid != 0 && uid != super::getuid() {
        return Err(refusal(part, path, Problem::Owner { uid }));
    }
    let sticky = mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !(part == Part::Ancestor && sticky) {
        return Err(refusal(part, path, Problem::Writable { mode }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scratch::ScratchDir;
    use std::io::Read;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn a_checked_file_is_read_from_the_descriptor_that_was_checked() {
        let scratch = ScratchDir::with_mode("sysfs-read", 0o755);
        let d = scratch.path();
        std::fs::write(d.join("a.toml"), b"x = 1\n").unwrap();
        chmod(&d.join("a.toml"), 0o644);
        let dir = TrustedDir::open(d).unwrap();
        let mut text = String::new();
        dir.open_file(OsStr::new("a.toml"))
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "x = 1\n");
        assert!(dir
            .open_file(OsStr::new("missing.toml"))
            .unwrap_err()
            .is_missing());
        assert!(dir.names().unwrap().contains(&OsString::from("a.toml")));
        // `..` and `.` are resolved before the walk.
        let odd = d.join("sub/../.");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        assert_eq!(TrustedDir::open(&odd).unwrap().path(), d);
    }

    #[test]
    fn writable_by_others_is_refused_with_the_reason_and_the_fix() {
        let scratch = ScratchDir::with_mode("sysfs-mode", 0o755);
        let d = scratch.path();
        let f = d.join("p.so");
        std::fs::write(&f, b"x").unwrap();
        for (mode, word) in [(0o666, "world-writable"), (0o620, "group-writable")] {
            chmod(&f, mode);
            let e = TrustedDir::open(d)
                .unwrap()
                .open_file(OsStr::new("p.so"))
                .unwrap_err();
            let line = format!("{e}; {}", e.hint());
            assert!(
                line.starts_with("the file is ") && line.contains(word),
                "{line}"
            );
            assert!(line.contains("chmod go-w"), "{line}");
            assert_eq!(line.lines().count(), 1, "{line}");
        }
        chmod(&f, 0o644);
        // The directory holding it may not be writable by others, sticky or not.
        chmod(d, 0o1777);
        let e = TrustedDir::open(d).unwrap_err();
        assert_eq!(e.part, Part::Directory);
        assert!(
            e.to_string().contains("its directory is world-writable"),
            "{e}"
        );
        chmod(d, 0o755);
    }

    #[test]
    fn a_sticky_directory_above_is_fine_a_writable_one_is_not() {
        let scratch = ScratchDir::with_mode("sysfs-sticky", 0o755);
        let d = scratch.path();
        let inner = d.join("inner");
        std::fs::create_dir(&inner).unwrap();
        chmod(&inner, 0o755);
        chmod(d, 0o1777);
        TrustedDir::open(&inner).unwrap();
        chmod(d, 0o777);
        let e = TrustedDir::open(&inner).unwrap_err();
        assert_eq!(e.part, Part::Ancestor);
        assert_eq!(e.path, d);
        assert!(
            e.to_string().contains(&format!(
                "the directory {} on its path is world-writable",
                d.display()
            )),
            "{e}"
        );
        chmod(d, 0o755);
    }

    #[test]
    fn symlinks_are_refused_not_followed() {
        let scratch = ScratchDir::with_mode("sysfs-links", 0o755);
        let d = scratch.path();
        let real = d.join("real");
        std::fs::create_dir(&real).unwrap();
        chmod(&real, 0o755);
        std::fs::write(real.join("lib.so"), b"x").unwrap();
        chmod(&real.join("lib.so"), 0o644);
        std::os::unix::fs::symlink(real.join("lib.so"), real.join("link.so")).unwrap();
        std::os::unix::fs::symlink(&real, d.join("linkdir")).unwrap();
        let dir = TrustedDir::open(&real).unwrap();
        let e = dir.open_file(OsStr::new("link.so")).unwrap_err();
        assert!(matches!(e.problem, Problem::Symlink { .. }), "{e:?}");
        let line = format!("{e}; {}", e.hint());
        assert!(
            line.contains("is a symbolic link")
                && line.contains(&real.join("lib.so").display().to_string())
                && line.contains("install -m 0644"),
            "{line}"
        );
        let e = TrustedDir::open(&d.join("linkdir")).unwrap_err();
        assert!(matches!(e.problem, Problem::Symlink { .. }), "{e:?}");
        let e = TrustedDir::open(&d.join("linkdir/sub")).unwrap_err();
        assert_eq!(e.part, Part::Ancestor, "{e:?}");
    }

    #[test]
    fn a_private_directory_opened_to_others_is_emptied_and_closed_not_refused() {
        let scratch = ScratchDir::with_mode("sysfs-private", 0o755);
        let d = scratch.path();
        let (dir, r) = TrustedDir::open_private(d, "copies", 0o700).unwrap();
        assert_eq!(r, Reclaimed::No);
        dir.write_atomically("a.so", b"a", 0o500).unwrap();
        // Set-gid and group-readable, nobody else may write: kept as it is.
        chmod(&d.join("copies"), 0o2750);
        let (dir, r) = TrustedDir::open_private(d, "copies", 0o700).unwrap();
        assert_eq!(r, Reclaimed::No);
        assert!(dir.open_file(OsStr::new("a.so")).is_ok());
        // Group-writable (kubelet's fsGroup on a writable volume): emptied, then closed.
        chmod(&d.join("copies"), 0o2770);
        let (dir, r) = TrustedDir::open_private(d, "copies", 0o700).unwrap();
        assert_eq!(
            r,
            Reclaimed::Emptied {
                mode: 0o2770,
                removed: 1
            }
        );
        assert!(dir.names().unwrap().is_empty());
        let mode = std::fs::metadata(d.join("copies"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o700);
        // A writable parent is still refused: only the private directory is taken back.
        chmod(d, 0o777);
        assert!(TrustedDir::open_private(d, "copies", 0o700).is_err());
        chmod(d, 0o755);
    }

    #[test]
    fn an_atomic_write_leaves_the_whole_file_or_nothing() {
        let scratch = ScratchDir::with_mode("sysfs-atomic", 0o755);
        let d = scratch.path();
        let dir = TrustedDir::open(d).unwrap();
        dir.write_atomically("copy.so", b"contents", 0o500).unwrap();
        assert_eq!(std::fs::read(d.join("copy.so")).unwrap(), b"contents");
        assert_eq!(
            std::fs::metadata(d.join("copy.so"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o500
        );
        // The rename fails (a non-empty directory holds the name): no file is left behind.
        std::fs::create_dir_all(d.join("taken.so/x")).unwrap();
        assert!(dir
            .write_atomically("taken.so", b"contents", 0o500)
            .is_err());
        let left: Vec<OsString> = dir
            .names()
            .unwrap()
            .into_iter()
            .filter(|n| is_temp_name(n))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
