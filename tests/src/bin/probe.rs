//! `sidejob-probe`: a test fixture run inside the sandbox. Each subcommand tries one thing and
//! prints one JSON line: `{"op", "ok", "errno", "detail"}`; the exit code is 0 when the
//! operation succeeded and 1 when it was refused. Escape tests assert on this report, and run
//! the same probe outside the sandbox as their positive control.
#![allow(unsafe_code)]

use std::ffi::CString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

fn report(op: &str, res: Result<String, std::io::Error>) -> ! {
    let (ok, errno, detail) = match res {
        Ok(d) => (true, None, d),
        Err(e) => (false, e.raw_os_error(), e.to_string()),
    };
    let line = serde_json::json!({"op": op, "ok": ok, "errno": errno, "detail": detail});
    println!("{line}");
    let _ = std::io::stdout().flush();
    std::process::exit(if ok { 0 } else { 1 })
}

fn last() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn cvt(r: libc::c_long) -> Result<libc::c_long, std::io::Error> {
    if r < 0 {
        Err(last())
    } else {
        Ok(r)
    }
}

fn cstr(s: &str) -> CString {
    CString::new(s).unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = |i: usize| args.get(i).cloned().unwrap_or_default();
    let op = a(0);
    let res: Result<String, std::io::Error> = match op.as_str() {
        "read" => std::fs::read(a(1)).map(|b| String::from_utf8_lossy(&b).into_owned()),
        "write" => std::fs::write(a(1), a(2)).map(|_| "written".into()),
        "append" => std::fs::OpenOptions::new()
            .append(true)
            .open(a(1))
            .and_then(|mut f| f.write_all(a(2).as_bytes()))
            .map(|_| "appended".into()),
        "rename" => std::fs::rename(a(1), a(2)).map(|_| "renamed".into()),
        "link" => std::fs::hard_link(a(1), a(2)).map(|_| "linked".into()),
        "symlink" => std::os::unix::fs::symlink(a(1), a(2)).map(|_| "symlinked".into()),
        "remove" => std::fs::remove_file(a(1)).map(|_| "removed".into()),
        "ls" => std::fs::read_dir(a(1)).map(|d| {
            let mut v: Vec<String> = d
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v.join(" ")
        }),
        "tcp" => std::net::TcpStream::connect(a(1))
            .and_then(|mut s| s.write_all(b"probe").map(|_| "connected".into())),
        "udp" => std::net::UdpSocket::bind("0.0.0.0:0")
            .and_then(|s| s.send_to(b"probe", a(1)).map(|n| format!("sent {n}"))),
        "tcp-listen" => std::net::TcpListener::bind(a(1))
            .map(|l| format!("listening on {:?}", l.local_addr().ok())),
        "unix" => std::os::unix::net::UnixStream::connect(a(1))
            .and_then(|mut s| s.write_all(b"probe\n").map(|_| "connected".into())),
        "abstract" => abstract_connect(&a(1)),
        "abstract-listen" => abstract_listen(&a(1), a(2).parse().unwrap_or(10)),
        "ptrace" => {
            let pid: i32 = a(1).parse().unwrap_or(1);
            // SAFETY: PTRACE_ATTACH takes a pid; the other arguments are ignored.
            cvt(unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) }).map(|_| "attached".into())
        }
        "kill" => {
            let pid: i32 = a(1).parse().unwrap_or(1);
            let sig: i32 = a(2).parse().unwrap_or(0);
            // SAFETY: kill takes integers.
            cvt(unsafe { libc::kill(pid, sig) } as libc::c_long).map(|_| "signalled".into())
        }
        "mount" => {
            let _ = std::fs::create_dir_all(a(1));
            let t = cstr(&a(1));
            // SAFETY: NUL-terminated strings that outlive the call.
            cvt(unsafe {
                libc::mount(
                    c"tmpfs".as_ptr(),
                    t.as_ptr(),
                    c"tmpfs".as_ptr(),
                    0,
                    std::ptr::null(),
                )
            } as libc::c_long)
            .map(|_| "mounted".into())
        }
        "unshare" => {
            let flags = match a(1).as_str() {
                "user" => libc::CLONE_NEWUSER,
                "net" => libc::CLONE_NEWNET,
                "mount" => libc::CLONE_NEWNS,
                _ => libc::CLONE_NEWUSER | libc::CLONE_NEWNS,
            };
            // SAFETY: unshare takes flags only.
            cvt(unsafe { libc::unshare(flags) } as libc::c_long).map(|_| "unshared".into())
        }
        "setns" => std::fs::File::open(a(1)).and_then(|f| {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid descriptor and nstype 0 (any).
            cvt(unsafe { libc::setns(f.as_raw_fd(), 0) } as libc::c_long).map(|_| "joined".into())
        }),
        "tiocsti" => {
            let c: libc::c_char = b'x' as libc::c_char;
            // SAFETY: TIOCSTI reads one byte from the pointer.
            cvt(unsafe { libc::ioctl(0, libc::TIOCSTI, &c) } as libc::c_long)
                .map(|_| "injected".into())
        }
        "io_uring" => {
            let mut params = [0u8; 120];
            // SAFETY: io_uring_setup writes into a 120-byte io_uring_params we own.
            cvt(unsafe { libc::syscall(libc::SYS_io_uring_setup, 1u32, params.as_mut_ptr()) })
                .map(|fd| format!("ring fd {fd}"))
        }
        "bpf" => {
            // BPF_MAP_CREATE with an array map.
            let mut attr = [0u32; 30];
            attr[0] = 2; // BPF_MAP_TYPE_ARRAY
            attr[1] = 4;
            attr[2] = 4;
            attr[3] = 1;
            // SAFETY: bpf reads `size` bytes of the attr union from our array.
            cvt(unsafe {
                libc::syscall(
                    libc::SYS_bpf,
                    0,
                    attr.as_mut_ptr(),
                    std::mem::size_of_val(&attr),
                )
            })
            .map(|fd| format!("map fd {fd}"))
        }
        "keyctl" => {
            // KEYCTL_GET_KEYRING_ID (0) of the session keyring (-3), creating it.
            // SAFETY: integer arguments only.
            cvt(unsafe { libc::syscall(libc::SYS_keyctl, 0, -3, 1) })
                .map(|id| format!("keyring {id}"))
        }
        "memfd-exec" => memfd_exec(),
        "clone3" => {
            #[repr(C)]
            struct CloneArgs([u64; 11]);
            let mut args = CloneArgs([0; 11]);
            args.0[4] = libc::SIGCHLD as u64; // exit_signal
                                              // SAFETY: clone3 with a valid struct and no stack: behaves like fork.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    &mut args as *mut CloneArgs,
                    std::mem::size_of::<CloneArgs>(),
                )
            };
            if r == 0 {
                // SAFETY: the child exits at once.
                unsafe { libc::_exit(0) };
            }
            cvt(r).map(|pid| format!("child {pid}"))
        }
        "status" => std::fs::read_to_string("/proc/self/status").map(|s| {
            s.lines()
                .filter(|l| {
                    l.starts_with("Cap")
                        || l.starts_with("NoNewPrivs")
                        || l.starts_with("Seccomp:")
                        || l.starts_with("Uid")
                        || l.starts_with("Gid")
                })
                .collect::<Vec<_>>()
                .join("; ")
        }),
        "env" => Ok(std::env::vars()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("\n")),
        "environs" => Ok(all_environs()),
        "fds" => std::fs::read_dir("/proc/self/fd").map(|d| {
            let mut v: Vec<String> = d
                .flatten()
                .map(|e| {
                    let target = std::fs::read_link(e.path())
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    format!("{}={target}", e.file_name().to_string_lossy())
                })
                .collect();
            v.sort();
            v.join(" ")
        }),
        "fork-bomb" => fork_bomb(a(1).parse().unwrap_or(100_000)),
        "alloc" => alloc(a(1).parse().unwrap_or(1024)),
        "spin" => loop {
            std::hint::spin_loop();
        },
        "flood" => flood(a(1).parse().unwrap_or(1 << 20)),
        "fill" => fill(&a(1), a(2).parse().unwrap_or(u64::MAX)),
        "orphan" => orphan(&a(1)),
        "sleep" => {
            std::thread::sleep(std::time::Duration::from_secs(a(1).parse().unwrap_or(3600)));
            Ok("slept".into())
        }
        "exit" => std::process::exit(a(1).parse().unwrap_or(0)),
        "signal" => {
            let sig: i32 = a(1).parse().unwrap_or(9);
            // SAFETY: raising a signal on ourselves.
            unsafe { libc::raise(sig) };
            Ok("survived".into())
        }
        "hostname" => {
            std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_owned())
        }
        "relay" => relay(&a(1)),
        "exec" => {
            let prog = cstr(&a(1));
            let argv: Vec<CString> = args[1..].iter().map(|s| cstr(s)).collect();
            let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
            ptrs.push(std::ptr::null());
            // SAFETY: NUL-terminated strings and a NULL-terminated array that outlive the call.
            unsafe { libc::execv(prog.as_ptr(), ptrs.as_ptr()) };
            Err(last())
        }
        _ => {
            eprintln!("usage: sidejob-probe OP [ARGS]");
            std::process::exit(2)
        }
    };
    report(&op, res)
}

/// Connects to the Unix socket `path` and copies stdin to it and its replies to stdout until
/// either side ends: a test's connection to the daemon made with this process's uid.
fn relay(path: &str) -> Result<String, std::io::Error> {
    let sock = std::os::unix::net::UnixStream::connect(path)?;
    let mut to_sock = sock.try_clone()?;
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut to_sock);
        let _ = to_sock.shutdown(std::net::Shutdown::Write);
    });
    let mut from_sock = &sock;
    std::io::copy(&mut from_sock, &mut std::io::stdout().lock())?;
    // The stream has ended: no report line after it.
    std::process::exit(0)
}

/// A stream socket and the abstract address `name`.
fn abstract_socket(
    name: &str,
) -> Result<(i32, libc::sockaddr_un, libc::socklen_t), std::io::Error> {
    // SAFETY: socket takes integers.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) } as libc::c_long)? as i32;
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = name.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        addr.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + bytes.len()) as libc::socklen_t;
    Ok((fd, addr, len))
}

/// Listens on the abstract address `name`: prints `listening` at once, then reports whether
/// anyone connected within `secs` seconds (`ETIMEDOUT` if not).
fn abstract_listen(name: &str, secs: i32) -> Result<String, std::io::Error> {
    let (fd, addr, len) = abstract_socket(name)?;
    // SAFETY: a valid socket and an address of `len` bytes.
    let r = unsafe { libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len) };
    cvt(r as libc::c_long)?;
    // SAFETY: a bound socket.
    cvt(unsafe { libc::listen(fd, 8) } as libc::c_long)?;
    println!("listening");
    let _ = std::io::stdout().flush();
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = cvt(unsafe { libc::poll(&mut pfd, 1, secs.saturating_mul(1000)) } as libc::c_long)?;
    if n == 0 {
        return Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
    }
    Ok("accepted".into())
}

fn abstract_connect(name: &str) -> Result<String, std::io::Error> {
    let (fd, addr, len) = abstract_socket(name)?;
    // SAFETY: a valid socket and an address of `len` bytes.
    let r = unsafe { libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) };
    cvt(r as libc::c_long)?;
    // SAFETY: writing 6 bytes from a static buffer.
    unsafe { libc::write(fd, b"probe\n".as_ptr().cast(), 6) };
    Ok("connected".into())
}

fn memfd_exec() -> Result<String, std::io::Error> {
    let body = std::fs::read("/bin/true")?;
    // SAFETY: a NUL-terminated name and flags (MFD_CLOEXEC).
    let fd =
        cvt(unsafe { libc::memfd_create(c"probe".as_ptr(), libc::MFD_CLOEXEC) } as libc::c_long)?
            as i32;
    // SAFETY: writing our buffer to the memfd.
    let n = unsafe { libc::write(fd, body.as_ptr().cast(), body.len()) };
    if n < 0 {
        return Err(last());
    }
    let argv = [c"true".as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null::<libc::c_char>()];
    // SAFETY: execveat with AT_EMPTY_PATH executes the memfd itself.
    unsafe {
        libc::syscall(
            libc::SYS_execveat,
            fd,
            c"".as_ptr(),
            argv.as_ptr(),
            envp.as_ptr(),
            libc::AT_EMPTY_PATH,
        )
    };
    Err(last())
}

fn all_environs() -> String {
    let mut out = Vec::new();
    if let Ok(d) = std::fs::read_dir("/proc") {
        for e in d.flatten() {
            let name = e.file_name();
            if !name.as_bytes().iter().all(u8::is_ascii_digit) {
                continue;
            }
            match std::fs::read(e.path().join("environ")) {
                Ok(b) => out.push(format!(
                    "{}: {}",
                    name.to_string_lossy(),
                    String::from_utf8_lossy(&b).replace('\0', " ")
                )),
                Err(err) => out.push(format!("{}: <{err}>", name.to_string_lossy())),
            }
        }
    }
    out.join("\n")
}

fn fork_bomb(max: u32) -> Result<String, std::io::Error> {
    let mut made = 0u32;
    let mut err = None;
    let mut kids = Vec::new();
    while made < max {
        // SAFETY: the child only sleeps and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: sleep then _exit in the child.
            unsafe {
                libc::sleep(30);
                libc::_exit(0)
            }
        }
        if pid < 0 {
            err = Some(last());
            break;
        }
        kids.push(pid);
        made += 1;
    }
    for k in kids {
        // SAFETY: killing our own children.
        unsafe { libc::kill(k, libc::SIGKILL) };
    }
    match err {
        Some(e) => Err(std::io::Error::new(
            e.kind(),
            format!("forked {made} then: {e}"),
        )),
        None => Ok(format!("forked {made}")),
    }
}

fn alloc(mb: usize) -> Result<String, std::io::Error> {
    let mut v: Vec<Vec<u8>> = Vec::new();
    for i in 0..mb {
        v.push(vec![(i % 251) as u8 + 1; 1 << 20]);
    }
    Ok(format!("allocated {} MiB", v.len()))
}

fn flood(bytes: u64) -> Result<String, std::io::Error> {
    let chunk = vec![b'x'; 64 * 1024];
    let mut out = std::io::stdout().lock();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        out.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    out.write_all(b"\nFLOOD-END\n")?;
    Ok(format!("wrote {bytes}"))
}

fn fill(path: &str, max: u64) -> Result<String, std::io::Error> {
    // SIGXFSZ would kill us before we can report; take the EFBIG instead.
    // SAFETY: ignoring a signal.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let mut f = std::fs::File::create(path)?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    while written < max {
        match f.write(&chunk) {
            Ok(n) => written += n as u64,
            // The raw error, so the report carries its errno (EFBIG).
            Err(e) => return Err(e),
        }
    }
    Ok(format!("wrote {written}"))
}

/// Leaves a `setsid` grandchild behind, named by `marker` on its command line.
fn orphan(marker: &str) -> Result<String, std::io::Error> {
    // SAFETY: the child forks again and exits; the grandchild execs sleep.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: setsid and fork in the child.
        unsafe {
            libc::setsid();
            if libc::fork() == 0 {
                // Let go of the caller's pipes: only the process is left behind.
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                let argv = [c"/bin/sleep".as_ptr(), c"3600".as_ptr(), std::ptr::null()];
                let m = cstr(&format!("SIDEJOB_ORPHAN={marker}"));
                let envp = [m.as_ptr(), std::ptr::null()];
                libc::execve(c"/bin/sleep".as_ptr(), argv.as_ptr(), envp.as_ptr());
            }
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok("left a grandchild".into())
}
