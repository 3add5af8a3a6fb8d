//! Loopback servers for the network tests: an HTTP server in this process that records what it
//! was asked, and a TLS one (Python's `ssl` with a certificate `openssl` makes) for HTTPS
//! through `CONNECT`. Both listen on 127.0.0.1 only, on a port the kernel picks.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A plain HTTP/1.1 server: `GET /anything` answers `hello <path> via <Host header>`, and
/// `GET /bytes/N` answers N bytes. Every request line and `Host` is recorded.
pub struct HttpServer {
    pub port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl HttpServer {
    pub fn start() -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback server");
        let port = listener.local_addr().expect("addr").port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (seen2, stop2) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let seen = seen2.clone();
                std::thread::spawn(move || serve(conn, &seen));
            }
        });
        HttpServer { port, seen, stop }
    }

    /// `METHOD target host=<Host>` for every request so far.
    pub fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("lock").clone()
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(conn: TcpStream, seen: &Mutex<Vec<String>>) {
    let mut reader = BufReader::new(conn.try_clone().expect("clone"));
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut host = String::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some(v) = h
            .split_once(':')
            .filter(|(k, _)| k.eq_ignore_ascii_case("host"))
        {
            host = v.1.trim().to_owned();
        }
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let target = parts.next().unwrap_or("").to_owned();
    seen.lock()
        .expect("lock")
        .push(format!("{method} {target} host={host}"));
    let mut out = conn;
    if let Some(n) = target
        .strip_prefix("/bytes/")
        .and_then(|n| n.parse::<u64>().ok())
    {
        let _ = write!(
            out,
            "HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n"
        );
        let chunk = vec![b'x'; 256 * 1024];
        let mut left = n;
        while left > 0 {
            let k = left.min(chunk.len() as u64) as usize;
            if out.write_all(&chunk[..k]).is_err() {
                return;
            }
            left -= k as u64;
        }
        return;
    }
    let body = format!("hello {target} via {host}\n");
    let _ = write!(
        out,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// An HTTPS server for `name` on 127.0.0.1 (a self-signed certificate written to
/// `dir/cert.pem`); `None` when `openssl` or `python3` is missing.
pub struct TlsServer {
    pub port: u16,
    child: Child,
}

impl TlsServer {
    pub fn start(dir: &Path, name: &str) -> Option<TlsServer> {
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .arg("-subj")
            .arg(format!("/CN={name}"))
            .arg("-addext")
            .arg(format!("subjectAltName=DNS:{name}"))
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .ok()?;
        if !made.success() {
            return None;
        }
        let script = r#"
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("tls hello " + self.path + "\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(script)
            .arg(&cert)
            .arg(&key)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut first = String::new();
        let mut out = child.stdout.take()?;
        let mut byte = [0u8; 1];
        while out.read(&mut byte).ok()? == 1 && byte[0] != b'\n' {
            first.push(byte[0] as char);
        }
        let port = first.trim().parse().ok()?;
        Some(TlsServer { port, child })
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Is a program on this host (for tests that skip without it)?
pub fn have(program: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {program}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
