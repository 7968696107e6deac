//! `hetmem`: the command, whose code is the `hetmem_cli` library target (src/lib.rs).

fn main() -> std::process::ExitCode {
    hetmem_cli::main()
}
