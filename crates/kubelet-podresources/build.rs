//! Generates the gRPC client and server from `proto/podresources/v1/api.proto`
//! and the deprecated `proto/podresources/v1alpha1/api.proto`.
//! Uses the protoc shipped by `protoc-bin-vendored` unless `PROTOC` is set, so a
//! fresh machine builds with `cargo build` alone.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let protos = [
        root.join("podresources/v1/api.proto"),
        root.join("podresources/v1alpha1/api.proto"),
    ];
    for proto in &protos {
        println!("cargo:rerun-if-changed={}", proto.display());
    }
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
        .compile_with_config(config, &protos, &[root])?;
    Ok(())
}
