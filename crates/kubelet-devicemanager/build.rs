//! Generates the gRPC client and server from `proto/deviceplugin/v1beta1/api.proto`.
//! Uses the protoc shipped by `protoc-bin-vendored` unless `PROTOC` is set, so a
//! fresh machine builds with `cargo build` alone.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let proto = root.join("deviceplugin/v1beta1/api.proto");
    println!("cargo:rerun-if-changed={}", proto.display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    let mut config = tonic_prost_build::Config::new();
    if std::env::var_os("PROTOC").is_none() {
        config.protoc_executable(protoc_bin_vendored::protoc_bin_path()?);
    }
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Test servers implement only the methods they need.
        .generate_default_stubs(true)
        // Deterministic encoding of envs and annotations: the checkpoint stores
        // the encoded AllocateResponse and its checksum must be stable.
        .btree_map(".")
        .compile_with_config(config, &[proto], &[root])?;
    Ok(())
}
