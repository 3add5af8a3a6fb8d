//! Refusals, recorded as they happen: one JSON line each in the run's private directory
//! (`network.jsonl`, next to the launch plan, where neither the run nor its caller can
//! write). The proxy writes the line *before* it answers the client, so a command that waits
//! for its refusal cannot end before the refusal is on disk; the supervisor reads the file
//! when the run is over and puts the refusals into `result.json` `violations`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::policy::Refusal;

/// The file name in the run's private directory.
pub(crate) const FILE: &str = "network.jsonl";

/// Lines one run may add; a run that keeps knocking is counted, not logged without end.
pub(crate) const MAX_LINES: u32 = 1000;

/// The largest file the supervisor reads back.
const MAX_BYTES: u64 = 1 << 20;

/// `kind` of a network violation; always `"network"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum NetworkKind {
    Network,
}

/// How the run asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Via {
    /// HTTP `CONNECT`.
    Connect,
    /// An absolute-form HTTP request (`GET http://host/...`).
    Http,
    Socks5,
    /// A lookup through the run's DNS responder.
    Dns,
}

/// One refused connection or lookup, as `result.json` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NetworkViolation {
    pub kind: NetworkKind,
    /// The host as the client named it (normalised when it could be).
    pub host: String,
    /// `null` for a lookup.
    pub port: Option<u16>,
    /// When it first happened (RFC 3339).
    pub at: String,
    /// [`Refusal::code`].
    pub reason: String,
    pub via: Via,
    /// How many times it happened (the same host, port, reason and way).
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

impl NetworkViolation {
    pub(crate) fn new(
        host: &str,
        port: Option<u16>,
        refusal: Refusal,
        via: Via,
    ) -> NetworkViolation {
        NetworkViolation {
            kind: NetworkKind::Network,
            host: host.chars().take(255).collect(),
            port,
            at: crate::ids::now_rfc3339(),
            reason: refusal.code().to_owned(),
            via,
            count: 1,
        }
    }

    /// `host:port` (or the host alone for a lookup).
    pub(crate) fn target(&self) -> String {
        match self.port {
            Some(p) => format!("{}:{p}", self.host),
            None => self.host.clone(),
        }
    }
}

/// Appends a run's refusals to its `network.jsonl`.
#[derive(Debug)]
pub(crate) struct Recorder {
    path: PathBuf,
    state: Mutex<(Option<File>, u32)>,
}

impl Recorder {
    /// A recorder for `path`; the file is made (0600) with the first refusal, so a run
    /// without one costs nothing. A restarted daemon appends to what is there.
    pub(crate) fn open(path: &Path) -> std::io::Result<Recorder> {
        let lines = match std::fs::read(path) {
            Ok(b) => b.iter().filter(|c| **c == b'\n').count() as u32,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(Recorder {
            path: path.to_path_buf(),
            state: Mutex::new((None, lines)),
        })
    }

    fn file(path: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    }

    /// Writes one refusal (up to [`MAX_LINES`] per run). Errors are logged, never raised:
    /// the refusal itself stands either way.
    pub(crate) fn record(&self, v: &NetworkViolation) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.1 >= MAX_LINES {
            return;
        }
        st.1 += 1;
        if st.0.is_none() {
            match Self::file(&self.path) {
                Ok(f) => st.0 = Some(f),
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), "cannot record a network refusal: {e}");
                    return;
                }
            }
        }
        let Some(file) = st.0.as_mut() else { return };
        let mut line = serde_json::to_vec(v).unwrap_or_default();
        line.push(b'\n');
        if let Err(e) = file.write_all(&line) {
            tracing::warn!(path = %self.path.display(), "cannot record a network refusal: {e}");
        }
    }
}

/// Reads a run's refusals, merged by host, port, reason and way (first time, count). A
/// missing file is no refusal.
pub(crate) fn read(path: &Path) -> Vec<NetworkViolation> {
    let Ok(f) = File::open(path) else {
        return Vec::new();
    };
    let mut out: Vec<NetworkViolation> = Vec::new();
    let mut index: HashMap<(String, Option<u16>, String, Via), usize> = HashMap::new();
    for line in BufReader::new(f.take(MAX_BYTES)).lines() {
        let Ok(line) = line else { break };
        let Ok(v) = serde_json::from_str::<NetworkViolation>(&line) else {
            continue;
        };
        let key = (v.host.clone(), v.port, v.reason.clone(), v.via);
        match index.get(&key) {
            Some(&i) => out[i].count = out[i].count.saturating_add(v.count),
            None => {
                index.insert(key, out.len());
                out.push(v);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn refusals_are_appended_capped_and_merged_on_reading() {
        let dir = crate::scratch::ScratchDir::new("record");
        let path = dir.path().join(FILE);
        let r = Recorder::open(&path).unwrap();
        for _ in 0..3 {
            r.record(&NetworkViolation::new(
                "evil.test",
                Some(443),
                Refusal::NotAllowed,
                Via::Connect,
            ));
        }
        r.record(&NetworkViolation::new(
            "evil.test",
            None,
            Refusal::NotAllowed,
            Via::Dns,
        ));
        drop(r);
        // A restarted daemon appends.
        let r = Recorder::open(&path).unwrap();
        r.record(&NetworkViolation::new(
            "x.test",
            Some(80),
            Refusal::Denied,
            Via::Http,
        ));
        let got = read(&path);
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            (got[0].target().as_str(), got[0].count),
            ("evil.test:443", 3)
        );
        assert_eq!(
            (got[1].target().as_str(), got[1].via),
            ("evil.test", Via::Dns)
        );
        assert_eq!(got[2].reason, "denied");
        for _ in 0..(MAX_LINES + 10) {
            r.record(&NetworkViolation::new(
                "y.test",
                Some(1),
                Refusal::Denied,
                Via::Http,
            ));
        }
        let lines = std::fs::read_to_string(&path).unwrap().lines().count() as u32;
        assert_eq!(lines, MAX_LINES);
    }
}
