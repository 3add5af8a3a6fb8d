//! The SOCKS5 handshake (RFC 1928), parsed by hand because it is small: a greeting that must
//! offer "no authentication", then one `CONNECT` request naming an IPv4 or IPv6 address or a
//! host name. Nothing else is accepted (no `BIND`, no `UDP ASSOCIATE`, no SOCKS4), and every
//! refusal has its own reply code. Sans-I/O: the proxy feeds bytes in and writes replies out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub(crate) const VERSION: u8 = 5;
const NO_AUTH: u8 = 0x00;
const CMD_CONNECT: u8 = 0x01;
const ATYP_V4: u8 = 0x01;
const ATYP_NAME: u8 = 0x03;
const ATYP_V6: u8 = 0x04;

/// Reply codes (RFC 1928 §6).
pub(crate) mod rep {
    pub(crate) const SUCCEEDED: u8 = 0x00;
    pub(crate) const GENERAL_FAILURE: u8 = 0x01;
    pub(crate) const NOT_ALLOWED: u8 = 0x02;
    pub(crate) const HOST_UNREACHABLE: u8 = 0x04;
    pub(crate) const CONNECTION_REFUSED: u8 = 0x05;
    pub(crate) const COMMAND_NOT_SUPPORTED: u8 = 0x07;
    pub(crate) const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 0x08;
}

/// The answer to a greeting that offers no method we accept.
pub(crate) const NO_ACCEPTABLE_METHOD: [u8; 2] = [VERSION, 0xff];
/// The answer to a greeting that offers "no authentication".
pub(crate) const METHOD_NO_AUTH: [u8; 2] = [VERSION, NO_AUTH];
/// A SOCKS4 "request rejected" reply, for SOCKS4 clients.
pub(crate) const SOCKS4_REJECTED: [u8; 8] = [0, 0x5b, 0, 0, 0, 0, 0, 0];

/// What a client may ask to reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Dest {
    Ip(IpAddr),
    /// As the client sent it (checked by the policy's `normalize`, not here).
    Name(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub dest: Dest,
    pub port: u16,
}

/// Why a handshake is refused; [`SocksError::reply`] is what the client is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SocksError {
    /// Not SOCKS5 (a SOCKS4 client gets a SOCKS4 rejection).
    Version(u8),
    /// The greeting lists no methods, or not "no authentication".
    NoAcceptableMethod,
    /// `BIND`, `UDP ASSOCIATE` or an unknown command.
    Command(u8),
    /// The reserved byte is not zero.
    Reserved,
    AddressType(u8),
    /// A name that is empty or not ASCII text.
    BadName,
    /// Port 0.
    BadPort,
}

impl SocksError {
    /// The bytes to send back before closing.
    pub(crate) fn reply(self) -> Vec<u8> {
        match self {
            SocksError::Version(4) => SOCKS4_REJECTED.to_vec(),
            SocksError::Version(_) => Vec::new(),
            SocksError::NoAcceptableMethod => NO_ACCEPTABLE_METHOD.to_vec(),
            SocksError::Command(_) => reply(rep::COMMAND_NOT_SUPPORTED).to_vec(),
            SocksError::AddressType(_) => reply(rep::ADDRESS_TYPE_NOT_SUPPORTED).to_vec(),
            SocksError::BadName => reply(rep::NOT_ALLOWED).to_vec(),
            SocksError::Reserved | SocksError::BadPort => reply(rep::GENERAL_FAILURE).to_vec(),
        }
    }
}

/// A reply to a request (the bound address is not meaningful here: 0.0.0.0:0).
pub(crate) fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, ATYP_V4, 0, 0, 0, 0, 0, 0]
}

/// Parses the greeting. `Ok(None)`: more bytes are needed; `Ok(Some(n))`: it was `n` bytes
/// and offers "no authentication".
pub(crate) fn greeting(buf: &[u8]) -> Result<Option<usize>, SocksError> {
    let Some(&ver) = buf.first() else {
        return Ok(None);
    };
    if ver != VERSION {
        return Err(SocksError::Version(ver));
    }
    let Some(&n) = buf.get(1) else {
        return Ok(None);
    };
    if n == 0 {
        return Err(SocksError::NoAcceptableMethod);
    }
    let end = 2 + n as usize;
    let Some(methods) = buf.get(2..end) else {
        return Ok(None);
    };
    if methods.contains(&NO_AUTH) {
        Ok(Some(end))
    } else {
        Err(SocksError::NoAcceptableMethod)
    }
}

/// Parses the request that follows the greeting. `Ok(None)`: more bytes are needed.
pub(crate) fn request(buf: &[u8]) -> Result<Option<(Request, usize)>, SocksError> {
    if buf.len() < 4 {
        // Check what is there already, so a wrong first byte fails at once.
        if let Some(&v) = buf.first() {
            if v != VERSION {
                return Err(SocksError::Version(v));
            }
        }
        return Ok(None);
    }
    if buf[0] != VERSION {
        return Err(SocksError::Version(buf[0]));
    }
    if buf[1] != CMD_CONNECT {
        return Err(SocksError::Command(buf[1]));
    }
    if buf[2] != 0 {
        return Err(SocksError::Reserved);
    }
    let (dest, at) = match buf[3] {
        ATYP_V4 => {
            let Some(b) = buf.get(4..8) else {
                return Ok(None);
            };
            (
                Dest::Ip(IpAddr::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3]))),
                8,
            )
        }
        ATYP_V6 => {
            let Some(b) = buf.get(4..20) else {
                return Ok(None);
            };
            let mut o = [0u8; 16];
            o.copy_from_slice(b);
            (Dest::Ip(IpAddr::V6(Ipv6Addr::from(o))), 20)
        }
        ATYP_NAME => {
            let Some(&len) = buf.get(4) else {
                return Ok(None);
            };
            if len == 0 {
                return Err(SocksError::BadName);
            }
            let end = 5 + len as usize;
            let Some(name) = buf.get(5..end) else {
                return Ok(None);
            };
            if !name.iter().all(|b| b.is_ascii_graphic()) {
                return Err(SocksError::BadName);
            }
            (Dest::Name(String::from_utf8_lossy(name).into_owned()), end)
        }
        other => return Err(SocksError::AddressType(other)),
    };
    let Some(p) = buf.get(at..at + 2) else {
        return Ok(None);
    };
    let port = u16::from_be_bytes([p[0], p[1]]);
    if port == 0 {
        return Err(SocksError::BadPort);
    }
    Ok(Some((Request { dest, port }, at + 2)))
}

/// Where a SOCKS4 (or 4a) request asks to go, as far as `buf` holds it: for the record of
/// its refusal.
pub(crate) fn socks4_target(buf: &[u8]) -> Option<(String, u16)> {
    let port = u16::from_be_bytes([*buf.get(2)?, *buf.get(3)?]);
    let ip = Ipv4Addr::new(*buf.get(4)?, *buf.get(5)?, *buf.get(6)?, *buf.get(7)?);
    let o = ip.octets();
    if o[..3] == [0, 0, 0] && o[3] != 0 {
        // 4a: the name follows the user id, each ending in a zero byte.
        let mut fields = buf.get(8..)?.split(|b| *b == 0);
        fields.next()?;
        let name = fields.next()?;
        if !name.is_empty() && name.iter().all(u8::is_ascii_graphic) {
            return Some((String::from_utf8_lossy(name).into_owned(), port));
        }
    }
    Some((ip.to_string(), port))
}

/// Where a request with a command other than `CONNECT` asks to go, as far as `buf` holds
/// it: for the record of its refusal.
pub(crate) fn refused_target(buf: &[u8]) -> Option<(String, u16)> {
    let mut as_connect = buf.to_vec();
    *as_connect.get_mut(1)? = CMD_CONNECT;
    let (req, _) = request(&as_connect).ok()??;
    let host = match req.dest {
        Dest::Ip(ip) => ip.to_string(),
        Dest::Name(n) => n,
    };
    Some((host, req.port))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn name_request(name: &[u8], port: u16) -> Vec<u8> {
        let mut v = vec![5, 1, 0, 3, name.len() as u8];
        v.extend_from_slice(name);
        v.extend_from_slice(&port.to_be_bytes());
        v
    }

    #[test]
    fn a_no_auth_greeting_and_a_connect_by_name_parse_in_pieces() {
        let g = [5u8, 2, 2, 0];
        for cut in 0..g.len() {
            assert_eq!(greeting(&g[..cut]), Ok(None));
        }
        assert_eq!(greeting(&g), Ok(Some(4)));
        let r = name_request(b"api.example.com", 443);
        for cut in 0..r.len() {
            assert_eq!(request(&r[..cut]), Ok(None), "cut at {cut}");
        }
        let (req, n) = request(&r).unwrap().unwrap();
        assert_eq!(n, r.len());
        assert_eq!(
            req,
            Request {
                dest: Dest::Name("api.example.com".into()),
                port: 443
            }
        );
        let v4 = [5u8, 1, 0, 1, 127, 0, 0, 1, 0x1f, 0x90];
        assert_eq!(
            request(&v4).unwrap().unwrap().0,
            Request {
                dest: Dest::Ip("127.0.0.1".parse().unwrap()),
                port: 8080
            }
        );
        let mut v6 = vec![5u8, 1, 0, 4];
        v6.extend_from_slice(&"::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0, 80]);
        assert_eq!(
            request(&v6).unwrap().unwrap().0.dest,
            Dest::Ip("::1".parse().unwrap())
        );
    }

    #[test]
    fn socks4_is_rejected_with_a_socks4_reply() {
        let e = greeting(&[4, 1, 0, 80, 127, 0, 0, 1, 0]).unwrap_err();
        assert_eq!(e, SocksError::Version(4));
        assert_eq!(e.reply(), SOCKS4_REJECTED);
        assert_eq!(
            socks4_target(&[4, 1, 0, 80, 127, 0, 0, 1, 0]),
            Some(("127.0.0.1".into(), 80))
        );
        assert_eq!(
            socks4_target(b"\x04\x01\x01\xbb\x00\x00\x00\x01me\x00evil.test\x00"),
            Some(("evil.test".into(), 443))
        );
        assert_eq!(socks4_target(&[4, 1]), None);
    }

    #[test]
    fn another_version_is_closed_without_a_reply() {
        let e = greeting(&[0x47, 0x45, 0x54]).unwrap_err();
        assert_eq!(e, SocksError::Version(0x47));
        assert!(e.reply().is_empty());
        assert_eq!(request(&[6]), Err(SocksError::Version(6)));
    }

    #[test]
    fn a_greeting_without_no_auth_gets_no_acceptable_method() {
        for g in [&[5u8, 0][..], &[5, 1, 2], &[5, 2, 1, 2]] {
            let e = greeting(g).unwrap_err();
            assert_eq!(e, SocksError::NoAcceptableMethod);
            assert_eq!(e.reply(), NO_ACCEPTABLE_METHOD);
        }
    }

    #[test]
    fn bind_and_udp_associate_are_not_supported() {
        for cmd in [2u8, 3, 9] {
            let e = request(&[5, cmd, 0, 1, 127, 0, 0, 1, 0, 80]).unwrap_err();
            assert_eq!(e, SocksError::Command(cmd));
            assert_eq!(e.reply()[1], rep::COMMAND_NOT_SUPPORTED);
        }
        assert_eq!(
            refused_target(&name_request(b"evil.test", 80)),
            Some(("evil.test".into(), 80))
        );
        assert_eq!(refused_target(&[5, 2, 0]), None);
    }

    #[test]
    fn a_nonzero_reserved_byte_is_a_general_failure() {
        let e = request(&[5, 1, 7, 1, 127, 0, 0, 1, 0, 80]).unwrap_err();
        assert_eq!(e, SocksError::Reserved);
        assert_eq!(e.reply()[1], rep::GENERAL_FAILURE);
    }

    #[test]
    fn an_unknown_address_type_is_not_supported() {
        let e = request(&[5, 1, 0, 2, 1, 2, 3, 4]).unwrap_err();
        assert_eq!(e, SocksError::AddressType(2));
        assert_eq!(e.reply()[1], rep::ADDRESS_TYPE_NOT_SUPPORTED);
    }

    #[test]
    fn empty_or_binary_names_are_not_allowed() {
        assert_eq!(
            request(&[5, 1, 0, 3, 0, 0, 80]).unwrap_err(),
            SocksError::BadName
        );
        for bad in [&b"a b"[..], b"a\0b", b"\xff\xfe", b"a\nb"] {
            let e = request(&name_request(bad, 80)).unwrap_err();
            assert_eq!(e, SocksError::BadName, "{bad:?}");
            assert_eq!(e.reply()[1], rep::NOT_ALLOWED);
        }
    }

    #[test]
    fn port_zero_is_a_general_failure() {
        let e = request(&name_request(b"example.com", 0)).unwrap_err();
        assert_eq!(e, SocksError::BadPort);
        assert_eq!(e.reply()[1], rep::GENERAL_FAILURE);
    }

    proptest::proptest! {
        /// Any bytes at all: the parsers answer (need more, a request, or a refusal) and never
        /// panic or read past what they were given.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..300)) {
            let _ = greeting(&bytes);
            if let Ok(Some((_, n))) = request(&bytes) {
                proptest::prop_assert!(n <= bytes.len());
            }
            if let Ok(Some(n)) = greeting(&bytes) {
                proptest::prop_assert!(n <= bytes.len());
            }
        }

        /// Every well-formed name request parses back to what was sent.
        #[test]
        fn name_requests_round_trip(name in "[a-z0-9.-]{1,255}", port in 1u16..) {
            let r = name_request(name.as_bytes(), port);
            let (req, n) = request(&r).unwrap().unwrap();
            proptest::prop_assert_eq!(n, r.len());
            proptest::prop_assert_eq!(req, Request { dest: Dest::Name(name), port });
        }
    }
}
