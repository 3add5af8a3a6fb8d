//! What the deploy files are checked against offline: the workspace's `rust-version` is the
//! oldest Rust that builds the locked dependencies, the container image builds with exactly
//! that Rust, and the systemd units pass `systemd-analyze verify` and `security`.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `1.91` or `1.89.0` as comparable numbers (a missing patch is 0).
fn version(v: &str) -> (u32, u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
        parts.next().unwrap_or(0),
    )
}

/// The `rust-version` the workspace declares (Cargo.toml, `[workspace.package]`).
fn declared_rust_version() -> String {
    let text = std::fs::read_to_string(workspace().join("Cargo.toml")).expect("Cargo.toml");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .expect("Cargo.toml declares rust-version")
}

#[test]
fn the_declared_rust_version_builds_every_locked_dependency() {
    // The lockfile as resolved for Linux (sidejob builds nowhere else): each package's own
    // `rust-version`, as its manifest declares it.
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let o = Command::new(cargo)
        .current_dir(workspace())
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--filter-platform",
            "x86_64-unknown-linux-gnu",
        ])
        .output()
        .expect("run cargo metadata");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let meta: Value = serde_json::from_slice(&o.stdout).expect("cargo metadata JSON");
    let members: Vec<&Value> = meta["workspace_members"]
        .as_array()
        .expect("members")
        .iter()
        .collect();
    let (mut need, mut who) = ((0, 0, 0), String::new());
    for p in meta["packages"].as_array().expect("packages") {
        if members.contains(&&p["id"]) {
            continue;
        }
        if let Some(rv) = p["rust_version"].as_str() {
            if version(rv) > need {
                need = version(rv);
                who = format!(
                    "{} {} needs Rust {rv}",
                    p["name"].as_str().unwrap_or("?"),
                    p["version"].as_str().unwrap_or("?")
                );
            }
        }
    }
    let declared = declared_rust_version();
    assert!(
        version(&declared) >= need,
        "Cargo.toml declares rust-version = {declared:?}, but the lockfile's {who}: raise \
         rust-version (and the Dockerfile's rust image) to it"
    );
}

#[test]
fn the_dockerfile_builds_with_the_declared_rust_version() {
    let dockerfile = workspace().join("deploy/container/Dockerfile");
    let text = std::fs::read_to_string(&dockerfile).expect("Dockerfile");
    let image = text
        .lines()
        .find_map(|l| l.strip_prefix("ARG RUST_VERSION="))
        .expect("the Dockerfile names its toolchain in ARG RUST_VERSION=");
    let declared = declared_rust_version();
    assert_eq!(
        version(image.trim()),
        version(&declared),
        "the Dockerfile builds with Rust {image}, Cargo.toml declares {declared}"
    );
    assert!(
        text.contains("FROM ${RUST_IMAGE} AS build") && text.contains("rust:${RUST_VERSION}-"),
        "the build stage must be the rust image of RUST_VERSION:\n{text}"
    );
}

/// The systemd units with `ExecStart=` pointing at this build (verify checks that it exists).
fn units_for_this_build(dir: &std::path::Path) -> (PathBuf, PathBuf) {
    let src = workspace().join("deploy/systemd");
    let bin = sidejob_tests::sidejob_bin();
    let mut out = Vec::new();
    for name in ["sidejob.service", "sidejob.socket"] {
        let text = std::fs::read_to_string(src.join(name)).expect("unit");
        let path = dir.join(name);
        std::fs::write(
            &path,
            text.replace("/usr/local/bin/sidejob", &bin.display().to_string()),
        )
        .expect("write unit");
        out.push(path);
    }
    (out.remove(0), out.remove(0))
}

#[test]
fn the_systemd_units_verify_and_the_service_is_not_exposed() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    if sidejob_tests::skip_unless(
        analyze.is_ok_and(|o| o.status.success()),
        "systemd-analyze is not installed (apt-get install systemd)",
    ) {
        return;
    }
    let tmp = sidejob_tests::TempDir::new("units");
    let (service, socket) = units_for_this_build(tmp.path());
    let o = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&service)
        .arg(&socket)
        .output()
        .expect("systemd-analyze verify");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && !said.contains("sidejob.s"),
        "systemd-analyze verify: {said}"
    );
    // 7.8 EXPOSED before the hardening; 5.7 with it (what the daemon's namespaces, mounts and
    // delegated cgroups allow; RestrictSUIDSGID= would be 5.5, but it refuses the daemon's
    // openat2). --offline needs systemd 250+.
    let o = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=57"])
        .arg(&service)
        .output()
        .expect("systemd-analyze security");
    let said = String::from_utf8_lossy(&o.stdout);
    let overall = said
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or("no overall exposure line");
    assert!(
        o.status.success(),
        "the service's exposure rose above 5.7: {overall}\n{said}"
    );
}
