//! cargo-fuzz entry of the `flags` target (see `kubelet_fuzz::flags`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::flags(data));
