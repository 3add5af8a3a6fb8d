//! Gates: a run that waits for the test instead of for the clock.
//!
//! A timing-based test ("sleep 1.5 so the call is still running when …") proves its point
//! only when the machine is fast enough, and on a loaded machine the run may finish before
//! the moment it was meant to straddle. A run that waits on a [`Gate`] is still running,
//! provably, until the test opens the gate; the test controls the order of events.

use std::path::{Path, PathBuf};

/// A file a run's command waits for: closed until the test creates it.
pub struct Gate {
    path: PathBuf,
}

impl Gate {
    /// A closed gate named `name` in `dir`, which must be visible to the run (its workspace).
    pub fn new(dir: &Path, name: &str) -> Gate {
        let path = dir.join(format!(".gate-{name}"));
        let _ = std::fs::remove_file(&path);
        Gate { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A shell command that returns once the gate is open.
    pub fn wait_cmd(&self) -> String {
        format!(
            "until [ -e '{}' ]; do sleep 0.01; done",
            self.path.display()
        )
    }

    /// Opens the gate: every run waiting on it goes on.
    pub fn open(&self) {
        std::fs::write(&self.path, b"open").expect("open the gate");
    }
}
