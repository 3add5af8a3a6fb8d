//! Refusals, recorded as they happen: one JSON line for each different refusal in the run's
//! private directory (`network.jsonl`, next to the launch plan, where neither the run nor its
//! caller can write). The proxy writes the line *before* it answers the client, so a command
//! that waits for its refusal cannot end before the refusal is on disk; the supervisor reads
//! the file when the run is over and puts the refusals into `result.json` `violations`.
//!
//! Every refusal is counted, and none makes the file grow without bound: the same refusal
//! again only rewrites its line's count in place, and past [`MAX_LINES`] different ones, a
//! new one is counted on the line of its reason and way whose host is [`OTHERS`].

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::policy::Refusal;

/// Different refusals one run may add a line for; a run that keeps knocking is counted, not
/// logged without end.
pub(crate) const MAX_LINES: u32 = 1000;

/// The host of the lines that count, by reason and way, the refusals past [`MAX_LINES`].
pub(crate) const OTHERS: &str = "(others)";

/// The width a line keeps for its count (`u32::MAX` has 10 digits), padded with spaces, so
/// that the count can be rewritten in place.
const COUNT_WIDTH: usize = 10;

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
    /// A SOCKS4 request (always refused).
    Socks4,
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

/// Records a run's refusals in its `network.jsonl`.
#[derive(Debug)]
pub(crate) struct Recorder {
    path: PathBuf,
    state: Mutex<State>,
}

/// What one refusal is told apart by: host, port, reason and way.
type Key = (String, Option<u16>, String, Via);

#[derive(Debug)]
struct State {
    /// Opened with the first refusal.
    file: Option<File>,
    /// Where the next line goes.
    end: u64,
    /// Lines in the file (a restarted daemon's included).
    lines: u32,
    /// The refusals this recorder wrote: how many times each happened, and where the line's
    /// count is.
    counted: HashMap<Key, (u32, u64)>,
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
            state: Mutex::new(State {
                file: None,
                end: 0,
                lines,
                counted: HashMap::new(),
            }),
        })
    }

    /// Not opened for appending: `pwrite` at an offset appends on such a file, and counts
    /// are rewritten where they are.
    fn file(path: &Path) -> std::io::Result<File> {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    }

    /// Counts one refusal: its first time writes its line (up to [`MAX_LINES`] different
    /// ones per run, then on its reason's [`OTHERS`] line), a repeat rewrites the count.
    /// Returns whether it was the first of its kind. Errors are logged, never raised: the
    /// refusal itself stands either way.
    pub(crate) fn record(&self, v: &NetworkViolation) -> bool {
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        let mut key: Key = (v.host.clone(), v.port, v.reason.clone(), v.via);
        if !st.counted.contains_key(&key) && st.lines >= MAX_LINES {
            key = (OTHERS.to_owned(), None, v.reason.clone(), v.via);
        }
        if let Some((count, at)) = st.counted.get_mut(&key) {
            *count = count.saturating_add(1);
            let text = format!("{:<COUNT_WIDTH$}", *count);
            if let Some(file) = &st.file {
                if let Err(e) = file.write_all_at(text.as_bytes(), *at) {
                    tracing::warn!(path = %self.path.display(), "cannot count a network refusal: {e}");
                }
            }
            return false;
        }
        if st.file.is_none() {
            match Self::file(&self.path).and_then(|f| Ok((f.metadata()?.len(), f))) {
                Ok((len, f)) => {
                    st.end = len;
                    st.file = Some(f);
                }
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), "cannot record a network refusal: {e}");
                    return true;
                }
            }
        }
        let Some(file) = &st.file else { return true };
        let mut first = v.clone();
        first.count = 1;
        if key.0 == OTHERS {
            first.host = OTHERS.to_owned();
            first.port = None;
        }
        // `count` is the last field: the line ends `"count":1}`.
        let json = serde_json::to_vec(&first).unwrap_or_default();
        let Some(head) = json.strip_suffix(b"1}") else {
            tracing::warn!(path = %self.path.display(), "cannot record a network refusal: unexpected JSON");
            return true;
        };
        let mut line = head.to_vec();
        line.extend_from_slice(format!("{:<COUNT_WIDTH$}}}\n", 1).as_bytes());
        if let Err(e) = file.write_all_at(&line, st.end) {
            tracing::warn!(path = %self.path.display(), "cannot record a network refusal: {e}");
            return true;
        }
        let count_at = st.end + head.len() as u64;
        st.end += line.len() as u64;
        st.lines = st.lines.saturating_add(1);
        st.counted.insert(key, (1, count_at));
        true
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
        let path = dir.path().join("network.jsonl");
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
        // The same refusal again is counted on its line; past MAX_LINES different ones, the
        // rest are counted on their reason's line.
        let y = |i: u32| {
            NetworkViolation::new(&format!("y{i}.test"), Some(1), Refusal::Denied, Via::Http)
        };
        for i in 0..(MAX_LINES + 10) {
            // Three lines are there already; the first past the cap begins the others' line.
            assert_eq!(r.record(&y(i)), i <= MAX_LINES - 3, "y{i}");
        }
        assert!(!r.record(&y(0)), "a repeat is not new");
        assert!(!r.record(&y(MAX_LINES + 20)), "counted on the others' line");
        let lines = std::fs::read_to_string(&path).unwrap().lines().count() as u32;
        assert_eq!(lines, MAX_LINES + 1);
        let got = read(&path);
        let y0 = got.iter().find(|v| v.host == "y0.test").unwrap();
        assert_eq!(y0.count, 2);
        let others = got.iter().find(|v| v.host == OTHERS).unwrap();
        assert_eq!(
            (others.port, others.reason.as_str(), others.count),
            (None, "denied", 14)
        );
        let total: u32 = got.iter().map(|v| v.count).sum();
        assert_eq!(total, 3 + 1 + 1 + MAX_LINES + 10 + 2);
    }
}
