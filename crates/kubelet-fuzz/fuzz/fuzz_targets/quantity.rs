//! cargo-fuzz entry of the `quantity` target (see `kubelet_fuzz::quantity`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::quantity(data));
