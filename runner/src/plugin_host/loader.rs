//! Loading one plugin file: ownership and mode checks, a private copy named by its hash, then
//! `lib_header_from_path` + `init_root_module` (not `RootModule::load_from_file`, which keeps
//! one module per type), the contract version, and `describe()`.
//!
//! Every refusal is one line that names the file and the reason.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sidejob_plugin_api::abi_stable::library::{lib_header_from_path, LibraryError};
use sidejob_plugin_api::json::PluginInfo;
use sidejob_plugin_api::{PluginModuleRef, API_VERSION, CONTRACT_VERSION};

use crate::protocol::ToolInfo;
use crate::sys;

/// Why a plugin file was not loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
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

/// A plugin that loaded: its module and what it offers.
pub struct LoadedPlugin {
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

/// Refuses a file or directory that someone other than root or the daemon's user could have
/// written: the daemon is privileged and runs whatever the plugin's code does.
pub fn check_owner_and_mode(path: &Path, what: &str) -> Result<(), LoadError> {
    let meta = std::fs::metadata(path).map_err(|e| LoadError::Io {
        step: "inspect",
        path: path.into(),
        message: e.to_string(),
    })?;
    let unsafe_err = |reason: String| LoadError::Unsafe {
        path: path.into(),
        reason,
    };
    let me = sys::getuid();
    if meta.uid() != 0 && meta.uid() != me {
        return Err(unsafe_err(format!(
            "{what} is owned by uid {}, not by root or the daemon's uid {me}",
            meta.uid()
        )));
    }
    let mode = meta.permissions().mode();
    if mode & 0o022 != 0 {
        return Err(unsafe_err(format!(
            "{what} is {} (mode {:o}); run chmod go-w on it",
            if mode & 0o002 != 0 {
                "world-writable"
            } else {
                "group-writable"
            },
            mode & 0o7777
        )));
    }
    Ok(())
}

/// Loads `source` through a private copy in `copies_dir`.
pub fn load(source: &Path, copies_dir: &Path) -> Result<LoadedPlugin, LoadError> {
    if let Some(dir) = source.parent() {
        check_owner_and_mode(dir, "its directory")?;
    }
    check_owner_and_mode(source, "the file")?;
    let io = |step: &'static str, path: &Path| {
        let path = path.to_path_buf();
        move |e: std::io::Error| LoadError::Io {
            step,
            path,
            message: e.to_string(),
        }
    };
    let bytes = std::fs::read(source).map_err(io("read", source))?;
    let sha256 = hex(&Sha256::digest(&bytes));
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("plugin");
    let copy = copies_dir.join(format!("{stem}-{sha256}.so"));
    if !copy.exists() {
        std::fs::create_dir_all(copies_dir).map_err(io("create", copies_dir))?;
        std::fs::set_permissions(copies_dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io("set permissions on", copies_dir))?;
        // Written under a temporary name and renamed, so a half-written copy is never mapped.
        let tmp = copies_dir.join(format!(".{stem}-{sha256}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, &bytes).map_err(io("copy", &tmp))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o500))
            .map_err(io("set permissions on", &tmp))?;
        std::fs::rename(&tmp, &copy).map_err(io("install", &copy))?;
    }

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
        if let Some(problem) = super::schema::problem(&t.input_schema) {
            return Err(invalid(format!("tool {}: {problem}", t.name)));
        }
        tools.push(ToolInfo {
            name: t.name.clone(),
            description: t.description.clone(),
            input_schema: t.input_schema.clone(),
            supports_background: t.supports_background,
            default_yield_after_ms: t.default_yield_after_ms,
        });
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

    fn temp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sidejob-loader-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn writable_by_others_is_refused_with_the_reason() {
        let d = temp("mode");
        let f = d.join("p.so");
        std::fs::write(&f, b"x").unwrap();
        for (mode, word) in [(0o666, "world-writable"), (0o620, "group-writable")] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_owner_and_mode(&f, "the file")
                .unwrap_err()
                .to_string();
            assert!(e.contains(word) && e.contains("chmod go-w"), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        check_owner_and_mode(&f, "the file").unwrap();
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_file_that_is_not_a_plugin_is_one_line() {
        let d = temp("junk");
        let f = d.join("junk.so");
        std::fs::write(&f, b"not an ELF file").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = load(&f, &d.join("copies")).unwrap_err().to_string();
        assert!(e.contains("junk.so"), "{e}");
        assert_eq!(e.lines().count(), 1, "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
