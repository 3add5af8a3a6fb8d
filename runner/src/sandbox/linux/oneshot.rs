//! bash's one-shot exec, without starting bash.
//!
//! `bash -c 'sleep 600'` starts bash (its loader and start-up cost about 1.2 ms of CPU, more
//! than the rest of the command's own start) only to search `PATH` and exec `sleep` in its
//! own place. When the script is one simple command of plain words (nothing bash would
//! expand, quote, redirect or run itself) the run's command does that last step itself: it
//! searches `PATH` as bash does and execs the program with the environment bash would have
//! given it (`_`, `SHLVL`, `PWD`). The process tree, argv, environment and exit status are
//! the same.
//!
//! Wherever the outcome could differ it execs bash as planned, and bash does and says exactly
//! what it always did: a script with a quote, `$`, glob, redirection or operator in it, a
//! builtin or keyword, an environment that changes how bash starts (`BASH_ENV`, exported
//! functions, `SHELLOPTS`, …), no program of that name, or a file bash would treat another
//! way (a script without `#!`, a missing interpreter, a file the run may not execute).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;

/// What bash would exec for a plain `bash -c SCRIPT`, worked out before the fork.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OneShot {
    /// The script's words: the program's argv.
    argv: Vec<CString>,
    /// Where to look for `argv[0]`: one candidate when it names a path, else one per `PATH`
    /// directory, in order.
    candidates: Vec<CString>,
    /// The environment without `_` and with bash's `SHLVL`; `PWD` is settled after `chdir`.
    env: Vec<CString>,
    /// The `PWD` the plan gives, if any: bash keeps it only if it is the working directory.
    pwd: Option<Vec<u8>>,
}

/// bash 5's builtins (`compgen -b`): bash runs these itself, so the script goes to bash.
const BUILTINS: &str = ". : [ alias bg bind break builtin caller cd command compgen complete \
    compopt continue declare dirs disown echo enable eval exec exit export false fc fg getopts \
    hash help history jobs kill let local logout mapfile popd printf pushd pwd read readarray \
    readonly return set shift shopt source suspend test times trap true type typeset ulimit \
    umask unalias unset wait";

/// bash's reserved words made of plain characters (`compgen -k`, less `{ } ! [[ ]]`).
const KEYWORDS: &str =
    "if then else elif fi case esac for select while until do done in function time coproc";

/// Variables that change how bash starts or what a command name means to it.
const BASH_STARTUP_VARS: &[&str] = &[
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "POSIXLY_CORRECT",
    "EXECIGNORE",
    "BASH_XTRACEFD",
    // bash drops an `OLDPWD` that is not a directory.
    "OLDPWD",
    // Debian's bash reads ~/.bashrc when it believes sshd started it.
    "SSH_CLIENT",
    "SSH2_CLIENT",
];

/// Bytes that stand for themselves in a bash word, wherever they are.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"_-./,:+@%".contains(&b)
}

/// The words of `script` if it is one simple command of plain words; `=` is allowed after
/// the first word (`dd if=x`), where bash takes it literally.
fn words(script: &str) -> Option<Vec<&str>> {
    let words: Vec<&str> = script
        .split([' ', '\t'])
        .filter(|w| !w.is_empty())
        .collect();
    let (first, rest) = words.split_first()?;
    // The command's name: no `=` (an assignment), no leading `%` (a job), and no leading `-`
    // or `+` (bash reads a script that starts with one as its own options).
    let name_ok = first.bytes().all(plain) && !first.starts_with(['%', '-', '+']);
    if !name_ok
        || !rest
            .iter()
            .all(|w| w.bytes().all(|b| plain(b) || b == b'='))
    {
        return None;
    }
    let listed = |list: &str| list.split_whitespace().any(|w| w == *first);
    if listed(BUILTINS) || listed(KEYWORDS) {
        return None;
    }
    Some(words)
}

/// bash's `SHLVL` after a one-shot exec: what it inherited, read as a number, when that is a
/// level bash keeps (anything else it warns about or rewrites: bash goes).
fn shell_level(inherited: Option<&str>) -> Option<&str> {
    let Some(v) = inherited else {
        return Some("0");
    };
    let canonical = v == "0" || (!v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit()));
    let level: u32 = v.parse().ok().filter(|_| canonical)?;
    (level <= 998).then_some(v)
}

/// Works out the one-shot exec for `argv` = `[…/bash, -c, SCRIPT]` with `env`, or `None` when
/// bash must run the script.
pub(crate) fn plan(
    program: &std::path::Path,
    argv: &[String],
    env: &[(String, String)],
) -> Option<OneShot> {
    if program.file_name()? != "bash" {
        return None;
    }
    let [_, flag, script] = argv else {
        return None;
    };
    if flag != "-c" {
        return None;
    }
    let words = words(script)?;
    if env
        .iter()
        .any(|(k, _)| k.starts_with("BASH_FUNC_") || BASH_STARTUP_VARS.contains(&k.as_str()))
    {
        return None;
    }
    // A name given twice (a call's `env` over the profile's) holds its last value, as in bash.
    let mut last: Vec<(&str, &str)> = Vec::with_capacity(env.len());
    for (k, v) in env {
        match last.iter_mut().find(|(name, _)| name == k) {
            Some(slot) => slot.1 = v,
            None => last.push((k, v)),
        }
    }
    let env = last;
    let get = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let name = words[0];
    let candidates: Vec<String> = if name.contains('/') {
        vec![name.to_owned()]
    } else {
        let dirs: Vec<&str> = get("PATH")?.split(':').collect();
        // An empty, relative or slash-ended entry: bash spells `_` its own way.
        if dirs.iter().any(|d| !d.starts_with('/') || d.ends_with('/')) {
            return None;
        }
        dirs.iter().map(|d| format!("{d}/{name}")).collect()
    };
    let level = shell_level(get("SHLVL"))?;
    let cstr = |s: &str| CString::new(s).ok();
    let mut vars: Vec<CString> = Vec::with_capacity(env.len() + 2);
    for (k, v) in &env {
        if !matches!(*k, "_" | "PWD" | "SHLVL") {
            vars.push(cstr(&format!("{k}={v}"))?);
        }
    }
    vars.push(cstr(&format!("SHLVL={level}"))?);
    Some(OneShot {
        argv: words.iter().map(|w| cstr(w)).collect::<Option<_>>()?,
        candidates: candidates.iter().map(|c| cstr(c)).collect::<Option<_>>()?,
        env: vars,
        pwd: get("PWD").map(|p| p.as_bytes().to_vec()),
    })
}

/// Execs the program as bash would have, in the command's process after its confinement.
/// Returns only when bash must run the script after all (see the module's doc); nothing has
/// changed then.
pub(crate) fn exec(o: &OneShot) {
    if let Ok(cwd) = std::env::current_dir() {
        attempt(o, cwd.as_os_str().as_bytes(), crate::sys::execve);
    }
}

/// [`exec`]'s search in the working directory `cwd`, with `execve` passed in: it returns only
/// on failure, and every failure but "nothing there" ends the search.
fn attempt(
    o: &OneShot,
    cwd: &[u8],
    mut execve: impl FnMut(&CString, &[CString], &[CString]) -> std::io::Error,
) {
    if o.pwd.as_deref().is_some_and(|p| p != cwd) {
        return;
    }
    let var = |name: &[u8], value: &[u8]| CString::new([name, value].concat()).ok();
    let Some(pwd) = var(b"PWD=", cwd) else {
        return;
    };
    let mut env = o.env.clone();
    env.push(pwd);
    let last = env.len();
    for candidate in &o.candidates {
        // bash names the program it found in `_`.
        let Some(underscore) = var(b"_=", candidate.as_bytes()) else {
            return;
        };
        env.truncate(last);
        env.push(underscore);
        let err = execve(candidate, &o.argv, &env);
        match err.raw_os_error() {
            // Nothing there: bash looks on. Something there that exec could not start (a
            // script whose interpreter is missing) is bash's to report.
            Some(libc::ENOENT) | Some(libc::ENOTDIR) if !exists(candidate) => continue,
            _ => return,
        }
    }
}

/// Whether `path` names something (following symlinks), as bash's `stat` would see it.
fn exists(path: &CString) -> bool {
    match std::fs::metadata(std::ffi::OsStr::from_bytes(path.as_bytes())) {
        Ok(_) => true,
        Err(e) => ![Some(libc::ENOENT), Some(libc::ENOTDIR)].contains(&e.raw_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn bash(script: &str) -> Vec<String> {
        vec!["/bin/bash".into(), "-c".into(), script.into()]
    }

    #[test]
    fn only_plain_simple_commands_skip_bash() {
        let e = env(&[("PATH", "/usr/bin:/bin")]);
        let plan = |s: &str| super::plan(Path::new("/bin/bash"), &bash(s), &e);
        for s in [
            "sleep 600",
            "  cargo test --release -p x  ",
            "dd if=/dev/zero of=out bs=1M count=1",
            "./build.sh",
            "git log -3 --format=%H",
            "\tls\t-la ",
        ] {
            assert!(plan(s).is_some(), "{s:?} should skip bash");
        }
        for s in [
            "",
            "   ",
            "true",
            "echo hi",
            "cd /tmp",
            "exec sleep 1",
            ". x",
            "[ -f x ]",
            "if",
            "time sleep 1",
            "A=1 sleep 1",
            "sleep 1; ls",
            "sleep 1 && ls",
            "ls | cat",
            "ls > out",
            "ls *.rs",
            "ls ?",
            "echo $HOME",
            "ls ~",
            "ls 'a b'",
            "ls \"a\"",
            "ls a\\ b",
            "ls {a,b}",
            "ls # comment",
            "ls\nls",
            "ls `pwd`",
            "ls (x)",
            "ls !x",
            "ls é",
            "%1",
            "-x",
            "--version",
            "+x ls",
        ] {
            assert!(plan(s).is_none(), "{s:?} should go to bash");
        }
    }

    #[test]
    fn only_bash_dash_c_with_one_script_is_taken() {
        let e = env(&[("PATH", "/usr/bin")]);
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(plan(Path::new("/usr/bin/bash"), &argv(&["bash", "-c", "ls"]), &e).is_some());
        assert!(plan(Path::new("/bin/sh"), &argv(&["sh", "-c", "ls"]), &e).is_none());
        assert!(plan(
            Path::new("/bin/bash"),
            &argv(&["bash", "-c", "ls", "x"]),
            &e
        )
        .is_none());
        assert!(plan(Path::new("/bin/bash"), &argv(&["bash", "-e", "ls"]), &e).is_none());
        assert!(plan(Path::new("/bin/bash"), &argv(&["bash", "x.sh"]), &e).is_none());
    }

    #[test]
    fn an_environment_that_changes_bash_sends_the_script_to_bash() {
        let go = |pairs: &[(&str, &str)]| plan(Path::new("/bin/bash"), &bash("ls"), &env(pairs));
        assert!(go(&[("PATH", "/usr/bin")]).is_some());
        for pairs in [
            &[("PATH", "/usr/bin"), ("BASH_ENV", "/x")][..],
            &[("PATH", "/usr/bin"), ("BASH_FUNC_ls%%", "() { :; }")],
            &[("PATH", "/usr/bin"), ("SHELLOPTS", "xtrace")],
            &[("PATH", "/usr/bin"), ("OLDPWD", "/x")],
            &[("PATH", "/usr/bin"), ("SSH_CLIENT", "1 2 3")],
            &[("PATH", "/usr/bin"), ("SHLVL", "999")],
            &[("PATH", "/usr/bin"), ("SHLVL", "007")],
            &[("PATH", "/usr/bin"), ("SHLVL", "-1")],
            &[("PATH", "/usr/bin:")],
            &[("PATH", "bin:/usr/bin")],
            &[("PATH", "/usr/bin/")],
            &[],
        ] {
            assert!(go(pairs).is_none(), "{pairs:?}");
        }
        // A path needs no PATH.
        assert!(plan(Path::new("/bin/bash"), &bash("/usr/bin/ls"), &env(&[])).is_some());
    }

    /// Runs `script` with exactly `vars` in `dir`, through [`attempt`] (whose exec is a real
    /// spawn) or through real bash. Returns the sorted lines the program printed and its exit
    /// code; `(_, 90)` when the one-shot hands the script to bash.
    fn run(dir: &Path, script: &str, vars: &[(&str, &str)], via_bash: bool) -> (Vec<String>, i32) {
        use std::os::unix::process::CommandExt;
        if via_bash {
            let out = std::process::Command::new("/bin/bash")
                .args(["-c", script])
                .env_clear()
                .envs(vars.iter().copied())
                .current_dir(dir)
                .output()
                .unwrap();
            return (sorted(&out.stdout), out.status.code().unwrap_or(-1));
        }
        let o = plan(Path::new("/bin/bash"), &bash(script), &env(vars)).expect("one-shot");
        let mut ran = None;
        attempt(&o, dir.as_os_str().as_bytes(), |path, argv, envp| {
            let text = |c: &CString| std::ffi::OsStr::from_bytes(c.as_bytes()).to_owned();
            let pairs = envp.iter().map(|kv| {
                let kv = kv.to_str().unwrap();
                let (k, v) = kv.split_once('=').unwrap();
                (k.to_owned(), v.to_owned())
            });
            match std::process::Command::new(text(path))
                .arg0(text(&argv[0]))
                .args(argv[1..].iter().map(text))
                .env_clear()
                .envs(pairs)
                .current_dir(dir)
                .output()
            {
                Ok(out) => {
                    ran = Some((sorted(&out.stdout), out.status.code().unwrap_or(-1)));
                    std::io::Error::other("ran")
                }
                Err(e) => e,
            }
        });
        ran.unwrap_or((Vec::new(), 90))
    }

    fn sorted(out: &[u8]) -> Vec<String> {
        let mut lines: Vec<String> = String::from_utf8_lossy(out)
            .lines()
            .map(String::from)
            .collect();
        lines.sort();
        lines
    }

    #[test]
    fn the_program_sees_what_bash_would_have_given_it() {
        let dir = crate::scratch::ScratchDir::new("oneshot");
        let d = dir.path().canonicalize().unwrap();
        let ds = d.to_str().unwrap();
        for vars in [
            vec![("PATH", "/nonexistent:/usr/bin:/bin")],
            vec![
                ("PATH", "/usr/bin"),
                ("SHLVL", "3"),
                ("PWD", ds),
                ("_", "stale"),
            ],
            vec![
                ("PATH", "/usr/bin"),
                ("SHLVL", "0"),
                ("HOME", "/h"),
                ("A-B", "1"),
            ],
        ] {
            for script in ["env", "/usr/bin/env", "env -u HOME"] {
                let direct = run(&d, script, &vars, false);
                let bash = run(&d, script, &vars, true);
                assert_eq!(direct, bash, "{script} with {vars:?}");
                assert_eq!(direct.1, 0);
            }
        }
    }

    #[test]
    fn what_bash_would_treat_otherwise_goes_to_bash() {
        use std::os::unix::fs::PermissionsExt;
        let dir = crate::scratch::ScratchDir::new("oneshot");
        let d = dir.path().canonicalize().unwrap();
        let (first, second) = (d.join("first"), d.join("second"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        let exe = |p: &Path, text: &str| {
            std::fs::write(p, text).unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        // The first of each name is one bash runs its own way; the second one must not run.
        exe(&first.join("noshebang"), "echo from-script\n");
        exe(&first.join("badinterp"), "#!/nonexistent/interp\necho no\n");
        std::fs::write(first.join("notexec"), "#!/bin/sh\necho no\n").unwrap();
        for name in ["noshebang", "badinterp", "notexec"] {
            exe(&second.join(name), "#!/bin/sh\necho second\n");
        }
        let path = format!("{}:{}", first.display(), second.display());
        let vars = [("PATH", path.as_str())];
        // Each returns to the caller (exit 90 above), where bash would then run it.
        for name in ["noshebang", "badinterp"] {
            assert_eq!(run(&d, name, &vars, false).1, 90, "{name}");
        }
        // A file the run may not execute: root may run anything with an x bit, so this one
        // has none; bash skips it and runs the second, and so does the one-shot (it hands
        // over to bash, which does).
        assert_eq!(run(&d, "notexec", &vars, false).1, 90);
        assert_eq!(run(&d, "notexec", &vars, true).0, ["second"]);
        // Nothing of the name anywhere: bash says "command not found".
        assert_eq!(run(&d, "no-such-program-here", &vars, false).1, 90);
        // A PWD that is not the working directory: bash would rewrite or keep it.
        let other = [("PATH", "/usr/bin"), ("PWD", "/elsewhere")];
        assert_eq!(run(&d, "env", &other, false).1, 90);
    }
}
