//! A plan's files and fixed stdin (docs/plugins.md): written into the run's private directory
//! before the run starts, handed to the user it runs as, and its files mounted read-only at
//! the same path (`context.tmp_dir`), so a plan can name them in its argv.

use std::path::{Path, PathBuf};

use super::ExecError;
use crate::plugin_host::ToolPlan;
use crate::run::dir::PrivateDir;
use crate::sandbox::{MountSpec, SandboxPlan};

fn io(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ExecError {
    let path = path.to_path_buf();
    move |source| ExecError::Io { step, path, source }
}

/// Writes the plan's files (returning their directory, if it has any) and its stdin.
pub(super) fn write(
    private: &PrivateDir,
    plan: &ToolPlan,
    run_as: (Option<u32>, Option<u32>),
) -> Result<Option<PathBuf>, ExecError> {
    if let Some(data) = &plan.stdin {
        std::fs::write(private.stdin(), data)
            .map_err(io("write the plan's stdin", &private.stdin()))?;
    }
    if plan.files.is_empty() {
        return Ok(None);
    }
    let dir = private
        .create_files()
        .map_err(io("create plan file directory", &private.files()))?;
    for f in &plan.files {
        // Plugins are trusted code, but a plan's file names come from a call's arguments as
        // often as not: each must stay beneath the files directory.
        let rel = Path::new(&f.path);
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(ExecError::InvalidParams(format!(
                "the tool's plan names a file {:?} outside its files directory",
                f.path
            )));
        }
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io("create plan file directory", parent))?;
        }
        std::fs::write(&path, &f.content).map_err(io("write plan file", &path))?;
        if f.executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(io("make plan file executable", &path))?;
        }
    }
    chown_tree(&dir, run_as).map_err(io("hand plan files to the run's user", &dir))?;
    Ok(Some(dir))
}

/// Adds the plan's files to the run's view, read-only, at the same path.
pub(super) fn mount(files_dir: Option<PathBuf>, mut sandbox: SandboxPlan) -> SandboxPlan {
    if let Some(dir) = files_dir {
        sandbox.mounts.push(MountSpec {
            source: Some(dir.clone()),
            target: dir,
            exec: true,
            write: false,
            required: true,
            as_caller: false,
        });
    }
    sandbox
}

/// Hands a tree to the user the run runs as (nothing to do when it runs as the daemon). The
/// tree is the daemon's own (in the run's private directory), so following paths is safe.
fn chown_tree(path: &Path, (uid, gid): (Option<u32>, Option<u32>)) -> std::io::Result<()> {
    if uid.is_none() && gid.is_none() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, uid, gid)?;
    if std::fs::symlink_metadata(path)?.is_dir() {
        for e in std::fs::read_dir(path)? {
            chown_tree(&e?.path(), (uid, gid))?;
        }
    }
    Ok(())
}
