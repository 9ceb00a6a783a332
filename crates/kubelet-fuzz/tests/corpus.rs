//! The short run of every fuzz target on the stable toolchain: each file of
//! the seed corpus (`corpus/<target>/`), then seeded mutations of them, each
//! input under a deadline (a hang fails the test as the fuzzer's timeout
//! would). `KUBELET_FUZZ_CASES` raises the number of mutations per target.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use kubelet_fuzz::{TARGETS, Target};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Far above any input's run time (milliseconds, even in debug): only a
/// hang reaches it.
const DEADLINE: Duration = Duration::from_secs(20);

/// Mutated inputs per target by default (the whole crate's tests stay
/// within seconds in debug).
const DEFAULT_CASES: usize = 400;

/// Bytes the mutator inserts: the structure of the formats fuzzed.
const TOKENS: &[&[u8]] = &[
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"\n",
    b"- ",
    b"&a ",
    b"*a",
    b"!!binary ",
    b"-1",
    b"0",
    b"99999999999999999999",
    b"1e308",
    b"Ki",
    b"Ei",
    b"m",
    b"n",
    b".",
    b"$(",
    b")",
    b"$$",
    b"=",
    b"&",
    b"%",
    b"\xff",
    b"\x00",
    b"null",
    b"true",
    b"'",
    b"--",
    b"*",
];

/// What went wrong with one input.
#[derive(Debug)]
enum Failure {
    Panicked(String),
    Hung,
}

/// Runs `target` over `inputs`, each within `deadline`; the first input that
/// panics or hangs, with why.
fn run(target: Target, inputs: Vec<Vec<u8>>, deadline: Duration) -> Option<(Vec<u8>, Failure)> {
    let (tx, rx) = mpsc::channel::<Result<(), String>>();
    let worker_inputs = inputs.clone();
    std::thread::spawn(move || {
        for input in worker_inputs {
            let r = catch_unwind(AssertUnwindSafe(|| target(&input))).map_err(|p| {
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            });
            if tx.send(r).is_err() {
                return;
            }
        }
    });
    for input in inputs {
        match rx.recv_timeout(deadline) {
            Ok(Ok(())) => {}
            Ok(Err(msg)) => return Some((input, Failure::Panicked(msg))),
            Err(_) => return Some((input, Failure::Hung)),
        }
    }
    None
}

/// The seed files of `name`, and which of them are `hostile_*` regressions
/// (run as they are, never mutated: variations of an alias bomb are slow in
/// a debug build, which is libFuzzer's job to explore).
fn corpus(name: &str) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    let read = |f: &PathBuf| std::fs::read(f).expect("corpus file");
    let hostile = |f: &&PathBuf| {
        f.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("hostile_"))
    };
    let seeds = files.iter().filter(|f| !hostile(f)).map(read).collect();
    let regressions = files.iter().filter(hostile).map(read).collect();
    (seeds, regressions)
}

/// A random edit of a seed (or a splice of two seeds).
fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut b = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..=4) {
        let at = rng.random_range(0..=b.len());
        match rng.random_range(0..6) {
            0 if !b.is_empty() => {
                let i = rng.random_range(0..b.len());
                b[i] ^= 1 << rng.random_range(0..8);
            }
            1 => {
                let t = TOKENS[rng.random_range(0..TOKENS.len())];
                b.splice(at..at, t.iter().copied());
            }
            2 => {
                let end = rng.random_range(at..=b.len().min(at + 16));
                b.drain(at..end);
            }
            3 => {
                let end = rng.random_range(at..=b.len().min(at + 32));
                let dup = b[at..end].to_vec();
                b.splice(at..at, dup);
            }
            4 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                let from = rng.random_range(0..=other.len());
                b.truncate(at);
                b.extend_from_slice(&other[from..]);
            }
            _ => b.insert(at.min(b.len()), rng.random()),
        }
    }
    b
}

fn cases() -> usize {
    std::env::var("KUBELET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

fn fuzz(name: &str) {
    let (_, target) = TARGETS
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no target {name}"));
    let (seeds, regressions) = corpus(name);
    assert!(!seeds.is_empty(), "corpus/{name} is empty");
    // Seeded by the target's name: the same inputs on every run.
    let seed = name
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31) ^ u64::from(b));
    let mut rng = StdRng::seed_from_u64(seed);
    let mut inputs = seeds.clone();
    inputs.extend(regressions);
    inputs.extend((0..cases()).map(|_| mutate(&mut rng, &seeds)));
    inputs.extend((0..cases() / 4).map(|_| {
        let n = rng.random_range(0..256);
        (0..n).map(|_| rng.random()).collect()
    }));
    if let Some((input, failure)) = run(*target, inputs, DEADLINE) {
        panic!(
            "{name}: {failure:?} on input {:?}",
            String::from_utf8_lossy(&input)
        );
    }
}

macro_rules! targets {
    ($($name:ident),* $(,)?) => {
        $(#[test] fn $name() { fuzz(stringify!($name)); })*

        #[test]
        fn every_target_has_a_test() {
            let tested = [$(stringify!($name)),*];
            for (name, _) in TARGETS {
                assert!(tested.contains(name), "{name} has no test");
            }
        }
    };
}

targets!(
    manifest,
    kubelet_config,
    flags,
    kubeconfig,
    watch_event,
    quantity,
    cri_log,
    spdy_frames,
    websocket,
    container_logs_query,
    docker_config,
    credential_provider,
);

#[test]
fn the_runner_reports_a_panic_and_a_hang() {
    fn panics(data: &[u8]) {
        assert!(data != b"boom", "found it");
    }
    fn hangs(data: &[u8]) {
        if data == b"stuck" {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }
    let inputs = || vec![b"ok".to_vec(), b"boom".to_vec(), b"stuck".to_vec()];
    match run(panics, inputs(), DEADLINE) {
        Some((input, Failure::Panicked(msg))) => {
            assert_eq!(input, b"boom");
            assert!(msg.contains("found it"), "{msg}");
        }
        other => panic!("{other:?}"),
    }
    match run(hangs, inputs(), Duration::from_millis(200)) {
        Some((input, Failure::Hung)) => assert_eq!(input, b"stuck"),
        other => panic!("{other:?}"),
    }
}
