//! One debounced directory watch, shared by hot reload of plugins and of profiles: an inotify
//! watch on some directories (not recursive), whose relevant events are debounced (a copy or
//! an editor writes a file in several steps) before a callback runs on the watch's own thread.
//!
//! The watch asks only for changes: creation, removal, renames, writes and metadata. Not for
//! opens: the plugin directories include the directory of the `sidejob` binary, which is
//! `/usr/bin` on an installed host, and a watch for opens there woke the daemon at every
//! program started from it, on the host and in every run.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tracing::warn;

/// How long the directories must be quiet before the callback runs.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// What a watched directory reports: every change to its entries or to itself, no opens or
/// reads.
fn changes() -> AddWatchFlags {
    AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
}

/// Keeps the watch alive; dropping it stops it (its thread ends at once).
pub(crate) struct DirWatch {
    inotify: Arc<Inotify>,
    watches: Vec<WatchDescriptor>,
    stop: Arc<AtomicBool>,
}

impl Drop for DirWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Each removal queues an event, which wakes the thread to see `stop`.
        for wd in &self.watches {
            let _ = self.inotify.rm_watch(*wd);
        }
    }
}

impl DirWatch {
    /// Watches `dirs`. A creation, change or removal of a path for which `relevant` is true
    /// (a watched directory itself changing counts: its mode or owner decides what in it is
    /// trusted) makes `on_change` run once things are quiet; `on_change` returns false to stop.
    /// `name` names the thread and the log lines.
    pub(crate) fn start(
        name: &str,
        dirs: &[PathBuf],
        relevant: impl Fn(&Path) -> bool + Send + 'static,
        mut on_change: impl FnMut() -> bool + Send + 'static,
    ) -> io::Result<DirWatch> {
        let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC)?);
        let mut watched = HashMap::new();
        for d in dirs {
            let wd = inotify.add_watch(d.as_path(), changes()).map_err(|e| {
                let e = io::Error::from(e);
                io::Error::new(e.kind(), format!("{}: {e}", d.display()))
            })?;
            watched.insert(wd, d.clone());
        }
        let watch = DirWatch {
            inotify: inotify.clone(),
            watches: watched.keys().copied().collect(),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let stop = watch.stop.clone();
        let label = name.to_owned();
        // Whether what was read names a relevant path (or a watched directory itself).
        let read_relevant = move || -> io::Result<bool> {
            let mut any = false;
            for ev in inotify.read_events()? {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    any = true; // events were lost: look again
                }
                let Some(dir) = watched.get(&ev.wd) else {
                    continue;
                };
                if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    continue;
                }
                any |= match &ev.name {
                    Some(n) => relevant(&dir.join(n)),
                    None => true,
                };
            }
            Ok(any)
        };
        let fd = watch.inotify.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let ready = |timeout: Option<Duration>| {
                    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
                    crate::sys::poll_readable(&[Some(fd.as_fd())], ms).map(|r| r[0])
                };
                let mut quiet_at: Option<Instant> = None;
                loop {
                    let wait = quiet_at.map(|t| t.saturating_duration_since(Instant::now()));
                    let got = ready(wait).and_then(|r| if r { read_relevant() } else { Ok(false) });
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    match got {
                        Ok(true) => quiet_at = Some(Instant::now() + DEBOUNCE),
                        Ok(false) => {}
                        Err(e) => {
                            warn!("{label}: {e}; no longer watching");
                            return;
                        }
                    }
                    if quiet_at.is_some_and(|t| Instant::now() >= t) {
                        quiet_at = None;
                        if !on_change() {
                            return;
                        }
                    }
                }
            })?;
        Ok(watch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    /// A burst of writes to relevant files runs the callback once, after the burst; a file
    /// that is not relevant runs nothing.
    #[test]
    fn a_burst_is_one_change_and_irrelevant_files_are_ignored() {
        let scratch = crate::scratch::ScratchDir::new("dirwatch");
        let dir = scratch.path().to_path_buf();
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let _w = DirWatch::start(
            "test-watch",
            std::slice::from_ref(&dir),
            |p| p.extension().is_some_and(|e| e == "toml"),
            move || {
                seen.fetch_add(1, Ordering::SeqCst);
                true
            },
        )
        .unwrap();
        let wait_for = |n: usize| {
            let t = Instant::now();
            while calls.load(Ordering::SeqCst) < n && t.elapsed() < Duration::from_secs(10) {
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        std::fs::write(dir.join("notes.txt"), "x").unwrap();
        for i in 0..5 {
            std::fs::write(dir.join("a.toml"), format!("v{i}")).unwrap();
        }
        wait_for(1);
        // Quiet for three debounce periods: the burst (and the .txt) made exactly one call.
        std::thread::sleep(DEBOUNCE * 3);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        std::fs::write(dir.join("other.txt"), "y").unwrap();
        std::thread::sleep(DEBOUNCE * 3);
        assert_eq!(calls.load(Ordering::SeqCst), 1, "an irrelevant file ran it");
        std::fs::remove_file(dir.join("a.toml")).unwrap();
        wait_for(2);
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    /// Context switches of every thread of this process but the calling one: how often the
    /// others woke.
    fn other_threads_woken() -> u64 {
        let me = nix::unistd::gettid().as_raw().to_string();
        let mut n = 0;
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            if t.file_name().to_str() == Some(me.as_str()) {
                continue;
            }
            let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
            n += status
                .lines()
                .filter_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum::<u64>();
        }
        n
    }

    /// Reading files in a watched directory (a program started from it, a plugin loaded) wakes
    /// nothing: the watch is for changes only. A watch that asked for opens woke its thread at
    /// each of these.
    #[test]
    fn opening_files_in_a_watched_directory_wakes_nothing() {
        let scratch = crate::scratch::ScratchDir::new("dirwatch-open");
        let dir = scratch.path().to_path_buf();
        std::fs::write(dir.join("tool.so"), "x").unwrap();
        let _w =
            DirWatch::start("test-open", std::slice::from_ref(&dir), |_| true, || true).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let before = other_threads_woken();
        for _ in 0..500 {
            let mut buf = String::new();
            std::io::Read::read_to_string(
                &mut std::fs::File::open(dir.join("tool.so")).unwrap(),
                &mut buf,
            )
            .unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
        let woken = other_threads_woken() - before;
        assert!(
            woken < 50,
            "500 opens woke the watch's threads {woken} times"
        );
    }

    /// Dropping the watch ends its thread.
    #[test]
    fn dropping_the_watch_ends_its_thread() {
        let scratch = crate::scratch::ScratchDir::new("dirwatch-drop");
        let threads = || std::fs::read_dir("/proc/self/task").unwrap().count();
        let w = DirWatch::start(
            "test-drop",
            &[scratch.path().to_path_buf()],
            |_| true,
            || true,
        )
        .unwrap();
        let with = threads();
        drop(w);
        let t = Instant::now();
        while threads() >= with && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(threads() < with, "the watch's thread outlived it");
    }
}
