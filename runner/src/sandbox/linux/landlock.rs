//! Landlock: which access rights this kernel's ABI can handle, and the ruleset for a run.
//!
//! The ruleset is built with the `landlock` crate. It handles every right of the ABI we use
//! ([`FULL_ABI`]: the filesystem with refer, truncate and device ioctl; TCP bind and connect
//! when the network is off; scoping of abstract Unix sockets and signals), so each is denied
//! unless a rule grants it; rules grant rights beneath the paths of the mount view.
//!
//! What a kernel cannot enforce is settled by the profile's `best_effort`, mapped onto the
//! crate's compatibility levels by [`compat_level`]:
//! - not best-effort: `HardRequirement`. A right the kernel lacks is an error. `prepare`
//!   already refused such a run (its layer is missing); the crate checks again where the
//!   ruleset is made, on the kernel that enforces it.
//! - best-effort: `BestEffort`. The crate leaves out what the kernel lacks and enforces the
//!   rest; [`coverage`] reports each layer left out as missing, never silently.
//!
//! `SoftRequirement` (all or nothing) is not used: a best-effort run wants every layer this
//! kernel has. After `restrict_self`, the `RulesetStatus` the crate reports is checked against
//! what the run's layers claim ([`restrict`]).

use std::io;
use std::path::{Path, PathBuf};

use landlock::{
    make_bitflags, Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath,
    Ruleset, RulesetAttr, RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope,
    ABI,
};

use crate::sandbox::profile::Network;
use crate::sandbox::SandboxPlan;
use crate::sys::sandbox as sys;

/// The ABI that has everything we use: filesystem (with refer, truncate and device ioctl),
/// TCP, and scoping of abstract sockets and signals. Rights of later ABIs are not asked for.
pub(crate) const FULL_ABI: ABI = ABI::V6;

/// The first ABI that scopes abstract Unix sockets and signals to the sandbox.
pub(crate) const SCOPE_ABI: u32 = 6;

pub(crate) const READ: BitFlags<AccessFs> = make_bitflags!(AccessFs::{ReadFile | ReadDir});
pub(crate) const WRITE: BitFlags<AccessFs> = make_bitflags!(AccessFs::{
    ReadFile
        | ReadDir
        | WriteFile
        | RemoveDir
        | RemoveFile
        | MakeDir
        | MakeReg
        | MakeSock
        | MakeFifo
        | MakeSym
        | Refer
        | Truncate
});
/// For the device nodes of the minimal `/dev`.
pub(crate) const DEVICE: BitFlags<AccessFs> =
    make_bitflags!(AccessFs::{ReadFile | WriteFile | Truncate | IoctlDev});
/// The rights that apply to a file; the others apply to directories only, and the kernel
/// refuses them in a rule on a file.
const FILE_RIGHTS: BitFlags<AccessFs> =
    make_bitflags!(AccessFs::{Execute | WriteFile | ReadFile | Truncate | IoctlDev});

/// What a ruleset on this ABI enforces, by layer name, and what it cannot.
pub(crate) fn coverage(
    abi: u32,
    network: Network,
) -> (Vec<&'static str>, Vec<(&'static str, String)>) {
    let mut active = Vec::new();
    let mut missing = Vec::new();
    if abi == 0 {
        missing.push(("landlock_fs", "landlock is not available".to_owned()));
        return (active, missing);
    }
    if abi >= 5 {
        active.push("landlock_fs");
    } else {
        missing.push((
            "landlock_fs",
            format!(
                "landlock ABI {abi} lacks {} (needs ABI 5)",
                match abi {
                    1 => "refer, truncate and device-ioctl control",
                    2 => "truncate and device-ioctl control",
                    _ => "device-ioctl control",
                }
            ),
        ));
    }
    match network {
        Network::None if abi >= 4 => active.push("landlock_net"),
        Network::None => missing.push((
            "landlock_net",
            format!("landlock ABI {abi} has no TCP rules (needs ABI 4)"),
        )),
        // loopback: the network namespace already isolates; host: the network is allowed.
        Network::Loopback | Network::Host => {}
    }
    if abi >= SCOPE_ABI {
        active.push("landlock_scope");
    } else {
        missing.push((
            "landlock_scope",
            format!(
                "landlock ABI {abi} cannot scope abstract sockets and signals (needs ABI {SCOPE_ABI})"
            ),
        ));
    }
    (active, missing)
}

/// How the profile's `best_effort` maps onto landlock's compatibility levels (see the module
/// documentation).
pub(crate) fn compat_level(sb: &SandboxPlan) -> CompatLevel {
    if sb.best_effort {
        CompatLevel::BestEffort
    } else {
        CompatLevel::HardRequirement
    }
}

/// One rule: a path in the view and the rights granted beneath it.
#[derive(Debug, Clone)]
pub(crate) struct PathRule {
    pub path: PathBuf,
    pub access: BitFlags<AccessFs>,
}

/// A run's ruleset as the supervisor decides it before forking; built and enforced in the
/// command's process ([`ruleset`], [`restrict`]).
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    rules: Vec<PathRule>,
    network: Network,
    level: CompatLevel,
    /// The run's layers claim every landlock layer: the kernel must enforce the whole
    /// ruleset. Otherwise they claim only those this ABI has, and part is enough.
    complete: bool,
}

impl Plan {
    /// The ruleset for `sb` (whose mounts are the view) on a kernel with landlock ABI `abi`.
    pub(crate) fn new(abi: u32, sb: &SandboxPlan) -> Plan {
        let mounts: Vec<(PathBuf, bool, bool)> = sb
            .mounts
            .iter()
            .map(|m| (m.target.clone(), m.exec, m.write))
            .collect();
        Plan {
            rules: rules_for(&mounts),
            network: sb.network,
            level: compat_level(sb),
            complete: coverage(abi, sb.network).1.is_empty(),
        }
    }
}

/// Why the ruleset could not be built or enforced; the message names the step and the path.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LandlockError {
    #[error("landlock ruleset: {0}")]
    Ruleset(#[source] RulesetError),
    #[error("landlock rule {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("landlock rule {}: {source}", path.display())]
    Rule { path: PathBuf, source: RulesetError },
    #[error("landlock restrict: {0}")]
    Restrict(#[source] RulesetError),
    #[error(
        "landlock restrict: the kernel reports the ruleset {enforced:?}, but the run's layers \
         claim {}",
        if *complete { "all of it" } else { "part of it" }
    )]
    Enforced {
        enforced: RulesetStatus,
        complete: bool,
    },
}

/// Builds the ruleset (opening each rule's path in the current view). A path that is gone is
/// skipped: it was optional and is not in the view.
pub(crate) fn ruleset(plan: &Plan) -> Result<RulesetCreated, LandlockError> {
    let mut ruleset = Ruleset::default()
        .set_compatibility(plan.level)
        .handle_access(AccessFs::from_all(FULL_ABI))
        .map_err(LandlockError::Ruleset)?;
    if plan.network == Network::None {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(FULL_ABI))
            .map_err(LandlockError::Ruleset)?;
    }
    let mut created = ruleset
        .scope(Scope::from_all(FULL_ABI))
        .and_then(Ruleset::create)
        .map_err(LandlockError::Ruleset)?;
    for r in &plan.rules {
        let fd = match sys::open_path(&r.path, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(source) => {
                return Err(LandlockError::Open {
                    path: r.path.clone(),
                    source,
                })
            }
        };
        let mut access = r.access;
        // Directory-only rights on a file are refused by the kernel (and would make the crate
        // report the ruleset as only partly enforced).
        if sys::fstat(&fd).map(|i| !i.is_dir()).unwrap_or(false) {
            access &= FILE_RIGHTS;
        }
        created = created
            .add_rule(PathBeneath::new(fd, access))
            .map_err(|source| LandlockError::Rule {
                path: r.path.clone(),
                source,
            })?;
    }
    Ok(created)
}

/// Enforces the ruleset on this process and what it executes, then checks that the kernel
/// enforced what the run's layers claim: all of it when no landlock layer is reported
/// missing, at least part of it otherwise. Needs `no_new_privs` (the crate sets it again).
pub(crate) fn restrict(ruleset: RulesetCreated, plan: &Plan) -> Result<(), LandlockError> {
    let status = ruleset.restrict_self().map_err(LandlockError::Restrict)?;
    let kept = match status.ruleset {
        RulesetStatus::FullyEnforced => true,
        RulesetStatus::PartiallyEnforced => !plan.complete,
        RulesetStatus::NotEnforced => false,
    };
    if kept {
        Ok(())
    } else {
        Err(LandlockError::Enforced {
            enforced: status.ruleset,
            complete: plan.complete,
        })
    }
}

/// The rules for a view: the profile's mounts plus the fixed parts (`/`, `/proc`, `/dev`).
fn rules_for(mounts: &[(PathBuf, bool, bool)]) -> Vec<PathRule> {
    let mut v = vec![
        // Listing directories of the view is harmless: it only holds what the profile names.
        PathRule {
            path: "/".into(),
            access: AccessFs::ReadDir.into(),
        },
        PathRule {
            path: "/proc".into(),
            access: READ,
        },
        PathRule {
            path: "/dev/pts".into(),
            access: DEVICE | AccessFs::ReadDir,
        },
        PathRule {
            path: "/dev/shm".into(),
            access: WRITE,
        },
    ];
    for d in super::view::DEVICES {
        v.push(PathRule {
            path: Path::new("/dev").join(d),
            access: DEVICE,
        });
    }
    for (target, exec, write) in mounts {
        let mut access = READ;
        if *exec {
            access |= AccessFs::Execute;
        }
        if *write {
            access |= WRITE;
        }
        v.push(PathRule {
            path: target.clone(),
            access,
        });
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::profile::Limits;

    fn sandbox(best_effort: bool, network: Network) -> SandboxPlan {
        SandboxPlan {
            mounts: Vec::new(),
            protected: Vec::new(),
            network,
            limits: Limits::default(),
            best_effort,
            egress: None,
            off_limits: Vec::new(),
        }
    }

    #[test]
    fn best_effort_maps_to_best_effort_and_anything_else_to_hard_requirement() {
        assert_eq!(
            compat_level(&sandbox(true, Network::None)),
            CompatLevel::BestEffort
        );
        assert_eq!(
            compat_level(&sandbox(false, Network::None)),
            CompatLevel::HardRequirement
        );
    }

    #[test]
    fn the_ruleset_must_be_whole_exactly_when_no_landlock_layer_is_missing() {
        assert!(Plan::new(6, &sandbox(false, Network::None)).complete);
        assert!(Plan::new(7, &sandbox(true, Network::Host)).complete);
        // ABI 5 has no scopes; ABI 3 no TCP rules (needed only with the network off) and no
        // device ioctl.
        assert!(!Plan::new(5, &sandbox(true, Network::Loopback)).complete);
        assert!(!Plan::new(3, &sandbox(true, Network::Host)).complete);
    }

    /// The rights are the kernel's bits (`LANDLOCK_ACCESS_FS_*`), as the raw constants this
    /// module spelled out before it used the crate.
    #[test]
    fn the_rights_keep_their_kernel_bits() {
        let bits = |ns: &[u32]| ns.iter().fold(0u64, |acc, n| acc | 1 << n);
        assert_eq!(READ.bits(), bits(&[2, 3]));
        assert_eq!(
            WRITE.bits(),
            bits(&[1, 2, 3, 4, 5, 7, 8, 9, 10, 12, 13, 14])
        );
        assert_eq!(DEVICE.bits(), bits(&[1, 2, 14, 15]));
        assert_eq!(FILE_RIGHTS.bits(), bits(&[0, 1, 2, 14, 15]));
        // The full ABI handles every filesystem right up to device ioctl, TCP, both scopes.
        assert_eq!(AccessFs::from_all(FULL_ABI).bits(), (1 << 16) - 1);
        assert_eq!(AccessNet::from_all(FULL_ABI).bits(), 0b11);
        assert_eq!(Scope::from_all(FULL_ABI).bits(), 0b11);
    }
}
