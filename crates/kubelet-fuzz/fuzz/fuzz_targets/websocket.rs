//! cargo-fuzz entry of the `websocket` target (see `kubelet_fuzz::websocket`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::websocket(data));
