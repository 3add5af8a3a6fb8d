//! Real builds in the sandbox: the shipped toolchain profiles (the caller's toolchain from
//! `{home}` read-only, persistent caches), `sidejob exec --read/--write/--allow/--env NAME`,
//! the hint for a command outside the view, and caches kept per owner, profile and workspace.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sidejob_tests::net::HttpServer;
use sidejob_tests::{sidejob_bin, TempDir};

use crate::containment::{exec_env, Out, Ws};
use crate::network::allow_profile;

/// `sidejob exec` with its own state directory (where caches are kept).
fn exec_in(ws: &Ws, state: &Path, extra: &[&str], cmd: &[&str]) -> Out {
    exec_env(
        ws,
        extra,
        cmd,
        &[("SIDEJOB_STATE_DIR", state.to_str().unwrap())],
    )
}

/// The caches `sidejob cache list --json` shows for the state directory `state`.
pub(crate) fn cache_list(state: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(sidejob_bin())
        .args(["cache", "list", "--json", "--state-dir"])
        .arg(state)
        .stdin(Stdio::null())
        .output()
        .expect("sidejob cache list");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .expect("cache list json")
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Where the cache `name` of `profile` for runs in `workspace` is on the host, as `sidejob
/// cache list` says (the run that made it has run).
pub(crate) fn cache_path(state: &Path, profile: &str, workspace: &Path, name: &str) -> PathBuf {
    let workspace = workspace.canonicalize().expect("workspace");
    let list = cache_list(state);
    let found = list.iter().find(|c| {
        c["profile"] == profile
            && c["name"] == name
            && c["workspace"].as_str() == workspace.to_str()
    });
    PathBuf::from(found.and_then(|c| c["path"].as_str()).unwrap_or_else(|| {
        panic!(
            "no cache {name} of {profile} in {}: {list:?}",
            workspace.display()
        )
    }))
}

fn home() -> PathBuf {
    let out = Command::new("getent")
        .args(["passwd", "0"])
        .output()
        .expect("getent");
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    PathBuf::from(line.trim().split(':').nth(5).unwrap_or("/root"))
}

/// The host's cached `libc` crate and its sparse-index entry, to warm a Cargo cache with.
fn host_libc() -> Option<(PathBuf, PathBuf, String)> {
    let registry = home().join(".cargo/registry");
    for index in std::fs::read_dir(registry.join("index")).ok()?.flatten() {
        let name = index.file_name().to_string_lossy().into_owned();
        let entry = index.path().join(".cache/li/bc/libc");
        if !entry.exists() {
            continue;
        }
        let cache = registry.join("cache").join(&name);
        let krate = std::fs::read_dir(&cache).ok()?.flatten().find(|e| {
            let f = e.file_name().to_string_lossy().into_owned();
            f.starts_with("libc-0.2.") && f.ends_with(".crate")
        })?;
        let version = krate
            .file_name()
            .to_string_lossy()
            .trim_start_matches("libc-")
            .trim_end_matches(".crate")
            .to_owned();
        return Some((index.path(), krate.path(), version));
    }
    None
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} → {}: {e}", from.display(), to.display()));
}

#[test]
fn a_cargo_project_builds_offline_from_a_warm_cache_under_the_rust_profile() {
    let Some(ws) = Ws::new() else { return };
    let h = home();
    let Some((index, krate, version)) = host_libc() else {
        eprintln!(
            "SKIPPED: no cached libc crate in {}/.cargo/registry to warm the cache with",
            h.display()
        );
        return;
    };
    if sidejob_tests::skip_unless(
        h.join(".cargo/bin/cargo").exists() && h.join(".rustup").is_dir(),
        "the rust profile uses a rustup toolchain in the caller's home",
    ) {
        return;
    }
    let state = TempDir::new("state");
    std::fs::create_dir_all(ws.path().join("src")).unwrap();
    std::fs::write(
        ws.path().join("Cargo.toml"),
        format!("[package]\nname = \"warm\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nlibc = \"={version}\"\n"),
    )
    .unwrap();
    std::fs::write(
        ws.path().join("src/main.rs"),
        "fn main() { println!(\"built with libc, page size {}\", unsafe { libc::sysconf(libc::_SC_PAGESIZE) }); }\n",
    )
    .unwrap();
    let build = ["cargo", "run", "--offline", "-q"];
    // Control: with a cold cache, an offline build cannot find the dependency.
    let cold = exec_in(&ws, state.path(), &["--profile", "rust"], &build);
    assert_ne!(cold.code, 0, "{}\n{}", cold.stdout, cold.stderr);
    // (The command's stderr is exec's stderr: its stdout and stderr are two pipes here.)
    assert!(cold.stderr.contains("libc"), "{}", cold.stderr);
    // Warm the cache as an earlier networked run would have: the index entry and the crate.
    let cache = cache_path(state.path(), "rust", ws.path(), "cargo").join("registry");
    let index_name = index.file_name().unwrap();
    copy(
        &index.join(".cache/li/bc/libc"),
        &cache
            .join("index")
            .join(index_name)
            .join(".cache/li/bc/libc"),
    );
    if index.join("config.json").exists() {
        copy(
            &index.join("config.json"),
            &cache.join("index").join(index_name).join("config.json"),
        );
    }
    copy(
        &krate,
        &cache
            .join("cache")
            .join(index_name)
            .join(krate.file_name().unwrap()),
    );
    let warm = exec_in(&ws, state.path(), &["--profile", "rust"], &build);
    assert_eq!(warm.code, 0, "{}\n{}", warm.stdout, warm.stderr);
    assert!(
        warm.stdout.contains("built with libc, page size"),
        "{}",
        warm.stdout
    );
    // The cache kept what the build unpacked, for the next run.
    assert!(std::fs::read_dir(cache.join("src")).is_ok_and(|mut d| d.next().is_some()));
    // The toolchain itself stayed read-only.
    let ro = exec_in(
        &ws,
        state.path(),
        &["--profile", "rust"],
        &[
            "sh",
            "-c",
            &format!("touch {}/.rustup/sidejob-probe 2>&1; echo $?", h.display()),
        ],
    );
    assert!(ro.stdout.contains("Read-only file system"), "{}", ro.stdout);
}

#[test]
fn a_python_projects_tests_run_under_the_python_profile() {
    let Some(ws) = Ws::new() else { return };
    let state = TempDir::new("state");
    std::fs::create_dir_all(ws.path().join("calc")).unwrap();
    std::fs::write(
        ws.path().join("calc/__init__.py"),
        "def add(a, b):\n    return a + b\n",
    )
    .unwrap();
    std::fs::write(
        ws.path().join("test_calc.py"),
        "import sys, unittest\nfrom calc import add\n\nclass T(unittest.TestCase):\n    def test_add(self):\n        print('python', sys.executable)\n        self.assertEqual(add(2, 3), 5)\n\nif __name__ == '__main__':\n    unittest.main()\n",
    )
    .unwrap();
    let out = exec_in(
        &ws,
        state.path(),
        &["--profile", "python"],
        &["python3", "-m", "unittest", "-v"],
    );
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    // unittest reports on stderr, which stays exec's stderr.
    assert!(
        out.stderr.contains("Ran 1 test") && out.stderr.contains("OK"),
        "{}",
        out.stderr
    );
    // The caller's pyenv, when there is one, is the interpreter the profile finds first.
    if home().join(".pyenv/shims/python3").exists() {
        assert!(
            out.stdout
                .contains(&format!("python {}/.pyenv/versions/", home().display())),
            "{}",
            out.stdout
        );
        // Control: under ci, whose view has no home, the same interpreter is not there.
        let ci = exec_in(
            &ws,
            state.path(),
            &["--profile", "ci"],
            &[&format!("{}/.pyenv/shims/python3", home().display()), "-V"],
        );
        assert_eq!(ci.code, 127, "{}", ci.stderr);
    }
    // The pip cache is the profile's own, writable.
    let cache = exec_in(
        &ws,
        state.path(),
        &["--profile", "python"],
        &["sh", "-c", "touch $PIP_CACHE_DIR/x && echo cache-ok"],
    );
    assert!(
        cache.stdout.contains("cache-ok"),
        "{}\n{}",
        cache.stdout,
        cache.stderr
    );
}

#[test]
fn a_command_outside_the_view_fails_with_a_hint_naming_the_profile_key() {
    let Some(ws) = Ws::new() else { return };
    let cargo = home().join(".cargo/bin/cargo");
    if sidejob_tests::skip_unless(cargo.exists(), "needs cargo in the caller's home") {
        return;
    }
    let state = TempDir::new("state");
    let path = format!("{}:/usr/bin:/bin", cargo.parent().unwrap().display());
    // Not on the profile's PATH: the hint names env.set.PATH and [paths] executable.
    let out = exec_env(
        &ws,
        &["--profile", "ci"],
        &["cargo", "--version"],
        &[
            ("PATH", &path),
            ("SIDEJOB_STATE_DIR", state.path().to_str().unwrap()),
        ],
    );
    assert_eq!(out.code, 127, "{}", out.stderr);
    assert!(
        out.stderr
            .contains("command not found in the sandbox: cargo"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("[paths] executable") && out.stderr.contains("env.set.PATH"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("\"{home}/.cargo/bin\""),
        "{}",
        out.stderr
    );
    // On the PATH (passed with --env PATH) but not in the view: the hint names the view.
    let out = exec_env(
        &ws,
        &["--profile", "ci", "--env", "PATH"],
        &["cargo", "--version"],
        &[
            ("PATH", &path),
            ("SIDEJOB_STATE_DIR", state.path().to_str().unwrap()),
        ],
    );
    assert_eq!(out.code, 127, "{}", out.stderr);
    assert!(
        out.stderr.contains("outside this profile's view")
            && out.stderr.contains("[paths] executable"),
        "{}",
        out.stderr
    );
    // Control: the rust profile has it.
    let ok = exec_in(
        &ws,
        state.path(),
        &["--profile", "rust"],
        &["cargo", "--version"],
    );
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert!(ok.stdout.starts_with("cargo "), "{}", ok.stdout);
}

#[test]
fn exec_flags_add_paths_hosts_and_the_callers_variables_for_one_run() {
    let Some(ws) = Ws::new() else { return };
    let state = TempDir::new("state");
    let outside = ws.outside.path().join("notes.txt");
    std::fs::write(&outside, "READ-ME").unwrap();
    let out_dir = TempDir::new("writable");
    let srv = HttpServer::start();
    let port = srv.port;
    // Names but no allow rule: everything is refused unless --allow adds it.
    let p = allow_profile(
        &ws,
        "hostsonly",
        "hosts = { \"models.test\" = \"127.0.0.1\" }",
    );
    let script = format!(
        "cat {f}; echo written > {d}/w && echo write-ok; echo \"FOO=$FOO\"; curl -sS -m 10 http://models.test:{port}/flag",
        f = outside.display(),
        d = out_dir.path().display()
    );
    let run = |extra: &[&str]| {
        let mut args = vec!["--profile", &p];
        args.extend_from_slice(extra);
        exec_env(
            &ws,
            &args,
            &["sh", "-c", &script],
            &[
                ("FOO", "from-caller"),
                ("SIDEJOB_STATE_DIR", state.path().to_str().unwrap()),
            ],
        )
    };
    // Control: without the flags, none of it.
    let plain = run(&[]);
    assert!(!plain.stdout.contains("READ-ME"), "{}", plain.stdout);
    assert!(!plain.stdout.contains("write-ok"), "{}", plain.stdout);
    assert!(plain.stdout.contains("FOO=\n"), "{}", plain.stdout);
    assert!(
        plain
            .stdout
            .contains("not on the profile's network.allow list"),
        "{}",
        plain.stdout
    );
    let lo = format!("127.0.0.1:{port}");
    let with = run(&[
        "--read",
        outside.to_str().unwrap(),
        "--write",
        out_dir.path().to_str().unwrap(),
        "--allow",
        "models.test",
        "--allow",
        &lo,
        "--env",
        "FOO",
    ]);
    assert!(
        with.stdout.contains("READ-ME"),
        "{}\n{}",
        with.stdout,
        with.stderr
    );
    assert!(with.stdout.contains("write-ok"), "{}", with.stdout);
    assert_eq!(
        std::fs::read_to_string(out_dir.path().join("w")).unwrap(),
        "written\n"
    );
    assert!(with.stdout.contains("FOO=from-caller"), "{}", with.stdout);
    assert!(
        with.stdout.contains("hello /flag via models.test"),
        "{}",
        with.stdout
    );
    // --allow on a profile without a network turns on an allow-list with just that.
    let none = exec_env(
        &ws,
        &["--profile", "workspace-write", "--allow", "models.test"],
        &["sh", "-c", "echo \"$HTTPS_PROXY\""],
        &[],
    );
    assert!(
        none.stdout.contains("http://127.0.0.1:3128"),
        "{}",
        none.stdout
    );
}

#[test]
fn caches_persist_per_profile_are_listed_by_doctor_and_cleared() {
    let Some(ws) = Ws::new() else { return };
    let state = TempDir::new("state");
    let p = ws.profile(
        "keeper",
        "extends = \"workspace-write\"\n[caches]\nstuff = \"/cache/stuff\"\n",
    );
    let q = ws.profile(
        "other",
        "extends = \"workspace-write\"\n[caches]\nstuff = \"/cache/stuff\"\n",
    );
    let write = exec_in(
        &ws,
        state.path(),
        &["--profile", &p],
        &["sh", "-c", "echo kept > /cache/stuff/f && echo wrote"],
    );
    assert!(
        write.stdout.contains("wrote"),
        "{}\n{}",
        write.stdout,
        write.stderr
    );
    let read = exec_in(
        &ws,
        state.path(),
        &["--profile", &p],
        &["cat", "/cache/stuff/f"],
    );
    assert_eq!(read.stdout, "kept\n", "{}", read.stderr);
    // Control: another profile has a cache of its own.
    let other = exec_in(
        &ws,
        state.path(),
        &["--profile", &q],
        &["sh", "-c", "ls -A /cache/stuff | wc -l"],
    );
    assert_eq!(other.stdout.trim(), "0", "{}", other.stdout);
    let doctor = Command::new(sidejob_bin())
        .args(["doctor", "--json"])
        .env("SIDEJOB_STATE_DIR", state.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let entries = report["caches"]["entries"].as_array().unwrap();
    assert!(
        entries.iter().any(|c| c["profile"] == "keeper"
            && c["name"] == "stuff"
            && c["bytes"].as_u64() > Some(0)),
        "{report}"
    );
    let clear = Command::new(sidejob_bin())
        .args(["cache", "clear", "--profile", "keeper"])
        .env("SIDEJOB_STATE_DIR", state.path())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&clear.stdout).contains("removed"),
        "{clear:?}"
    );
    let gone = exec_in(
        &ws,
        state.path(),
        &["--profile", &p],
        &["sh", "-c", "cat /cache/stuff/f 2>/dev/null || echo empty"],
    );
    assert_eq!(gone.stdout, "empty\n");
}

#[test]
fn a_profile_file_that_extends_an_unknown_profile_is_refused_with_its_line() {
    let Some(ws) = Ws::new() else { return };
    let p = ws.profile(
        "orphan",
        "description = \"x\"\nextends = \"no-such-profile\"\n",
    );
    let out = crate::containment::exec(&ws, &["--profile", &p], &["true"]);
    assert_eq!(out.code, 125);
    assert!(
        out.stderr
            .contains("orphan.toml:2: extends: unknown profile \"no-such-profile\""),
        "{}",
        out.stderr
    );
    // Control: extending a shipped profile works.
    let ok = ws.profile("child", "extends = \"read-only\"\n");
    assert_eq!(
        crate::containment::exec(&ws, &["--profile", &ok], &["true"]).code,
        0
    );
}
