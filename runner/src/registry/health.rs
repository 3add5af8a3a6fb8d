//! Keeping the registry trustworthy: the check the daemon makes before it trusts the file, an
//! online backup, and the ways back from damage (restore the backup, or rebuild the rows from
//! the runs' `result.json` files when no backup is left).
//!
//! A damaged or emptied registry is never used silently: a daemon that finds one refuses to
//! start, with one line naming the file and the way out (`sidejob registry restore` or
//! `rebuild`).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::{owner_only, Registry, RegistryError, Result, SessionRow, Settlement, TaskRow};
use crate::protocol::{Delivery, SessionState, TaskKind};
use crate::run::result::RunResult;

/// The backup next to the registry.
pub(crate) const BACKUP_FILE: &str = "sidejob.db.backup";

/// The registry's backup path in `state_dir`.
pub(crate) fn backup_path(state_dir: &Path) -> PathBuf {
    state_dir.join(BACKUP_FILE)
}

/// The way out, for messages.
fn way_out(state_dir: &Path) -> String {
    if backup_path(state_dir).exists() {
        format!(
            "stop the daemon and run `sidejob registry restore` (from {BACKUP_FILE} beside it), or `sidejob registry rebuild` to rebuild it from the runs' result.json"
        )
    } else {
        "stop the daemon and run `sidejob registry rebuild` to rebuild it from the runs' result.json (there is no backup)".into()
    }
}

/// Refuses a registry that is damaged (`PRAGMA quick_check`), or empty beside sessions and
/// runs of a registry that was there before (a truncated file).
pub(super) fn check_on_open(conn: &Connection, path: &Path, state_dir: &Path) -> Result<()> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| damaged(path, state_dir, e.to_string()))?;
    if version == 0 {
        let left = leftovers(state_dir);
        if left > 0 {
            return Err(RegistryError::Unusable {
                path: path.into(),
                why: format!(
                    "it is empty, but {left} session or run directories of an earlier registry are in {}; {}",
                    state_dir.display(),
                    way_out(state_dir)
                ),
            });
        }
        return Ok(());
    }
    let verdict: String = conn
        .query_row("PRAGMA quick_check(1)", [], |r| r.get(0))
        .map_err(|e| damaged(path, state_dir, e.to_string()))?;
    if verdict != "ok" {
        return Err(damaged(path, state_dir, verdict));
    }
    Ok(())
}

fn damaged(path: &Path, state_dir: &Path, detail: String) -> RegistryError {
    RegistryError::Unusable {
        path: path.into(),
        why: format!("it is damaged ({detail}); {}", way_out(state_dir)),
    }
}

/// Session directories and private run directories in the state directory.
fn leftovers(state_dir: &Path) -> usize {
    ["sessions", "runs"]
        .iter()
        .filter_map(|d| std::fs::read_dir(state_dir.join(d)).ok())
        .map(|entries| entries.count())
        .sum()
}

/// `sidejob registry check`: the same check as at start-up, on a file opened read-only.
pub(crate) fn check_file(db: &Path, state_dir: &Path) -> Result<()> {
    let conn =
        Connection::open_with_flags(db, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|source| {
            RegistryError::Open {
                path: db.into(),
                source,
            }
        })?;
    check_on_open(&conn, db, state_dir)
}

/// Copies the registry to [`BACKUP_FILE`] with SQLite's online backup: a consistent snapshot,
/// taken through a connection of its own while the daemon keeps writing, written to a
/// temporary file and renamed into place.
pub(crate) fn backup(state_dir: &Path) -> Result<PathBuf> {
    let db = state_dir.join("sidejob.db");
    let src =
        Connection::open_with_flags(&db, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(|source| {
            RegistryError::Open {
                path: db.clone(),
                source,
            }
        })?;
    src.busy_timeout(std::time::Duration::from_secs(5))?;
    let dest = backup_path(state_dir);
    let tmp = state_dir.join(format!("{BACKUP_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    src.backup(rusqlite::DatabaseName::Main, &tmp, None)
        .map_err(|e| {
            // A half-written copy only takes room: on a full disk, the room that is missing.
            let _ = std::fs::remove_file(&tmp);
            RegistryError::Backup {
                path: dest.clone(),
                why: backup_failure(&e),
            }
        })?;
    let io = |source| RegistryError::StateDir {
        path: dest.clone(),
        source,
    };
    // Whatever the umask of whoever took it (`sidejob registry backup` from a shell, say).
    owner_only(&tmp).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, &dest).map_err(io)?;
    crate::sys::fsync_dir(state_dir).map_err(io)?;
    Ok(dest)
}

/// Why a backup failed, in words: a failed backup step leaves SQLite's message for the
/// connection at "not an error", so the error code speaks instead.
fn backup_failure(e: &rusqlite::Error) -> String {
    match e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull => {
            "no space left on its disk".into()
        }
        rusqlite::Error::SqliteFailure(_, Some(m)) if m != "not an error" => m.clone(),
        rusqlite::Error::SqliteFailure(f, _) => f.to_string(),
        other => other.to_string(),
    }
}

/// Moves a damaged registry (and its -wal/-shm) aside as `sidejob.db.damaged-<time>`;
/// returns where it went, if there was one.
fn set_aside(state_dir: &Path) -> Result<Option<PathBuf>> {
    let db = state_dir.join("sidejob.db");
    if !db.exists() {
        return Ok(None);
    }
    let stamp = crate::ids::now_rfc3339().replace([':', '.'], "-");
    let aside = state_dir.join(format!("sidejob.db.damaged-{stamp}"));
    let io = |source| RegistryError::StateDir {
        path: db.clone(),
        source,
    };
    std::fs::rename(&db, &aside).map_err(io)?;
    for suffix in ["-wal", "-shm"] {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        let _ = std::fs::remove_file(&p);
    }
    Ok(Some(aside))
}

/// `sidejob registry restore`: the backup becomes the registry (the current one is set
/// aside). The daemon must be stopped. Returns where the old one went.
pub(crate) fn restore(state_dir: &Path) -> Result<Option<PathBuf>> {
    let backup = backup_path(state_dir);
    let check = Connection::open_with_flags(&backup, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(
        |source| RegistryError::Open {
            path: backup.clone(),
            source,
        },
    )?;
    let verdict: String = check.query_row("PRAGMA quick_check(1)", [], |r| r.get(0))?;
    drop(check);
    if verdict != "ok" {
        return Err(RegistryError::Unusable {
            path: backup,
            why: format!("the backup is damaged too ({verdict}); use `sidejob registry rebuild`"),
        });
    }
    let aside = set_aside(state_dir)?;
    let db = state_dir.join("sidejob.db");
    // The copy gets the backup's mode: owner-only, whatever an older backup had.
    std::fs::copy(&backup, &db)
        .and_then(|_| owner_only(&db))
        .map_err(|source| RegistryError::StateDir {
            path: db.clone(),
            source,
        })?;
    Ok(aside)
}

/// What a rebuild found.
#[derive(Debug, Default)]
pub(crate) struct Rebuilt {
    pub sessions: usize,
    pub tasks: usize,
    pub set_aside: Option<PathBuf>,
}

/// A session directory found on disk, with the results of its runs (read by
/// `session::found_on_disk`: the registry reads no run files).
pub(crate) struct FoundSession {
    pub session_id: String,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub dir: PathBuf,
    /// Each names this session and the run directory it was read from.
    pub results: Vec<RunResult>,
}

/// `sidejob registry rebuild`: a new registry from what is on disk when no backup is left.
/// Every session directory the daemon made becomes a closed session of its directory's
/// owner, and every run in it with a `result.json` a settled task, as that file describes
/// it. What the files cannot say (a session's workspace and profile, a run's arguments) is
/// recorded as unknown (a session's first reopening names its own: see `session::reopen`);
/// runs without a result are left out. The daemon must be stopped.
pub(crate) fn rebuild(state_dir: &Path, found: Vec<FoundSession>) -> Result<Rebuilt> {
    let mut out = Rebuilt {
        set_aside: set_aside(state_dir)?,
        ..Rebuilt::default()
    };
    let registry = Registry::open_unchecked(state_dir)?;
    for found in found {
        let FoundSession {
            session_id,
            owner_uid,
            owner_gid,
            dir,
            mut results,
        } = found;
        results.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        let session = SessionRow {
            session_id: session_id.clone(),
            owner_uid,
            owner_gid,
            workspace: String::new(),
            session_dir: dir.display().to_string(),
            profile: results
                .first()
                .map(|r| r.profile.clone())
                .unwrap_or_default(),
            proactive_wake: true,
            parent_session_id: None,
            state: SessionState::Closed,
            created_at: results
                .first()
                .map(|r| r.started_at.clone())
                .unwrap_or_else(crate::ids::now_rfc3339),
            closed_at: Some(crate::ids::now_rfc3339()),
        };
        registry.insert_session(&session)?;
        out.sessions += 1;
        for res in results {
            let row = TaskRow {
                profile: res.profile.clone(),
                created_at: res.started_at.clone(),
                ..TaskRow::new(
                    res.task_id.clone(),
                    &session,
                    res.tool.clone(),
                    TaskKind::Call,
                    "(rebuilt from result.json)".into(),
                    "null".into(),
                )
            };
            registry.insert_task(&row)?;
            let settlement = Settlement {
                delivery: Delivery::Pending,
                ..Settlement::from_result(&res)
            };
            // Whether it was delivered is not on disk: `pending`, so a `task.wait` can still
            // take it.
            registry.settle(&res.task_id, &session_id, &settlement, None)?;
            out.tasks += 1;
        }
    }
    Ok(out)
}
