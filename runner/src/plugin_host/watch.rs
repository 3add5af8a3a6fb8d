//! Hot reload: a debounced watch (`dirwatch`) on the plugin directories; a change to a
//! candidate `*.so` file, or to a watched directory itself, makes the host rescan.

use std::path::PathBuf;
use std::sync::Weak;

use tracing::debug;

use super::ToolHost;
use crate::dirwatch::DirWatch;

/// Watches `dirs`, each with whether only shipped plugin names count in it (the directory of
/// the binary changes with every build). Dropping the watch stops hot reload; so does the
/// host going away.
pub(super) fn start(host: Weak<ToolHost>, dirs: &[(PathBuf, bool)]) -> std::io::Result<DirWatch> {
    let shipped_dirs: Vec<PathBuf> = dirs
        .iter()
        .filter(|(_, shipped_only)| *shipped_only)
        .map(|(d, _)| d.clone())
        .collect();
    let watched: Vec<PathBuf> = dirs.iter().map(|(d, _)| d.clone()).collect();
    DirWatch::start(
        "plugin-reload",
        &watched,
        move |p| {
            let shipped_only = p
                .parent()
                .is_some_and(|d| shipped_dirs.iter().any(|s| s == d));
            super::is_candidate(p, shipped_only)
        },
        move || {
            let Some(host) = host.upgrade() else {
                return false;
            };
            debug!("a plugin directory changed: reloading");
            host.reload();
            true
        },
    )
}
