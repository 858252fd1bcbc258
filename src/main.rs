fn main() {
    std::process::exit(code_interpreter_mcp::cli::main());
}
