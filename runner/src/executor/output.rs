//! Reading a run's output.log: excerpts for inline results and pages for `task.output`.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsFd;
use std::path::Path;

use crate::protocol::{OutputSegment, OutputStream, TaskOutputResult};
use crate::registry::TaskRow;
use crate::run::streams::Segment;

/// Opens a task's `output.log` through its run directory's descriptor, without following
/// symlinks, and only if it is the session owner's file (see `run_dir`). `None` when there is
/// none (yet) or it is not what it should be.
pub(super) fn open_output(row: &TaskRow) -> Option<File> {
    let run = Path::new(&row.public_dir);
    let session_dir = run.parent()?.parent()?;
    let dir = crate::run::dir::open_public(session_dir, row.owner_uid, &row.task_id).ok()?;
    crate::run::dir::open_file(dir.as_fd(), crate::run::dir::OUTPUT, row.owner_uid).ok()
}

/// The segments of a task's `output.log` (`output.streams`, opened as [`open_output`] opens
/// the log); `None` for a run without a separate stderr.
fn segments(row: &TaskRow) -> Option<Vec<Segment>> {
    let session_dir = Path::new(&row.public_dir).parent()?.parent()?;
    let dir = crate::run::dir::open_public(session_dir, row.owner_uid, &row.task_id).ok()?;
    let mut f =
        crate::run::dir::open_file(dir.as_fd(), crate::run::dir::STREAMS, row.owner_uid).ok()?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes).ok()?;
    Some(crate::run::streams::decode(&bytes))
}

/// How `task.output` answers a page, by stream.
pub(crate) enum Streams {
    /// `data` alone.
    Not,
    /// `segments` too, every byte stdout's (a run without a separate stderr).
    AllStdout,
    /// `segments` too, from the run's index.
    Indexed(Vec<Segment>),
}

/// Default and largest page `task.output` returns.
pub(super) const DEFAULT_PAGE_BYTES: u64 = 64 * 1024;
pub(super) const MAX_PAGE_BYTES: u64 = 512 * 1024;

fn read_range(f: &mut File, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len as usize);
    f.take(len).read_to_end(&mut buf)?;
    Ok(buf)
}

/// The whole output if it fits in `max`, else its head and tail around a marker. Returns the
/// text and whether anything was left out.
pub(crate) fn excerpt(row: &TaskRow, max: usize) -> (String, bool) {
    let Some(mut f) = open_output(row) else {
        return (String::new(), false);
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let max = max as u64;
    if size <= max {
        let data = read_range(&mut f, 0, size).unwrap_or_default();
        return (String::from_utf8_lossy(&data).into_owned(), false);
    }
    let half = max / 2;
    let head = read_range(&mut f, 0, half).unwrap_or_default();
    let tail = read_range(&mut f, size - half, half).unwrap_or_default();
    let text = format!(
        "{}\n[sidejob: {} bytes not shown; task.output has all of it ({})]\n{}",
        String::from_utf8_lossy(&head),
        size - 2 * half,
        row.output_path(),
        String::from_utf8_lossy(&tail)
    );
    (text, true)
}

/// The last `max` bytes of the output (what a yielded call has printed so far).
pub(crate) fn tail(row: &TaskRow, max: usize) -> String {
    let Some(mut f) = open_output(row) else {
        return String::new();
    };
    let size = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = size.saturating_sub(max as u64);
    let data = read_range(&mut f, start, size - start).unwrap_or_default();
    String::from_utf8_lossy(&data).into_owned()
}

/// One page of output for `task.output`. `terminal` says whether the run has settled (and so
/// whether reaching the end means end of file); `streams` whether the page is also cut by
/// stream. A page of a run still going, cut by stream, stops where its index does: the
/// supervisor records a range once its bytes are in the log, so what follows is not yet
/// known to be either stream's.
pub(crate) fn page(
    f: Option<File>,
    offset: Option<u64>,
    max_bytes: Option<u64>,
    tail_bytes: Option<u64>,
    terminal: bool,
    truncated: bool,
    streams: Streams,
) -> TaskOutputResult {
    let mut f = f;
    let size = f
        .as_ref()
        .and_then(|f| f.metadata().ok())
        .map(|m| m.len())
        .unwrap_or(0);
    let max = max_bytes
        .unwrap_or(DEFAULT_PAGE_BYTES)
        .clamp(1, MAX_PAGE_BYTES);
    let start = match (offset, tail_bytes) {
        (Some(o), _) => o.min(size),
        (None, Some(t)) => size.saturating_sub(t),
        (None, None) => 0,
    };
    let end = match &streams {
        Streams::Indexed(segs) if !terminal => crate::run::streams::recorded_end(segs).min(size),
        Streams::Not | Streams::AllStdout | Streams::Indexed(_) => size,
    };
    let len = max.min(end.saturating_sub(start));
    let data = match f.as_mut() {
        Some(f) if len > 0 => read_range(f, start, len).unwrap_or_default(),
        _ => Vec::new(),
    };
    let next = start + data.len() as u64;
    let segs = match streams {
        Streams::Not => None,
        Streams::AllStdout => Some(Vec::new()),
        Streams::Indexed(segs) => Some(segs),
    };
    let segments = segs.map(|segs| {
        crate::run::streams::split(&segs, start, next)
            .into_iter()
            .map(|(stream, from, to)| OutputSegment {
                stream: match stream {
                    crate::run::streams::Stream::Stdout => OutputStream::Stdout,
                    crate::run::streams::Stream::Stderr => OutputStream::Stderr,
                },
                text: String::from_utf8_lossy(
                    &data[(from - start) as usize..(to - start) as usize],
                )
                .into_owned(),
            })
            .collect()
    });
    TaskOutputResult {
        data: String::from_utf8_lossy(&data).into_owned(),
        offset: start,
        next_offset: next,
        size,
        eof: terminal && next >= size,
        truncated,
        segments,
    }
}

/// `task.output` for a task row.
pub(crate) fn task_page(row: &TaskRow, p: &crate::protocol::TaskOutputParams) -> TaskOutputResult {
    page(
        open_output(row),
        p.offset,
        p.max_bytes,
        p.tail_bytes,
        row.state.is_terminal(),
        row.output_truncated.unwrap_or(false),
        // The index is read before the log's size is: every record in it is of bytes
        // already in the log.
        match p.streams {
            Some(true) => segments(row).map_or(Streams::AllStdout, Streams::Indexed),
            Some(false) | None => Streams::Not,
        },
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::run::streams::Stream;

    fn log(text: &str) -> (crate::scratch::ScratchDir, File) {
        let dir = crate::scratch::ScratchDir::new("output-page");
        let path = dir.path().join("output.log");
        std::fs::write(&path, text).unwrap();
        let f = File::open(&path).unwrap();
        (dir, f)
    }

    fn cut(r: &TaskOutputResult) -> Vec<(OutputStream, String)> {
        r.segments
            .as_ref()
            .unwrap()
            .iter()
            .map(|s| (s.stream, s.text.clone()))
            .collect()
    }

    /// A running task's page by stream stops where the index does: the bytes after it are
    /// in the log but not yet known to be either stream's. Settled, the rest is stdout's.
    #[test]
    fn a_running_page_by_stream_stops_at_the_index() {
        let segs = vec![(Stream::Stdout, 0, 4), (Stream::Stderr, 4, 4)];
        let (_d, f) = log("out\nerr\nmore");
        let running = page(
            Some(f),
            Some(0),
            None,
            None,
            false,
            false,
            Streams::Indexed(segs.clone()),
        );
        assert_eq!(
            (running.data.as_str(), running.next_offset, running.size),
            ("out\nerr\n", 8, 12)
        );
        assert_eq!(
            cut(&running),
            [
                (OutputStream::Stdout, "out\n".into()),
                (OutputStream::Stderr, "err\n".into())
            ]
        );
        let (_d, f) = log("out\nerr\nmore");
        let settled = page(
            Some(f),
            Some(0),
            None,
            None,
            true,
            false,
            Streams::Indexed(segs),
        );
        assert!(settled.eof);
        assert_eq!(cut(&settled)[2], (OutputStream::Stdout, "more".into()));
        // Not asked: no segments, as before.
        let (_d, f) = log("out\n");
        assert_eq!(
            page(Some(f), None, None, None, false, false, Streams::Not).segments,
            None
        );
    }
}
