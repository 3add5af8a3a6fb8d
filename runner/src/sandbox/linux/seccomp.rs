//! The seccomp filter, as data: each denied system call with the reason it is denied, compiled
//! to classic BPF. Everything not listed is allowed; the filesystem, the network and signals
//! are confined by the mount view, landlock and the namespaces, not here.
//!
//! The filter first checks the architecture: a process that switches to another syscall ABI
//! (i386 through `int 0x80`, or x32 numbers on x86-64) could otherwise reach calls under
//! numbers this filter never looks at, so it is killed.

use libc::sock_filter;

use crate::sandbox::profile::Network;

/// What the filter does with a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Fails with `EPERM`.
    Deny,
    /// Fails with `ENOSYS`, as if the kernel did not have it: callers fall back to an older
    /// call whose arguments the filter can inspect.
    NoSys,
    /// Fails with `EPERM` when the flags argument (arg 0) has any namespace flag.
    DenyNamespaceFlags,
    /// `ioctl`: fails with `EPERM` for the terminal-injection requests.
    DenyTerminalInjection,
    /// `socket`: fails with `EAFNOSUPPORT` for every family but `AF_UNIX` (network off).
    UnixOnly,
    /// Fails with `EPERM` when the mode argument (this one) has the set-uid or set-gid bit.
    DenySetidMode(u32),
    /// Fails with `EPERM` when the call creates a file (`O_CREAT` or `O_TMPFILE` in the
    /// `flags` argument) with a set-uid or set-gid `mode`.
    DenySetidCreate { flags: u32, mode: u32 },
}

/// One rule: the call, what happens to it, and why. `name` and `why` are the table's
/// documentation, which the tests check (each call once, each explained); the filter is
/// built from `nr` and `action`.
pub(crate) struct Rule {
    #[cfg_attr(not(test), allow(dead_code))]
    pub name: &'static str,
    pub nr: libc::c_long,
    pub action: Action,
    #[cfg_attr(not(test), allow(dead_code))]
    pub why: &'static str,
}

const fn rule(name: &'static str, nr: libc::c_long, action: Action, why: &'static str) -> Rule {
    Rule {
        name,
        nr,
        action,
        why,
    }
}

/// Every `CLONE_NEW*` flag: creating namespaces is how most container escapes begin (new
/// user namespaces hand out capabilities over fresh kernel attack surface).
pub(crate) const NAMESPACE_FLAGS: u32 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | 0x80) as u32; // CLONE_NEWTIME

/// The mode bits no run may give a file: a set-uid or set-gid file left in the workspace would
/// grant whoever runs it on the host the owner's (for a root caller's run: root's) authority.
pub(crate) const SETID_BITS: u32 = libc::S_ISUID | libc::S_ISGID;

/// The flags with which `open`/`openat` create a file (`O_TMPFILE` without its `O_DIRECTORY`).
const CREATE_FLAGS: u32 = (libc::O_CREAT | (libc::O_TMPFILE & !libc::O_DIRECTORY)) as u32;

const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;

/// The policy. The order does not matter: every rule matches a distinct call number.
pub(crate) const RULES: &[Rule] = &[
    rule(
        "ptrace",
        libc::SYS_ptrace,
        Action::Deny,
        "reads and writes other processes' memory and registers",
    ),
    rule(
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        Action::Deny,
        "reads another process's memory",
    ),
    rule(
        "process_vm_writev",
        libc::SYS_process_vm_writev,
        Action::Deny,
        "writes another process's memory",
    ),
    rule(
        "process_madvise",
        libc::SYS_process_madvise,
        Action::Deny,
        "acts on another process's memory",
    ),
    rule(
        "pidfd_getfd",
        libc::SYS_pidfd_getfd,
        Action::Deny,
        "steals a descriptor from another process",
    ),
    rule(
        "kcmp",
        libc::SYS_kcmp,
        Action::Deny,
        "probes other processes' kernel objects",
    ),
    rule(
        "mount",
        libc::SYS_mount,
        Action::Deny,
        "would change the mount view the sandbox is built from",
    ),
    rule(
        "umount2",
        libc::SYS_umount2,
        Action::Deny,
        "would uncover what the mount view hides",
    ),
    rule(
        "pivot_root",
        libc::SYS_pivot_root,
        Action::Deny,
        "would change the root of the mount view",
    ),
    rule(
        "chroot",
        libc::SYS_chroot,
        Action::Deny,
        "a classic step in escaping a chroot-style view",
    ),
    rule(
        "fsopen",
        libc::SYS_fsopen,
        Action::Deny,
        "new mount API: creates filesystems",
    ),
    rule(
        "fsconfig",
        libc::SYS_fsconfig,
        Action::Deny,
        "new mount API: configures filesystems",
    ),
    rule(
        "fsmount",
        libc::SYS_fsmount,
        Action::Deny,
        "new mount API: creates mounts",
    ),
    rule(
        "fspick",
        libc::SYS_fspick,
        Action::Deny,
        "new mount API: reconfigures existing mounts",
    ),
    rule(
        "open_tree",
        libc::SYS_open_tree,
        Action::Deny,
        "new mount API: clones mounts",
    ),
    rule(
        "move_mount",
        libc::SYS_move_mount,
        Action::Deny,
        "new mount API: attaches mounts",
    ),
    rule(
        "mount_setattr",
        libc::SYS_mount_setattr,
        Action::Deny,
        "new mount API: would make read-only mounts writable",
    ),
    rule(
        "setns",
        libc::SYS_setns,
        Action::Deny,
        "would join another namespace (the host's, through an inherited fd)",
    ),
    rule(
        "unshare",
        libc::SYS_unshare,
        Action::DenyNamespaceFlags,
        "new namespaces expose kernel attack surface; unsharing files or fs state is harmless",
    ),
    rule(
        "clone",
        libc::SYS_clone,
        Action::DenyNamespaceFlags,
        "same as unshare, at process creation",
    ),
    rule(
        "clone3",
        libc::SYS_clone3,
        Action::NoSys,
        "its flags live in memory the filter cannot read; ENOSYS makes libc fall back to clone",
    ),
    rule(
        "kexec_load",
        libc::SYS_kexec_load,
        Action::Deny,
        "replaces the running kernel",
    ),
    rule(
        "kexec_file_load",
        libc::SYS_kexec_file_load,
        Action::Deny,
        "replaces the running kernel",
    ),
    rule(
        "init_module",
        libc::SYS_init_module,
        Action::Deny,
        "loads kernel code",
    ),
    rule(
        "finit_module",
        libc::SYS_finit_module,
        Action::Deny,
        "loads kernel code",
    ),
    rule(
        "delete_module",
        libc::SYS_delete_module,
        Action::Deny,
        "unloads kernel code",
    ),
    rule(
        "bpf",
        libc::SYS_bpf,
        Action::Deny,
        "loads programs into the kernel; a large attack surface",
    ),
    rule(
        "perf_event_open",
        libc::SYS_perf_event_open,
        Action::Deny,
        "observes other processes and the kernel; a large attack surface",
    ),
    rule(
        "userfaultfd",
        libc::SYS_userfaultfd,
        Action::Deny,
        "stalls the kernel at will, the usual way to win kernel races",
    ),
    rule(
        "keyctl",
        libc::SYS_keyctl,
        Action::Deny,
        "kernel keyrings are not namespaced: other users' secrets live there",
    ),
    rule(
        "add_key",
        libc::SYS_add_key,
        Action::Deny,
        "kernel keyrings are not namespaced",
    ),
    rule(
        "request_key",
        libc::SYS_request_key,
        Action::Deny,
        "kernel keyrings are not namespaced",
    ),
    rule(
        "io_uring_setup",
        libc::SYS_io_uring_setup,
        Action::Deny,
        "io_uring runs operations outside the reach of this filter",
    ),
    rule(
        "io_uring_enter",
        libc::SYS_io_uring_enter,
        Action::Deny,
        "io_uring runs operations outside the reach of this filter",
    ),
    rule(
        "io_uring_register",
        libc::SYS_io_uring_register,
        Action::Deny,
        "io_uring runs operations outside the reach of this filter",
    ),
    rule(
        "open_by_handle_at",
        libc::SYS_open_by_handle_at,
        Action::Deny,
        "opens files by handle, around the mount view (the 'shocker' escape)",
    ),
    rule(
        "name_to_handle_at",
        libc::SYS_name_to_handle_at,
        Action::Deny,
        "the other half of open_by_handle_at",
    ),
    rule("reboot", libc::SYS_reboot, Action::Deny, "not a build step"),
    rule(
        "swapon",
        libc::SYS_swapon,
        Action::Deny,
        "host administration",
    ),
    rule(
        "swapoff",
        libc::SYS_swapoff,
        Action::Deny,
        "host administration",
    ),
    rule("acct", libc::SYS_acct, Action::Deny, "host administration"),
    rule(
        "quotactl",
        libc::SYS_quotactl,
        Action::Deny,
        "host administration",
    ),
    rule("iopl", libc::SYS_iopl, Action::Deny, "raw hardware I/O"),
    rule("ioperm", libc::SYS_ioperm, Action::Deny, "raw hardware I/O"),
    rule(
        "ioctl",
        libc::SYS_ioctl,
        Action::DenyTerminalInjection,
        "TIOCSTI and TIOCLINUX push input into a terminal the caller shares",
    ),
];

/// No run leaves a set-uid or set-gid file on the host, by any route that sets mode bits: the
/// `chmod` family and the mode given when a file or directory is made. Capabilities are gone,
/// so file capabilities (`security.capability`) cannot be set either, and writing to an
/// existing set-id file clears its bits.
pub(crate) const SETID_RULES: &[Rule] = &[
    rule(
        "fchmod",
        libc::SYS_fchmod,
        Action::DenySetidMode(1),
        "would make a set-uid/set-gid file",
    ),
    rule(
        "fchmodat",
        libc::SYS_fchmodat,
        Action::DenySetidMode(2),
        "would make a set-uid/set-gid file",
    ),
    rule(
        "fchmodat2",
        libc::SYS_fchmodat2,
        Action::DenySetidMode(2),
        "would make a set-uid/set-gid file",
    ),
    rule(
        "mkdirat",
        libc::SYS_mkdirat,
        Action::DenySetidMode(2),
        "would make a set-gid directory",
    ),
    rule(
        "mknodat",
        libc::SYS_mknodat,
        Action::DenySetidMode(2),
        "would make a set-uid/set-gid file",
    ),
    rule(
        "openat",
        libc::SYS_openat,
        Action::DenySetidCreate { flags: 2, mode: 3 },
        "would create a set-uid/set-gid file",
    ),
    rule(
        "openat2",
        libc::SYS_openat2,
        Action::NoSys,
        "its mode lives in memory the filter cannot read; ENOSYS makes callers fall back to openat",
    ),
    #[cfg(target_arch = "x86_64")]
    rule(
        "chmod",
        libc::SYS_chmod,
        Action::DenySetidMode(1),
        "would make a set-uid/set-gid file",
    ),
    #[cfg(target_arch = "x86_64")]
    rule(
        "creat",
        libc::SYS_creat,
        Action::DenySetidMode(1),
        "would create a set-uid/set-gid file",
    ),
    #[cfg(target_arch = "x86_64")]
    rule(
        "mkdir",
        libc::SYS_mkdir,
        Action::DenySetidMode(1),
        "would make a set-gid directory",
    ),
    #[cfg(target_arch = "x86_64")]
    rule(
        "mknod",
        libc::SYS_mknod,
        Action::DenySetidMode(1),
        "would make a set-uid/set-gid file",
    ),
    #[cfg(target_arch = "x86_64")]
    rule(
        "open",
        libc::SYS_open,
        Action::DenySetidCreate { flags: 1, mode: 2 },
        "would create a set-uid/set-gid file",
    ),
];

/// The `socket` rule, added when the profile's network is off.
pub(crate) const SOCKET_RULE: Rule = rule(
    "socket",
    libc::SYS_socket,
    Action::UnixOnly,
    "network off: only Unix sockets (the mount view decides which of those are reachable)",
);

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

// Offsets into `struct seccomp_data` (little-endian: the low half of an argument comes first).
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const fn off_arg_low(i: u32) -> u32 {
    16 + 8 * i
}

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

const LD_W_ABS: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const JEQ_K: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JGE_K: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;
const JSET_K: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
const RET_K: u32 = libc::BPF_RET | libc::BPF_K;
const JA: u32 = libc::BPF_JMP | libc::BPF_JA;

fn errno(e: i32) -> u32 {
    RET_ERRNO | (e as u32 & 0xffff)
}

/// Compiles the policy for a run with this network setting.
///
/// The rules are found by a binary search on the call number, not one after another: the
/// kernel works out, when the filter is installed, which calls it allows whatever their
/// arguments (those then skip it), by running it for every call number; and every call
/// whose arguments it checks runs it. Either way, a search takes a handful of steps where a
/// list took one per rule.
pub(crate) fn build(network: Network) -> Vec<sock_filter> {
    let mut rules: Vec<&Rule> = RULES.iter().chain(SETID_RULES).collect();
    match network {
        Network::None => rules.push(&SOCKET_RULE),
        Network::Loopback | Network::Host => {}
    }
    rules.sort_by_key(|r| r.nr);
    let mut f = Vec::with_capacity(8 + rules.len() * 6);
    // Wrong architecture: kill.
    f.push(stmt(LD_W_ABS, OFF_ARCH));
    f.push(jump(JEQ_K, AUDIT_ARCH, 1, 0));
    f.push(stmt(RET_K, RET_KILL_PROCESS));
    f.push(stmt(LD_W_ABS, OFF_NR));
    // x32 syscall numbers on x86-64: kill.
    #[cfg(target_arch = "x86_64")]
    {
        f.push(jump(JGE_K, X32_SYSCALL_BIT, 0, 1));
        f.push(stmt(RET_K, RET_KILL_PROCESS));
    }
    search(&mut f, &rules);
    f
}

/// At most this many rules are checked one after another at the end of a search.
const LEAF: usize = 4;

/// A binary search over `rules` (sorted by call number, the accumulator holding the call's)
/// that ends in the block of the rule naming the call, or in allowing a call none names.
fn search(f: &mut Vec<sock_filter>, rules: &[&Rule]) {
    if rules.len() <= LEAF {
        for r in rules {
            block(f, r);
        }
        f.push(stmt(RET_K, RET_ALLOW));
        return;
    }
    let (low, high) = rules.split_at(rules.len() / 2);
    // A number from the high half's first on jumps over the low half's code (`JA` takes a
    // 32-bit offset; a conditional jump only 8 bits).
    f.push(jump(JGE_K, high[0].nr as u32, 0, 1));
    let over = f.len();
    f.push(stmt(JA, 0));
    search(f, low);
    f[over].k = (f.len() - over - 1) as u32;
    search(f, high);
}

/// One rule's block: it returns when the call is the rule's, and otherwise falls through
/// with the accumulator still holding the call number.
fn block(f: &mut Vec<sock_filter>, r: &Rule) {
    let nr = r.nr as u32;
    match r.action {
        Action::Deny => {
            f.push(jump(JEQ_K, nr, 0, 1));
            f.push(stmt(RET_K, errno(libc::EPERM)));
        }
        Action::NoSys => {
            f.push(jump(JEQ_K, nr, 0, 1));
            f.push(stmt(RET_K, errno(libc::ENOSYS)));
        }
        Action::DenyNamespaceFlags => {
            // Loading the argument overwrites the call number, so both outcomes return.
            f.push(jump(JEQ_K, nr, 0, 4));
            f.push(stmt(LD_W_ABS, off_arg_low(0)));
            f.push(jump(JSET_K, NAMESPACE_FLAGS, 0, 1));
            f.push(stmt(RET_K, errno(libc::EPERM)));
            f.push(stmt(RET_K, RET_ALLOW));
        }
        Action::DenyTerminalInjection => {
            // The kernel truncates the request to 32 bits, so the low half is what counts.
            f.push(jump(JEQ_K, nr, 0, 5));
            f.push(stmt(LD_W_ABS, off_arg_low(1)));
            f.push(jump(JEQ_K, TIOCSTI, 2, 0));
            f.push(jump(JEQ_K, TIOCLINUX, 1, 0));
            f.push(stmt(RET_K, RET_ALLOW));
            f.push(stmt(RET_K, errno(libc::EPERM)));
        }
        Action::UnixOnly => {
            f.push(jump(JEQ_K, nr, 0, 4));
            f.push(stmt(LD_W_ABS, off_arg_low(0)));
            f.push(jump(JEQ_K, libc::AF_UNIX as u32, 0, 1));
            f.push(stmt(RET_K, RET_ALLOW));
            f.push(stmt(RET_K, errno(libc::EAFNOSUPPORT)));
        }
        Action::DenySetidMode(arg) => {
            // mode_t is 32 bits wide: the low half is the whole of it.
            f.push(jump(JEQ_K, nr, 0, 4));
            f.push(stmt(LD_W_ABS, off_arg_low(arg)));
            f.push(jump(JSET_K, SETID_BITS, 0, 1));
            f.push(stmt(RET_K, errno(libc::EPERM)));
            f.push(stmt(RET_K, RET_ALLOW));
        }
        Action::DenySetidCreate { flags, mode } => {
            // Without O_CREAT/O_TMPFILE the mode is ignored (and may be garbage).
            f.push(jump(JEQ_K, nr, 0, 6));
            f.push(stmt(LD_W_ABS, off_arg_low(flags)));
            f.push(jump(JSET_K, CREATE_FLAGS, 0, 3));
            f.push(stmt(LD_W_ABS, off_arg_low(mode)));
            f.push(jump(JSET_K, SETID_BITS, 0, 1));
            f.push(stmt(RET_K, errno(libc::EPERM)));
            f.push(stmt(RET_K, RET_ALLOW));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny interpreter for the subset of classic BPF the builder emits, so the policy can
    /// be checked without installing it.
    fn run(f: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        run_counting(f, arch, nr, args).0
    }

    /// [`run`], and how many instructions it took.
    fn run_counting(f: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_le_bytes());
        data.extend_from_slice(&arch.to_le_bytes());
        data.extend_from_slice(&0u64.to_le_bytes());
        for a in args {
            data.extend_from_slice(&a.to_le_bytes());
        }
        let (mut pc, mut acc, mut steps) = (0usize, 0u32, 0usize);
        loop {
            let i = f[pc];
            steps += 1;
            match i.code as u32 {
                LD_W_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                JA => pc += 1 + i.k as usize,
                RET_K => return (i.k, steps),
                c => {
                    let t = match c {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        JSET_K => acc & i.k != 0,
                        _ => panic!("unknown opcode {c:#x}"),
                    };
                    pc += 1 + if t { i.jt } else { i.jf } as usize;
                }
            }
        }
    }

    #[test]
    fn the_policy_does_what_it_says() {
        let f = build(Network::None);
        let call = |nr: libc::c_long, args: [u64; 6]| run(&f, AUDIT_ARCH, nr as u32, args);
        assert_eq!(call(libc::SYS_read, [0; 6]), RET_ALLOW);
        assert_eq!(call(libc::SYS_ptrace, [0; 6]), errno(libc::EPERM));
        assert_eq!(call(libc::SYS_clone3, [0; 6]), errno(libc::ENOSYS));
        assert_eq!(
            call(libc::SYS_clone, [libc::SIGCHLD as u64, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_clone, [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            call(libc::SYS_unshare, [libc::CLONE_FILES as u64, 0, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_unshare, [libc::CLONE_NEWNS as u64, 0, 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(call(libc::SYS_ioctl, [0, 0x5401, 0, 0, 0, 0]), RET_ALLOW); // TCGETS
        assert_eq!(
            call(libc::SYS_ioctl, [0, TIOCSTI as u64 | (1 << 32), 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            call(libc::SYS_ioctl, [0, TIOCLINUX as u64, 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_UNIX as u64, 1, 0, 0, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_INET as u64, 1, 0, 0, 0, 0]),
            errno(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            call(libc::SYS_socket, [libc::AF_NETLINK as u64, 1, 0, 0, 0, 0]),
            errno(libc::EAFNOSUPPORT)
        );
        assert_eq!(
            run(&f, 0x4000_0003, libc::SYS_read as u32, [0; 6]),
            RET_KILL_PROCESS
        ); // i386
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            call(X32_SYSCALL_BIT as libc::c_long | libc::SYS_read, [0; 6]),
            RET_KILL_PROCESS
        );
        // Set-uid and set-gid bits, by every route.
        assert_eq!(call(libc::SYS_fchmod, [3, 0o755, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            call(libc::SYS_fchmod, [3, 0o4755, 0, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            call(libc::SYS_fchmodat, [3, 0, 0o2755, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            call(libc::SYS_fchmodat2, [3, 0, 0o6755, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(call(libc::SYS_fchmodat, [3, 0, 0o1777, 0, 0, 0]), RET_ALLOW);
        assert_eq!(
            call(libc::SYS_mkdirat, [3, 0, 0o2775, 0, 0, 0]),
            errno(libc::EPERM)
        );
        assert_eq!(
            call(libc::SYS_mknodat, [3, 0, 0o104755, 0, 0, 0]),
            errno(libc::EPERM)
        );
        let creat = (libc::O_CREAT | libc::O_WRONLY) as u64;
        assert_eq!(
            call(libc::SYS_openat, [3, 0, creat, 0o644, 0, 0]),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_openat, [3, 0, creat, 0o4755, 0, 0]),
            errno(libc::EPERM)
        );
        let tmpfile = (libc::O_TMPFILE | libc::O_WRONLY) as u64;
        assert_eq!(
            call(libc::SYS_openat, [3, 0, tmpfile, 0o2755, 0, 0]),
            errno(libc::EPERM)
        );
        // Without a create flag the mode is not looked at.
        assert_eq!(
            call(
                libc::SYS_openat,
                [3, 0, libc::O_RDONLY as u64, 0o7777, 0, 0]
            ),
            RET_ALLOW
        );
        assert_eq!(
            call(libc::SYS_openat2, [3, 0, 0, 24, 0, 0]),
            errno(libc::ENOSYS)
        );
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(
                call(libc::SYS_chmod, [0, 0o4755, 0, 0, 0, 0]),
                errno(libc::EPERM)
            );
            assert_eq!(
                call(libc::SYS_creat, [0, 0o2755, 0, 0, 0, 0]),
                errno(libc::EPERM)
            );
            assert_eq!(
                call(libc::SYS_open, [0, creat, 0o4700, 0, 0, 0]),
                errno(libc::EPERM)
            );
            assert_eq!(call(libc::SYS_open, [0, creat, 0o700, 0, 0, 0]), RET_ALLOW);
        }
        let host = build(Network::Host);
        assert_eq!(
            run(
                &host,
                AUDIT_ARCH,
                libc::SYS_socket as u32,
                [libc::AF_INET as u64, 1, 0, 0, 0, 0]
            ),
            RET_ALLOW
        );
    }

    /// What the table says of a call, worked out from the rules themselves.
    fn expected(rules: &[&Rule], nr: u32, args: [u64; 6]) -> u32 {
        let Some(r) = rules.iter().find(|r| r.nr as u32 == nr) else {
            return RET_ALLOW;
        };
        let low = |i: u32| args[i as usize] as u32;
        let deny_if = |cond: bool, e: i32| if cond { errno(e) } else { RET_ALLOW };
        match r.action {
            Action::Deny => errno(libc::EPERM),
            Action::NoSys => errno(libc::ENOSYS),
            Action::DenyNamespaceFlags => deny_if(low(0) & NAMESPACE_FLAGS != 0, libc::EPERM),
            Action::DenyTerminalInjection => {
                deny_if([TIOCSTI, TIOCLINUX].contains(&low(1)), libc::EPERM)
            }
            Action::UnixOnly => deny_if(low(0) != libc::AF_UNIX as u32, libc::EAFNOSUPPORT),
            Action::DenySetidMode(arg) => deny_if(low(arg) & SETID_BITS != 0, libc::EPERM),
            Action::DenySetidCreate { flags, mode } => deny_if(
                low(flags) & CREATE_FLAGS != 0 && low(mode) & SETID_BITS != 0,
                libc::EPERM,
            ),
        }
    }

    #[test]
    fn the_search_agrees_with_the_table_for_every_call_in_a_few_steps() {
        let creat = (libc::O_CREAT | libc::O_WRONLY) as u64;
        let arg_sets: [[u64; 6]; 8] = [
            [0; 6],
            [u64::MAX; 6],
            [libc::CLONE_NEWUSER as u64, 0, 0, 0, 0, 0],
            [libc::AF_INET as u64, TIOCSTI as u64, 0o4755, 0o4755, 0, 0],
            [libc::AF_UNIX as u64, TIOCLINUX as u64, creat, 0o2755, 0, 0],
            [3, creat, 0o6755, 0o644, 0, 0],
            [3, 0x5401, libc::O_RDONLY as u64, 0o7777, 0, 0],
            [libc::SIGCHLD as u64, 0o755, 0o1777, 0o755, 0, 0],
        ];
        for network in [Network::None, Network::Loopback, Network::Host] {
            let f = build(network);
            let mut rules: Vec<&Rule> = RULES.iter().chain(SETID_RULES).collect();
            if network == Network::None {
                rules.push(&SOCKET_RULE);
            }
            let mut most = 0;
            for nr in 0..1024u32 {
                for args in arg_sets {
                    let (got, steps) = run_counting(&f, AUDIT_ARCH, nr, args);
                    assert_eq!(got, expected(&rules, nr, args), "call {nr} {args:?}");
                    most = most.max(steps);
                }
            }
            // A list of the rules took up to two steps per rule (over a hundred); the search
            // takes the header, two per level, at most LEAF rules' checks and the longest
            // rule's block.
            assert!(most <= 32, "{network:?}: up to {most} steps for one call");
        }
    }

    #[test]
    fn every_rule_is_distinct_and_explained() {
        let mut seen = std::collections::HashSet::new();
        for r in RULES
            .iter()
            .chain(SETID_RULES)
            .chain(std::iter::once(&SOCKET_RULE))
        {
            assert!(seen.insert(r.nr), "{} listed twice", r.name);
            assert!(!r.why.is_empty());
        }
    }
}
