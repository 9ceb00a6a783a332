//! cargo-fuzz entry of the `watch_event` target (see `kubelet_fuzz::watch_event`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::watch_event(data));
