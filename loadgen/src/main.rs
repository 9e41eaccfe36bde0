//! `felix-loadgen`: drive a Felix broker and report what it stored.

fn main() {
    eprintln!("felix-loadgen: no workloads yet");
    std::process::exit(2);
}
