//! The `felix` binary.

fn main() {
    eprintln!("felix: the broker is not assembled yet");
    std::process::exit(2);
}
