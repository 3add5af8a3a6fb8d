fn main() {
    // The supervisor is started once per run: go straight to it, before any argument parser
    // or runtime is set up (it must stay single-threaded and start fast).
    let mut args = std::env::args_os().skip(1);
    if std::env::args_os().len() == 2
        && std::env::args_os().nth(1).as_deref() == Some(sidejob::CHECK_SCHEMAS.as_ref())
    {
        std::process::exit(sidejob::check_schemas_main());
    }
    if let (Some(cmd), Some(run_dir), None) = (args.next(), args.next(), args.next()) {
        if cmd == "supervise" {
            std::process::exit(sidejob::supervisor::main(std::path::Path::new(&run_dir)));
        }
        if cmd == "spawner" {
            std::process::exit(sidejob::supervisor::spawner::main(std::path::Path::new(
                &run_dir,
            )));
        }
    }
    std::process::exit(sidejob::cli::main());
}
