//! `--lock-file` and `--exit-on-lock-contention` with two real kubelet-rs
//! processes (issue 7, fix 4.12), as upstream: the kubelet holds an exclusive
//! flock on the file; a second kubelet opening it makes a first one started
//! with `--exit-on-lock-contention` exit, then takes the lock itself.

mod common;

use std::time::Duration;

use common::{BIN, Kubelet, standalone_args};

const STARTED: &str = "Started kubelet";
const WATCHING: &str = "Watching for inotify events";

fn with_lock(dir: &std::path::Path, name: &str, extra: &[&str]) -> Vec<String> {
    let mut args = standalone_args(dir, name);
    args.push(format!(
        "--lock-file={}",
        dir.join("kubelet.lock").display()
    ));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[test]
fn a_second_kubelet_makes_the_first_exit_and_takes_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Kubelet::start(&with_lock(
        dir.path(),
        "first",
        &["--exit-on-lock-contention"],
    ));
    assert!(
        first.wait_for(WATCHING, Duration::from_secs(30))
            && first.wait_for(STARTED, Duration::from_secs(30)),
        "first kubelet holds the lock and runs:\n{}",
        first.output()
    );
    assert!(
        first.exited_within(Duration::from_millis(500)).is_none(),
        "{}",
        first.output()
    );

    let mut second = Kubelet::start(&with_lock(
        dir.path(),
        "second",
        &["--exit-on-lock-contention"],
    ));
    let status = first
        .exited_within(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("the first kubelet must exit:\n{}", first.output()));
    assert!(
        status.success(),
        "contention is a clean exit (upstream run returns nil): {status}"
    );
    let out = first.output();
    assert!(
        out.contains("Another process opened the lock file"),
        "{out}"
    );

    assert!(
        second.wait_for(WATCHING, Duration::from_secs(15))
            && second.wait_for(STARTED, Duration::from_secs(15)),
        "the second kubelet gets the lock once the first is gone:\n{}",
        second.output()
    );
    // The second one watches too: still running, until told to stop.
    assert!(
        second.exited_within(Duration::from_millis(500)).is_none(),
        "{}",
        second.output()
    );
    let status = second.terminate();
    assert!(status.success(), "{status}\n{}", second.output());
}

#[test]
fn without_exit_on_contention_the_second_kubelet_waits_for_the_lock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Kubelet::start(&with_lock(dir.path(), "first", &[]));
    assert!(
        first.wait_for(STARTED, Duration::from_secs(30)),
        "{}",
        first.output()
    );
    assert!(
        !first.output().contains(WATCHING),
        "no watch without --exit-on-lock-contention"
    );

    let mut second = Kubelet::start(&with_lock(dir.path(), "second", &[]));
    assert!(
        second.wait_for("Acquiring file lock", Duration::from_secs(30)),
        "{}",
        second.output()
    );
    assert!(
        !second.wait_for(STARTED, Duration::from_secs(2)),
        "blocked in flock while the first holds the lock:\n{}",
        second.output()
    );
    assert!(
        first.exited_within(Duration::ZERO).is_none(),
        "opening the file does not stop the first"
    );

    assert!(first.terminate().success());
    assert!(
        second.wait_for(STARTED, Duration::from_secs(15)),
        "the lock is free once its holder exits:\n{}",
        second.output()
    );
    assert!(second.terminate().success(), "{}", second.output());
}

#[test]
fn a_kubelet_waiting_for_the_lock_still_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first = Kubelet::start(&with_lock(dir.path(), "first", &[]));
    assert!(
        first.wait_for(STARTED, Duration::from_secs(30)),
        "{}",
        first.output()
    );
    let mut second = Kubelet::start(&with_lock(dir.path(), "second", &[]));
    assert!(
        second.wait_for("Acquiring file lock", Duration::from_secs(30)),
        "{}",
        second.output()
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(second.terminate().success(), "{}", second.output());
    assert!(first.terminate().success(), "{}", first.output());
}

#[test]
fn lock_flag_errors_are_reported() {
    let out = std::process::Command::new(BIN)
        .arg("--exit-on-lock-contention")
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64), "a usage error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no lock file specified"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let mut args = standalone_args(dir.path(), "n");
    args.push(format!(
        "--lock-file={}",
        dir.path().join("no/such/dir/lock").display()
    ));
    let mut k = Kubelet::start(&args);
    let status = k
        .exited_within(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("must not start without its lock:\n{}", k.output()));
    assert_eq!(status.code(), Some(1), "{}", k.output());
    assert!(
        k.output().contains("unable to open lock file"),
        "{}",
        k.output()
    );
}
