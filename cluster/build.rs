//! Nothing to generate: this script only makes `protoc-bin-vendored` part of the build, so that
//! cargo downloads it before any build script runs and `tools/protoc` (the `PROTOC` that
//! `.cargo/config.toml` gives etcd-client's build script) can fall back to its binary on a
//! machine without a protoc package.
fn main() {
    // The path is not needed here; asking for it keeps the dependency honest.
    let _ = protoc_bin_vendored::protoc_bin_path();
    println!("cargo:rerun-if-changed=build.rs");
}
