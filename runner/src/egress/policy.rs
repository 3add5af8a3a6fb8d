//! The network allow-list of a run, as a small pure module: normalise the host a client asked
//! for, match it against `allow` and `deny` (deny wins), classify the addresses a name resolves
//! to, and name every refusal with one constant that both the reply to the client and the
//! violation in `result.json` use.
//!
//! Rules are written as in a profile's `[network]` table:
//! - `api.example.com`, `api.example.com:443`: that name (on any port, or on that port);
//! - `*.example.org`, `*.example.org:443`: every name below `example.org` (not the name itself);
//! - `127.0.0.1`, `127.0.0.1:8080`, `[::1]:8080`, `10.0.0.0/8`, `fd00::/8`: addresses. An
//!   address rule lets a client connect to that address given directly (an IP literal), and
//!   lets an allowed name resolve into it when it is loopback, private, link-local or
//!   metadata space, which is refused otherwise.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The longest host name DNS allows (253 characters, without the trailing dot).
const MAX_NAME: usize = 253;

/// A host as a client named it, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Host {
    /// Lower-case ASCII, no trailing dot, every label checked.
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Where an address lies. Everything but `Public` needs an address rule of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrClass {
    Public,
    Loopback,
    Private,
    LinkLocal,
    /// Cloud instance-metadata endpoints (169.254.169.254 and friends).
    Metadata,
    /// 0.0.0.0/8, `::`: "this host" on most systems.
    Unspecified,
    /// Multicast, broadcast, documentation and other ranges no service lives in.
    Reserved,
}

/// Why a connection or lookup was refused. [`Refusal::code`] goes into the violation,
/// [`Refusal::text`] into the reply; both come from the constants below, so the two always
/// say the same thing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Denied,
    NotAllowed,
    IpLiteral,
    Address(AddrClass),
    BadName,
    Unresolved,
    /// Not a request the proxy serves: a malformed or oversized head, `user@` in the URI
    /// (`allowed@denied`), origin form, another scheme, a SOCKS5 handshake out of order.
    BadRequest,
    /// SOCKS5 `BIND`, `UDP ASSOCIATE` or another command than `CONNECT`.
    UnsupportedCommand,
    /// SOCKS4, or a SOCKS5 greeting that does not offer "no authentication".
    UnsupportedProtocol,
}

pub(crate) const DENIED: &str = "on the profile's network.deny list";
pub(crate) const NOT_ALLOWED: &str = "not on the profile's network.allow list";
pub(crate) const IP_LITERAL: &str = "an address given directly must itself be on network.allow";
pub(crate) const LOOPBACK: &str = "resolves to a loopback address that is not on network.allow";
pub(crate) const PRIVATE: &str = "resolves to a private address that is not on network.allow";
pub(crate) const LINK_LOCAL: &str = "resolves to a link-local address that is not on network.allow";
pub(crate) const METADATA: &str =
    "resolves to a cloud metadata address that is not on network.allow";
pub(crate) const UNSPECIFIED: &str = "resolves to an unspecified address (0.0.0.0 or ::)";
pub(crate) const RESERVED: &str = "resolves to a multicast or reserved address";
pub(crate) const BAD_NAME: &str = "not a valid host name";
pub(crate) const UNRESOLVED: &str = "the name does not resolve on the host";
pub(crate) const BAD_REQUEST: &str = "not a request this proxy serves";
pub(crate) const UNSUPPORTED_COMMAND: &str =
    "only SOCKS5 CONNECT is served (no BIND, no UDP ASSOCIATE)";
pub(crate) const UNSUPPORTED_PROTOCOL: &str =
    "only HTTP CONNECT, http:// requests and SOCKS5 without authentication are served";

impl Refusal {
    /// A short, stable name (`result.json` `violations[].reason`).
    pub(crate) fn code(self) -> &'static str {
        match self {
            Refusal::Denied => "denied",
            Refusal::NotAllowed => "not_allowed",
            Refusal::IpLiteral => "ip_literal",
            Refusal::Address(AddrClass::Loopback) => "loopback_address",
            Refusal::Address(AddrClass::Private) => "private_address",
            Refusal::Address(AddrClass::LinkLocal) => "link_local_address",
            Refusal::Address(AddrClass::Metadata) => "metadata_address",
            Refusal::Address(AddrClass::Unspecified) => "unspecified_address",
            Refusal::Address(AddrClass::Reserved) => "reserved_address",
            Refusal::Address(AddrClass::Public) => "public_address",
            Refusal::BadName => "bad_name",
            Refusal::Unresolved => "unresolved",
            Refusal::BadRequest => "bad_request",
            Refusal::UnsupportedCommand => "unsupported_command",
            Refusal::UnsupportedProtocol => "unsupported_protocol",
        }
    }

    /// One line for the client.
    pub(crate) fn text(self) -> &'static str {
        match self {
            Refusal::Denied => DENIED,
            Refusal::NotAllowed => NOT_ALLOWED,
            Refusal::IpLiteral => IP_LITERAL,
            Refusal::Address(AddrClass::Loopback) => LOOPBACK,
            Refusal::Address(AddrClass::Private) => PRIVATE,
            Refusal::Address(AddrClass::LinkLocal) => LINK_LOCAL,
            Refusal::Address(AddrClass::Metadata) => METADATA,
            Refusal::Address(AddrClass::Unspecified) => UNSPECIFIED,
            Refusal::Address(AddrClass::Reserved | AddrClass::Public) => RESERVED,
            Refusal::BadName => BAD_NAME,
            Refusal::Unresolved => UNRESOLVED,
            Refusal::BadRequest => BAD_REQUEST,
            Refusal::UnsupportedCommand => UNSUPPORTED_COMMAND,
            Refusal::UnsupportedProtocol => UNSUPPORTED_PROTOCOL,
        }
    }

    /// Whether the refusal is recorded as a violation: every refusal is, a request the
    /// proxy cannot serve included (what a run tried is what its caller needs to see); only
    /// a name that does not exist is not.
    pub(crate) fn is_violation(self) -> bool {
        match self {
            Refusal::Denied
            | Refusal::NotAllowed
            | Refusal::IpLiteral
            | Refusal::Address(_)
            | Refusal::BadName
            | Refusal::BadRequest
            | Refusal::UnsupportedCommand
            | Refusal::UnsupportedProtocol => true,
            Refusal::Unresolved => false,
        }
    }
}

/// An address range: one address is a /32 or /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Net {
    fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }

    fn covers(&self, other: &Net) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }

    fn is_single(&self) -> bool {
        match self.addr {
            IpAddr::V4(_) => self.prefix == 32,
            IpAddr::V6(_) => self.prefix == 128,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = (prefix / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rest = prefix % 8;
    rest == 0 || (a[full] ^ b[full]) & (0xffu8 << (8 - rest)) == 0
}

/// One allow or deny entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Rule {
    /// Exactly this name.
    Name { name: String, port: Option<u16> },
    /// Every name below `suffix` (`*.suffix`).
    Below { suffix: String, port: Option<u16> },
    /// An address or a range.
    Addr { net: Net, port: Option<u16> },
}

fn port_matches(rule: Option<u16>, port: Option<u16>) -> bool {
    match (rule, port) {
        (None, _) | (_, None) => true,
        (Some(r), Some(p)) => r == p,
    }
}

fn port_covers(session: Option<u16>, call: Option<u16>) -> bool {
    session.is_none() || session == call
}

/// Why an allow-list entry does not parse; says what is wrong, for `file:line: field:
/// message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("an empty entry")]
    Empty,
    #[error("\"*\" would allow every host; use network = \"host\" for that")]
    Everything,
    #[error("{0:?}: a range is an address and a prefix length, like 10.0.0.0/8")]
    Range(String),
    #[error("{entry:?}: the prefix length must be 0 to {max}")]
    Prefix { entry: String, max: u8 },
    #[error("{entry:?}: {why}")]
    Port { entry: String, why: PortError },
    #[error("{0:?}: \"*.\" must be followed by a host name")]
    BareWildcard(String),
    #[error("{0:?}: a wildcard may only be a leading \"*.\", like *.example.org")]
    Wildcard(String),
    #[error("{0:?}: not a host name, *.suffix, address or range (non-ASCII names are written in their xn-- form)")]
    NotAHost(String),
}

impl Rule {
    /// Parses one entry.
    pub fn parse(s: &str) -> Result<Rule, RuleError> {
        let s = s.trim();
        if s.is_empty() {
            return Err(RuleError::Empty);
        }
        if s == "*" || s.starts_with("*:") {
            return Err(RuleError::Everything);
        }
        // Ranges: `10.0.0.0/8`, `fd00::/8` (no port).
        if let Some((addr, bits)) = s.split_once('/') {
            let addr: IpAddr = addr.parse().map_err(|_| RuleError::Range(s.into()))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix: u8 =
                bits.parse()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| RuleError::Prefix {
                        entry: s.into(),
                        max,
                    })?;
            return Ok(Rule::Addr {
                net: Net {
                    addr: canonical(addr),
                    prefix,
                },
                port: None,
            });
        }
        let (host, port) = split_host_port(s).map_err(|why| RuleError::Port {
            entry: s.into(),
            why,
        })?;
        if let Some(suffix) = host.strip_prefix("*.") {
            return match normalize(suffix) {
                Ok(Host::Name(suffix)) => Ok(Rule::Below { suffix, port }),
                _ => Err(RuleError::BareWildcard(s.into())),
            };
        }
        if host.contains('*') {
            return Err(RuleError::Wildcard(s.into()));
        }
        match normalize(host) {
            Ok(Host::Name(name)) => Ok(Rule::Name { name, port }),
            Ok(Host::Ip(ip)) => Ok(Rule::Addr {
                net: Net {
                    addr: canonical(ip),
                    prefix: if ip.is_ipv4() { 32 } else { 128 },
                },
                port,
            }),
            Err(_) => Err(RuleError::NotAHost(s.into())),
        }
    }

    fn matches_name(&self, name: &str, port: Option<u16>) -> bool {
        match self {
            Rule::Name { name: n, port: p } => n == name && port_matches(*p, port),
            Rule::Below { suffix, port: p } => {
                name.len() > suffix.len() + 1
                    && name.ends_with(suffix.as_str())
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
                    && port_matches(*p, port)
            }
            Rule::Addr { .. } => false,
        }
    }

    fn matches_addr(&self, ip: IpAddr, port: Option<u16>) -> bool {
        match self {
            Rule::Addr { net, port: p } => net.contains(ip) && port_matches(*p, port),
            Rule::Name { .. } | Rule::Below { .. } => false,
        }
    }

    /// Is everything this rule allows also allowed by `other`?
    fn covered_by(&self, other: &Rule) -> bool {
        match (self, other) {
            (Rule::Name { name, port }, o @ (Rule::Name { .. } | Rule::Below { .. })) => {
                o.matches_name(name, None) && port_covers(o.port(), *port)
            }
            (Rule::Below { suffix: a, port }, Rule::Below { suffix: b, port: q }) => {
                (a == b || a.ends_with(&format!(".{b}"))) && port_covers(*q, *port)
            }
            (Rule::Addr { net: a, port }, Rule::Addr { net: b, port: q }) => {
                b.covers(a) && port_covers(*q, *port)
            }
            _ => false,
        }
    }

    fn port(&self) -> Option<u16> {
        match self {
            Rule::Name { port, .. } | Rule::Below { port, .. } | Rule::Addr { port, .. } => *port,
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let port = |f: &mut fmt::Formatter<'_>, p: &Option<u16>| match p {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        };
        match self {
            Rule::Name { name, port: p } => {
                f.write_str(name)?;
                port(f, p)
            }
            Rule::Below { suffix, port: p } => {
                write!(f, "*.{suffix}")?;
                port(f, p)
            }
            Rule::Addr { net, port: p } if net.is_single() => {
                match (net.addr, p) {
                    (IpAddr::V6(a), Some(_)) => write!(f, "[{a}]")?,
                    (a, _) => write!(f, "{a}")?,
                }
                port(f, p)
            }
            Rule::Addr { net, .. } => write!(f, "{}/{}", net.addr, net.prefix),
        }
    }
}

impl TryFrom<String> for Rule {
    type Error = RuleError;
    fn try_from(s: String) -> Result<Rule, RuleError> {
        Rule::parse(&s)
    }
}

impl From<Rule> for String {
    fn from(r: Rule) -> String {
        r.to_string()
    }
}

/// Why `host:port` does not split ([`split_host_port`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    #[error("port {0:?} must be 1 to 65535")]
    OutOfRange(String),
    #[error("an IPv6 address in brackets needs its closing ']'")]
    Unclosed,
    #[error("expected :port after ']'")]
    AfterBracket,
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`, or a bare IPv6 address.
pub(crate) fn split_host_port(s: &str) -> Result<(&str, Option<u16>), PortError> {
    let parse_port = |p: &str| -> Result<Option<u16>, PortError> {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .map(Some)
            .ok_or_else(|| PortError::OutOfRange(p.to_owned()))
    };
    if let Some(rest) = s.strip_prefix('[') {
        let (host, tail) = rest.split_once(']').ok_or(PortError::Unclosed)?;
        return match tail {
            "" => Ok((host, None)),
            t => match t.strip_prefix(':') {
                Some(p) => Ok((host, parse_port(p)?)),
                None => Err(PortError::AfterBracket),
            },
        };
    }
    if s.matches(':').count() > 1 {
        return Ok((s, None)); // a bare IPv6 address
    }
    match s.rsplit_once(':') {
        Some((host, p)) => Ok((host, parse_port(p)?)),
        None => Ok((s, None)),
    }
}

/// Normalises a host as a client wrote it: an IP literal (IPv6 with or without brackets), or
/// a name made lower-case without its trailing dot, whose labels are 1 to 63 characters of
/// letters, digits, `-` and `_`. A name whose last label is numeric (`2130706433`, `127.1`,
/// `0x7f.1`) is refused: resolvers read those as addresses.
pub(crate) fn normalize(raw: &str) -> Result<Host, Refusal> {
    let s = raw
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .unwrap_or(raw);
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(Host::Ip(canonical(ip)));
    }
    let s = s.strip_suffix('.').unwrap_or(s);
    if s.is_empty() || s.len() > MAX_NAME || !s.is_ascii() {
        return Err(Refusal::BadName);
    }
    let name = s.to_ascii_lowercase();
    let mut last = "";
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(Refusal::BadName);
        }
        last = label;
    }
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || (last.starts_with("0x") && last[2..].bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err(Refusal::BadName);
    }
    Ok(Host::Name(name))
}

/// An IPv4-mapped IPv6 address (`::ffff:a.b.c.d`) is the IPv4 address it carries.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Where `ip` lies. IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4)
/// are classified by the address they carry, so `::ffff:127.0.0.1` is loopback.
pub(crate) fn classify(ip: IpAddr) -> AddrClass {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddrClass {
    let o = ip.octets();
    let metadata = [
        [169, 254, 169, 254], // AWS, GCP, Azure, OpenStack
        [169, 254, 170, 2],   // AWS ECS task metadata
        [100, 100, 100, 200], // Alibaba Cloud
        [192, 0, 0, 192],     // Oracle Cloud
    ];
    if metadata.contains(&o) {
        return AddrClass::Metadata;
    }
    match o {
        [127, ..] => AddrClass::Loopback,
        [0, ..] => AddrClass::Unspecified,
        [10, ..] | [192, 168, ..] => AddrClass::Private,
        [172, b, ..] if (16..32).contains(&b) => AddrClass::Private,
        // Carrier-grade NAT: private to a provider's network.
        [100, b, ..] if (64..128).contains(&b) => AddrClass::Private,
        [169, 254, ..] => AddrClass::LinkLocal,
        // IETF protocol assignments, documentation, benchmarking, multicast, reserved,
        // broadcast.
        [192, 0, 0, _] | [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _] => {
            AddrClass::Reserved
        }
        [198, b, ..] if b == 18 || b == 19 => AddrClass::Reserved,
        [a, ..] if a >= 224 => AddrClass::Reserved,
        _ => AddrClass::Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddrClass {
    let s = ip.segments();
    if ip == Ipv6Addr::LOCALHOST {
        return AddrClass::Loopback;
    }
    if ip == Ipv6Addr::UNSPECIFIED {
        return AddrClass::Unspecified;
    }
    // AWS's IPv6 instance-metadata endpoint.
    if s == [0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254] {
        return AddrClass::Metadata;
    }
    let embedded_v4 =
        |hi: u16, lo: u16| Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8);
    match s {
        // IPv4-compatible (deprecated) `::a.b.c.d`.
        [0, 0, 0, 0, 0, 0, hi, lo] => classify_v4(embedded_v4(hi, lo)),
        // NAT64 well-known and local-use prefixes.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] | [0x64, 0xff9b, 1, _, _, _, hi, lo] => {
            classify_v4(embedded_v4(hi, lo))
        }
        // 6to4: the IPv4 address is in bits 16..48.
        [0x2002, hi, lo, ..] => classify_v4(embedded_v4(hi, lo)),
        [a, ..] if a & 0xfe00 == 0xfc00 => AddrClass::Private,
        [a, ..] if a & 0xffc0 == 0xfe80 => AddrClass::LinkLocal,
        // Site-local (deprecated) is private too.
        [a, ..] if a & 0xffc0 == 0xfec0 => AddrClass::Private,
        [a, ..] if a & 0xff00 == 0xff00 => AddrClass::Reserved,
        // Documentation.
        [0x2001, 0xdb8, ..] => AddrClass::Reserved,
        _ => AddrClass::Public,
    }
}

/// A run's network policy: the profile's `[network]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Policy {
    pub allow: Vec<Rule>,
    #[serde(default)]
    pub deny: Vec<Rule>,
    /// Static names, like `--add-host`: looked up before the host's resolver.
    #[serde(default)]
    pub hosts: BTreeMap<String, IpAddr>,
}

impl Policy {
    /// A policy that allows `hosts` (allow-list entries, each parsed) and nothing else.
    pub(crate) fn allowing<S: AsRef<str>>(hosts: &[S]) -> Result<Policy, RuleError> {
        Ok(Policy {
            allow: hosts
                .iter()
                .map(|h| Rule::parse(h.as_ref()))
                .collect::<Result<_, _>>()?,
            ..Default::default()
        })
    }

    /// May a client connect to `host` on `port`? A name is decided on the name itself (it is
    /// resolved and its addresses checked with [`Policy::check_addr`] afterwards); an address
    /// given directly must be on the allow list.
    pub(crate) fn check_target(&self, host: &Host, port: u16) -> Result<(), Refusal> {
        match host {
            Host::Name(name) => self.check_name(name, Some(port)),
            Host::Ip(ip) => {
                if self.deny.iter().any(|r| r.matches_addr(*ip, Some(port))) {
                    Err(Refusal::Denied)
                } else if self.allow.iter().any(|r| r.matches_addr(*ip, Some(port))) {
                    Ok(())
                } else {
                    Err(Refusal::IpLiteral)
                }
            }
        }
    }

    /// May `name` be used (on `port`, or on some port when `None`, as for a DNS lookup)?
    pub(crate) fn check_name(&self, name: &str, port: Option<u16>) -> Result<(), Refusal> {
        // A deny rule with a port only denies that port; for a lookup (no port yet) only a
        // deny rule without a port refuses the name.
        let denied = self.deny.iter().any(|r| match port {
            Some(_) => r.matches_name(name, port),
            None => r.port().is_none() && r.matches_name(name, None),
        });
        if denied {
            Err(Refusal::Denied)
        } else if self.allow.iter().any(|r| r.matches_name(name, port)) {
            Ok(())
        } else {
            Err(Refusal::NotAllowed)
        }
    }

    /// May an allowed name's address `ip` be used (on `port`, or on some port)? Public
    /// addresses may, unless denied; loopback, private, link-local, metadata and other special
    /// addresses only when an address rule allows them. This is what stops DNS rebinding and
    /// metadata access through an allowed name.
    pub(crate) fn check_addr(&self, ip: IpAddr, port: Option<u16>) -> Result<(), Refusal> {
        let deny_port = |r: &Rule| port.is_some() || r.port().is_none();
        if self
            .deny
            .iter()
            .any(|r| deny_port(r) && r.matches_addr(ip, port))
        {
            return Err(Refusal::Denied);
        }
        match classify(ip) {
            AddrClass::Public => Ok(()),
            _ if self.allow.iter().any(|r| r.matches_addr(ip, port)) => Ok(()),
            class => Err(Refusal::Address(class)),
        }
    }

    /// The addresses of `addrs` that may be used (on `port`, or on some port), in order; with
    /// none, the first refusal (`None` when there was no address at all).
    pub(crate) fn usable_addrs(
        &self,
        addrs: impl IntoIterator<Item = IpAddr>,
        port: Option<u16>,
    ) -> Result<Vec<IpAddr>, Option<Refusal>> {
        let mut first_refusal = None;
        let usable: Vec<IpAddr> = addrs
            .into_iter()
            .filter(|ip| match self.check_addr(*ip, port) {
                Ok(()) => true,
                Err(r) => {
                    first_refusal.get_or_insert(r);
                    false
                }
            })
            .collect();
        if usable.is_empty() {
            Err(first_refusal)
        } else {
            Ok(usable)
        }
    }

    /// The static address of `name`, if the profile gives one.
    pub(crate) fn static_host(&self, name: &str) -> Option<IpAddr> {
        self.hosts.get(name).copied()
    }

    /// Adds `other`'s rules (a profile that extends another, or the `[subagent]` grants);
    /// `other`'s static names win.
    pub(crate) fn extend(&mut self, other: &Policy) {
        for r in &other.allow {
            if !self.allow.contains(r) {
                self.allow.push(r.clone());
            }
        }
        for r in &other.deny {
            if !self.deny.contains(r) {
                self.deny.push(r.clone());
            }
        }
        for (k, v) in &other.hosts {
            self.hosts.insert(k.clone(), *v);
        }
    }

    /// Is this policy no wider than `session`'s? Every allowed name or address must be
    /// allowed there too, every deny rule there must be here, and a static name must map to
    /// the same address.
    pub(crate) fn check_narrows(&self, session: &Policy) -> Result<(), PolicyWidening> {
        for r in &self.allow {
            if !session.allow.iter().any(|s| r.covered_by(s)) {
                return Err(PolicyWidening::Allows(r.clone()));
            }
        }
        for r in &session.deny {
            if !self.deny.contains(r) {
                return Err(PolicyWidening::DoesNotDeny(r.clone()));
            }
        }
        for (name, ip) in &self.hosts {
            if session.hosts.get(name) != Some(ip) {
                return Err(PolicyWidening::Maps(name.clone(), *ip));
            }
        }
        Ok(())
    }
}

/// How an allow-list is wider than the session's ([`Policy::check_narrows`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PolicyWidening {
    #[error("network.allow {0} is not allowed by the session")]
    Allows(Rule),
    #[error("it does not deny {0}")]
    DoesNotDeny(Rule),
    #[error("network.hosts maps {0} to {1}")]
    Maps(String, IpAddr),
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn policy(allow: &[&str], deny: &[&str]) -> Policy {
        Policy {
            allow: allow.iter().map(|s| Rule::parse(s).unwrap()).collect(),
            deny: deny.iter().map(|s| Rule::parse(s).unwrap()).collect(),
            hosts: BTreeMap::new(),
        }
    }

    fn name(s: &str) -> Host {
        normalize(s).unwrap()
    }

    #[test]
    fn rules_parse_and_print_back() {
        for s in [
            "api.example.com",
            "api.example.com:443",
            "*.example.org",
            "*.example.org:443",
            "127.0.0.1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "::1",
            "10.0.0.0/8",
            "fd00::/8",
        ] {
            assert_eq!(Rule::parse(s).unwrap().to_string(), s);
        }
        assert_eq!(
            Rule::parse("API.Example.COM.").unwrap().to_string(),
            "api.example.com"
        );
        for bad in [
            "",
            "*",
            "*:443",
            "a.*.b",
            "foo:0",
            "foo:70000",
            "10.0.0.0/33",
            "ünïcode.example",
            "*.",
            "[::1",
            "a..b",
            "-a.b",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn names_normalise_and_numeric_forms_are_not_names() {
        assert_eq!(
            name("Api.Example.COM."),
            Host::Name("api.example.com".into())
        );
        assert_eq!(name("[::1]"), Host::Ip("::1".parse().unwrap()));
        assert_eq!(
            name("::ffff:127.0.0.1"),
            Host::Ip("127.0.0.1".parse().unwrap())
        );
        for bad in [
            "2130706433",
            "127.1",
            "0x7f.1",
            "a b",
            "",
            ".",
            "x%2e",
            "a..b",
        ] {
            assert_eq!(normalize(bad), Err(Refusal::BadName), "{bad:?}");
        }
    }

    #[test]
    fn deny_wins_and_wildcards_match_below_only() {
        let p = policy(
            &["*.example.org", "api.example.com:443"],
            &["internal.example.org"],
        );
        assert_eq!(p.check_target(&name("a.example.org"), 80), Ok(()));
        assert_eq!(p.check_target(&name("a.b.example.org"), 80), Ok(()));
        assert_eq!(
            p.check_target(&name("example.org"), 80),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(
            p.check_target(&name("badexample.org"), 80),
            Err(Refusal::NotAllowed)
        );
        assert_eq!(
            p.check_target(&name("internal.example.org"), 443),
            Err(Refusal::Denied)
        );
        assert_eq!(p.check_target(&name("api.example.com"), 443), Ok(()));
        assert_eq!(
            p.check_target(&name("api.example.com"), 80),
            Err(Refusal::NotAllowed)
        );
        // Lookups are decided without a port.
        assert_eq!(p.check_name("api.example.com", None), Ok(()));
        assert_eq!(
            p.check_name("internal.example.org", None),
            Err(Refusal::Denied)
        );
    }

    #[test]
    fn ip_literals_pass_only_when_listed() {
        let p = policy(&["127.0.0.1:8080", "10.1.0.0/16", "example.com"], &[]);
        let ip = |s: &str| Host::Ip(s.parse().unwrap());
        assert_eq!(p.check_target(&ip("127.0.0.1"), 8080), Ok(()));
        assert_eq!(
            p.check_target(&ip("127.0.0.1"), 22),
            Err(Refusal::IpLiteral)
        );
        assert_eq!(p.check_target(&ip("::ffff:127.0.0.1"), 8080), Ok(()));
        assert_eq!(p.check_target(&ip("10.1.2.3"), 1), Ok(()));
        assert_eq!(
            p.check_target(&ip("93.184.216.34"), 443),
            Err(Refusal::IpLiteral)
        );
    }

    #[test]
    fn special_addresses_of_allowed_names_need_their_own_rule() {
        let p = policy(&["example.com"], &[]);
        for (addr, class) in [
            ("127.0.0.1", AddrClass::Loopback),
            ("::1", AddrClass::Loopback),
            ("::ffff:127.0.0.2", AddrClass::Loopback),
            ("10.0.0.1", AddrClass::Private),
            ("172.31.255.1", AddrClass::Private),
            ("192.168.1.1", AddrClass::Private),
            ("100.64.0.1", AddrClass::Private),
            ("fd12::1", AddrClass::Private),
            ("169.254.169.254", AddrClass::Metadata),
            ("fd00:ec2::254", AddrClass::Metadata),
            ("100.100.100.200", AddrClass::Metadata),
            ("169.254.1.1", AddrClass::LinkLocal),
            ("fe80::1", AddrClass::LinkLocal),
            ("0.0.0.0", AddrClass::Unspecified),
            ("::", AddrClass::Unspecified),
            ("224.0.0.1", AddrClass::Reserved),
            ("64:ff9b::7f00:1", AddrClass::Loopback),
            ("2002:a00:1::", AddrClass::Private),
            ("::127.0.0.1", AddrClass::Loopback),
        ] {
            let ip: IpAddr = addr.parse().unwrap();
            assert_eq!(classify(ip), class, "{addr}");
            assert_eq!(
                p.check_addr(ip, Some(443)),
                Err(Refusal::Address(class)),
                "{addr}"
            );
        }
        assert_eq!(
            p.check_addr("93.184.216.34".parse().unwrap(), Some(443)),
            Ok(())
        );
        assert_eq!(
            p.check_addr("2606:2800::1".parse().unwrap(), Some(443)),
            Ok(())
        );
        let with_lo = policy(&["example.com", "127.0.0.1:8080"], &[]);
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(with_lo.check_addr(lo, Some(8080)), Ok(()));
        assert_eq!(
            with_lo.check_addr(lo, Some(22)),
            Err(Refusal::Address(AddrClass::Loopback))
        );
        // For a lookup the port is not known yet: the address may be answered.
        assert_eq!(with_lo.check_addr(lo, None), Ok(()));
    }

    #[test]
    fn every_refusal_has_its_own_code_and_text() {
        let all = [
            Refusal::Denied,
            Refusal::NotAllowed,
            Refusal::IpLiteral,
            Refusal::Address(AddrClass::Loopback),
            Refusal::Address(AddrClass::Private),
            Refusal::Address(AddrClass::LinkLocal),
            Refusal::Address(AddrClass::Metadata),
            Refusal::Address(AddrClass::Unspecified),
            Refusal::Address(AddrClass::Reserved),
            Refusal::BadName,
            Refusal::Unresolved,
            Refusal::BadRequest,
            Refusal::UnsupportedCommand,
            Refusal::UnsupportedProtocol,
        ];
        let codes: std::collections::BTreeSet<_> = all.iter().map(|r| r.code()).collect();
        let texts: std::collections::BTreeSet<_> = all.iter().map(|r| r.text()).collect();
        assert_eq!(codes.len(), all.len());
        assert_eq!(texts.len(), all.len());
    }

    #[test]
    fn narrowing_compares_rules() {
        let session = policy(
            &["*.example.org", "api.example.com", "10.0.0.0/8"],
            &["internal.example.org"],
        );
        let ok = policy(
            &[
                "a.example.org:443",
                "*.b.example.org",
                "api.example.com:443",
                "10.1.0.0/16",
            ],
            &["internal.example.org"],
        );
        ok.check_narrows(&session).unwrap();
        for (allow, deny) in [
            (&["example.org"][..], &["internal.example.org"][..]),
            (&["*.org"][..], &["internal.example.org"][..]),
            (&["11.0.0.0/8"][..], &["internal.example.org"][..]),
            (&["a.example.org"][..], &[][..]),
        ] {
            assert!(
                policy(allow, deny).check_narrows(&session).is_err(),
                "{allow:?}"
            );
        }
        let mut mapped = policy(&["api.example.com"], &["internal.example.org"]);
        mapped
            .hosts
            .insert("api.example.com".into(), "127.0.0.1".parse().unwrap());
        assert!(mapped.check_narrows(&session).is_err());
    }

    #[test]
    fn policies_travel_as_their_profile_text() {
        let mut p = policy(&["*.example.org:443", "[::1]:80"], &["x.example.org"]);
        p.hosts
            .insert("m.test".into(), "127.0.0.1".parse().unwrap());
        let json = serde_json::to_string(&p).unwrap();
        assert!(json.contains("\"*.example.org:443\""), "{json}");
        assert_eq!(serde_json::from_str::<Policy>(&json).unwrap(), p);
    }
}
