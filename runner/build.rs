//! Links the GCC unwinder into `sidejob` statically instead of loading `libgcc_s.so.1`, and
//! packs its relative relocations where the toolchain can.
//!
//! Every `sidejob` process that starts from its binary (the CLI, `sidejob exec`, a supervisor
//! started without the spawner) paid about 0.1 ms for that library: mapping it, and its
//! constructor probing the CPU with `cpuid`, which traps to the hypervisor in a VM. The Rust
//! standard library asks the linker for `-lgcc_s`; a linker script of that name, found first,
//! hands it the static `libgcc_eh` instead (the same unwinder, in the binary). Where the C
//! toolchain has no `libgcc_eh.a`, nothing changes.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let target = std::env::var("TARGET").unwrap_or_default();
    // glibc targets only: the only ones that link `libgcc_s`.
    if !target.ends_with("-linux-gnu") {
        return;
    }
    let cc = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".into());
    pack_relative_relocs(&cc);
    static_unwinder(&cc);
}

/// Packs the binary's relative relocations (`DT_RELR`, glibc 2.36+), when the linker can:
/// the loader reads a few KiB at every start instead of a 466 KiB table of 19 000 entries.
fn pack_relative_relocs(cc: &str) {
    const FLAG: &str = "-Wl,-z,pack-relative-relocs";
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    let probe = Command::new(cc)
        .args(["-x", "c", "-", "-o"])
        .arg(out.join("relr-probe"))
        .arg(FLAG)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .and_then(|mut c| {
            c.stdin
                .take()
                .map(|mut i| i.write_all(b"int main(void) { return 0; }\n"))
                .transpose()?;
            c.wait()
        });
    // Linked, and loaded by this machine's glibc (an older one refuses a RELR binary).
    let runs = || {
        Command::new(out.join("relr-probe"))
            .status()
            .is_ok_and(|s| s.success())
    };
    if probe.is_ok_and(|s| s.success()) && runs() {
        println!("cargo:rustc-link-arg-bins={FLAG}");
    }
}

/// Links `libgcc_eh` for `-lgcc_s` (see the file's documentation).
fn static_unwinder(cc: &str) {
    // The C compiler cargo links with asks for `libgcc_eh.a` by name: it answers with a path
    // only if it has one.
    let found = Command::new(cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    if !found.is_some_and(|p| p.is_absolute() && p.is_file()) {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    // Without the script the binary links libgcc_s as usual: slower to start, nothing else.
    if let Err(e) = std::fs::write(out.join("libgcc_s.so"), "INPUT(-lgcc_eh)\n") {
        println!("cargo:warning=linking libgcc_s dynamically: cannot write the linker script: {e}");
        return;
    }
    println!("cargo:rustc-link-search=native={}", out.display());
}
