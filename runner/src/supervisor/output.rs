//! Output capture: the first `head` bytes go straight to output.log as they arrive; after
//! that only the last `tail` bytes are kept (in memory) and written after a marker when the
//! run ends. The command is never blocked or slowed by the cap.

use std::fs::File;
use std::io::{self, Write};

pub struct Capture {
    file: File,
    tee: Option<io::Stdout>,
    head: u64,
    tail_cap: usize,
    written: u64,
    total: u64,
    /// Ring buffer of the bytes past the head.
    tail: Vec<u8>,
    tail_start: usize,
    /// The first error writing `output.log` (a full disk, say): from then on the output is
    /// still read and counted, so the command is never blocked, but no longer written.
    write_error: Option<io::Error>,
}

impl Capture {
    pub fn new(file: File, head: u64, tail_cap: u64, tee: bool) -> Capture {
        Capture {
            file,
            tee: tee.then(io::stdout),
            head,
            tail_cap: tail_cap as usize,
            written: 0,
            total: 0,
            tail: Vec::new(),
            tail_start: 0,
            write_error: None,
        }
    }

    /// Why `output.log` stopped being written, if it did.
    pub fn write_error(&self) -> Option<&io::Error> {
        self.write_error.as_ref()
    }

    fn write(&mut self, data: &[u8]) {
        if self.write_error.is_none() {
            if let Err(e) = self.file.write_all(data) {
                self.write_error = Some(e);
            }
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// True once the head is full and bytes are being dropped from the middle.
    pub fn truncated(&self) -> bool {
        self.total > self.head + self.tail.len() as u64
    }

    pub fn push(&mut self, mut data: &[u8]) {
        self.total += data.len() as u64;
        if let Some(out) = self.tee.as_mut() {
            // The terminal going away must not stop the run or its log.
            let _ = out.write_all(data).and_then(|_| out.flush());
        }
        if self.written < self.head {
            let room = (self.head - self.written).min(data.len() as u64) as usize;
            self.write(&data[..room]);
            self.written += room as u64;
            data = &data[room..];
        }
        if data.is_empty() || self.tail_cap == 0 {
            return;
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend_from_slice(&data[data.len() - self.tail_cap..]);
            self.tail_start = 0;
            return;
        }
        if self.tail.len() < self.tail_cap {
            let room = self.tail_cap - self.tail.len();
            let take = room.min(data.len());
            self.tail.extend_from_slice(&data[..take]);
            data = &data[take..];
        }
        // The ring is full: overwrite the oldest bytes.
        for &b in data {
            self.tail[self.tail_start] = b;
            self.tail_start = (self.tail_start + 1) % self.tail_cap;
        }
    }

    /// Writes the kept tail (after a marker if bytes were dropped) and syncs the file.
    /// Returns `(bytes produced, truncated)`.
    /// Writes the kept tail and makes the file durable. Returns the total bytes the command
    /// wrote, whether some were left out, and why writing stopped if it did.
    pub fn finish(mut self) -> (u64, bool, Option<io::Error>) {
        let truncated = self.truncated();
        if !self.tail.is_empty() {
            if truncated {
                let omitted = self.total - self.head - self.tail.len() as u64;
                self.write(
                    format!("\n[sidejob: output truncated: {omitted} bytes omitted]\n").as_bytes(),
                );
            }
            let tail = std::mem::take(&mut self.tail);
            let (newer, older) = tail.split_at(self.tail_start);
            self.write(older);
            self.write(newer);
        }
        if self.write_error.is_none() {
            if let Err(e) = self.file.sync_data() {
                self.write_error = Some(e);
            }
        }
        (self.total, truncated, self.write_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(head: u64, tail: u64, chunks: &[&[u8]]) -> (String, u64, bool) {
        let dir = std::env::temp_dir().join(format!(
            "sidejob-capture-{}-{}",
            std::process::id(),
            crate::ids::ulid()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("output.log");
        let mut c = Capture::new(File::create(&path).unwrap(), head, tail, false);
        for ch in chunks {
            c.push(ch);
        }
        let (total, truncated, err) = c.finish();
        assert!(err.is_none());
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        (text, total, truncated)
    }

    #[test]
    fn small_output_is_kept_whole() {
        assert_eq!(
            run(10, 4, &[b"hello", b" you"]),
            ("hello you".into(), 9, false)
        );
    }

    #[test]
    fn output_just_over_the_head_is_kept_whole() {
        // 12 bytes: 10 in the head, 2 in the tail, nothing dropped.
        assert_eq!(
            run(10, 4, &[b"0123456789ab"]),
            ("0123456789ab".into(), 12, false)
        );
    }

    #[test]
    fn long_output_keeps_head_and_tail_with_a_marker() {
        let (text, total, truncated) = run(4, 3, &[b"abcd", b"efgh", b"ij", b"klm", b"n"]);
        assert_eq!(total, 14);
        assert!(truncated);
        assert_eq!(
            text,
            "abcd\n[sidejob: output truncated: 7 bytes omitted]\nlmn"
        );
    }

    #[test]
    fn one_huge_chunk_keeps_its_end() {
        let big = vec![b'x'; 100];
        let mut chunk = big.clone();
        chunk.extend_from_slice(b"END");
        let (text, _, truncated) = run(2, 3, &[&chunk]);
        assert!(truncated);
        assert!(text.starts_with("xx\n[sidejob"));
        assert!(text.ends_with("END"));
    }
}
