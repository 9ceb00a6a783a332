//! cargo-fuzz entry of the `spdy_frames` target (see `kubelet_fuzz::spdy_frames`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::spdy_frames(data));
