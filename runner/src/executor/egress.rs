//! The daemon's side of a run with a network allow-list: its proxy socket, bound at
//! submission in `<bridge dir>/<task_id>.egress/` (beside the run's bridge; only the daemon
//! and the run's supervisor, which relays the run's connections to it, use it), served by one
//! task per run with the run's own policy and refusals ([`crate::egress::Run`]) until the run
//! settles, then removed. The supervisor connects by path for every connection, so a
//! restarted daemon that binds the socket again is reached again.
//!
//! After a restart the policy is read from the launch plan in the run's private directory
//! (written by the daemon, never by the run or its caller). A socket that cannot be served
//! again leaves the run without a way out: its relay's connections are closed, never opened
//! any other way (fail closed).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tracing::{info, info_span, warn, Instrument};

use super::{ExecError, Executor};
use crate::egress::{self as eg, EgressPlan};
use crate::registry::TaskRow;
use crate::run::dir::PrivateDir;
use crate::run::plan::LaunchPlan;

/// A bound proxy socket, served once the task is live ([`Executor::serve_egress`]).
pub(super) struct Bound {
    task_id: String,
    listener: UnixListener,
    dir: PathBuf,
    run: eg::Run,
}

/// `<bridge dir>/<task_id>.egress`.
fn egress_dir(task_id: &str) -> std::io::Result<PathBuf> {
    crate::run::dir::socket_dir(&format!("{task_id}.egress"))
}

/// Removes a settled run's egress directory, if it has one.
pub(super) fn forget(task_id: &str) {
    let dir = crate::config::default_bridge_dir().join(format!("{task_id}.egress"));
    let _ = std::fs::remove_dir_all(dir);
}

fn bind_in(dir: &Path) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            if !std::fs::symlink_metadata(dir)?.is_dir() {
                return Err(std::io::Error::other("not a directory"));
            }
        }
        Err(e) => return Err(e),
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let sock = dir.join(eg::SOCKET);
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)?;
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

impl Executor {
    /// Makes the run's egress directory and binds its socket, both the daemon's alone (0700
    /// and 0600: the run's supervisor, which relays to it, runs as the daemon's user). Fills
    /// in the plan's `socket_dir`. The run's connections count against `owner_uid`'s share.
    pub(super) fn bind_egress(
        &self,
        task_id: &str,
        owner_uid: u32,
        private: &PrivateDir,
        plan: &mut EgressPlan,
    ) -> Result<Bound, ExecError> {
        let io = |step: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |source| ExecError::Io { step, path, source }
        };
        let dir =
            egress_dir(task_id).map_err(io("prepare the egress directory", private.path()))?;
        let listener = bind_in(&dir).map_err(io("bind the egress socket", &dir))?;
        let record = private.network_record();
        let run = eg::Run::new(task_id, plan.policy.clone(), &record)
            .map_err(io("open the run's network record", &record))?
            .with_timeouts(self.cfg.egress.timeouts())
            .with_share(self.egress_shares.clone(), owner_uid);
        plan.socket_dir = dir.clone();
        Ok(Bound {
            task_id: task_id.to_owned(),
            listener,
            dir,
            run,
        })
    }

    /// Serves a run's proxy socket until the run settles (its connections are closed then),
    /// then removes its directory.
    pub(super) fn serve_egress(self: &Arc<Self>, b: Bound) {
        let Bound {
            task_id,
            listener,
            dir,
            run,
        } = b;
        let Some(mut done) = self.settled_signal(&task_id) else {
            let _ = std::fs::remove_dir_all(&dir);
            return;
        };
        let span = info_span!("egress", task_id = %task_id);
        tokio::spawn(
            async move {
                let stop = async move {
                    let _ = done.wait_for(|d| *d).await;
                };
                eg::serve(listener, Arc::new(run), stop).await;
                let _ = std::fs::remove_dir_all(&dir);
            }
            .instrument(span),
        );
    }

    /// After a restart: serves the proxy of a run a previous daemon started, with the policy
    /// from its launch plan. Failing to leaves the run's network closed.
    pub(super) fn reopen_egress(self: &Arc<Self>, row: &TaskRow) {
        let private = self.runs.existing_private(&row.task_id);
        let Some(plan) = std::fs::read(private.plan())
            .ok()
            .and_then(|b| serde_json::from_slice::<LaunchPlan>(&b).ok())
        else {
            return;
        };
        let Some(mut egress) = plan.sandbox.egress else {
            return;
        };
        // The plan is the daemon's own; still, the socket goes nowhere but where this task's
        // always goes.
        match egress_dir(&row.task_id) {
            Ok(dir) if dir == egress.socket_dir => {}
            _ => {
                warn!(task_id = %row.task_id, "the launch plan names another egress directory; its network stays closed");
                return;
            }
        }
        match self.bind_egress(&row.task_id, row.owner_uid, &private, &mut egress) {
            Ok(b) => {
                info!(task_id = %row.task_id, "egress proxy served again after the restart");
                self.serve_egress(b);
            }
            Err(e) => {
                warn!(task_id = %row.task_id, "cannot serve the egress proxy again; the run's network stays closed: {e}")
            }
        }
    }
}
