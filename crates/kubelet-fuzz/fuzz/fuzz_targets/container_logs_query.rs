//! cargo-fuzz entry of the `container_logs_query` target (see `kubelet_fuzz::container_logs_query`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::container_logs_query(data));
