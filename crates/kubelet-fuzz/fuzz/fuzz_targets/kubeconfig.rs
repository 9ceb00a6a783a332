//! cargo-fuzz entry of the `kubeconfig` target (see `kubelet_fuzz::kubeconfig`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kubelet_fuzz::kubeconfig(data));
