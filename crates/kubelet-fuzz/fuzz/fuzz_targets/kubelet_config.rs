//! cargo-fuzz entry of the `kubelet_config` target (see `kubelet_fuzz::kubelet_config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::kubelet_config(data));
