//! Issue 7 fix 4.8: file reads must not block the async runtime. A FIFO
//! with no writer stands for a read that blocks (a hung mount).

use std::future::Future;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

/// Makes `fifo` (relative to a fresh directory) a FIFO with no writer, so
/// that opening it for reading blocks, then runs `task(dir)` on a
/// current-thread runtime in its own thread. Asserts that another task on
/// that runtime still runs within a deadline: a read done on the runtime
/// thread would stall it.
pub fn assert_runtime_not_stalled_by<F, Fut>(fifo: &str, task: F)
where
    F: FnOnce(PathBuf) -> Fut + Send + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: Send + 'static,
{
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join(fifo);
    if let Some(parent) = fifo.parent() {
        std::fs::create_dir_all(parent).expect("fifo dir");
    }
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let root = dir.path().to_path_buf();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let _blocked = tokio::spawn(task(root));
            // Other tasks on this runtime still run while the read blocks.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let _ = done_tx.send(());
        });
    });
    let answered = done_rx.recv_timeout(Duration::from_secs(5));
    // Unblock the reader, whatever happened. Non-blocking: this open
    // succeeds while a reader waits, and never hangs when none does.
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(&fifo);
    assert!(
        answered.is_ok(),
        "the runtime stalled on a blocking read of {}",
        fifo.display()
    );
}
