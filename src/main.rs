//! `skyriver`: the node daemon and the tools around it.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    skyriver::cli::main_with_args(std::env::args_os())
}
