//! Reading a child's output line by line with a deadline, so a test whose child goes quiet
//! fails with a message instead of hanging in `read_line`.

use std::io::{BufRead, BufReader, Read};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The lines of a pipe, read on a thread of their own.
pub struct Lines {
    rx: mpsc::Receiver<String>,
}

impl Lines {
    pub fn spawn(pipe: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines { rx }
    }

    /// The next line, `None` at the end of the stream; panics naming `what` if none comes
    /// within `within`.
    pub fn next_within(&self, within: Duration, what: &str) -> Option<String> {
        match self.rx.recv_timeout(within) {
            Ok(line) => Some(line),
            Err(mpsc::RecvTimeoutError::Disconnected) => None,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                panic!("no line within {within:?} while waiting for {what}")
            }
        }
    }

    /// Reads lines until one satisfies `pred` and returns it; panics if the stream ends first
    /// or `within` passes.
    pub fn until(
        &self,
        within: Duration,
        what: &str,
        mut pred: impl FnMut(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_within(left.max(Duration::from_millis(1)), what) {
                Some(line) if pred(&line) => return line,
                Some(_) => {}
                None => panic!("the stream ended before {what}"),
            }
        }
    }
}
