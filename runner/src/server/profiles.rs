//! Hot reload of sandbox profiles: a debounced watch (`dirwatch`) on the profile directory.
//! Profiles are read when a run needs them, so an edit takes effect without a restart; the
//! watch validates each edit as it is made, so a broken one is reported at once (and keeps the
//! previous version in force, see `sandbox::catalog`).

use std::sync::Arc;

use tracing::{info, warn};

use crate::dirwatch::DirWatch;
use crate::sandbox::Catalog;

/// Watches the catalog's directory if it exists; `None` otherwise (the shipped profiles need
/// no watching).
pub(super) fn watch(catalog: Arc<Catalog>) -> Option<DirWatch> {
    let dir = catalog.dir().filter(|d| d.is_dir())?.to_path_buf();
    for line in catalog.refresh() {
        info!("{line}");
    }
    let started = DirWatch::start(
        "profile-reload",
        std::slice::from_ref(&dir),
        |p| p.extension().is_some_and(|e| e == "toml"),
        move || {
            for line in catalog.refresh() {
                if line.ends_with(": ok") {
                    info!("{line}");
                } else {
                    warn!("{line}");
                }
            }
            true
        },
    );
    started
        .map_err(|e| warn!("cannot watch {}: {e}", dir.display()))
        .ok()
}
