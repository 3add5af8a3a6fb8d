//! Class 2 of issue 8: a run leaves nothing on the host that grants more than its caller had.
//! As root — through `sidejob exec` and through a root session of the daemon — every route to
//! a set-uid or set-gid file, and to a file capability, is tried in the workspace; the host
//! then finds none there, while ordinary modes set the same ways are kept. And (issue 32,
//! item 4) a set-uid file already in a root run's workspace keeps its bytes and its bits
//! whatever route the run writes it by, while a plain file beside it is written.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use serde_json::json;
use sidejob_tests::{sidejob_bin, Daemon, TempDir};

use super::{mode_uid, set_mode};
use sidejob_tests::{skip_without, Need};

/// Every way to a set-id file or a file capability (each reports `NAME: ok|refused`), then
/// the positive controls.
const ATTACK: &str = r#"
try() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "$name: ok"; else echo "$name: refused"; fi; }
py() { python3 -c "import os, ctypes; $1"; }
cp /bin/sh x;  try chmod-6755 chmod 6755 x
try install-4755 install -m 4755 /bin/sh y
try mkdir-2755 mkdir -m 2755 d
mkdir d2;      try chmod-g+s-dir chmod g+s d2
try open-creat-4755 py 'os.close(os.open("p", os.O_CREAT | os.O_WRONLY, 0o4755))'
cp /bin/sh q;  try os.chmod-6755 py 'os.chmod("q", 0o6755)'
try mknod-4755 py 'os.mknod("m", 0o100000 | 0o4755)'
try tmpfile-4755 py 'fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o4755); os.link("/proc/self/fd/%d" % fd, "tmpf")'
try openat2-4755 py '
class How(ctypes.Structure): _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]
how = How(os.O_CREAT | os.O_WRONLY, 0o4755, 0)
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(437, -100, b"o2", ctypes.byref(how), ctypes.sizeof(how))
assert fd >= 0, os.strerror(ctypes.get_errno())'
cp /bin/sh c2; try fchmodat2-6755 py '
libc = ctypes.CDLL(None, use_errno=True)
assert libc.syscall(452, -100, b"c2", 0o6755, 0) == 0, os.strerror(ctypes.get_errno())'
try tar-x tar -xpf setid.tar
suid=; for f in /usr/bin/passwd /usr/bin/su /bin/su /usr/bin/mount /usr/bin/newgrp; do [ -u "$f" ] && suid=$f && break; done
if [ -n "$suid" ]; then try cp-p cp -p "$suid" cpp; else echo "cp-p: no set-uid file in view"; fi
cp /bin/sh capf; try setxattr-capability py 'os.setxattr("capf", "security.capability", bytes.fromhex("0100000200200000000000000000000000000000"))'
if command -v setcap >/dev/null; then cp /bin/sh capf2; try setcap setcap cap_net_raw+ep capf2; else echo "setcap: not installed"; fi
cp /bin/sh ok; try control-chmod-755 chmod 755 ok
try control-mkdir-755 mkdir -m 755 okd
try control-open-creat-755 py 'os.close(os.open("okp", os.O_CREAT | os.O_WRONLY, 0o755))'
echo done
"#;

/// A workspace holding `setid.tar`, an archive made on the host whose members are a
/// set-uid file and a set-gid directory.
fn workspace() -> TempDir {
    let ws = TempDir::new("setid-ws");
    let src = TempDir::new("setid-src");
    std::fs::write(src.path().join("t"), "#!/bin/sh\n").expect("t");
    set_mode(&src.path().join("t"), 0o4755);
    std::fs::create_dir(src.path().join("tdir")).expect("tdir");
    set_mode(&src.path().join("tdir"), 0o2755);
    let o = Command::new("tar")
        .arg("-cf")
        .arg(ws.path().join("setid.tar"))
        .arg("-C")
        .arg(src.path())
        .args(["t", "tdir"])
        .output()
        .expect("tar");
    assert!(o.status.success(), "make the archive: {o:?}");
    ws
}

/// Files under `dir` (symlinks not followed) with a set-uid or set-gid bit, or a
/// `security.capability` attribute.
fn escalating_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).expect("stat");
            if m.mode() & 0o6000 != 0 {
                out.push(format!("{} mode {:o}", p.display(), m.mode() & 0o7777));
            }
            if has_capability(&p) {
                out.push(format!("{} has security.capability", p.display()));
            }
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    out
}

fn has_capability(p: &Path) -> bool {
    let path = CString::new(p.as_os_str().as_bytes()).expect("path");
    let name = CString::new("security.capability").expect("name");
    // SAFETY: both strings are NUL-terminated and live across the call; a null buffer of
    // size 0 only asks for the attribute's size.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    n >= 0
}

/// The host-side verdict after the attack ran in `ws` and printed `output`.
fn check_host(ws: &Path, output: &str) {
    assert!(
        output.contains("done"),
        "the attack did not run to its end: {output}"
    );
    let found = escalating_files(ws);
    assert!(
        found.is_empty(),
        "the run left files that grant more than its caller had: {found:#?}\nrun output:\n{output}"
    );
    // Positive controls: ordinary modes, set the same ways, are kept.
    for line in [
        "control-chmod-755: ok",
        "control-mkdir-755: ok",
        "control-open-creat-755: ok",
    ] {
        assert!(output.contains(line), "{line:?} missing:\n{output}");
    }
    assert_eq!(mode_uid(&ws.join("ok")).0, 0o755);
    assert_eq!(mode_uid(&ws.join("okd")).0, 0o755);
    assert_eq!(mode_uid(&ws.join("okp")).0, 0o755);
}

fn needs() -> bool {
    !skip_without(&[Need::Root]) && !skip_without(&[Need::Python3])
}

#[test]
fn attack_setid_files_through_sidejob_exec_as_root() {
    if !needs() {
        return;
    }
    let ws = workspace();
    let o = Command::new(sidejob_bin())
        .arg("exec")
        .arg("--workspace")
        .arg(ws.path())
        .args(["--", "sh", "-c", ATTACK])
        .current_dir(ws.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("sidejob exec");
    let output = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{output}{}", String::from_utf8_lossy(&o.stderr));
    check_host(ws.path(), &output);
}

#[test]
fn attack_setid_files_through_a_root_session() {
    if !needs() {
        return;
    }
    let ws = workspace();
    let d = Daemon::start();
    let mut c = d.client();
    let s = c.open_session_in(ws.path());
    let r = c.bash(&s, ATTACK, json!({"yield_after_ms": 120_000}));
    let output = r["output"].as_str().unwrap_or("").to_owned();
    eprintln!("{output}");
    check_host(ws.path(), &output);
}

/// Every route that writes to an existing file, tried by a root run on its own copy of a
/// set-uid file (`s-<route>`) and of a plain one (`p-<route>`): each reports
/// `<file>: ok|refused`.
const WRITE_ROUTES: &str = r#"
import mmap, os
def write(p):
    fd = os.open(p, os.O_WRONLY); os.write(fd, b"PWNED"); os.close(fd)
def mmap_shared(p):
    fd = os.open(p, os.O_RDWR)
    m = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    m[0:5] = b"PWNED"; m.flush(); m.close(); os.close(fd)
def truncate(p):
    os.truncate(p, 1)
def fallocate(p):
    fd = os.open(p, os.O_WRONLY); os.posix_fallocate(fd, 0, 1 << 20); os.close(fd)
def copy_file_range(p):
    src = os.open("source", os.O_RDONLY); fd = os.open(p, os.O_WRONLY)
    os.copy_file_range(src, fd, 5, 0, 0); os.close(fd); os.close(src)
for f in [write, mmap_shared, truncate, fallocate, copy_file_range]:
    for p in ["s-" + f.__name__, "p-" + f.__name__]:
        try:
            f(p); print(p + ": ok")
        except OSError as e:
            print(p + ": refused", e)
print("done")
"#;

/// The mapping first: the one route that kept the bits before set-id files were pinned.
const ROUTES: [&str; 5] = [
    "mmap_shared",
    "write",
    "truncate",
    "fallocate",
    "copy_file_range",
];

/// What each file holds before the run: a page, so that a mapping has something to map.
fn original() -> Vec<u8> {
    let mut bytes = b"#!/bin/sh\necho original\n".to_vec();
    bytes.resize(4096, b'#');
    bytes
}

/// A workspace with a root-owned 4755 copy and a 0755 copy per route, and `source` (what
/// `copy_file_range` copies).
fn write_routes_workspace() -> TempDir {
    let ws = TempDir::new("setid-write-ws");
    std::fs::write(ws.path().join("source"), "PWNED").expect("source");
    for route in ROUTES {
        for (prefix, mode) in [("s", 0o4755), ("p", 0o755)] {
            let f = ws.path().join(format!("{prefix}-{route}"));
            std::fs::write(&f, original()).expect("file");
            set_mode(&f, mode);
        }
    }
    ws
}

/// The host's verdict: every set-uid file has its bytes and its 4755, every plain one was
/// changed by its route (the control).
fn check_write_routes(ws: &Path, output: &str) {
    assert!(output.contains("done"), "the attack did not run: {output}");
    for route in ROUTES {
        let s = ws.join(format!("s-{route}"));
        assert_eq!(
            mode_uid(&s),
            (0o4755, 0),
            "{route}: the set-uid file's mode changed:\n{output}"
        );
        assert!(
            std::fs::read(&s).expect("read") == original(),
            "{route}: a root run rewrote a set-uid file:\n{output}"
        );
        let p = ws.join(format!("p-{route}"));
        assert!(
            output.contains(&format!("p-{route}: ok")),
            "{route}: the control was refused:\n{output}"
        );
        assert!(
            std::fs::read(&p).expect("read") != original(),
            "{route}: the control file is unchanged:\n{output}"
        );
        assert_eq!(mode_uid(&p).0, 0o755, "{route}");
    }
}

#[test]
fn attack_root_run_rewrites_a_setuid_file_through_mmap_shared() {
    if !needs() {
        return;
    }
    let ws = write_routes_workspace();
    let d = Daemon::start();
    let mut c = d.client();
    let s = c.open_session_in(ws.path());
    let command = format!("python3 - <<'EOF'\n{WRITE_ROUTES}\nEOF\n");
    let r = c.bash(&s, &command, json!({"yield_after_ms": 120_000}));
    let output = r["output"].as_str().unwrap_or("").to_owned();
    eprintln!("{output}");
    check_write_routes(ws.path(), &output);
}

#[test]
fn attack_root_exec_rewrites_a_setuid_file_through_mmap_shared() {
    if !needs() {
        return;
    }
    let ws = write_routes_workspace();
    let o = Command::new(sidejob_bin())
        .arg("exec")
        .arg("--workspace")
        .arg(ws.path())
        .args(["--", "python3", "-c", WRITE_ROUTES])
        .current_dir(ws.path())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("sidejob exec");
    let output = String::from_utf8_lossy(&o.stdout).into_owned();
    eprintln!("{output}{}", String::from_utf8_lossy(&o.stderr));
    check_write_routes(ws.path(), &output);
}
