//! Loop devices backing the host-path driver's block volumes, as
//! csi-driver-host-path (and upstream's `volumepathhandler`) attach them:
//! `losetup -j <file>` finds the device already bound to a volume's
//! backing file, `losetup --find --show <file>` binds a free one,
//! `losetup -c` refreshes its size after an expansion and `losetup -d`
//! detaches it. Every `losetup` run has a deadline and is killed past it;
//! the calls block, so the services run them on the blocking pool (the
//! driver's `Drop` runs them directly).

use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// How long one `losetup` run may take.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

/// The `losetup` binary: util-linux installs it in `/usr/sbin`, which a
/// test's `PATH` may lack.
fn losetup_bin() -> &'static str {
    const SBIN: &str = "/usr/sbin/losetup";
    if Path::new(SBIN).exists() {
        SBIN
    } else {
        "losetup"
    }
}

/// Runs `losetup args`, killed after `deadline`; its standard output, or
/// an error carrying its standard error.
fn losetup<I, S>(args: I, deadline: Duration) -> std::io::Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args
        .into_iter()
        .map(|a| a.as_ref().to_os_string())
        .collect();
    let mut child = Command::new(losetup_bin())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Counted polls rather than a clock: this runs off the runtime, whose
    // clock a test may have paused.
    const POLL: Duration = Duration::from_millis(5);
    let mut left = deadline.as_millis() / POLL.as_millis();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if left == 0 {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("losetup {args:?} did not finish within {deadline:?}"),
            ));
        }
        left -= 1;
        std::thread::sleep(POLL);
    };
    // The outputs are a few lines: the pipes never fill before the exit.
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        o.read_to_string(&mut out)?;
    }
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    if status.success() {
        Ok(out)
    } else {
        Err(std::io::Error::other(format!(
            "losetup {args:?} failed ({status}): {}",
            err.trim()
        )))
    }
}

/// The device names of `losetup -j` output
/// (`/dev/loop3: [2049]:1234 (/data/vol.block)` per line).
fn parse_devices(out: &str) -> Vec<PathBuf> {
    out.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(dev, _)| PathBuf::from(dev.trim()))
        .filter(|d| !d.as_os_str().is_empty())
        .collect()
}

/// The loop devices bound to `file` (none when the file is gone).
pub(crate) fn find(file: &Path, deadline: Duration) -> std::io::Result<Vec<PathBuf>> {
    if !file.exists() {
        return Ok(Vec::new());
    }
    let mut args = vec![OsStr::new("-j").to_os_string()];
    args.push(file.as_os_str().to_os_string());
    Ok(parse_devices(&losetup(args, deadline)?))
}

/// The loop device bound to `file`: the one already there, or a free one
/// bound now.
pub(crate) fn attach(file: &Path, deadline: Duration) -> std::io::Result<PathBuf> {
    if let Some(dev) = find(file, deadline)?.into_iter().next() {
        return Ok(dev);
    }
    let mut args = vec![
        OsStr::new("--find").to_os_string(),
        OsStr::new("--show").to_os_string(),
    ];
    args.push(file.as_os_str().to_os_string());
    let out = losetup(args, deadline)?;
    let dev = out.trim();
    if dev.is_empty() {
        return Err(std::io::Error::other(format!(
            "losetup named no device for {}",
            file.display()
        )));
    }
    tracing::debug!(file = %file.display(), device = dev, "test CSI driver attached a loop device");
    Ok(PathBuf::from(dev))
}

/// Detaches every loop device bound to `file`; how many there were. A
/// device still open elsewhere (a udev probe, a runtime) is detached by the
/// kernel at its last close (`losetup -d` sets autoclear on it): this waits
/// up to `deadline` for the devices to be gone, so callers see them gone.
pub(crate) fn detach_all(file: &Path, deadline: Duration) -> std::io::Result<usize> {
    let devices = find(file, deadline)?;
    for dev in &devices {
        losetup([OsStr::new("-d"), dev.as_os_str()], deadline)?;
        tracing::debug!(file = %file.display(), device = %dev.display(), "test CSI driver detached a loop device");
    }
    if !devices.is_empty() {
        const POLL: Duration = Duration::from_millis(50);
        let mut polls = deadline.as_millis() / POLL.as_millis();
        while !find(file, deadline)?.is_empty() {
            if polls == 0 {
                tracing::warn!(file = %file.display(), "loop device still bound after detaching; the kernel frees it at its last close");
                break;
            }
            polls -= 1;
            std::thread::sleep(POLL);
        }
    }
    Ok(devices.len())
}

/// Makes the devices bound to `file` follow its size (after it grew).
pub(crate) fn refresh(file: &Path, deadline: Duration) -> std::io::Result<()> {
    for dev in find(file, deadline)? {
        losetup([OsStr::new("-c"), dev.as_os_str()], deadline)?;
    }
    Ok(())
}

/// The size in bytes of the block device at `path` (its end offset).
pub(crate) fn device_size(path: &Path) -> std::io::Result<u64> {
    std::fs::File::open(path)?.seek(SeekFrom::End(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losetup_lines_name_their_devices() {
        let out = "/dev/loop3: [2049]:1234 (/data/vol.block)\n\
                   /dev/loop12: [2049]:1234 (/data/vol.block (deleted))\n";
        assert_eq!(
            parse_devices(out),
            vec![PathBuf::from("/dev/loop3"), PathBuf::from("/dev/loop12")]
        );
        assert!(parse_devices("").is_empty());
        assert!(parse_devices("\n").is_empty());
    }

    #[test]
    fn a_missing_file_has_no_device() {
        let found = find(Path::new("/no/such/file.block"), DEADLINE).expect("no losetup run");
        assert!(found.is_empty());
    }

    /// Needs root and a free loop device, as the driver does.
    #[test]
    fn attach_reuses_then_detach_frees() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("v.block");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(1 << 20))
            .expect("backing file");
        let dev = attach(&file, DEADLINE).expect("attach");
        let again = attach(&file, DEADLINE);
        let listed = find(&file, DEADLINE);
        let size = device_size(&dev);
        let grown = std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .and_then(|f| f.set_len(2 << 20))
            .and_then(|()| refresh(&file, DEADLINE))
            .and_then(|()| device_size(&dev));
        let detached = detach_all(&file, DEADLINE);
        let after = find(&file, DEADLINE);
        assert_eq!(again.expect("attach again"), dev, "one device per file");
        assert_eq!(listed.expect("find"), vec![dev.clone()]);
        assert_eq!(size.expect("size"), 1 << 20);
        assert_eq!(grown.expect("grown size"), 2 << 20);
        assert_eq!(detached.expect("detach"), 1);
        assert!(after.expect("find after").is_empty(), "loop device leaked");
    }
}
