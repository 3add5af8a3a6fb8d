//! Which CPUs a process may run on.
//!
//! A sandbox's start is a chain of hand-offs: the supervisor forks init, init starts the
//! command and waits for it, init reports to the supervisor. Left to itself, the scheduler
//! wakes each waiting process on an idle CPU rather than on the busy one its waker runs on;
//! on a virtual machine an idle CPU first has to be woken by the host, which took 30–40 µs
//! here for each hand-off, against 2–6 µs on the waker's own CPU. `sidejob exec` therefore
//! keeps itself and its init on the CPU it starts on ([`stay_here`]), and the command is given
//! back every CPU the caller allowed as its exec ends ([`ExecHold`]; [`free_to_move`] before
//! it, where init may not hold it): only sidejob's own processes, which mostly wait, are
//! held to one CPU. At the end init leaves that CPU
//! ([`leave_this_cpu`]), so that the teardown of its exit runs beside the supervisor's last
//! steps, not ahead of whoever the supervisor's exit wakes.

use std::io;
use std::sync::OnceLock;

/// The CPUs this process may use, as a set.
pub(crate) type CpuSet = libc::cpu_set_t;

/// What this process was allowed before [`stay_here`] narrowed it; inherited by its forks.
static ALLOWED_BEFORE: OnceLock<CpuSet> = OnceLock::new();

/// The CPUs the calling thread may use.
pub(crate) fn allowed() -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is plain data, and the call writes at most its size.
    unsafe {
        let mut set: CpuSet = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<CpuSet>(), &mut set) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(set)
    }
}

/// Lets `pid` (0: the calling thread) use the CPUs in `set`.
pub(crate) fn allow(pid: i32, set: &CpuSet) -> io::Result<()> {
    // SAFETY: the call reads the set given, of the size given.
    if unsafe { libc::sched_setaffinity(pid, std::mem::size_of::<CpuSet>(), set) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPU the calling thread is running on.
pub(crate) fn current() -> Option<usize> {
    // SAFETY: sched_getcpu takes nothing.
    usize::try_from(unsafe { libc::sched_getcpu() }).ok()
}

/// How many CPUs are in `set`.
pub(crate) fn count(set: &CpuSet) -> usize {
    // SAFETY: reads the set given.
    usize::try_from(unsafe { libc::CPU_COUNT(set) }).unwrap_or(0)
}

/// The set of `cpu` alone.
fn only(cpu: usize) -> CpuSet {
    // SAFETY: cpu_set_t is plain data; CPU_SET ignores a CPU beyond the set's size.
    unsafe {
        let mut one: CpuSet = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut one);
        one
    }
}

/// `set` without `cpu`.
pub(crate) fn without(mut set: CpuSet, cpu: usize) -> CpuSet {
    // SAFETY: CPU_CLR ignores a CPU beyond the set's size.
    unsafe { libc::CPU_CLR(cpu, &mut set) };
    set
}

/// Keeps this process, and what it forks from here on, on the CPU it is running on, and
/// remembers what it was allowed for [`free_to_move`]. Meant for a single-threaded process,
/// once; a second call changes nothing. Best effort: on failure nothing is narrowed.
pub(crate) fn stay_here() {
    let (Ok(before), Some(here)) = (allowed(), current()) else {
        return;
    };
    if count(&before) < 2 || ALLOWED_BEFORE.set(before).is_err() {
        return;
    }
    let _ = allow(0, &only(here));
}

/// What this process was allowed before [`stay_here`], if it narrowed it.
pub(crate) fn allowed_before() -> Option<&'static CpuSet> {
    ALLOWED_BEFORE.get()
}

/// The CPUs this process may use, [`stay_here`] or not.
pub(crate) fn usable() -> io::Result<CpuSet> {
    allowed_before().copied().map_or_else(allowed, Ok)
}

/// Gives the calling process back the CPUs [`stay_here`] took away (a fork of a process that
/// called it, e.g. the command before it execs). Does nothing where nothing was taken.
pub(crate) fn free_to_move() {
    if let Some(before) = allowed_before() {
        let _ = allow(0, before);
    }
}

/// The command held on init's CPU through its `execve`, where the kernel would otherwise
/// move it: exec balances a task onto the CPU that looks least loaded, and the one init
/// (and `sidejob exec`, see [`stay_here`]) has just worked on looks the busier, so on a busy
/// machine the command went to the other CPU and waited there behind whatever ran on it.
///
/// Init holds itself to its CPU and makes itself real-time for the command's start
/// ([`hold_through_exec`]), from just before it detaches the host's tree: that `umount`
/// sleeps through an RCU grace period (`synchronize_rcu_expedited`), and init, woken without
/// priority, would wait for its CPU behind whatever ran there meanwhile. Its forks reset to
/// normal scheduling, and the command is forked on that CPU without its CPUs given back.
/// When the command's exec releases init (`CLONE_VFORK`), init, real-time on the same CPU,
/// runs before the command gets back to user space, gives it (and itself) back every CPU
/// ([`ExecHold::release`]) and returns to normal scheduling. So the command has every CPU
/// from its first instruction: nothing it forks keeps one CPU, and its own
/// `sched_setaffinity` comes after ours. Where init may not be real-time (no `CAP_SYS_NICE`,
/// a cgroup with no real-time budget), nothing is held and the command frees itself before
/// its exec, as before.
pub(crate) struct ExecHold {
    /// What the command (and init) may use.
    before: CpuSet,
    /// Whether init was narrowed here (not by [`stay_here`]) and is given `before` back too.
    narrowed_here: bool,
}

/// `sched_setscheduler` flag: children start with normal scheduling.
const SCHED_RESET_ON_FORK: libc::c_int = 0x4000_0000;

/// Sets the calling thread's scheduling policy.
fn set_policy(policy: libc::c_int, priority: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: the call reads the parameter given.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Holds the calling process (init, about to detach the host's tree and fork the command)
/// to the CPU it runs on and makes it real-time, so that the command can be held there
/// through its exec. `None`: nothing is held (one CPU, or no real-time allowed), and the
/// command must call [`free_to_move`] itself.
pub(crate) fn hold_through_exec() -> Option<ExecHold> {
    let (before, narrowed_here) = match allowed_before() {
        Some(before) => (*before, false),
        None => (allowed().ok()?, true),
    };
    if count(&before) < 2 {
        return None;
    }
    if narrowed_here {
        allow(0, &only(current()?)).ok()?;
    }
    let hold = ExecHold {
        before,
        narrowed_here,
    };
    if set_policy(libc::SCHED_FIFO | SCHED_RESET_ON_FORK, 1).is_err() {
        hold.give_back();
        return None;
    }
    Some(hold)
}

impl ExecHold {
    /// Gives `child` (the command, just exec'd) every CPU the caller allowed, and takes the
    /// calling process back to normal scheduling and to its CPUs.
    pub(crate) fn release(self, child: i32) {
        let _ = allow(child, &self.before);
        let _ = set_policy(libc::SCHED_OTHER, 0);
        self.give_back();
    }

    fn give_back(&self) {
        if self.narrowed_here {
            let _ = allow(0, &self.before);
        }
    }
}

/// The CPUs this process may use other than the one it runs on, when there are any.
pub(crate) fn elsewhere() -> Option<CpuSet> {
    let (set, here) = (usable().ok()?, current()?);
    (count(&set) > 1).then(|| without(set, here))
}

/// Moves the calling process off the CPU [`stay_here`] kept it on, to another it may use:
/// the work it has left (its exit's teardown, say) then runs beside the process it shared
/// that CPU with instead of ahead of it. Returns whether it moved; it cannot where
/// [`stay_here`] narrowed nothing or there is no other CPU.
pub(crate) fn leave_this_cpu() -> bool {
    allowed_before().is_some() && elsewhere().is_some_and(|set| allow(0, &set).is_ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn cpus(set: &CpuSet) -> Vec<usize> {
        // SAFETY: reads the set given.
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, set) })
            .collect()
    }

    /// Narrowed to the CPU it runs on, moved off it, then given back exactly what it had. (On
    /// a thread of its own: the calls change the calling thread's CPUs only.)
    #[test]
    fn stays_on_one_cpu_leaves_it_and_is_given_back_what_it_had() {
        let before = allowed().unwrap();
        if count(&before) < 2 {
            eprintln!("skipped: this machine lets us use one CPU only");
            return;
        }
        let (narrowed, here, left, moved, back) = std::thread::spawn(|| {
            stay_here();
            let narrowed = cpus(&allowed().unwrap());
            let here = current().unwrap();
            let left = leave_this_cpu();
            // sched_setaffinity has moved the thread before it returns.
            let moved = (current().unwrap(), cpus(&allowed().unwrap()));
            free_to_move();
            (narrowed, here, left, moved, cpus(&allowed().unwrap()))
        })
        .join()
        .unwrap();
        assert_eq!(narrowed, [here]);
        assert!(left, "leave_this_cpu found no other CPU");
        assert_ne!(moved.0, here, "still on CPU {here}");
        assert_eq!(moved.1, cpus(&without(before, here)));
        assert_eq!(back, cpus(&before));
        assert_eq!(cpus(allowed_before().unwrap()), cpus(&before));
    }

    #[test]
    fn without_takes_one_cpu_out() {
        // SAFETY: plain data, and CPUs within the set's size.
        let set = unsafe {
            let mut set: CpuSet = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::CPU_SET(3, &mut set);
            set
        };
        assert_eq!(cpus(&without(set, 0)), [3]);
        assert_eq!(count(&without(set, 7)), 2);
    }
}
