//! cargo-fuzz entry of the `credential_provider` target (see `kubelet_fuzz::credential_provider`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::credential_provider(data));
