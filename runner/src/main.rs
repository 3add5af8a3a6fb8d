fn main() {
    std::process::exit(sidejob::cli::main());
}
