//! HTTP proxy requests, parsed with `httparse`: `CONNECT host:port` (a tunnel, for HTTPS and
//! anything else), and absolute-form requests (`GET http://host/path HTTP/1.1`) for plain
//! HTTP, which are forwarded in origin form with the `Host` header set to the host that was
//! decided on (so a plain request cannot name one host and ask another behind the same
//! server), hop-by-hop headers removed and `Connection: close`. Sans-I/O.

/// The largest request head accepted (request line and headers).
pub(crate) const MAX_HEAD: usize = 64 * 1024;
/// Headers beyond this many are refused.
const MAX_HEADERS: usize = 100;

/// What a client asked the proxy for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProxyRequest {
    /// `CONNECT host:port`: the host (as written) and the port.
    Connect { host: String, port: u16 },
    /// An absolute-form `http://` request: where to, and the head to send there.
    Forward {
        host: String,
        port: u16,
        /// The request line in origin form and the headers to send upstream, ending in an
        /// empty line. The host is filled in by [`ProxyRequest::upstream_head`].
        method: String,
        path: String,
        version: u8,
        headers: Vec<(String, Vec<u8>)>,
    },
}

/// Why a request head is refused, with the status line to answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HttpError {
    /// The head is longer than [`MAX_HEAD`] or has too many headers.
    TooLarge,
    /// Not HTTP/1.x the parser accepts.
    Malformed(String),
    /// `GET /path` sent to a proxy: it does not say where to.
    OriginForm,
    /// `https://` or another scheme in absolute form (HTTPS goes through `CONNECT`).
    Scheme(String),
    /// `user:password@` in the URI.
    Userinfo,
    /// A `CONNECT` without a port, or with a bad one.
    Authority(String),
}

impl HttpError {
    pub(crate) fn status(&self) -> &'static str {
        match self {
            HttpError::TooLarge => "431 Request Header Fields Too Large",
            HttpError::Malformed(_)
            | HttpError::OriginForm
            | HttpError::Scheme(_)
            | HttpError::Userinfo
            | HttpError::Authority(_) => "400 Bad Request",
        }
    }

    pub(crate) fn message(&self) -> String {
        match self {
            HttpError::TooLarge => {
                format!("the request head is over {MAX_HEAD} bytes or {MAX_HEADERS} headers")
            }
            HttpError::Malformed(m) => format!("not an HTTP/1 request: {m}"),
            HttpError::OriginForm => {
                "this is a proxy: send CONNECT host:port, or an absolute http:// URI".into()
            }
            HttpError::Scheme(s) => format!(
                "{s}:// cannot be requested in absolute form; use CONNECT (HTTPS_PROXY does this)"
            ),
            HttpError::Userinfo => "credentials in the URI are not forwarded".into(),
            HttpError::Authority(a) => format!("{a:?}: CONNECT needs host:port"),
        }
    }
}

/// Headers that describe one hop, never forwarded.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "host",
];

/// Parses a request head. `Ok(None)`: more bytes are needed; `Ok(Some((req, n)))`: the head
/// was the first `n` bytes (what follows is the body, forwarded as it is).
pub(crate) fn parse(buf: &[u8]) -> Result<Option<(ProxyRequest, usize)>, HttpError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let n = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => return Err(HttpError::TooLarge),
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HttpError::TooLarge),
        Err(e) => return Err(HttpError::Malformed(e.to_string())),
    };
    if n > MAX_HEAD {
        return Err(HttpError::TooLarge);
    }
    let method = req.method.unwrap_or_default();
    let target = req.path.unwrap_or_default();
    let version = req.version.unwrap_or(1);
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = authority(target)?;
        let port = port.ok_or_else(|| HttpError::Authority(target.to_owned()))?;
        return Ok(Some((ProxyRequest::Connect { host, port }, n)));
    }
    let Some((scheme, rest)) = target.split_once("://") else {
        return Err(HttpError::OriginForm);
    };
    if !scheme.eq_ignore_ascii_case("http") {
        return Err(HttpError::Scheme(scheme.to_ascii_lowercase()));
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (auth, path) = rest.split_at(end);
    let (host, port) = authority(auth)?;
    let path = match path.split_once('#').map_or(path, |(p, _)| p) {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    // The Connection header names more hop-by-hop headers.
    let mut drop: Vec<String> = HOP_BY_HOP.iter().map(|s| (*s).to_owned()).collect();
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("connection") {
            for name in String::from_utf8_lossy(h.value).split(',') {
                drop.push(name.trim().to_ascii_lowercase());
            }
        }
    }
    let headers = req
        .headers
        .iter()
        .filter(|h| !drop.iter().any(|d| h.name.eq_ignore_ascii_case(d)))
        .map(|h| (h.name.to_owned(), h.value.to_vec()))
        .collect();
    Ok(Some((
        ProxyRequest::Forward {
            host,
            port: port.unwrap_or(80),
            method: method.to_owned(),
            path,
            version,
            headers,
        },
        n,
    )))
}

/// `host`, `host:port`, `[v6]:port`; a `user@` part is refused.
fn authority(a: &str) -> Result<(String, Option<u16>), HttpError> {
    if a.contains('@') {
        return Err(HttpError::Userinfo);
    }
    if a.is_empty() {
        return Err(HttpError::Authority(a.to_owned()));
    }
    let (host, port) =
        super::policy::split_host_port(a).map_err(|_| HttpError::Authority(a.to_owned()))?;
    if host.is_empty() {
        return Err(HttpError::Authority(a.to_owned()));
    }
    Ok((host.to_owned(), port))
}

impl ProxyRequest {
    /// The head to send upstream for a forwarded request, with `Host` set to `host_header`.
    pub(crate) fn upstream_head(&self, host_header: &str) -> Option<Vec<u8>> {
        let ProxyRequest::Forward {
            method,
            path,
            version,
            headers,
            ..
        } = self
        else {
            return None;
        };
        let mut out =
            format!("{method} {path} HTTP/1.{version}\r\nHost: {host_header}\r\n").into_bytes();
        for (name, value) in headers {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        Some(out)
    }
}

/// What the first line of a head that was refused names: its request target (printable
/// ASCII only, at most 255 bytes; `None` when there is none), and whether its method is
/// `CONNECT`. For the record of the refusal.
pub(crate) fn refused_target(buf: &[u8]) -> (Option<String>, bool) {
    let line = buf
        .split(|b| *b == b'\r' || *b == b'\n')
        .next()
        .unwrap_or_default();
    let mut words = line.split(|b| *b == b' ').filter(|w| !w.is_empty());
    let is_connect = words
        .next()
        .is_some_and(|m| m.eq_ignore_ascii_case(b"CONNECT"));
    let target = words.next().map(|t| {
        t.iter()
            .take(255)
            .filter(|b| b.is_ascii_graphic())
            .map(|b| char::from(*b))
            .collect::<String>()
    });
    (target.filter(|t| !t.is_empty()), is_connect)
}

/// A complete response with a one-line plain-text body.
pub(crate) fn response(status: &str, reason_code: Option<&str>, body: &str) -> Vec<u8> {
    let body = format!("{body}\n");
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if let Some(code) = reason_code {
        head.push_str(&format!("X-Sidejob-Refusal: {code}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(&body);
    head.into_bytes()
}

/// The answer to a `CONNECT` that was allowed and connected.
pub(crate) const CONNECTED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn connect_names_host_and_port() {
        let r = b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\nTLS";
        for cut in 0..r.len() - 3 {
            assert_eq!(parse(&r[..cut]), Ok(None));
        }
        let (req, n) = parse(r).unwrap().unwrap();
        assert_eq!(&r[n..], b"TLS");
        assert_eq!(
            req,
            ProxyRequest::Connect {
                host: "api.example.com".into(),
                port: 443
            }
        );
        let v6 = parse(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(
            v6,
            ProxyRequest::Connect {
                host: "::1".into(),
                port: 8443
            }
        );
        assert_eq!(
            parse(b"CONNECT api.example.com HTTP/1.1\r\n\r\n"),
            Err(HttpError::Authority("api.example.com".into()))
        );
    }

    #[test]
    fn absolute_form_is_forwarded_in_origin_form_with_the_decided_host() {
        let r = b"GET http://Example.com:8080/a/b?c=d#frag HTTP/1.1\r\nHost: other.example\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive, X-Secret\r\nX-Secret: 1\r\nAccept: */*\r\n\r\n";
        let (req, _) = parse(r).unwrap().unwrap();
        let ProxyRequest::Forward { host, port, .. } = &req else {
            panic!("{req:?}")
        };
        assert_eq!((host.as_str(), *port), ("Example.com", 8080));
        let head = String::from_utf8(req.upstream_head("example.com:8080").unwrap()).unwrap();
        assert_eq!(
            head,
            "GET /a/b?c=d HTTP/1.1\r\nHost: example.com:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
        let (q, _) = parse(b"GET http://example.com?x HTTP/1.0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(String::from_utf8(q.upstream_head("example.com").unwrap())
            .unwrap()
            .starts_with("GET /?x HTTP/1.0\r\n"));
    }

    #[test]
    fn a_refused_head_names_its_target_for_the_record() {
        assert_eq!(
            refused_target(b"CONNECT a.test@b.test:443 HTTP/1.1\r\n\r\n"),
            (Some("a.test@b.test:443".into()), true)
        );
        assert_eq!(
            refused_target(b"GET  http://u@h/\x01x HTTP/1.1"),
            (Some("http://u@h/x".into()), false)
        );
        assert_eq!(refused_target(b"\x16\x03\x01"), (None, false));
    }

    #[test]
    fn what_a_proxy_cannot_forward_is_refused() {
        assert_eq!(
            parse(b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(HttpError::OriginForm)
        );
        assert_eq!(
            parse(b"GET https://a/ HTTP/1.1\r\n\r\n"),
            Err(HttpError::Scheme("https".into()))
        );
        assert_eq!(
            parse(b"GET http://u:p@a/ HTTP/1.1\r\n\r\n"),
            Err(HttpError::Userinfo)
        );
        assert!(matches!(
            parse(b"GET http://a/ HTTP/1.1\r\nBad Header\r\n\r\n"),
            Err(HttpError::Malformed(_))
        ));
        let mut big = b"GET http://a/ HTTP/1.1\r\n".to_vec();
        big.extend(std::iter::repeat_n(b'x', MAX_HEAD));
        assert_eq!(parse(&big), Err(HttpError::TooLarge));
        let mut many = b"GET http://a/ HTTP/1.1\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("X-{i}: y\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(parse(&many), Err(HttpError::TooLarge));
    }

    proptest::proptest! {
        /// Any bytes: the parser answers and never panics; a complete head is never longer
        /// than what it was given.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            if let Ok(Some((req, n))) = parse(&bytes) {
                proptest::prop_assert!(n <= bytes.len());
                let _ = req.upstream_head("h");
            }
        }

        /// Request-shaped input with random targets and headers.
        #[test]
        fn request_shaped_input_never_panics(
            method in "[A-Z]{1,8}",
            target in "[ -~]{0,80}",
            header in "[ -~]{0,80}",
        ) {
            let r = format!("{method} {target} HTTP/1.1\r\n{header}\r\n\r\n");
            if let Ok(Some((req, _))) = parse(r.as_bytes()) {
                let _ = req.upstream_head("h");
            }
        }
    }
}
