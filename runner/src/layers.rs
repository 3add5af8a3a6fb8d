//! The import graph of `runner/src` (ARCHITECTURE.md, "Layers"): every module has a place in
//! [`LAYERS`], and a module names only modules below its own (`crate::m`, `crate::{m, …}`,
//! or `super::m` reaching out of a submodule). So no two modules import each other, directly
//! or through others, and nothing below knows what is above it. Read from the sources: a new
//! `use` that points upward fails here, naming the file and both modules.
//!
//! The nodes are the top-level modules, but for two parts of `sandbox` that sit elsewhere in
//! the order: `sandbox::linux`, which carries out a launch plan (so it is above `run`, whose
//! plan holds the pure sandbox's `SandboxPlan`), and `sandbox::call`, which resolves a daemon
//! call's sandbox and asks `sandbox::linux` what this host can enforce.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The modules, lowest first. A module may import only modules listed before it.
const LAYERS: &[&str] = &[
    "names",
    "sys",
    "ids",
    "protocol",
    "metrics",
    "dirwatch",
    "egress",
    "sandbox",
    "run",
    "sandbox::linux",
    "supervisor",
    "registry",
    "wake",
    "sandbox::call",
    "config",
    "plugin_host",
    "session",
    "executor",
    "schedule",
    "bridge",
    "server",
    "cli",
];

/// Modules that are not part of the program (test support, and this test).
const NOT_LAYERED: &[&str] = &["scratch", "layers", "lib", "main"];

/// The submodules that are nodes of their own.
const SPLIT: &[&str] = &["sandbox::linux", "sandbox::call"];

/// The node a module path (`["sandbox", "linux", "view"]`) belongs to.
fn node(path: &[String]) -> Option<String> {
    let first = path.first()?;
    if let Some(second) = path.get(1) {
        let both = format!("{first}::{second}");
        if SPLIT.contains(&both.as_str()) {
            return Some(both);
        }
    }
    Some(first.clone())
}

/// A source file's module path: `src/sandbox/linux/mod.rs` is `["sandbox", "linux"]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if stem != "mod" {
            parts.push(stem.to_owned());
        }
    }
    parts
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            collect(&e.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The module paths a source names: `crate::a::b` and each name of `crate::{a, b::c}` as
/// absolute paths (two segments at most: enough to place them), and `super::x` resolved
/// against `here` (the file's own module path). Comments are left out.
fn references(text: &str, here: &[String]) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        for (prefix, base) in [("crate::", Vec::new()), ("super::", parent(here))] {
            let mut rest = code;
            while let Some(i) = rest.find(prefix) {
                let before = &rest[..i];
                rest = &rest[i + prefix.len()..];
                // `self::super::` or a longer path that merely ends in `super::`: not ours.
                if prefix == "super::" && before.ends_with("::") {
                    continue;
                }
                let group = rest.strip_prefix('{');
                let names = group.map_or(rest, |g| g.split('}').next().unwrap_or(""));
                for item in names.split(',') {
                    let segs: Vec<String> = item
                        .trim()
                        .split("::")
                        .map(|s| {
                            s.chars()
                                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                                .collect::<String>()
                        })
                        .take_while(|s| !s.is_empty() && s != "self")
                        .take(2)
                        .collect();
                    if !segs.is_empty() {
                        let mut full = base.clone();
                        full.extend(segs);
                        out.insert(full);
                    }
                    if group.is_none() {
                        break;
                    }
                }
            }
        }
    }
    out
}

fn parent(path: &[String]) -> Vec<String> {
    path[..path.len().saturating_sub(1)].to_vec()
}

/// Every reference from one node to another: (file, from, to).
fn edges() -> Vec<(PathBuf, String, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&src, &mut files);
    let mut out = Vec::new();
    for f in files {
        let here = module_path(&src, &f);
        let Some(from) = node(&here) else { continue };
        if NOT_LAYERED.contains(&from.as_str()) {
            continue;
        }
        for target in references(&std::fs::read_to_string(&f).unwrap(), &here) {
            let Some(to) = node(&target) else { continue };
            if to != from && !NOT_LAYERED.contains(&to.as_str()) {
                out.push((
                    f.strip_prefix(&src).unwrap().to_path_buf(),
                    from.clone(),
                    to,
                ));
            }
        }
    }
    out
}

fn rank(node: &str) -> Option<usize> {
    LAYERS.iter().position(|l| *l == node)
}

#[test]
fn every_module_imports_only_modules_below_it() {
    let mut upward = Vec::new();
    for (file, from, to) in edges() {
        let (Some(a), Some(b)) = (rank(&from), rank(&to)) else {
            // A name that is no module (`crate::start`), or a module not placed yet.
            if rank(&from).is_none() {
                upward.push(format!(
                    "{}: module {from} has no place in LAYERS",
                    file.display()
                ));
            }
            continue;
        };
        if b >= a {
            upward.push(format!("{}: {from} imports {to}", file.display()));
        }
    }
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports that point upward:\n{}",
        upward.join("\n")
    );
}

#[test]
fn every_top_level_module_has_a_place() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for e in std::fs::read_dir(&src).unwrap() {
        let name = module_path(&src, &e.unwrap().path())[0].clone();
        if !NOT_LAYERED.contains(&name.as_str()) {
            assert!(
                rank(&name).is_some(),
                "module {name} has no place in LAYERS"
            );
        }
    }
}

#[test]
fn references_read_paths_groups_and_super_but_not_comments() {
    let here: Vec<String> = ["sandbox", "linux"].map(String::from).to_vec();
    let text = "use crate::executor::X;\nuse crate::{ids, session::dirs};\n// crate::server\n\
                use super::resolve::MountSpec;\nuse super::{caches, Home};\n";
    let found: Vec<String> = references(text, &here)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        found,
        [
            "executor",
            "ids",
            "sandbox::caches",
            "sandbox::resolve",
            "session::dirs"
        ]
    );
    assert_eq!(
        node(&["sandbox".into(), "linux".into(), "view".into()]).unwrap(),
        "sandbox::linux"
    );
    assert_eq!(
        node(&["sandbox".into(), "resolve".into()]).unwrap(),
        "sandbox"
    );
}
