//! `output.streams`: which byte ranges of `output.log` came from which of the command's
//! streams, for a run whose stderr has a pipe of its own (`Stderr::Separate` in the plan).
//! `output.log` stays one interleaved log, in the order the supervisor read it; this index
//! sits beside it.
//!
//! The file is a sequence of fixed-size records, each appended by the supervisor once the
//! bytes it describes are in `output.log`: `offset` (u64, little-endian), `len` (u32),
//! `stream` (one byte: [`STDOUT`] or [`STDERR`]), then the three bytes [`MAGIC`]. Bytes no
//! record covers are past what is recorded yet (a reader of a running task stops before
//! them), or, once the run is over, sidejob's own truncation marker (shown as stdout). A
//! reader stops at the first record that is short (a write torn by a crash) or malformed (a
//! block the filesystem extended with zeros), so a crash costs at most the attribution of
//! the last bytes, never the log.

/// The stream byte of a stdout record.
pub(crate) const STDOUT: u8 = 1;
/// The stream byte of a stderr record.
pub(crate) const STDERR: u8 = 2;
/// The last three bytes of every record: a record of zeros (or of anything else) is refused.
pub(crate) const MAGIC: [u8; 3] = *b"sjs";
/// The size of one record.
pub(crate) const RECORD: usize = 16;

/// Which of the command's streams a byte came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

/// One record: `len` bytes of `stream` at `offset` of `output.log`.
pub(crate) fn encode(stream: Stream, offset: u64, len: u32) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..8].copy_from_slice(&offset.to_le_bytes());
    r[8..12].copy_from_slice(&len.to_le_bytes());
    r[12] = match stream {
        Stream::Stdout => STDOUT,
        Stream::Stderr => STDERR,
    };
    r[13..].copy_from_slice(&MAGIC);
    r
}

/// A run of bytes of one stream: `(stream, offset, len)`.
pub(crate) type Segment = (Stream, u64, u64);

/// The segments an index holds, in order, adjacent ones of one stream merged, up to its
/// first record that is torn or malformed (one that overlaps or precedes the one before it
/// is malformed too).
pub(crate) fn decode(bytes: &[u8]) -> Vec<Segment> {
    let mut out: Vec<Segment> = Vec::new();
    for r in bytes.chunks_exact(RECORD) {
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&r[..8]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&r[8..12]);
        let (offset, len) = (u64::from_le_bytes(offset), u32::from_le_bytes(len) as u64);
        let stream = match r[12] {
            STDOUT => Stream::Stdout,
            STDERR => Stream::Stderr,
            _ => break,
        };
        let after_last = out.last().map_or(0, |(_, o, l)| o + l);
        if r[13..] != MAGIC || len == 0 || offset < after_last {
            break;
        }
        match out.last_mut() {
            Some((s, o, l)) if *s == stream && *o + *l == offset => *l += len,
            _ => out.push((stream, offset, len)),
        }
    }
    out
}

/// The window `[start, end)` of `output.log` cut into runs of one stream each, in order,
/// as `(stream, start, end)`; what no segment covers is stdout's.
pub(crate) fn split(segments: &[Segment], start: u64, end: u64) -> Vec<(Stream, u64, u64)> {
    let mut out: Vec<(Stream, u64, u64)> = Vec::new();
    let mut push = |stream: Stream, from: u64, to: u64| match out.last_mut() {
        Some((s, _, e)) if *s == stream && *e == from => *e = to,
        _ => out.push((stream, from, to)),
    };
    let mut at = start;
    for &(stream, o, l) in segments {
        let (o, e) = (o.max(start), (o + l).min(end));
        if o >= e {
            continue;
        }
        if at < o {
            push(Stream::Stdout, at, o);
        }
        push(stream, o, e);
        at = e;
    }
    if at < end {
        push(Stream::Stdout, at, end);
    }
    out
}

/// Where the recorded bytes end: a reader of a run still going stops its page there.
pub(crate) fn recorded_end(segments: &[Segment]) -> u64 {
    segments.last().map_or(0, |(_, o, l)| o + l)
}

#[cfg(test)]
mod tests {
    use super::*;
    use Stream::{Stderr as E, Stdout as O};

    fn index(records: &[(Stream, u64, u32)]) -> Vec<u8> {
        records
            .iter()
            .flat_map(|&(s, o, l)| encode(s, o, l))
            .collect()
    }

    #[test]
    fn records_round_trip_and_adjacent_ones_merge() {
        let bytes = index(&[(O, 0, 4), (E, 4, 3), (E, 7, 2), (O, 9, 1), (E, 20, 5)]);
        assert_eq!(
            decode(&bytes),
            vec![(O, 0, 4), (E, 4, 5), (O, 9, 1), (E, 20, 5)]
        );
        assert_eq!(recorded_end(&decode(&bytes)), 25);
    }

    /// A crash leaves a short last record, or zeros where the filesystem extended the file:
    /// both are where reading stops, and what came before is kept.
    #[test]
    fn a_torn_or_zeroed_tail_is_ignored() {
        let mut bytes = index(&[(E, 0, 4)]);
        bytes.extend_from_slice(&encode(O, 4, 4)[..9]);
        assert_eq!(decode(&bytes), vec![(E, 0, 4)]);
        let mut zeros = index(&[(E, 0, 4)]);
        zeros.extend_from_slice(&[0; RECORD]);
        zeros.extend_from_slice(&encode(E, 30, 1));
        assert_eq!(decode(&zeros), vec![(E, 0, 4)]);
        // Going backwards is malformed too.
        assert_eq!(decode(&index(&[(E, 10, 4), (O, 2, 1)])), vec![(E, 10, 4)]);
    }

    #[test]
    fn a_window_is_cut_into_runs_of_one_stream() {
        let segs = [(O, 0, 4), (E, 4, 3), (O, 7, 3), (E, 10, 2)];
        assert_eq!(
            split(&segs, 0, 14),
            vec![(O, 0, 4), (E, 4, 7), (O, 7, 10), (E, 10, 12), (O, 12, 14)]
        );
        assert_eq!(
            split(&segs, 5, 11),
            vec![(E, 5, 7), (O, 7, 10), (E, 10, 11)]
        );
        // Uncovered bytes (a marker) are stdout's, merged with stdout around them.
        assert_eq!(split(&[(O, 0, 2), (O, 5, 2)], 0, 7), vec![(O, 0, 7)]);
        assert_eq!(split(&[], 3, 3), vec![]);
    }
}
