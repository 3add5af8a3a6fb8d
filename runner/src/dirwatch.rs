//! One debounced directory watch, shared by hot reload of plugins and of profiles: a `notify`
//! watch on some directories (not recursive), whose relevant events are debounced (a copy or
//! an editor writes a file in several steps) before a callback runs on the watch's own thread.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher as _};
use tracing::warn;

/// How long the directories must be quiet before the callback runs.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Keeps the watch alive; dropping it stops it (the thread ends at its next event).
pub(crate) struct DirWatch {
    _inner: notify::RecommendedWatcher,
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
    ) -> notify::Result<DirWatch> {
        let (tx, rx) = mpsc::channel::<()>();
        let watched = dirs.to_vec();
        let label = name.to_owned();
        let mut inner =
            notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
                Ok(ev) => {
                    let changed = matches!(
                        ev.kind,
                        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
                    );
                    if changed
                        && ev
                            .paths
                            .iter()
                            .any(|p| relevant(p) || watched.iter().any(|w| w == p))
                    {
                        let _ = tx.send(());
                    }
                }
                Err(e) => warn!("{label}: {e}"),
            })?;
        for d in dirs {
            inner.watch(d, RecursiveMode::NonRecursive)?;
        }
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    loop {
                        match rx.recv_timeout(DEBOUNCE) {
                            Ok(()) => continue,
                            Err(mpsc::RecvTimeoutError::Timeout) => break,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    }
                    if !on_change() {
                        return;
                    }
                }
            })
            .map_err(|e| notify::Error::generic(&format!("cannot start {name}: {e}")))?;
        Ok(DirWatch { _inner: inner })
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
}
