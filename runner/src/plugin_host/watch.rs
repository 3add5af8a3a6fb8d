//! Hot reload: a `notify` watch on the plugin directories. Changes to `*.so` files are
//! debounced (a copy or a build writes a file in several steps), then the host rescans.

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Weak;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher as _};
use tracing::{debug, warn};

use super::ToolHost;

/// How long the directories must be quiet before a reload.
const DEBOUNCE: Duration = Duration::from_millis(300);

/// Keeps the watch alive; dropping it stops hot reload.
pub struct Watcher {
    _inner: notify::RecommendedWatcher,
}

impl Watcher {
    /// Watches `dirs`, each with whether only shipped plugin names count in it (the
    /// directory of the binary changes with every build).
    pub fn start(host: Weak<ToolHost>, dirs: &[(PathBuf, bool)]) -> notify::Result<Watcher> {
        let shipped_dirs: Vec<PathBuf> = dirs
            .iter()
            .filter(|(_, shipped_only)| *shipped_only)
            .map(|(d, _)| d.clone())
            .collect();
        let watched: Vec<PathBuf> = dirs.iter().map(|(d, _)| d.clone()).collect();
        let (tx, rx) = mpsc::channel::<()>();
        let mut inner =
            notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
                Ok(ev) => {
                    let relevant = matches!(
                        ev.kind,
                        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
                    ) && ev.paths.iter().any(|p| {
                        // A watched directory itself changing (its mode or owner) is news
                        // too: it may no longer be trusted.
                        let shipped_only = p
                            .parent()
                            .is_some_and(|d| shipped_dirs.iter().any(|s| s == d));
                        super::is_candidate(p, shipped_only) || watched.iter().any(|w| w == p)
                    });
                    if relevant {
                        let _ = tx.send(());
                    }
                }
                Err(e) => warn!("plugin watch: {e}"),
            })?;
        for (d, _) in dirs {
            inner.watch(d, RecursiveMode::NonRecursive)?;
        }
        std::thread::Builder::new()
            .name("plugin-reload".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    // Wait until nothing has changed for DEBOUNCE.
                    loop {
                        match rx.recv_timeout(DEBOUNCE) {
                            Ok(()) => continue,
                            Err(mpsc::RecvTimeoutError::Timeout) => break,
                            Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        }
                    }
                    let Some(host) = host.upgrade() else { return };
                    debug!("a plugin directory changed: reloading");
                    host.reload();
                }
            })
            .map_err(|e| notify::Error::generic(&format!("cannot start the reload thread: {e}")))?;
        Ok(Watcher { _inner: inner })
    }
}
