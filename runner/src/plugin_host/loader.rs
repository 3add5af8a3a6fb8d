//! Loading one plugin file: opened once, by descriptor, and checked on that descriptor
//! ([`read_source`], see `sys::fs` for the walk and the rule); a private copy named by its
//! hash, made once per content and checked again before each reuse ([`ensure_copy`]); then
//! `lib_header_from_path` + `init_root_module` (not `RootModule::load_from_file`, which keeps
//! one module per type), the contract version, and `describe()`.
//!
//! Every refusal is one line that names the file and the reason.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sidejob_plugin_api::abi_stable::library::{lib_header_from_path, LibraryError};
use sidejob_plugin_api::json::PluginInfo;
use sidejob_plugin_api::{PluginModuleRef, API_VERSION, CONTRACT_VERSION};
use tracing::warn;

use crate::protocol::ToolInfo;
use crate::sys::fs::{Refusal, TrustedDir};

/// Why a plugin file was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LoadError {
    #[error("refusing plugin {path}: {reason}")]
    Unsafe { path: PathBuf, reason: String },
    #[error("cannot {step} plugin {path}: {message}")]
    Io {
        step: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("plugin {path}: ABI mismatch: expected {expected}, found {found}")]
    Abi {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("plugin {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("tool {tool:?} is offered by both {first} and {second}; {second} is not loaded")]
    DuplicateTool {
        tool: String,
        first: PathBuf,
        second: PathBuf,
    },
}

impl LoadError {
    /// A refusal of `path` for what `sys::fs` found, with its fix, on one line.
    pub(crate) fn refused(path: &Path, why: &Refusal) -> LoadError {
        LoadError::Unsafe {
            path: path.into(),
            reason: format!("{why}; {}", why.hint()),
        }
    }
}

/// A plugin that loaded: its module and what it offers.
pub(crate) struct LoadedPlugin {
    pub info: PluginInfo,
    pub tools: Vec<ToolInfo>,
    /// The file it was loaded from (in a plugin directory).
    pub source: PathBuf,
    /// The private copy that is actually mapped (`<state_dir>/plugins/<name>-<sha256>.so`).
    pub copy: PathBuf,
    pub sha256: String,
    pub module: PluginModuleRef,
}

impl std::fmt::Debug for LoadedPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadedPlugin")
            .field("name", &self.info.name)
            .field("source", &self.source)
            .field("sha256", &self.sha256)
            .finish()
    }
}

/// A plugin file's contents, read from the descriptor whose owner and mode were checked.
pub(super) struct Source {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub sha256: String,
}

/// Opens `name` in the plugin directory `dir` (already opened and checked) without following
/// a symlink, checks the descriptor, and reads and hashes the file from it. What is hashed,
/// copied and loaded is therefore what was checked, whatever happens to the path meanwhile.
/// `Ok(None)`: the file is gone.
pub(super) fn read_source(dir: &TrustedDir, name: &OsStr) -> Result<Option<Source>, LoadError> {
    let path = dir.path().join(name);
    let mut file = match dir.open_file(name) {
        Ok(file) => file,
        Err(why) if why.is_missing() => return Ok(None),
        Err(why) => return Err(LoadError::refused(&path, &why)),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| LoadError::Io {
        step: "read",
        path: path.clone(),
        message: e.to_string(),
    })?;
    let sha256 = hex(&Sha256::digest(&bytes));
    Ok(Some(Source {
        path,
        bytes,
        sha256,
    }))
}

/// The name of the private copy of `source`: its file stem and its content hash.
fn copy_name(source: &Source) -> String {
    let stem = source
        .path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plugin");
    format!("{stem}-{}.so", source.sha256)
}

/// Makes sure `copies` holds a copy of `source` under its hash-named file, and returns that
/// file's path. A copy that is already there is reused only if it passes the same checks as a
/// plugin file (not a symlink, owner, mode) and its contents still hash to its name; anything
/// else in its place is replaced. A new copy is written under a temporary name, fsynced and
/// renamed, so a failed copy (a full disk) leaves nothing behind and breaks nothing but this
/// plugin's load.
pub(super) fn ensure_copy(copies: &TrustedDir, source: &Source) -> Result<PathBuf, LoadError> {
    let name = copy_name(source);
    let copy = copies.path().join(&name);
    match copies.open_file(OsStr::new(&name)) {
        Ok(mut file) => {
            let mut bytes = Vec::new();
            let intact = file.read_to_end(&mut bytes).is_ok()
                && hex(&Sha256::digest(&bytes)) == source.sha256;
            if intact {
                return Ok(copy);
            }
            warn!(copy = %copy.display(), "the private plugin copy does not match its hash: replacing it");
        }
        Err(why) if why.is_missing() => {}
        Err(why) => warn!(copy = %copy.display(), "replacing the private plugin copy: {why}"),
    }
    // The rename at the end replaces whatever holds the name (a symlink is replaced, not
    // followed).
    copies
        .write_atomically(&name, &source.bytes, 0o500)
        .map_err(|e| LoadError::Io {
            step: "copy",
            path: source.path.clone(),
            message: format!("{}: {e}", copy.display()),
        })?;
    Ok(copy)
}

/// Loads a plugin from its checked contents, through a private copy in `copies`.
/// The tools' schemas are checked in the helper `schema_helper` when there is one
/// (`schema.rs`).
pub(super) fn load(
    plugin: &Source,
    copies: &TrustedDir,
    schema_helper: Option<&Path>,
) -> Result<LoadedPlugin, LoadError> {
    let source = plugin.path.as_path();
    let sha256 = plugin.sha256.clone();
    // The copy is opened by path (dlopen knows no other way; `/proc/self/fd/N` would not do:
    // glibc matches an already-loaded library by that name, so a later plugin opened through a
    // reused descriptor number would get this one back). That path resolves to the file
    // `ensure_copy` just checked: every directory on it was checked to be writable by root or
    // the daemon only, and no symlink is on it.
    let copy = ensure_copy(copies, plugin)?;

    let header = lib_header_from_path(&copy).map_err(|e| library_error(source, e))?;
    let module = header
        .init_root_module::<PluginModuleRef>()
        .map_err(|e| library_error(source, e))?;

    let invalid = |message: String| LoadError::Invalid {
        path: source.into(),
        message,
    };
    let found = (module.contract_version())();
    if found != CONTRACT_VERSION {
        return Err(LoadError::Abi {
            path: source.into(),
            expected: format!("plugin contract version {CONTRACT_VERSION}"),
            found: format!("contract version {found}"),
        });
    }
    let described = (module.describe())()
        .into_result()
        .map_err(|e| invalid(format!("describe() failed: {e}")))?;
    let info: PluginInfo = serde_json::from_str(described.as_str())
        .map_err(|e| invalid(format!("describe() returned invalid JSON: {e}")))?;
    if info.name.is_empty() || !info.name.bytes().all(is_name_byte) {
        return Err(invalid(format!(
            "plugin name {:?} must be 1 or more of [a-z0-9_-]",
            info.name
        )));
    }
    let mut tools = Vec::new();
    for t in &info.tools {
        if t.name.is_empty() || !t.name.bytes().all(is_name_byte) {
            return Err(invalid(format!(
                "tool name {:?} must be 1 or more of [a-z0-9_-]",
                t.name
            )));
        }
        if !t.input_schema.is_object() {
            return Err(invalid(format!(
                "tool {}: input_schema must be a JSON object",
                t.name
            )));
        }
        tools.push(ToolInfo {
            name: t.name.clone(),
            description: t.description.clone(),
            input_schema: t.input_schema.clone(),
            supports_background: t.supports_background,
            default_yield_after_ms: t.default_yield_after_ms,
        });
    }
    let schemas: Vec<&serde_json::Value> = tools.iter().map(|t| &t.input_schema).collect();
    let problems = super::schema::problems(&schemas, schema_helper);
    if let Some((t, problem)) = tools
        .iter()
        .zip(problems)
        .find_map(|(t, p)| p.map(|p| (t, p)))
    {
        return Err(invalid(format!("tool {}: {problem}", t.name)));
    }
    Ok(LoadedPlugin {
        info,
        tools,
        source: source.into(),
        copy,
        sha256,
        module,
    })
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One line for abi_stable's (multi-line) load errors.
fn library_error(path: &Path, e: LibraryError) -> LoadError {
    let abi = |expected: String, found: String| LoadError::Abi {
        path: path.into(),
        expected,
        found,
    };
    match e {
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => abi(
            format!(
                "sidejob-plugin-api {}.x (this daemon has {API_VERSION})",
                expected_version.major
            ),
            format!("a plugin built against {actual_version}"),
        ),
        LibraryError::AbiInstability(err) => abi(
            format!("the root module layout of sidejob-plugin-api {API_VERSION}"),
            format!("a different layout ({})", first_line(&err.to_string())),
        ),
        LibraryError::InvalidAbiHeader(found) => abi(
            "an abi_stable 0.11 library header".into(),
            format!("abi_stable ABI {}.{}", found.abi_major, found.abi_minor),
        ),
        LibraryError::InvalidCAbi { expected, found } => abi(
            format!("C ABI {}", first_line(&expected.to_string())),
            format!("C ABI {}", first_line(&found.to_string())),
        ),
        LibraryError::GetSymbolError { .. } => LoadError::Invalid {
            path: path.into(),
            message: "is not a sidejob plugin: it exports no abi_stable root module (build it with sidejob_plugin_api::export_plugin!)".into(),
        },
        other => LoadError::Invalid {
            path: path.into(),
            message: one_line(&other.to_string()),
        },
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_owned()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scratch::ScratchDir;
    use std::os::unix::fs::PermissionsExt;

    fn source(d: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<Source, LoadError> {
        let f = d.join(name);
        std::fs::write(&f, bytes).unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
        read_source(&TrustedDir::open(d).unwrap(), OsStr::new(name)).map(Option::unwrap)
    }

    #[test]
    fn writable_by_others_is_refused_with_the_reason() {
        let scratch = ScratchDir::with_mode("loader-mode", 0o755);
        let d = scratch.path();
        for (mode, word) in [(0o666, "world-writable"), (0o620, "group-writable")] {
            let e = source(d, "p.so", b"x", mode).err().unwrap().to_string();
            assert!(
                e.starts_with(&format!(
                    "refusing plugin {}: the file is",
                    d.join("p.so").display()
                )) && e.contains(word)
                    && e.contains("chmod go-w"),
                "{e}"
            );
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let ok = source(d, "p.so", b"x", 0o644).ok().unwrap();
        assert_eq!(ok.bytes, b"x");
    }

    #[test]
    fn a_file_that_is_not_a_plugin_is_one_line() {
        let scratch = ScratchDir::with_mode("loader-junk", 0o755);
        let d = scratch.path();
        let src = source(d, "junk.so", b"not an ELF file", 0o644)
            .ok()
            .unwrap();
        let copies = TrustedDir::open_private(d, "copies", 0o700).unwrap().0;
        let e = load(&src, &copies, None).err().unwrap().to_string();
        assert!(e.contains("junk.so"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }

    #[test]
    fn a_copy_is_made_once_and_checked_before_reuse() {
        let scratch = ScratchDir::with_mode("loader-copies", 0o755);
        let d = scratch.path();
        let src = source(d, "p.so", b"version 1", 0o644).ok().unwrap();
        let copies = TrustedDir::open_private(d, "copies", 0o700).unwrap().0;
        let copy = ensure_copy(&copies, &src).unwrap();
        assert_eq!(
            copy.file_name().unwrap().to_str().unwrap(),
            format!("p-{}.so", src.sha256)
        );
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let first = inode(&copy);
        // Reused as it is: not copied again.
        assert_eq!(ensure_copy(&copies, &src).unwrap(), copy);
        assert_eq!(inode(&copy), first);
        // A copy whose contents no longer match its name is replaced.
        std::fs::remove_file(&copy).unwrap();
        std::fs::write(&copy, b"tampered").unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o500)).unwrap();
        ensure_copy(&copies, &src).unwrap();
        assert_eq!(std::fs::read(&copy).unwrap(), b"version 1");
        // So is a symlink in its place (replaced, not followed).
        let elsewhere = d.join("elsewhere.so");
        std::fs::write(&elsewhere, b"version 1").unwrap();
        std::fs::remove_file(&copy).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &copy).unwrap();
        ensure_copy(&copies, &src).unwrap();
        assert!(!std::fs::symlink_metadata(&copy)
            .unwrap()
            .file_type()
            .is_symlink());
    }
}
