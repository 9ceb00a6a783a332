//! cargo-fuzz entry of the `manifest` target (see `kubelet_fuzz::manifest`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::manifest(data));
