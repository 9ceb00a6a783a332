//! Tests of the atomic writer.
use std::os::unix::fs::MetadataExt;

use super::*;

fn file(data: &str, mode: u32) -> FileProjection {
    FileProjection {
        data: data.as_bytes().to_vec(),
        mode,
        fs_user: None,
    }
}

fn payload(files: &[(&str, &str)]) -> Payload {
    files
        .iter()
        .map(|(p, d)| (p.to_string(), file(d, 0o644)))
        .collect()
}

fn data_link(dir: &Path) -> String {
    std::fs::read_link(dir.join(DATA_DIR_NAME))
        .expect("..data")
        .to_string_lossy()
        .into_owned()
}

fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect()
}

#[tokio::test]
async fn first_write_lays_out_data_dir_and_links() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = AtomicWriter::new(tmp.path(), "test");
    w.write(payload(&[("a", "1"), ("sub/deep/b", "2")]), None)
        .await
        .expect("write");

    let ts = data_link(tmp.path());
    // `..YYYY_MM_DD_HH_MM_SS.<digits>`
    let (stamp, random) = ts[2..].split_once('.').expect("dot");
    assert_eq!(stamp.len(), 19, "{ts}");
    assert_eq!(stamp.matches('_').count(), 5, "{ts}");
    assert!(random.chars().all(|c| c.is_ascii_digit()) && !random.is_empty());
    assert_eq!(
        std::fs::metadata(tmp.path().join(&ts)).expect("ts").mode() & 0o7777,
        0o755
    );
    assert_eq!(
        std::fs::read_link(tmp.path().join("a")).expect("a"),
        Path::new("..data/a")
    );
    assert_eq!(
        std::fs::read_link(tmp.path().join("sub")).expect("sub"),
        Path::new("..data/sub")
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("a")).expect("a"),
        "1"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("sub/deep/b")).expect("b"),
        "2"
    );
    assert_eq!(
        entries(tmp.path()),
        BTreeSet::from(["a".into(), "sub".into(), DATA_DIR_NAME.into(), ts])
    );
}

#[tokio::test]
async fn update_swaps_data_dir_prunes_links_and_removes_old_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = AtomicWriter::new(tmp.path(), "test");
    w.write(payload(&[("a", "1"), ("gone", "x"), ("sub/b", "2")]), None)
        .await
        .expect("write");
    let first = data_link(tmp.path());

    w.write(payload(&[("a", "1"), ("new", "n"), ("sub/c", "3")]), None)
        .await
        .expect("update");
    let second = data_link(tmp.path());
    assert_ne!(first, second);
    assert!(!tmp.path().join(&first).exists(), "old ts dir removed");
    assert!(std::fs::symlink_metadata(tmp.path().join("gone")).is_err());
    assert!(!tmp.path().join("sub/b").exists());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("sub/c")).expect("c"),
        "3"
    );
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("new")).expect("n"),
        "n"
    );
    assert_eq!(
        entries(tmp.path()),
        BTreeSet::from([
            "a".into(),
            "new".into(),
            "sub".into(),
            DATA_DIR_NAME.into(),
            second
        ])
    );
}

#[tokio::test]
async fn unchanged_payload_is_not_rewritten_but_links_are_restored() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = AtomicWriter::new(tmp.path(), "test");
    let p = payload(&[("a", "1"), ("b", "2")]);
    w.write(p.clone(), None).await.expect("write");
    let first = data_link(tmp.path());
    std::fs::remove_file(tmp.path().join("b")).expect("rm link");

    w.write(p, None).await.expect("again");
    assert_eq!(data_link(tmp.path()), first);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("b")).expect("b"),
        "2"
    );

    // A change in content alone is a write.
    w.write(payload(&[("a", "1"), ("b", "3")]), None)
        .await
        .expect("change");
    assert_ne!(data_link(tmp.path()), first);
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("b")).expect("b"),
        "3"
    );
}

#[tokio::test]
async fn modes_and_owner_are_applied_whatever_the_umask() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = AtomicWriter::new(tmp.path(), "test");
    let mut p = Payload::new();
    p.insert("rw".into(), file("x", 0o666));
    p.insert("x".into(), file("x", 0o755));
    p.insert("ro".into(), file("x", 0o400));
    p.insert(
        "token".into(),
        FileProjection {
            fs_user: Some(4321),
            ..file("t", 0o600)
        },
    );
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let res = w.write(p, None).await;
    nix::sys::stat::umask(old);
    res.expect("write");
    let meta = |n: &str| std::fs::metadata(tmp.path().join(n)).expect("stat");
    assert_eq!(meta("rw").mode() & 0o7777, 0o666);
    assert_eq!(meta("x").mode() & 0o7777, 0o755);
    assert_eq!(meta("ro").mode() & 0o7777, 0o400);
    assert_eq!(meta("token").mode() & 0o7777, 0o600);
    assert_eq!(meta("token").uid(), 4321);
    assert_eq!(meta("rw").uid(), nix::unistd::geteuid().as_raw());
}

#[tokio::test]
async fn set_perms_sees_the_new_dir_before_it_is_visible() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = AtomicWriter::new(tmp.path(), "test");
    let target = tmp.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    let hook: SetPerms = Box::new(move |ts: &Path| {
        let visible = std::fs::read_link(target.join(DATA_DIR_NAME)).is_ok();
        let _ = tx.send((ts.to_path_buf(), visible));
        Ok(())
    });
    w.write(payload(&[("a", "1")]), Some(hook))
        .await
        .expect("write");
    let (ts, visible) = rx.try_recv().expect("called");
    assert!(!visible);
    assert_eq!(ts, tmp.path().join(data_link(tmp.path())));
}

#[tokio::test]
async fn stale_tmp_link_does_not_block_writes() {
    let tmp = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink("..nowhere", tmp.path().join(NEW_DATA_DIR_NAME))
        .expect("stale link");
    let w = AtomicWriter::new(tmp.path(), "test");
    w.write(payload(&[("a", "1")]), None).await.expect("write");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("a")).expect("a"),
        "1"
    );
}

#[test]
fn invalid_paths_are_rejected_with_upstream_messages() {
    let msg = |p: &str| match validate_path(p) {
        Err(Error::Invalid(m)) => m,
        other => panic!("{p}: {other:?}"),
    };
    assert_eq!(msg(""), "invalid path: must not be empty: \"\"");
    assert_eq!(msg("/etc/x"), "invalid path: must be relative path: /etc/x");
    assert_eq!(msg("a/../b"), "invalid path: must not contain '..': a/../b");
    assert_eq!(msg(".."), "invalid path: must not contain '..': ..");
    assert_eq!(
        msg("..data"),
        "invalid path: must not start with '..': ..data"
    );
    assert_eq!(
        msg(&"x".repeat(256)),
        "invalid path: filenames must be less than or equal to 255 characters"
    );
    assert_eq!(
        msg(&"a/".repeat(2049)),
        "invalid path: must be less than or equal to 4096 characters"
    );
    for ok in ["a", "a/b", "a..b", ".a", "./a"] {
        assert!(validate_path(ok).is_ok(), "{ok}");
    }
}

#[tokio::test]
async fn payload_paths_are_cleaned_and_missing_target_fails() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = AtomicWriter::new(tmp.path(), "test");
    w.write(payload(&[("./a//b/", "1")]), None)
        .await
        .expect("write");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("a/b")).expect("b"),
        "1"
    );

    let missing = AtomicWriter::new(tmp.path().join("nope"), "test");
    assert!(matches!(
        missing.write(payload(&[("a", "1")]), None).await,
        Err(Error::Io { .. })
    ));
    let bad = payload(&[("../evil", "1")]);
    assert!(matches!(w.write(bad, None).await, Err(Error::Invalid(_))));
    assert!(!tmp.path().parent().expect("parent").join("evil").exists());
}
