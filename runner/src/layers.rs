//! The import graph of `runner/src` (ARCHITECTURE.md, "Boundaries"): calls run in one
//! direction, so the modules that serve requests and runs — `server`, `bridge`, `schedule`,
//! `executor`, `session` — are in no cycle of `crate::<module>` references, direct or
//! through any other module. Read from the sources, so a new `use` that closes a cycle fails
//! here with the path it takes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The modules no cycle may pass through.
const ONE_WAY: [&str; 5] = ["server", "bridge", "schedule", "executor", "session"];

/// Every top-level module's `crate::<module>` references (comments left out).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut mods = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if name != "lib" && name != "main" {
            let mut files = Vec::new();
            collect(&path, &mut files);
            mods.insert(name, files);
        }
    }
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    mods.into_iter()
        .map(|(name, files)| {
            let mut to = BTreeSet::new();
            for f in files {
                for target in references(&std::fs::read_to_string(f).unwrap()) {
                    if target != name && names.contains(&target) {
                        to.insert(target);
                    }
                }
            }
            (name, to)
        })
        .collect()
}

fn collect(path: &Path, out: &mut Vec<std::path::PathBuf>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            collect(&e.unwrap().path(), out);
        }
    } else if path.extension().is_some_and(|e| e == "rs") {
        out.push(path.to_path_buf());
    }
}

/// The modules a source names as `crate::m` or in `crate::{m, …}`.
fn references(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            rest = &rest[i + "crate::".len()..];
            let group = rest.strip_prefix('{');
            let names = group.map_or(rest, |g| g.split('}').next().unwrap_or(""));
            for item in names.split(',') {
                let word: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if !word.is_empty() {
                    out.insert(word);
                }
                if group.is_none() {
                    break;
                }
            }
        }
    }
    out
}

/// A path from `from` back to itself, if there is one.
fn cycle_through(g: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![from.to_owned()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last().unwrap();
        for next in g.get(last).into_iter().flatten() {
            if next == from {
                let mut cycle = path.clone();
                cycle.push(from.to_owned());
                return Some(cycle);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

#[test]
fn no_import_cycle_passes_through_the_request_and_run_modules() {
    let g = graph();
    for m in ONE_WAY {
        assert!(g.contains_key(m), "no module {m} in runner/src");
        if let Some(cycle) = cycle_through(&g, m) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
    // The executor knows nothing of the layers that drive it.
    for above in ["server", "bridge", "schedule"] {
        assert!(!g["executor"].contains(above), "executor imports {above}");
    }
    assert!(
        !g["session"].contains("executor"),
        "session imports executor"
    );
}

#[test]
fn references_reads_paths_and_groups_but_not_comments() {
    let text = "use crate::executor::X;\nuse crate::{ids, session::dirs};\n// crate::server\n";
    let found: Vec<String> = references(text).into_iter().collect();
    assert_eq!(found, ["executor", "ids", "session"]);
}
