//! Placeholder replaced in the benchmark stage.
fn main() {}
