//! Gates: a run that waits for the test instead of for the clock.
//!
//! A timing-based test ("sleep 1.5 so the call is still running when …") proves its point
//! only when the machine is fast enough, and on a loaded machine the run may finish before
//! the moment it was meant to straddle. A run that waits on a [`Gate`] is still running,
//! provably, until the test opens the gate; the test controls the order of events.
//!
//! A gate is a FIFO: opening it for reading blocks in the kernel (no polling, no CPU, any
//! number of runs) until someone holds it open for writing. [`Gate::open`] opens it
//! read-write and keeps it open for the gate's life, so every run waiting on it, and every
//! run that comes to it later, goes on.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A FIFO a run's command waits on: closed until the test opens it.
pub struct Gate {
    path: PathBuf,
    held: Mutex<Option<std::fs::File>>,
}

impl Gate {
    /// A closed gate named `name` in `dir`, which must be visible to the run (its workspace).
    pub fn new(dir: &Path, name: &str) -> Gate {
        use std::os::unix::ffi::OsStrExt;
        let path = dir.join(format!(".gate-{name}"));
        let _ = std::fs::remove_file(&path);
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).expect("gate path");
        // SAFETY: a NUL-terminated path that outlives the call.
        #[allow(unsafe_code)]
        let r = unsafe { libc::mkfifo(c.as_ptr(), 0o666) };
        assert_eq!(
            r,
            0,
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Gate {
            path,
            held: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A shell command that returns once the gate is open.
    pub fn wait_cmd(&self) -> String {
        format!(": < '{}'", self.path.display())
    }

    /// Opens the gate: every run waiting on it goes on, and so will any that come later.
    pub fn open(&self) {
        // Read-write: never blocks, and counts as a writer for the readers waiting.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.path)
            .expect("open the gate");
        *self.held.lock().expect("gate") = Some(f);
    }
}
