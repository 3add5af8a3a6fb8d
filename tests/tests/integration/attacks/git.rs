//! Class 4 of issue 8: nothing a run writes makes the host's git run code or read
//! configuration the run chose. Hooks (even where `hooks/` was missing), `config`,
//! `commondir` and a submodule's git directory are out of the run's reach; a `git init`
//! below a host repository stays in the run (and is reported); commits inside the sandbox
//! still work. Each attack plants an `fsmonitor` or a hook that would touch a marker file
//! outside the workspace, then runs host git and looks for the marker.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use sidejob_tests::{skip_unless, Client, Daemon, TempDir};

use super::{has, present, result_json};
use sidejob_tests::{skip_without, Need};

/// Host git in `dir`, with a fixed identity and no inherited `GIT_*` variables.
fn git(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut c = Command::new("git");
    c.arg("-C")
        .arg(dir)
        .args(["-c", "user.name=host", "-c", "user.email=host@example.com"])
        .args(["-c", "protocol.file.allow=always"])
        .args(args);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GIT_") {
            c.env_remove(k);
        }
    }
    c.output().expect("run git")
}

/// Host git that must succeed; returns its stdout.
fn git_ok(dir: &Path, args: &[&str]) -> String {
    let o = git(dir, args);
    assert!(
        o.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A repository with one commit.
fn repo(dir: &Path) {
    git_ok(dir, &["init", "-q", "."]);
    std::fs::write(dir.join("README"), "hello\n").expect("README");
    git_ok(dir, &["add", "README"]);
    git_ok(dir, &["commit", "-q", "-m", "initial"]);
}

/// The test's fixtures: a root daemon, a repository as its workspace, and a directory
/// outside it for marker files.
struct Fixture {
    _d: Daemon,
    c: Client,
    session: String,
    ws: TempDir,
    outside: TempDir,
}

impl Fixture {
    fn new() -> Option<Fixture> {
        Self::with(repo)
    }

    /// Sets the workspace up with `setup`, then opens a root session on `workspace(ws)`.
    fn with(setup: impl FnOnce(&Path)) -> Option<Fixture> {
        Self::in_dir(setup, |ws| ws.to_path_buf())
    }

    fn in_dir(
        setup: impl FnOnce(&Path),
        workspace: impl FnOnce(&Path) -> PathBuf,
    ) -> Option<Fixture> {
        if skip_without(&[Need::Root]) || skip_unless(has("git"), "git is not installed") {
            return None;
        }
        let ws = TempDir::new("git-ws");
        setup(ws.path());
        let d = Daemon::start();
        let mut c = d.client();
        let session = c.ok("session.open", json!({"workspace": workspace(ws.path())}))
            ["session_id"]
            .as_str()
            .expect("session_id")
            .to_owned();
        Some(Fixture {
            _d: d,
            c,
            session,
            ws,
            outside: TempDir::new("git-outside"),
        })
    }

    fn ws(&self) -> &Path {
        self.ws.path()
    }

    fn marker(&self, name: &str) -> PathBuf {
        self.outside.path().join(name)
    }

    /// Runs `script` in the session and returns the settled call.
    fn run(&mut self, script: &str) -> Value {
        let r = self
            .c
            .bash(&self.session, script, json!({"yield_after_ms": 120_000}));
        eprintln!("run output:\n{}", r["output"].as_str().unwrap_or(""));
        r
    }
}

/// An `fsmonitor` command that touches `marker` (and reports no changes).
fn fsmonitor(marker: &Path) -> String {
    format!("touch {}; false", marker.display())
}

#[test]
fn attack_git_hook_planted_where_hooks_was_missing_never_runs_on_the_host() {
    let Some(mut f) = Fixture::with(|ws| {
        repo(ws);
        std::fs::remove_dir_all(ws.join(".git/hooks")).expect("rm hooks");
    }) else {
        return;
    };
    let marker = f.marker("hook-ran");
    let hook = format!("#!/bin/sh\ntouch {}\n", marker.display());
    f.run(&format!(
        "mkdir -p .git/hooks; printf '{hook}' > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; \
         echo planted=$?"
    ));
    let planted = f.ws().join(".git/hooks/pre-commit");
    assert!(!present(&planted), "the run planted {}", planted.display());
    git_ok(
        f.ws(),
        &["commit", "-q", "--allow-empty", "-m", "host commit"],
    );
    assert!(!present(&marker), "host git ran a hook the run planted");

    // Positive control: the same hook, put there by the host, runs on its next commit.
    std::fs::write(&planted, &hook).expect("write hook");
    super::set_mode(&planted, 0o755);
    git_ok(f.ws(), &["commit", "-q", "--allow-empty", "-m", "control"]);
    assert!(
        present(&marker),
        "control: the hook did not run, so the test proves nothing"
    );
}

#[test]
fn attack_git_commondir_and_config_cannot_make_host_git_run_a_command() {
    let Some(mut f) = Fixture::new() else { return };
    let marker = f.marker("fsmonitor-ran");
    let config_before = std::fs::read(f.ws().join(".git/config")).expect("config");
    let monitor = fsmonitor(&marker);
    f.run(&format!(
        r#"echo "commondir during the run: $(cat .git/commondir)"
cp -r .git evil && git config -f evil/config core.fsmonitor '{monitor}'
printf '../evil\n' > .git/commondir; echo commondir=$?
git config core.fsmonitor '{monitor}'; echo config=$?
git config core.hooksPath /tmp; echo hookspath=$?
printf '[include]\n\tpath = ../evil/config\n' >> .git/config; echo include=$?
rm -f .git/config; echo rm-config=$?
"#
    ));
    assert!(
        !present(&f.ws().join(".git/commondir")),
        "a commondir is left in the host's repository"
    );
    assert_eq!(
        std::fs::read(f.ws().join(".git/config")).expect("config"),
        config_before,
        "the run changed .git/config"
    );
    git_ok(f.ws(), &["status", "--short"]);
    assert!(!present(&marker), "host git status ran the run's fsmonitor");

    // Positive controls: the fsmonitor runs on this host's git, and the planted directory
    // would have been used had commondir named it.
    std::fs::write(f.ws().join(".git/commondir"), "../evil\n").expect("commondir");
    git_ok(f.ws(), &["status", "--short"]);
    std::fs::remove_file(f.ws().join(".git/commondir")).expect("rm commondir");
    assert!(
        present(&marker),
        "control: the planted commondir did not make git run the fsmonitor"
    );
}

/// The stand-ins are the run's only: `commondir` exists during the run and is gone after
/// it. Positive control for the class: git inside the sandbox still commits (objects, refs,
/// index and logs stay writable), and the host sees the commit.
#[test]
fn attack_git_commondir_stand_in_lives_only_as_long_as_the_run_and_commits_still_work() {
    let Some(mut f) = Fixture::new() else { return };
    let r = f.run(
        "cat .git/commondir && echo more > file && git add file && \
         git -c user.name=run -c user.email=run@example.com commit -q -m 'made in the sandbox'",
    );
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], ".\n", "commondir during the run: {r}");
    assert!(
        !present(&f.ws().join(".git/commondir")),
        "the commondir stand-in outlived the run"
    );
    assert_eq!(
        git_ok(f.ws(), &["log", "-1", "--format=%s"]),
        "made in the sandbox\n"
    );
    assert_eq!(git_ok(f.ws(), &["status", "--porcelain"]), "");
}

#[test]
fn attack_git_init_below_a_host_repository_stays_in_the_run() {
    let Some(mut f) = Fixture::in_dir(
        |ws| {
            repo(ws);
            std::fs::create_dir(ws.join("sub")).expect("sub");
            std::fs::write(ws.join("sub/file"), "x\n").expect("file");
        },
        |ws| ws.join("sub"),
    ) else {
        return;
    };
    let sub = f.ws().join("sub");
    let r = f.run(
        "git init -q . && git -c user.name=run -c user.email=run@example.com commit -q --allow-empty -m inner \
         && git rev-parse --show-toplevel",
    );
    // Inside the run, the repository it made is real (it is the run's to use).
    assert_eq!(r["state"], "succeeded", "{r}");
    assert_eq!(r["output"], format!("{}\n", sub.display()), "{r}");
    assert!(
        !present(&sub.join(".git")),
        "the run's git init left {} on the host",
        sub.join(".git").display()
    );
    assert_eq!(
        git_ok(&sub, &["rev-parse", "--show-toplevel"]),
        format!("{}\n", f.ws().display()),
        "host git no longer finds the parent repository"
    );
    let result = result_json(&r);
    let violations = result["violations"].as_array().cloned().unwrap_or_default();
    assert!(
        violations.iter().any(|v| v == "git_repository"),
        "result.json does not report the git init: {result}"
    );
}

#[test]
fn attack_git_submodule_git_dir_config_and_hooks_are_protected() {
    let Some(mut f) = Fixture::with(|ws| {
        let sub_src = PathBuf::from(format!("{}-sub-src", ws.display()));
        std::fs::create_dir(&sub_src).expect("sub src");
        repo(&sub_src);
        repo(ws);
        git_ok(
            ws,
            &[
                "submodule",
                "add",
                "-q",
                &sub_src.display().to_string(),
                "x",
            ],
        );
        git_ok(ws, &["commit", "-q", "-m", "add x"]);
        std::fs::remove_dir_all(&sub_src).expect("rm sub src");
        std::fs::remove_dir_all(ws.join(".git/modules/x/hooks")).expect("rm hooks");
    }) else {
        return;
    };
    let gd = f.ws().join(".git/modules/x");
    assert!(gd.join("HEAD").exists(), "no submodule git dir");
    let marker = f.marker("submodule-ran");
    let config_before = std::fs::read(gd.join("config")).expect("config");
    let monitor = fsmonitor(&marker);
    f.run(&format!(
        r#"git -C x config core.fsmonitor '{monitor}'; echo config=$?
printf '[core]\n\tfsmonitor = {monitor}\n' >> .git/modules/x/config; echo append=$?
mkdir -p .git/modules/x/hooks && printf '#!/bin/sh\ntouch {marker}\n' > .git/modules/x/hooks/post-checkout; echo hook=$?
"#,
        marker = marker.display()
    ));
    assert_eq!(
        std::fs::read(gd.join("config")).expect("config"),
        config_before,
        "the run changed the submodule's config"
    );
    assert!(
        !present(&gd.join("hooks/post-checkout")),
        "the run planted a submodule hook"
    );
    git_ok(&f.ws().join("x"), &["status", "--short"]);
    git_ok(f.ws(), &["status", "--short"]);
    assert!(
        !present(&marker),
        "host git ran what the run planted in the submodule"
    );

    // Positive control: the fsmonitor, set by the host, runs in the submodule.
    git_ok(&f.ws().join("x"), &["config", "core.fsmonitor", &monitor]);
    git_ok(&f.ws().join("x"), &["status", "--short"]);
    assert!(
        present(&marker),
        "control: the submodule's fsmonitor did not run"
    );
}

// ---- Gaps found in main: each test fails there today and is ignored until it is fixed ----

/// The run makes a repository below the workspace and stages it as a gitlink (the index is
/// writable: commits need it). Host `git status` at the top of the protected repository then
/// runs `git status` inside the embedded repository, whose config the run wrote.
#[test]
fn a_staged_embedded_repository_is_set_aside_before_host_git_enters_it() {
    let Some(mut f) = Fixture::new() else { return };
    let marker = f.marker("embedded-ran");
    let monitor = fsmonitor(&marker);
    let r = f.run(&format!(
        "git init -q x && git -C x -c user.name=run -c user.email=run@example.com commit -q --allow-empty -m x \
         && git -C x config core.fsmonitor '{monitor}' && git add x 2>/dev/null; git ls-files -s x"
    ));
    assert_eq!(r["state"], "succeeded", "{r}");
    assert!(
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("x/.git") && e.contains("set aside")),
        "the result says what was set aside: {r}"
    );
    assert!(
        f.ws().join("x/.git.quarantined-by-sidejob").is_dir() && !present(&f.ws().join("x/.git")),
        "the staged repository's .git is set aside"
    );
    git_ok(f.ws(), &["status", "--short"]);
    assert!(
        !present(&marker),
        "host git status in the workspace ran the fsmonitor of a repository the run made"
    );
}

/// With `extensions.worktreeConfig` on (as `git sparse-checkout` sets it), git reads
/// `.git/config.worktree`; only an existing one is protected, so the run creates it.
#[test]
fn a_config_worktree_the_run_would_create_cannot_be_created() {
    let Some(mut f) = Fixture::with(|ws| {
        repo(ws);
        git_ok(ws, &["config", "extensions.worktreeConfig", "true"]);
    }) else {
        return;
    };
    let marker = f.marker("worktree-config-ran");
    let monitor = fsmonitor(&marker);
    f.run(&format!(
        "printf '[core]\\n\\tfsmonitor = {monitor}\\n' > .git/config.worktree; echo config.worktree=$?"
    ));
    git_ok(f.ws(), &["status", "--short"]);
    assert!(
        !present(&marker),
        "host git status ran the fsmonitor from a config.worktree the run created"
    );
}

/// A workspace whose `.git` is a file naming a git directory inside the workspace
/// (`git init --separate-git-dir`): its hooks and config are in the writable workspace.
#[test]
fn a_git_dir_named_by_a_git_file_inside_the_workspace_is_protected() {
    let Some(mut f) = Fixture::with(|ws| {
        let gd = ws.join(".realgit");
        git_ok(
            ws,
            &[
                "init",
                "-q",
                "--separate-git-dir",
                &gd.display().to_string(),
                ".",
            ],
        );
        std::fs::write(ws.join("README"), "hello\n").expect("README");
        git_ok(ws, &["add", "README"]);
        git_ok(ws, &["commit", "-q", "-m", "initial"]);
    }) else {
        return;
    };
    let marker = f.marker("separate-git-dir-ran");
    let config_before = std::fs::read(f.ws().join(".realgit/config")).expect("config");
    f.run(&format!(
        "printf '#!/bin/sh\\ntouch {m}\\n' > .realgit/hooks/pre-commit; chmod +x .realgit/hooks/pre-commit; echo hook=$?; \
         git config core.fsmonitor '{monitor}'; echo config=$?",
        m = marker.display(),
        monitor = fsmonitor(&marker)
    ));
    let config_changed =
        std::fs::read(f.ws().join(".realgit/config")).expect("config") != config_before;
    git_ok(f.ws(), &["commit", "-q", "--allow-empty", "-m", "host"]);
    assert!(
        !config_changed,
        "the run changed the git directory's config"
    );
    assert!(
        !present(&marker),
        "host git ran what the run planted in the git directory"
    );
}
