//! `cancel.json` in the run's private directory: why the daemon asked the run to stop. The
//! daemon writes it before it signals the supervisor; the supervisor (on SIGTERM) and the
//! daemon (settling a run stopped before it started) read it, here and nowhere else.

use serde::{Deserialize, Serialize};

use super::dir::PrivateDir;

/// Why a run is being stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StopReason {
    Canceled,
    Timeout,
}

/// The contents of `cancel.json` (`run::dir::PrivateDir::cancel`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CancelRequest {
    pub reason: StopReason,
    pub grace_ms: u64,
    /// Shown as the result's `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The caller took the cancel back (`task.cancel` with `withdraw`) before the grace ran
    /// out: the supervisor no longer escalates to SIGKILL, and the run ends as it ends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub withdrawn: bool,
}

impl CancelRequest {
    /// Records the request, before the signal that makes the supervisor read it. Written
    /// beside the file and renamed over it, so a supervisor reading it while a withdrawal
    /// replaces a cancel finds one or the other, never an empty file (which reads as a
    /// cancel that stands: the run was killed after `call` said it was left running).
    pub(crate) fn write(&self, private: &PrivateDir) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        private.check()?;
        std::fs::write(private.cancel_next(), bytes)?;
        std::fs::rename(private.cancel_next(), private.cancel())
    }

    /// The request, if one was written and can be read.
    pub(crate) fn read(private: &PrivateDir) -> Option<CancelRequest> {
        std::fs::read(private.cancel())
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// What a stop signal means: the request written before it, or (none readable) a plain
    /// cancel with the run's own grace.
    pub(crate) fn read_or_cancel(private: &PrivateDir, default_grace_ms: u64) -> CancelRequest {
        CancelRequest::read(private).unwrap_or(CancelRequest {
            reason: StopReason::Canceled,
            grace_ms: default_grace_ms,
            message: None,
            withdrawn: false,
        })
    }

    /// Whether a stop was asked for and not taken back (a file that cannot be read counts
    /// as asked).
    pub(crate) fn requested(private: &PrivateDir) -> bool {
        match CancelRequest::read(private) {
            Some(r) => !r.withdrawn,
            None => private.cancel().exists(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_request_reads_back_and_a_missing_one_is_a_plain_cancel() {
        let scratch = crate::scratch::ScratchDir::new("cancel");
        // A directory of its own inside: `create` makes it, and refuses one already there.
        let dir = scratch.path().join("private");
        let private = PrivateDir::at(dir.clone());
        private.create().unwrap();
        assert!(!CancelRequest::requested(&private));
        assert_eq!(CancelRequest::read(&private), None);
        assert_eq!(
            CancelRequest::read_or_cancel(&private, 1234),
            CancelRequest {
                reason: StopReason::Canceled,
                grace_ms: 1234,
                message: None,
                withdrawn: false,
            }
        );
        let req = CancelRequest {
            reason: StopReason::Timeout,
            grace_ms: 50,
            message: Some("the schedule's cap".into()),
            withdrawn: false,
        };
        req.write(&private).unwrap();
        assert!(CancelRequest::requested(&private));
        // Taken back: no longer asked for.
        let back = CancelRequest {
            withdrawn: true,
            ..req.clone()
        };
        back.write(&private).unwrap();
        assert!(!CancelRequest::requested(&private));
        req.write(&private).unwrap();
        assert_eq!(CancelRequest::read(&private), Some(req.clone()));
        assert_eq!(CancelRequest::read_or_cancel(&private, 1), req);
        // A damaged file is a stop nonetheless, of the plain kind.
        std::fs::write(private.cancel(), b"{").unwrap();
        assert!(CancelRequest::requested(&private));
        assert_eq!(CancelRequest::read_or_cancel(&private, 9).grace_ms, 9);
        private.remove();
        assert!(!dir.exists());
    }

    /// A reader racing writes always finds a whole request.
    #[test]
    fn a_request_is_replaced_whole() {
        let scratch = crate::scratch::ScratchDir::new("cancel-race");
        let private = PrivateDir::new(scratch.path(), "01RACE");
        private.create().unwrap();
        let cancel = CancelRequest {
            reason: StopReason::Canceled,
            grace_ms: 5000,
            message: Some("x".repeat(4000)),
            withdrawn: false,
        };
        cancel.write(&private).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (stop, private, cancel) =
                (stop.clone(), private.path().to_path_buf(), cancel.clone());
            std::thread::spawn(move || {
                let private = PrivateDir::at(private);
                let mut withdrawn = false;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    withdrawn = !withdrawn;
                    let r = CancelRequest {
                        withdrawn,
                        ..cancel.clone()
                    };
                    r.write(&private).unwrap();
                }
            })
        };
        let torn = (0..5000)
            .filter(|_| CancelRequest::read(&private).is_none())
            .count();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        writer.join().unwrap();
        assert_eq!(torn, 0, "{torn} of 5000 reads found no whole request");
    }
}
