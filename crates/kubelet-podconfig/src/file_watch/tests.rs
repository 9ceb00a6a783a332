use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use super::*;

/// Long enough for an event the kernel queued to be read.
const QUIET: Duration = Duration::from_millis(300);

async fn wakes(w: &mut PathWatch) -> bool {
    tokio::time::timeout(QUIET, w.changed()).await.is_ok()
}

fn watch(path: &Path) -> (PathWatch, Retarget) {
    let w = PathWatch::new(path).expect("inotify");
    let r = w.retarget();
    r.ensure();
    (w, r)
}

/// What the source does on every wake-up: list the directory and read
/// every file in it.
fn read_everything(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("list") {
        let p = e.expect("entry").path();
        if p.is_file() {
            let _ = std::fs::read(&p).expect("read");
        }
    }
}

#[tokio::test]
async fn reading_the_directory_and_its_manifests_wakes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("a.yaml"), "x").expect("write");
    let (mut w, r) = watch(dir.path());
    for _ in 0..20 {
        r.ensure();
        read_everything(dir.path());
    }
    assert!(!wakes(&mut w).await, "the source's own reads woke it");
}

#[tokio::test]
async fn creates_completed_writes_removals_renames_and_mode_changes_wake_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut w, _r) = watch(dir.path());
    let a = dir.path().join("a.yaml");
    std::fs::write(&a, "x").expect("write");
    assert!(wakes(&mut w).await, "create");
    w.drain();
    std::fs::write(&a, "y").expect("write");
    assert!(wakes(&mut w).await, "write completed");
    w.drain();
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    assert!(wakes(&mut w).await, "mode change");
    w.drain();
    let aside = dir.path().join(".a.yaml.swp");
    std::fs::rename(&a, &aside).expect("rename out");
    assert!(wakes(&mut w).await, "renamed away");
    w.drain();
    std::fs::rename(&aside, &a).expect("rename in");
    assert!(wakes(&mut w).await, "renamed in");
    w.drain();
    std::fs::remove_file(&a).expect("rm");
    assert!(wakes(&mut w).await, "removed");
}

#[tokio::test]
async fn dotfiles_and_other_names_do_not_wake_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut w, _r) = watch(dir.path());
    std::fs::write(dir.path().join(".pod.yaml.swp"), "x").expect("write");
    std::fs::write(dir.path().join("notes.txt"), "x").expect("write");
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    assert!(!wakes(&mut w).await);
}

#[tokio::test]
async fn a_single_manifest_file_is_watched_by_name_in_its_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pod = dir.path().join("pod.yaml");
    std::fs::write(&pod, "x").expect("write");
    let (mut w, r) = watch(&pod);
    std::fs::write(dir.path().join("other.yaml"), "x").expect("write");
    r.ensure();
    let _ = std::fs::read(&pod).expect("read");
    assert!(!wakes(&mut w).await, "a sibling or a read woke it");
    std::fs::write(&pod, "y").expect("write");
    assert!(wakes(&mut w).await);
}

#[tokio::test]
async fn a_directory_created_later_is_watched_after_the_next_ensure() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("manifests");
    let (mut w, r) = watch(&dir);
    std::fs::write(parent.path().join("kubelet.conf"), "x").expect("write");
    assert!(!wakes(&mut w).await, "another file in the parent");
    std::fs::create_dir(&dir).expect("mkdir");
    assert!(wakes(&mut w).await, "the directory appeared");
    r.ensure();
    std::fs::write(dir.join("a.yaml"), "x").expect("write");
    assert!(wakes(&mut w).await, "a manifest in the new directory");
    w.drain();
    // Removed and made again: the old watch is gone, the next ensure sets a new one.
    std::fs::remove_file(dir.join("a.yaml")).expect("rm");
    std::fs::remove_dir(&dir).expect("rmdir");
    assert!(wakes(&mut w).await, "the directory went");
    w.drain();
    std::fs::create_dir(&dir).expect("mkdir");
    r.ensure();
    w.drain();
    std::fs::write(dir.join("b.yaml"), "x").expect("write");
    assert!(
        wakes(&mut w).await,
        "a manifest in the directory made again"
    );
}

#[test]
fn manifest_names() {
    for yes in ["a.yaml", "b.yml", "c.json"] {
        assert!(is_manifest_name(OsStr::new(yes)), "{yes}");
    }
    for no in [".a.yaml", "a.yaml~", "a.txt", "yaml", ".swp"] {
        assert!(!is_manifest_name(OsStr::new(no)), "{no}");
    }
}
