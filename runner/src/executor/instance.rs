//! Where the daemon's runs live: the boot and the PID namespace (told apart by its init's
//! start time, since a namespace's inode number is reused once it is freed). A run's
//! supervisor outlives a daemon crash, restart or in-place upgrade, all of which leave these
//! alone; it does not outlive a reboot, nor a container or pod restart, which makes a new PID
//! namespace. Recovery compares the one recorded by the previous daemon with this one, so a
//! run lost that way says why (`recover.rs`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The file, in the state directory.
const FILE: &str = "daemon.instance";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Instance {
    boot_id: String,
    pid_ns: u64,
    init_start: u64,
}

impl Instance {
    /// This daemon's, or `None` where `/proc` does not say.
    pub(super) fn current() -> Option<Instance> {
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
        Some(Instance {
            boot_id: boot_id.trim().to_owned(),
            pid_ns: std::fs::metadata("/proc/self/ns/pid").ok()?.ino(),
            init_start: crate::sys::process_start_time(1).ok()?,
        })
    }

    /// The previous daemon's, if it left one.
    pub(super) fn recorded(state_dir: &Path) -> Option<Instance> {
        let text = std::fs::read_to_string(path(state_dir)).ok()?;
        let mut it = text.split_whitespace();
        let inst = Instance {
            boot_id: it.next()?.to_owned(),
            pid_ns: it.next()?.parse().ok()?,
            init_start: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(inst)
    }

    /// Records this one for the next daemon (a temporary file renamed into place).
    pub(super) fn record(&self, state_dir: &Path) -> std::io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = state_dir.join(format!(".{FILE}.tmp"));
        let mut f = std::fs::File::options()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        writeln!(f, "{} {} {}", self.boot_id, self.pid_ns, self.init_start)?;
        std::fs::rename(&tmp, path(state_dir))
    }

    /// Why runs started under `before` cannot have outlived the move to `self`, if they
    /// cannot.
    pub(super) fn ended_runs_of(&self, before: &Instance) -> Option<&'static str> {
        if self.boot_id != before.boot_id {
            Some("the machine restarted since it started, and a reboot ends every run")
        } else if self.pid_ns != before.pid_ns || self.init_start != before.init_start {
            Some(
                "the container (or pod) it ran in was restarted since it started (a new PID \
                 namespace), and a container restart ends every run; a daemon restart or an \
                 in-place upgrade (SIGHUP) keeps them",
            )
        } else {
            None
        }
    }
}

fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(boot: &str, ns: u64, init: u64) -> Instance {
        Instance {
            boot_id: boot.into(),
            pid_ns: ns,
            init_start: init,
        }
    }

    #[test]
    fn a_new_boot_or_pid_namespace_ends_runs_and_nothing_else_does() {
        let a = inst("b1", 4026531836, 10);
        assert_eq!(a.ended_runs_of(&a), None);
        assert!(inst("b2", 4026531836, 10)
            .ended_runs_of(&a)
            .is_some_and(|w| w.contains("machine restarted")));
        // A namespace inode reused by the next container: its init started later.
        for next in [inst("b1", 4026532999, 10), inst("b1", 4026531836, 99)] {
            assert!(next
                .ended_runs_of(&a)
                .is_some_and(|w| w.contains("container (or pod)")));
        }
    }

    #[test]
    fn the_record_reads_back() {
        let dir = std::env::temp_dir().join(format!("sidejob-instance-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let a = inst("0b2c-77", 4026531836, 12345);
        a.record(&dir).unwrap();
        assert_eq!(Instance::recorded(&dir), Some(a));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
