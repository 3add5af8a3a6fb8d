//! The run's DNS responder: answers `A` and `AAAA` for names the allow-list allows, with the
//! addresses the host resolves them to (checked like the proxy checks them), and `REFUSED`
//! for every other name. Messages are parsed and built with `hickory-proto`. Nothing is
//! forwarded: a name that is not allowed never reaches the host's resolver, so the responder
//! cannot carry data out either.

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::policy::{self, Host, Refusal};
use super::record::Via;
use super::Run;

/// The largest message accepted or sent.
pub(crate) const MAX_MESSAGE: usize = 4096;
/// Time to live of the answers: short, so a changed address is seen soon.
const TTL: u32 = 30;
/// Answers per response (enough for any service; keeps UDP replies small).
const MAX_ANSWERS: usize = 8;
/// How long a TCP client may stay idle between queries.
const TCP_IDLE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

/// The response to one query, or `None` when the bytes are not a DNS query at all.
pub(crate) async fn answer(run: &Run, query: &[u8], transport: Transport) -> Option<Vec<u8>> {
    if query.len() > MAX_MESSAGE {
        return None;
    }
    let msg = match Message::from_vec(query) {
        Ok(m) => m,
        // Too broken to answer; echo the id with FORMERR when there is one.
        Err(_) if query.len() >= 2 => {
            let id = u16::from_be_bytes([query[0], query[1]]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr)
                .to_vec()
                .ok();
        }
        Err(_) => return None,
    };
    if msg.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut resp = Message::response(msg.metadata.id, msg.metadata.op_code);
    resp.metadata.recursion_desired = msg.metadata.recursion_desired;
    resp.metadata.recursion_available = true;
    let code = if msg.metadata.op_code != OpCode::Query {
        ResponseCode::NotImp
    } else if msg.queries.len() != 1 {
        ResponseCode::FormErr
    } else {
        let q = msg.queries[0].clone();
        resp.add_query(q.clone());
        lookup(run, &q, &mut resp).await
    };
    resp.metadata.response_code = code;
    let bytes = resp.to_vec().ok()?;
    if transport == Transport::Udp && bytes.len() > 512 {
        let mut cut = resp.truncate();
        cut.metadata.truncation = true;
        return cut.to_vec().ok();
    }
    Some(bytes)
}

async fn lookup(run: &Run, q: &hickory_proto::op::Query, resp: &mut Message) -> ResponseCode {
    let qtype = q.query_type();
    let asks_address = matches!(qtype, RecordType::A | RecordType::AAAA | RecordType::ANY);
    let raw = q.name().to_ascii();
    let raw = raw.strip_suffix('.').unwrap_or(&raw);
    // Every refusal is recorded, whatever record type was asked for: a TXT, MX or PTR
    // lookup of a name that is not allowed is as much a knock as an A lookup.
    if q.query_class() != DNSClass::IN {
        run.refuse(raw, None, Refusal::BadRequest, Via::Dns);
        return ResponseCode::Refused;
    }
    let name = match policy::normalize(raw) {
        Ok(Host::Name(n)) => n,
        // Odd names are not the run's business.
        Ok(Host::Ip(_)) | Err(_) => {
            run.refuse(raw, None, Refusal::BadName, Via::Dns);
            return ResponseCode::Refused;
        }
    };
    if let Err(r) = run.policy.check_name(&name, None) {
        run.refuse(&name, None, r, Via::Dns);
        return ResponseCode::Refused;
    }
    if !asks_address {
        return ResponseCode::NoError; // an allowed name with no such record here
    }
    let addrs = match run.resolve(&name).await {
        Ok(a) if !a.is_empty() => a,
        _ => return ResponseCode::NXDomain,
    };
    let allowed = match run.policy.usable_addrs(addrs, None) {
        Ok(a) => a,
        Err(Some(r)) => {
            run.refuse(&name, None, r, Via::Dns);
            return ResponseCode::Refused;
        }
        Err(None) => Vec::new(),
    };
    for ip in allowed.into_iter().take(MAX_ANSWERS) {
        let rdata = match (ip, qtype) {
            (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => RData::A(A(v4)),
            (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => RData::AAAA(AAAA(v6)),
            _ => continue,
        };
        run.remember(ip, &name);
        resp.add_answer(Record::from_rdata(q.name().clone(), TTL, rdata));
    }
    ResponseCode::NoError
}

/// DNS over TCP: two-byte lengths before each message, until the client stops.
pub(crate) async fn serve_tcp(mut stream: TcpStream, run: Arc<Run>) -> io::Result<()> {
    loop {
        let mut len = [0u8; 2];
        match tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut len)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => return Ok(()),
        }
        let len = u16::from_be_bytes(len) as usize;
        if len > MAX_MESSAGE {
            return Ok(());
        }
        let mut msg = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut msg))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "idle"))??;
        let Some(reply) = answer(&run, &msg, Transport::Tcp).await else {
            return Ok(());
        };
        let mut out = (reply.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(&reply);
        stream.write_all(&out).await?;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::egress::record;
    use crate::scratch::ScratchDir;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    /// A run with this policy, and the directory of its violation record (gone when dropped).
    fn run(allow: &[&str], deny: &[&str], hosts: &[(&str, &str)]) -> (Run, ScratchDir) {
        let dir = ScratchDir::new("dns");
        let policy = policy::Policy {
            allow: allow
                .iter()
                .map(|s| policy::Rule::parse(s).unwrap())
                .collect(),
            deny: deny
                .iter()
                .map(|s| policy::Rule::parse(s).unwrap())
                .collect(),
            hosts: hosts
                .iter()
                .map(|(n, a)| ((*n).to_owned(), a.parse().unwrap()))
                .collect(),
        };
        let run = Run::new("t", policy, &dir.path().join("network.jsonl")).unwrap();
        (run, dir)
    }

    fn violations(dir: &ScratchDir) -> Vec<record::NetworkViolation> {
        record::read(&dir.path().join("network.jsonl"))
    }

    fn query(name: &str, ty: RecordType) -> Vec<u8> {
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), ty));
        m.to_vec().unwrap()
    }

    async fn ask(run: &Run, name: &str, ty: RecordType) -> Message {
        let bytes = answer(run, &query(name, ty), Transport::Udp).await.unwrap();
        Message::from_vec(&bytes).unwrap()
    }

    #[tokio::test]
    async fn allowed_names_are_answered_and_others_refused_and_recorded() {
        let (r, dir) = run(
            &["models.test", "127.0.0.1"],
            &[],
            &[("models.test", "127.0.0.1"), ("other.test", "127.0.0.1")],
        );
        let a = ask(&r, "Models.Test.", RecordType::A).await;
        assert_eq!(a.metadata.id, 0x1234);
        assert_eq!(a.metadata.response_code, ResponseCode::NoError);
        assert_eq!(a.answers.len(), 1);
        assert_eq!(a.answers[0].data, RData::A(A("127.0.0.1".parse().unwrap())));
        // An allowed name without an address of that family: no data, no error.
        let aaaa = ask(&r, "models.test", RecordType::AAAA).await;
        assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
        assert!(aaaa.answers.is_empty());
        // Not allowed: refused (even though it has a static address), and recorded.
        let other = ask(&r, "other.test", RecordType::A).await;
        assert_eq!(other.metadata.response_code, ResponseCode::Refused);
        assert!(other.answers.is_empty());
        let v = violations(&dir);
        assert_eq!(v.len(), 1, "{v:?}");
        assert_eq!(
            (v[0].host.as_str(), v[0].port, v[0].via),
            ("other.test", None, Via::Dns)
        );
        assert_eq!(v[0].reason, "not_allowed");
        // The answered address is remembered for the proxy.
        assert_eq!(
            r.answered_name("127.0.0.1".parse().unwrap()).as_deref(),
            Some("models.test")
        );
    }

    #[tokio::test]
    async fn an_allowed_name_on_a_private_address_is_refused_unless_the_address_is_allowed() {
        let (r, dir) = run(&["inside.test"], &[], &[("inside.test", "10.1.2.3")]);
        let m = ask(&r, "inside.test", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        assert_eq!(violations(&dir)[0].reason, "private_address");
        let (ok, _) = run(
            &["inside.test", "10.0.0.0/8"],
            &[],
            &[("inside.test", "10.1.2.3")],
        );
        let m = ask(&ok, "inside.test", RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
    }

    #[tokio::test]
    async fn garbage_gets_formerr_or_nothing_and_other_record_types_of_refused_names_are_recorded()
    {
        let (r, dir) = run(&["a.test"], &[], &[]);
        let reply = answer(&r, &[0xab, 0xcd, 0xff], Transport::Udp)
            .await
            .unwrap();
        let m = Message::from_vec(&reply).unwrap();
        assert_eq!(
            (m.metadata.id, m.metadata.response_code),
            (0xabcd, ResponseCode::FormErr)
        );
        assert_eq!(answer(&r, &[1], Transport::Udp).await, None);
        assert!(violations(&dir).is_empty());
        // Control: another record type of an allowed name is no refusal.
        let txt = ask(&r, "a.test", RecordType::TXT).await;
        assert_eq!(txt.metadata.response_code, ResponseCode::NoError);
        assert!(violations(&dir).is_empty());
        let ptr = ask(&r, "1.0.0.127.in-addr.arpa", RecordType::PTR).await;
        assert_eq!(ptr.metadata.response_code, ResponseCode::Refused);
        for ty in [RecordType::TXT, RecordType::MX] {
            let m = ask(&r, "evil.test", ty).await;
            assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        }
        let v: Vec<_> = violations(&dir)
            .into_iter()
            .map(|v| (v.host, v.reason, v.count))
            .collect();
        assert_eq!(
            v,
            [
                ("1.0.0.127.in-addr.arpa".into(), "not_allowed".into(), 1),
                ("evil.test".into(), "not_allowed".into(), 2),
            ]
        );
    }

    proptest::proptest! {
        /// Random bytes: an answer or nothing, never a panic.
        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
            let (r, _dir) = run(&["a.test"], &[], &[("a.test", "192.0.2.1")]);
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let _ = rt.block_on(answer(&r, &bytes, Transport::Udp));
        }
    }
}
