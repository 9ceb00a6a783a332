//! cargo-fuzz entry of the `cri_log` target (see `kubelet_fuzz::cri_log`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::cri_log(data));
