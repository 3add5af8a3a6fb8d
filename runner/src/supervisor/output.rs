//! Output capture: the first `head` bytes go straight to output.log as they arrive; after
//! that only the last `tail` bytes are kept (in memory) and written after a marker when the
//! run ends. The command is never blocked or slowed by the cap.
//!
//! The bytes move with as few copies as the kernel allows: the head is spliced from the
//! run's pipe into output.log (no copy through this process), and past the head the pipe is
//! read straight into the ring that keeps the tail (one copy, no intermediate buffer). Only a
//! run whose output is also shown on a terminal reads through a buffer.
//!
//! A run whose stderr has a pipe of its own (`Stderr::Separate`) is captured into the same
//! log, each read appended as it comes; which stream each range came from is recorded in
//! `output.streams` (`run::streams`), at once for the head and when the run ends for the
//! tail. Order between the two pipes is the order the supervisor read them in: writes to
//! both closer together than one of its wake-ups are recorded stdout first.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::fcntl::{splice, SpliceFFlags};

use crate::run::plan::Tee;
use crate::run::streams::{self, Segment, Stream};
use crate::sys;

/// The most one splice moves; the pipe holds at most this much anyway (see [`PIPE_SIZE`]).
const SPLICE_CHUNK: usize = 1 << 20;

/// The largest buffer output is read through (when it cannot be spliced).
const SCRATCH_MAX: usize = 64 * 1024;

/// The size the output pipe is given, so a fast writer fills it in few system calls and the
/// supervisor drains it in few wake-ups (`/proc/sys/fs/pipe-max-size` caps it; the default
/// 64 KiB stays if the kernel refuses).
pub(crate) const PIPE_SIZE: i32 = 1 << 20;

pub(crate) struct Capture {
    file: File,
    tee: Option<Box<dyn Write>>,
    /// Where a separate stderr's bytes are copied (the supervisor's stderr, when teeing).
    tee_err: Option<Box<dyn Write>>,
    /// `output.streams`, for a run with a separate stderr (`None` once a write to it fails:
    /// the rest is then attributed to stdout, and the log is untouched).
    index: Option<File>,
    /// The streams of the bytes past the head, as `(stream, offset in the whole output,
    /// len)`: their place in `output.log` is known only when the tail is written.
    tail_segments: VecDeque<Segment>,
    head: u64,
    written: u64,
    total: u64,
    tail: Ring,
    /// Where the bytes are read when they cannot be spliced (teeing, or output.log failed).
    scratch: Vec<u8>,
    /// The first error writing `output.log` (a full disk, say): from then on the output is
    /// still read and counted, so the command is never blocked, but no longer written.
    write_error: Option<io::Error>,
}

impl Capture {
    /// `index` is `output.streams`, for a run whose stderr has a pipe of its own.
    pub(crate) fn new(
        file: File,
        head: u64,
        tail_cap: u64,
        tee: Tee,
        index: Option<File>,
    ) -> Capture {
        let to = |tee: Tee| -> Option<Box<dyn Write>> {
            match tee {
                Tee::None => None,
                Tee::Stdout => Some(Box::new(io::stdout())),
                Tee::Stderr => Some(Box::new(io::stderr())),
            }
        };
        // A separate stderr is shown on stderr, wherever stdout's bytes go.
        let tee_err = match (tee, &index) {
            (Tee::None, _) | (_, None) => None,
            (Tee::Stdout | Tee::Stderr, Some(_)) => to(Tee::Stderr),
        };
        Capture {
            file,
            tee: to(tee),
            tee_err,
            index,
            tail_segments: VecDeque::new(),
            head,
            written: 0,
            total: 0,
            tail: Ring::new(tail_cap as usize),
            scratch: Vec::new(),
            write_error: None,
        }
    }

    fn write(&mut self, data: &[u8]) {
        if self.write_error.is_none() {
            if let Err(e) = self.file.write_all(data) {
                self.write_error = Some(e);
            }
        }
    }

    /// Records that `len` bytes of `stream` were just put at `at` of the whole output.
    fn note(&mut self, stream: Stream, at: u64, len: u64) {
        if len == 0 || self.index.is_none() {
            return;
        }
        // The part in the head is in output.log already, at the same offset.
        let in_head = self.head.saturating_sub(at).min(len);
        if in_head > 0 {
            self.record(stream, at, in_head);
        }
        if in_head < len {
            let (start, len) = (at + in_head, len - in_head);
            match self.tail_segments.back_mut() {
                Some((s, o, l)) if *s == stream && *o + *l == start => *l += len,
                _ => self.tail_segments.push_back((stream, start, len)),
            }
            // Only what the ring can still hold is worth keeping.
            let kept_from = self.total.saturating_sub(self.tail.cap as u64);
            while self
                .tail_segments
                .front()
                .is_some_and(|(_, o, l)| o + l <= kept_from)
            {
                self.tail_segments.pop_front();
            }
        }
    }

    /// Appends one record to `output.streams` (records longer than a u32 are cut in parts).
    fn record(&mut self, stream: Stream, mut offset: u64, mut len: u64) {
        while len > 0 {
            let part = len.min(u32::MAX as u64);
            let Some(index) = self.index.as_mut() else {
                return;
            };
            if index
                .write_all(&streams::encode(stream, offset, part as u32))
                .is_err()
            {
                self.index = None;
                return;
            }
            offset += part;
            len -= part;
        }
    }

    /// True once the head is full and bytes are being dropped from the middle.
    pub(crate) fn truncated(&self) -> bool {
        self.total > self.head + self.tail.len() as u64
    }

    /// Moves what `pipe` (non-blocking, the command's `stream`) holds into the capture, in
    /// one system call: `Ok(0)` at end of file, `WouldBlock` when the pipe is empty.
    pub(crate) fn fill_from(&mut self, pipe: BorrowedFd<'_>, stream: Stream) -> io::Result<usize> {
        let at = self.total;
        let n = self.fill(pipe, stream)?;
        self.note(stream, at, n as u64);
        Ok(n)
    }

    fn fill(&mut self, pipe: BorrowedFd<'_>, stream: Stream) -> io::Result<usize> {
        if self.tee.is_none() && self.write_error.is_none() && self.written < self.head {
            let room = (self.head - self.written).min(SPLICE_CHUNK as u64) as usize;
            match splice(
                pipe,
                None,
                self.file.as_fd(),
                None,
                room,
                SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE,
            ) {
                Ok(n) => {
                    self.written += n as u64;
                    self.total += n as u64;
                    return Ok(n);
                }
                Err(Errno::EINTR) => return Err(io::ErrorKind::Interrupted.into()),
                Err(Errno::EAGAIN) => return Err(io::ErrorKind::WouldBlock.into()),
                // Splice refused by the file's filesystem, or the write failed (a full
                // disk): the bytes are still in the pipe; read them instead, below, where a
                // write error is recorded and the run goes on.
                Err(_) => {}
            }
        }
        if self.tee.is_none() && self.written >= self.head {
            let n = self.tail.read_from(pipe)?;
            self.total += n as u64;
            return Ok(n);
        }
        // Most runs print little: their output is read through one page, and only a run that
        // fills it gets the larger buffer (zeroing that alone faults in 16 pages, a good part
        // of a short run's cost). On the heap, not the stack: a page-sized frame in the run
        // loop would be one more page for every supervisor, output or not.
        if self.scratch.is_empty() {
            self.scratch = vec![0; 4096];
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let read = sys::read_fd(pipe, &mut scratch);
        if let Ok(n) = read {
            self.push_from(stream, &scratch[..n]);
            if n == scratch.len() && scratch.len() < SCRATCH_MAX {
                scratch = vec![0; SCRATCH_MAX];
            }
        }
        self.scratch = scratch;
        read
    }

    /// Takes bytes of the command's stdout.
    #[cfg(test)]
    pub(crate) fn push(&mut self, data: &[u8]) {
        self.push_from(Stream::Stdout, data);
    }

    /// Takes bytes the caller read (the note in `output.streams` is [`Capture::note`]'s).
    fn push_from(&mut self, stream: Stream, mut data: &[u8]) {
        self.total += data.len() as u64;
        let tee = match stream {
            Stream::Stdout => self.tee.as_mut(),
            Stream::Stderr => self.tee_err.as_mut().or(self.tee.as_mut()),
        };
        if let Some(out) = tee {
            // The terminal going away must not stop the run or its log.
            let _ = out.write_all(data).and_then(|_| out.flush());
        }
        if self.written < self.head {
            let room = (self.head - self.written).min(data.len() as u64) as usize;
            self.write(&data[..room]);
            self.written += room as u64;
            data = &data[room..];
        }
        self.tail.push(data);
    }

    /// Writes the kept tail (after a marker if bytes were dropped). The file is handed back
    /// complete, for the caller to make durable once the run's outcome has been reported.
    pub(crate) fn finish(mut self) -> Captured {
        let truncated = self.truncated();
        if self.tail.len() > 0 {
            // Where the tail starts, in the whole output and in output.log.
            let kept_from = self.total - self.tail.len() as u64;
            let mut at = self.written;
            if truncated {
                let omitted = self.total - self.head - self.tail.len() as u64;
                let marker = format!("\n[sidejob: output truncated: {omitted} bytes omitted]\n");
                self.write(marker.as_bytes());
                at += marker.len() as u64;
            }
            let tail = std::mem::replace(&mut self.tail, Ring::new(0));
            let (older, newer) = tail.parts();
            self.write(older);
            self.write(newer);
            for (stream, o, l) in std::mem::take(&mut self.tail_segments) {
                let start = o.max(kept_from);
                if o + l > start {
                    self.record(stream, at + (start - kept_from), o + l - start);
                }
            }
        }
        Captured {
            bytes: self.total,
            truncated,
            error: self.write_error,
            file: self.file,
        }
    }
}

/// What a finished [`Capture`] hands back.
pub(crate) struct Captured {
    /// Every byte the command wrote, kept or not.
    pub bytes: u64,
    /// Whether some were left out (the marker says how many).
    pub truncated: bool,
    /// Why writing `output.log` stopped, if it did.
    pub error: Option<io::Error>,
    /// `output.log`, complete.
    pub file: File,
}

/// The last `cap` bytes seen, in a buffer allocated the first time one is kept.
struct Ring {
    buf: Vec<u8>,
    cap: usize,
    /// Where the next byte goes; once full, also where the oldest byte is.
    pos: usize,
    filled: usize,
}

impl Ring {
    fn new(cap: usize) -> Ring {
        Ring {
            buf: Vec::new(),
            cap,
            pos: 0,
            filled: 0,
        }
    }

    fn len(&self) -> usize {
        self.filled
    }

    fn space(&mut self) -> &mut [u8] {
        if self.buf.is_empty() {
            self.buf = vec![0; self.cap];
        }
        &mut self.buf[self.pos..]
    }

    fn advance(&mut self, n: usize) {
        self.pos = (self.pos + n) % self.cap;
        self.filled = (self.filled + n).min(self.cap);
    }

    fn push(&mut self, data: &[u8]) {
        if self.cap == 0 || data.is_empty() {
            return;
        }
        let data = &data[data.len().saturating_sub(self.cap)..];
        let first = data.len().min(self.cap - self.pos);
        self.space()[..first].copy_from_slice(&data[..first]);
        self.buf[..data.len() - first].copy_from_slice(&data[first..]);
        self.advance(data.len());
    }

    /// One `read(2)` from `fd` straight into the ring: up to the end of the buffer, so a
    /// full pipe is drained in a few calls.
    fn read_from(&mut self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        if self.cap == 0 {
            return read_to_sink(fd);
        }
        let n = sys::read_fd(fd, self.space())?;
        self.advance(n);
        Ok(n)
    }

    /// The kept bytes, oldest first, in two pieces.
    fn parts(&self) -> (&[u8], &[u8]) {
        if self.filled < self.cap {
            (&self.buf[..self.filled], &[])
        } else {
            (&self.buf[self.pos..], &self.buf[..self.pos])
        }
    }
}

/// One `read(2)` whose bytes are counted and dropped (nothing is kept past the head). Its
/// buffer lives in a frame of its own: inlined, it would make the supervisor's run loop's
/// frame 8 KiB larger, and every supervisor would touch (and keep) those stack pages.
#[inline(never)]
fn read_to_sink(fd: BorrowedFd<'_>) -> io::Result<usize> {
    let mut sink = [0u8; 8192];
    sys::read_fd(fd, &mut sink)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `feed` on a capture into a fresh output.log; returns the file, the count and
    /// whether it was truncated.
    fn capture(head: u64, tail: u64, feed: impl FnOnce(&mut Capture)) -> (Vec<u8>, u64, bool) {
        let dir = crate::scratch::ScratchDir::new("capture");
        let path = dir.path().join("output.log");
        let mut c = Capture::new(File::create(&path).unwrap(), head, tail, Tee::None, None);
        feed(&mut c);
        let Captured {
            bytes: total,
            truncated,
            error: err,
            ..
        } = c.finish();
        assert!(err.is_none());
        let bytes = std::fs::read(&path).unwrap();
        (bytes, total, truncated)
    }

    fn run(head: u64, tail: u64, chunks: &[&[u8]]) -> (String, u64, bool) {
        let (bytes, total, truncated) = capture(head, tail, |c| {
            for ch in chunks {
                c.push(ch);
            }
        });
        (String::from_utf8(bytes).unwrap(), total, truncated)
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

    /// Through a real pipe, as the supervisor reads it: the head spliced, the tail read into
    /// the ring (wrapping many times), the layout and the byte count exact.
    #[test]
    fn a_pipe_is_captured_exactly() {
        let cases: [(u64, u64, usize); 6] = [
            (10, 4, 3),
            (10, 4, 14),
            (1000, 300, 100_000),
            (3 * 65536 + 7, 70_000, (1 << 21) + 12_345),
            (0, 5000, 300_000),
            // No tail kept: past the head, bytes are read and counted only.
            (10, 0, 300_000),
        ];
        for (head, tail, total) in cases {
            let data: Vec<u8> = (0..total).map(|i| (i * 7 % 251) as u8).collect();
            let (r, w) = crate::sys::pipe().unwrap();
            crate::sys::set_nonblocking(&r, true).unwrap();
            let _ = crate::sys::set_pipe_size(&r, PIPE_SIZE);
            let sent = data.clone();
            let writer = std::thread::spawn(move || {
                let mut f = File::from(w);
                for ch in sent.chunks(4093) {
                    f.write_all(ch).unwrap();
                }
            });
            let (got, count, truncated) = capture(head, tail, |c| loop {
                match c.fill_from(r.as_fd(), Stream::Stdout) {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        crate::sys::poll_readable(&[Some(r.as_fd())], 1000).unwrap();
                    }
                    Err(e) => panic!("{e}"),
                }
            });
            writer.join().unwrap();
            let (head, tail) = (head as usize, tail as usize);
            let mut want = data.clone();
            if total > head + tail {
                want = data[..head].to_vec();
                // The marker introduces the tail; with none kept, the head stands alone.
                if tail > 0 {
                    let omitted = total - head - tail;
                    want.extend_from_slice(
                        format!("\n[sidejob: output truncated: {omitted} bytes omitted]\n")
                            .as_bytes(),
                    );
                    want.extend_from_slice(&data[total - tail..]);
                }
            }
            assert_eq!(count, total as u64, "head {head} tail {tail}");
            assert_eq!(truncated, total > head + tail);
            assert!(
                got == want,
                "head {head} tail {tail} total {total}: layout differs"
            );
        }
    }

    /// With a separate stderr, `output.log` is the same interleaved log and the index says
    /// which of its bytes were stderr's: in the head, and in the tail after the marker.
    #[test]
    fn a_separate_stderr_is_indexed_in_the_head_and_the_tail() {
        let dir = crate::scratch::ScratchDir::new("capture-streams");
        let (log, idx) = (
            dir.path().join("output.log"),
            dir.path().join("output.streams"),
        );
        let mut c = Capture::new(
            File::create(&log).unwrap(),
            6,
            5,
            Tee::None,
            Some(File::create(&idx).unwrap()),
        );
        let chunks: [(Stream, &[u8]); 6] = [
            (Stream::Stdout, b"out\n"),
            (Stream::Stderr, b"E1"),
            (Stream::Stderr, b"E2"),
            (Stream::Stdout, b"xxxxxxxx"),
            (Stream::Stderr, b"ee"),
            (Stream::Stdout, b"o"),
        ];
        for (stream, data) in chunks {
            let at = c.total;
            c.push_from(stream, data);
            c.note(stream, at, data.len() as u64);
        }
        assert!(c.finish().error.is_none());
        let text = std::fs::read(&log).unwrap();
        let marker = "\n[sidejob: output truncated: 8 bytes omitted]\n";
        assert_eq!(
            String::from_utf8_lossy(&text),
            format!("out\nE1{marker}xxeeo")
        );
        let segments = streams::decode(&std::fs::read(&idx).unwrap());
        let shown: Vec<(Stream, &str)> = streams::split(&segments, 0, text.len() as u64)
            .into_iter()
            .map(|(s, from, to)| {
                (
                    s,
                    std::str::from_utf8(&text[from as usize..to as usize]).unwrap(),
                )
            })
            .collect();
        let tail_at = 6 + marker.len();
        assert_eq!(streams::recorded_end(&segments), text.len() as u64);
        assert_eq!(
            shown,
            [
                (Stream::Stdout, "out\n"),
                (Stream::Stderr, "E1"),
                (Stream::Stdout, &*format!("{marker}xx")),
                (Stream::Stderr, "ee"),
                (Stream::Stdout, "o"),
            ]
        );
        assert_eq!(&text[tail_at..tail_at + 2], b"xx");
    }
}
