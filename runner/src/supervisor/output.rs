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
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    /// True once the head is full and bytes are being dropped from the middle.
    pub fn truncated(&self) -> bool {
        self.total > self.head + self.tail.len() as u64
    }

    pub fn push(&mut self, mut data: &[u8]) -> io::Result<()> {
        self.total += data.len() as u64;
        if let Some(out) = self.tee.as_mut() {
            // The terminal going away must not stop the run or its log.
            let _ = out.write_all(data).and_then(|_| out.flush());
        }
        if self.written < self.head {
            let room = (self.head - self.written).min(data.len() as u64) as usize;
            self.file.write_all(&data[..room])?;
            self.written += room as u64;
            data = &data[room..];
        }
        if data.is_empty() || self.tail_cap == 0 {
            return Ok(());
        }
        if data.len() >= self.tail_cap {
            self.tail.clear();
            self.tail
                .extend_from_slice(&data[data.len() - self.tail_cap..]);
            self.tail_start = 0;
            return Ok(());
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
        Ok(())
    }

    /// Writes the kept tail (after a marker if bytes were dropped) and syncs the file.
    /// Returns `(bytes produced, truncated)`.
    pub fn finish(mut self) -> io::Result<(u64, bool)> {
        let truncated = self.truncated();
        if !self.tail.is_empty() {
            if truncated {
                let omitted = self.total - self.head - self.tail.len() as u64;
                write!(
                    self.file,
                    "\n[sidejob: output truncated: {omitted} bytes omitted]\n"
                )?;
            }
            let (newer, older) = self.tail.split_at(self.tail_start);
            self.file.write_all(older)?;
            self.file.write_all(newer)?;
        }
        self.file.sync_data()?;
        Ok((self.total, truncated))
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
            c.push(ch).unwrap();
        }
        let (total, truncated) = c.finish().unwrap();
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
