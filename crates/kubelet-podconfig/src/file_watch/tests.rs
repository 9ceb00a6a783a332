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
async fn dotfiles_do_not_wake_it_other_names_do() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut w, _r) = watch(dir.path());
    std::fs::write(dir.path().join(".pod.yaml.swp"), "x").expect("write");
    assert!(!wakes(&mut w).await);
    // Upstream reads every file not starting with a dot (GCE's `*.manifest`).
    std::fs::write(dir.path().join("etcd.manifest"), "x").expect("write");
    assert!(wakes(&mut w).await);
}

#[tokio::test]
async fn a_moved_directory_is_let_go_and_a_relinked_path_followed() {
    let parent = tempfile::tempdir().expect("tempdir");
    let a = parent.path().join("a");
    let b = parent.path().join("b");
    std::fs::create_dir(&a).expect("mkdir");
    std::fs::create_dir(&b).expect("mkdir");
    let link = parent.path().join("manifests");
    std::os::unix::fs::symlink(&a, &link).expect("symlink");
    let (mut w, r) = watch(&link);
    std::fs::write(a.join("p.yaml"), "x").expect("write");
    assert!(wakes(&mut w).await, "through the link");
    w.drain();
    // The link now names another directory: the next ensure follows it.
    std::fs::remove_file(&link).expect("rm link");
    std::os::unix::fs::symlink(&b, &link).expect("relink");
    r.ensure();
    std::fs::write(a.join("q.yaml"), "x").expect("write");
    assert!(
        !wakes(&mut w).await,
        "the old directory is no longer watched"
    );
    std::fs::write(b.join("q.yaml"), "x").expect("write");
    assert!(wakes(&mut w).await, "the new one is");
    w.drain();
    // Moved away: one wake-up, then nothing from where it went.
    let gone = parent.path().join("gone");
    std::fs::rename(&b, &gone).expect("move");
    assert!(wakes(&mut w).await, "moved");
    w.drain();
    std::fs::write(gone.join("r.yaml"), "x").expect("write");
    assert!(!wakes(&mut w).await, "a moved directory still woke it");
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
    for yes in ["a.yaml", "b.yml", "c.json", "etcd.manifest", "a.yaml~"] {
        assert!(is_manifest_name(OsStr::new(yes)), "{yes}");
    }
    for no in [".a.yaml", ".swp", ".#pod.yaml"] {
        assert!(!is_manifest_name(OsStr::new(no)), "{no}");
    }
}
