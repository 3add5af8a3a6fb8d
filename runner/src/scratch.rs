//! A directory of its own for a unit test, removed with everything in it when dropped.

use std::path::{Path, PathBuf};

pub(crate) struct ScratchDir(PathBuf);

impl ScratchDir {
    /// `<tmp>/sidejob-<tag>-<pid>-<ulid>`, made now.
    pub(crate) fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!(
            "sidejob-{tag}-{}-{}",
            std::process::id(),
            crate::ids::ulid()
        ));
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        ScratchDir(dir)
    }

    /// [`ScratchDir::new`], with `mode` whatever the umask (for the tests of checks that
    /// look at who may write a directory).
    pub(crate) fn with_mode(tag: &str, mode: u32) -> ScratchDir {
        use std::os::unix::fs::PermissionsExt;
        let dir = ScratchDir::new(tag);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode))
            .expect("set a scratch directory's mode");
        dir
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
