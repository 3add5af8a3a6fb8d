//! Hot reload of sandbox profiles: a `notify` watch on the profile directory. Profiles are read
//! when a run needs them, so an edit takes effect without a restart; the watch validates each
//! edit as it is made, so a broken one is reported at once (and keeps the previous version in
//! force, see `sandbox::catalog`).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher as _};
use tracing::{info, warn};

use crate::sandbox::Catalog;

const DEBOUNCE: Duration = Duration::from_millis(300);

/// Keeps the watch alive; dropping it stops it.
pub struct ProfileWatch {
    _inner: notify::RecommendedWatcher,
}

/// Watches `dir` if it exists; `None` otherwise (the shipped profiles need no watching).
pub fn watch(dir: PathBuf) -> Option<ProfileWatch> {
    if !dir.is_dir() {
        return None;
    }
    let catalog = Catalog::new(Some(dir.clone()));
    for line in catalog.refresh() {
        info!("{line}");
    }
    let (tx, rx) = mpsc::channel::<()>();
    let watched = dir.clone();
    let mut inner =
        notify::recommended_watcher(move |ev: notify::Result<notify::Event>| match ev {
            Ok(ev) => {
                // A profile, or the directory itself (a chmod or chown of it changes whether
                // any profile in it is trusted).
                let relevant = matches!(
                    ev.kind,
                    EventKind::Create(_) | EventKind::Modify(_) | EventKind::Remove(_)
                ) && ev
                    .paths
                    .iter()
                    .any(|p| p.extension().is_some_and(|e| e == "toml") || *p == watched);
                if relevant {
                    let _ = tx.send(());
                }
            }
            Err(e) => warn!("profile watch: {e}"),
        })
        .map_err(|e| warn!("cannot watch {}: {e}", dir.display()))
        .ok()?;
    if let Err(e) = inner.watch(&dir, RecursiveMode::NonRecursive) {
        warn!("cannot watch {}: {e}", dir.display());
        return None;
    }
    let spawned = std::thread::Builder::new()
        .name("profile-reload".into())
        .spawn(move || {
            while rx.recv().is_ok() {
                loop {
                    match rx.recv_timeout(DEBOUNCE) {
                        Ok(()) => continue,
                        Err(mpsc::RecvTimeoutError::Timeout) => break,
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                for line in catalog.refresh() {
                    if line.ends_with(": ok") {
                        info!("{line}");
                    } else {
                        warn!("{line}");
                    }
                }
            }
        });
    if let Err(e) = spawned {
        warn!("cannot start the profile watch: {e}");
        return None;
    }
    Some(ProfileWatch { _inner: inner })
}
