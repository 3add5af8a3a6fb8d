fn main() {
    // The internal commands the daemon starts (a supervisor once per run, the spawner once,
    // the schema checker per plugin): go straight to them, before any argument parser or
    // runtime is set up (a supervisor must stay single-threaded and start fast).
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    match args.as_slice() {
        [cmd] if cmd == sidejob::CHECK_SCHEMAS => std::process::exit(sidejob::check_schemas_main()),
        [cmd, run_dir] if cmd == "supervise" => {
            std::process::exit(sidejob::supervisor::main(std::path::Path::new(run_dir)))
        }
        [cmd, runs_dir] if cmd == "spawner" => std::process::exit(
            sidejob::supervisor::spawner::main(std::path::Path::new(runs_dir)),
        ),
        _ => std::process::exit(sidejob::cli::main()),
    }
}
