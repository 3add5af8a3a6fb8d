//! A tool's `input_schema` is checked against the JSON Schema meta-schema when its plugin
//! loads: one plugin with a broken schema would otherwise make MCP clients reject the whole
//! tool list.
//!
//! The daemon checks in a short-lived helper, its own binary started as
//! `sidejob check-schemas` ([`helper_main`]): the validator and the regex engines it compiles
//! patterns with are about 1.5 MiB of code that runs only while a plugin loads, and every
//! page of it the daemon touched would stay in its memory for as long as it runs. The helper
//! also keeps a pathological schema from tying up the daemon: it is killed after
//! [`HELPER_TIMEOUT`]. If the helper cannot be started or answers nonsense, the daemon checks
//! in-process instead (and says so in its log), so a plugin is never refused for the
//! helper's sake.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tracing::warn;

use crate::sys;

/// The helper's command (`sidejob check-schemas`, dispatched before the argument parser).
pub const HELPER_COMMAND: &str = "check-schemas";

/// How long the helper may take for one plugin's schemas.
const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// Why each of `schemas` is not a usable JSON Schema (`None` for one that is), checked by the
/// helper `exe` when there is one.
pub(super) fn problems(schemas: &[&Value], exe: Option<&Path>) -> Vec<Option<String>> {
    if let Some(exe) = exe {
        match in_helper(exe, schemas) {
            Ok(found) => return found,
            Err(e) => warn!(
                helper = %exe.display(),
                "cannot check plugin schemas in a helper process ({e}); checking them here"
            ),
        }
    }
    schemas.iter().map(|s| problem(s)).collect()
}

fn in_helper(exe: &Path, schemas: &[&Value]) -> io::Result<Vec<Option<String>>> {
    let input = serde_json::to_vec(schemas)?;
    // Started as every process the daemon starts is (`sys::spawn`): an empty environment and
    // only the descriptors named here.
    let (stdin_r, stdin_w) = sys::pipe()?;
    let (stdout_r, stdout_w) = sys::pipe()?;
    let null = File::options().write(true).open("/dev/null")?;
    let pid = sys::spawn::spawn(
        exe,
        &[OsStr::new(HELPER_COMMAND)],
        &[stdin_r.as_fd(), stdout_w.as_fd(), null.as_fd()],
    )?;
    drop((stdin_r, stdout_w, null));
    let mut stdin = File::from(stdin_w);
    let mut stdout = File::from(stdout_r);
    // Written and read on a thread, so that a helper that stops reading or writing holds up
    // nobody once it is killed.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut output = Vec::new();
        let written = stdin.write_all(&input);
        drop(stdin);
        let done = written.and_then(|()| stdout.read_to_end(&mut output));
        let _ = tx.send(done.map(|_| output));
    });
    let answer = rx.recv_timeout(HELPER_TIMEOUT);
    if answer.is_err() {
        let _ = sys::kill(pid, libc::SIGKILL);
    }
    let exit = sys::waitpid(pid, false)?.map(|(_, exit)| exit);
    let output = answer.map_err(|_| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no answer in {} s", HELPER_TIMEOUT.as_secs()),
        )
    })??;
    if exit != Some(sys::Exit::Code(0)) {
        return Err(io::Error::other(format!("it ended with {exit:?}")));
    }
    let found: Vec<Option<String>> = serde_json::from_slice(&output)?;
    if found.len() != schemas.len() {
        return Err(io::Error::other(format!(
            "{} answers for {} schemas",
            found.len(),
            schemas.len()
        )));
    }
    Ok(found)
}

/// `sidejob check-schemas`: reads a JSON array of schemas on stdin and writes, as a JSON
/// array, why each is not a usable JSON Schema (or `null`). Exit code 2 for input that is
/// not a JSON array.
pub fn helper_main() -> i32 {
    let mut input = Vec::new();
    let schemas: Vec<Value> = match io::stdin()
        .read_to_end(&mut input)
        .map_err(|e| e.to_string())
        .and_then(|_| serde_json::from_slice(&input).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sidejob check-schemas: expected a JSON array of schemas on stdin: {e}");
            return 2;
        }
    };
    let found: Vec<Option<String>> = schemas.iter().map(problem).collect();
    let mut out = io::stdout().lock();
    let written = serde_json::to_writer(&mut out, &found).map_err(io::Error::from);
    match written.and_then(|()| out.flush()) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}

/// Why `schema` is not a usable JSON Schema, in one line; `None` when it is.
fn problem(schema: &Value) -> Option<String> {
    if let Err(e) = jsonschema::meta::validate(schema) {
        let at = e.instance_path().to_string();
        let at = if at.is_empty() {
            "the root".to_owned()
        } else {
            at
        };
        return Some(format!("invalid JSON Schema at {at}: {e}"));
    }
    // The meta-schema does not check everything a validator needs (regex syntax, $refs).
    jsonschema::validator_for(schema)
        .err()
        .map(|e| format!("unusable JSON Schema: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelled_type_is_refused_and_a_good_schema_passes() {
        let bad = problem(&json!({"type": "objekt"})).unwrap_or_default();
        assert!(bad.contains("objekt"), "{bad}");
        assert!(!bad.contains('\n'), "{bad}");
        assert_eq!(
            problem(&json!({"type": "object", "properties": {"command": {"type": "string"}}})),
            None
        );
        assert!(problem(&json!({"type": "string", "pattern": "(["})).is_some());
    }

    #[test]
    fn a_helper_that_cannot_answer_leaves_the_check_to_the_daemon() {
        let bad = json!({"type": "objekt"});
        let good = json!({"type": "object"});
        // Not a sidejob binary: `false` exits 1, `cat` echoes the schemas back.
        for exe in ["/nonexistent/sidejob", "/bin/false", "/bin/cat"] {
            let found = problems(&[&bad, &good], Some(Path::new(exe)));
            assert!(
                found[0].as_deref().unwrap_or("").contains("objekt"),
                "{exe}: {found:?}"
            );
            assert_eq!(found[1], None, "{exe}");
        }
    }
}
