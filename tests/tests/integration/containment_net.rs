//! Containment of the network: TCP, UDP, abstract and pathname Unix sockets (see
//! `containment.rs` for how these tests work).

use std::net::{TcpListener, UdpSocket};
use std::time::Duration;

use crate::containment::{exec, inside, outside, profile_with, Ws};

// ---- network ---------------------------------------------------------------------------------

#[test]
fn tcp_to_a_host_listener_is_refused_and_the_listener_sees_nothing() {
    let Some(ws) = Ws::new() else { return };
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.set_nonblocking(true).unwrap();
    let addr = l.local_addr().unwrap().to_string();
    for profile in ["workspace-write", "read-only", "ci"] {
        let out = exec(&ws, &["--profile", profile], &[&ws.probe(), "tcp", &addr]);
        assert!(!out.ok(), "{profile}: {}", out.stdout);
    }
    let loopback = ws.profile("lo", &profile_with("network = \"loopback\"", ""));
    let out = exec(&ws, &["--profile", &loopback], &[&ws.probe(), "tcp", &addr]);
    assert_eq!(
        out.errno(),
        libc::ECONNREFUSED as i64,
        "loopback is the run's own: {}",
        out.stdout
    );
    assert!(l.accept().is_err(), "the listener saw a connection");
    // Controls: from the host it connects, and so does a run under the network profile.
    assert!(outside(&["tcp", &addr]).ok());
    assert!(l.accept().is_ok());
    let host = exec(&ws, &["--profile", "network"], &[&ws.probe(), "tcp", &addr]);
    assert!(host.ok(), "{}", host.stdout);
    assert!(l.accept().is_ok());
}

#[test]
fn udp_to_a_host_listener_is_refused_and_the_listener_sees_nothing() {
    let Some(ws) = Ws::new() else { return };
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let addr = s.local_addr().unwrap().to_string();
    let out = inside(&ws, &["udp", &addr]);
    assert!(!out.ok(), "{}", out.stdout);
    let loopback = ws.profile("lo", &profile_with("network = \"loopback\"", ""));
    let lo = exec(&ws, &["--profile", &loopback], &[&ws.probe(), "udp", &addr]);
    let mut buf = [0u8; 16];
    assert!(
        s.recv(&mut buf).is_err(),
        "the listener got a datagram (loopback sent: {})",
        lo.stdout
    );
    // Control.
    assert!(outside(&["udp", &addr]).ok());
    assert_eq!(s.recv(&mut buf).unwrap(), 5);
}

#[test]
fn the_loopback_profile_gives_the_run_its_own_working_loopback() {
    let Some(ws) = Ws::new() else { return };
    let loopback = ws.profile("lo", &profile_with("network = \"loopback\"", ""));
    let out = exec(
        &ws,
        &["--profile", &loopback],
        &[&ws.probe(), "tcp-listen", "127.0.0.1:0"],
    );
    assert!(out.ok(), "{} {}", out.stdout, out.stderr);
    // Under network = none there is no loopback to bind at all.
    let none = inside(&ws, &["tcp-listen", "127.0.0.1:0"]);
    assert!(!none.ok());
}

#[test]
fn unix_sockets_outside_abstract_and_pathname_are_unreachable() {
    let Some(ws) = Ws::new() else { return };
    let path = ws.outside.path().join("host.sock");
    let pl = std::os::unix::net::UnixListener::bind(&path).unwrap();
    pl.set_nonblocking(true).unwrap();
    let name = format!("sidejob-test-{}", std::process::id());
    let al = abstract_listener(&name);
    let p = inside(&ws, &["unix", path.to_str().unwrap()]);
    assert_eq!(p.errno(), libc::ENOENT as i64, "{}", p.stdout);
    let a = inside(&ws, &["abstract", &name]);
    assert!(!a.ok(), "{}", a.stdout);
    assert!(
        pl.accept().is_err(),
        "the pathname listener saw a connection"
    );
    assert!(!accepts(al), "the abstract listener saw a connection");
    // Controls: both reachable from the host.
    assert!(outside(&["unix", path.to_str().unwrap()]).ok());
    let al = abstract_listener(&format!("{name}-2"));
    assert!(outside(&["abstract", &format!("{name}-2")]).ok());
    assert!(accepts(al));
}

fn abstract_listener(name: &str) -> i32 {
    // SAFETY: plain socket calls on a sockaddr_un we fill.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in name.bytes().enumerate() {
            addr.sun_path[i + 1] = b as libc::c_char;
        }
        let len = (std::mem::size_of::<libc::sa_family_t>() + 1 + name.len()) as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len),
            0
        );
        assert_eq!(libc::listen(fd, 4), 0);
        fd
    }
}

fn accepts(fd: i32) -> bool {
    // SAFETY: accept on our non-blocking listener; both descriptors are closed after.
    unsafe {
        let c = libc::accept(fd, std::ptr::null_mut(), std::ptr::null_mut());
        if c >= 0 {
            libc::close(c);
        }
        libc::close(fd);
        c >= 0
    }
}
