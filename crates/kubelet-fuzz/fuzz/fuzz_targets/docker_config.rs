//! cargo-fuzz entry of the `docker_config` target (see `kubelet_fuzz::docker_config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::docker_config(data));
