//! Memory threshold notifiers (upstream `memory_threshold_notifier.go`,
//! `threshold_notifier_linux.go`): wake the eviction loop the moment
//! memory crosses a `memory.available` threshold instead of at the next
//! monitoring interval. On cgroup v1 a threshold on the root cgroup's
//! `memory.usage_in_bytes`, registered through `cgroup.event_control` with
//! an eventfd, as upstream; the threshold is the capacity less the
//! eviction threshold, plus the inactive file pages, and is set again
//! every 10 s as the page cache moves (upstream `notifierRefreshInterval`).
//! On cgroup v2, where upstream only polls, a PSI trigger on
//! `/proc/pressure/memory` (kubelet-rs addition): any stall for memory
//! wakes the loop, which then measures. The polling loop stays the
//! fallback either way.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::time::Instant;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::EvictionError;
use crate::api::{Signal, Threshold};

/// Upstream `notifierRefreshInterval`.
pub const NOTIFIER_REFRESH_INTERVAL: Duration = Duration::from_secs(10);

/// The node's memory as the root cgroup accounts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RootMemory {
    /// `MemTotal`.
    pub capacity: u64,
    /// Usage including page cache.
    pub usage: u64,
    /// Inactive file pages.
    pub inactive_file: u64,
}

impl RootMemory {
    /// Usage minus inactive file pages.
    pub fn working_set(&self) -> u64 {
        self.usage.saturating_sub(self.inactive_file)
    }

    /// Capacity minus the working set (`memory.available`).
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.working_set())
    }
}

fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(char::is_whitespace)?;
        (k.trim_end_matches(':') == key).then(|| {
            let mut parts = v.split_whitespace();
            let n: u64 = parts.next()?.parse().ok()?;
            Some(if parts.next() == Some("kB") {
                n.saturating_mul(1024)
            } else {
                n
            })
        })?
    })
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> EvictionError + '_ {
    move |source| EvictionError::Notifier {
        path: path.display().to_string(),
        source,
    }
}

fn read(path: &Path) -> Result<String, EvictionError> {
    std::fs::read_to_string(path).map_err(io_err(path))
}

/// Whether `cgroup_root` is cgroup v1 (has a `memory` controller directory).
pub fn is_v1(cgroup_root: &Path) -> bool {
    cgroup_root.join("memory/memory.usage_in_bytes").exists()
}

/// Reads the root cgroup's memory (blocking): v1 `memory.usage_in_bytes`
/// and `total_inactive_file`, as cAdvisor does for the root container; v2
/// from `/proc/meminfo` (the v2 root cgroup has no `memory.current`).
pub fn read_root_memory(cgroup_root: &Path, proc_root: &Path) -> Result<RootMemory, EvictionError> {
    let meminfo_path = proc_root.join("meminfo");
    let meminfo = read(&meminfo_path)?;
    let bad = || EvictionError::Notifier {
        path: meminfo_path.display().to_string(),
        source: io::Error::new(io::ErrorKind::InvalidData, "no MemTotal"),
    };
    let capacity = keyed(&meminfo, "MemTotal").ok_or_else(bad)?;
    if is_v1(cgroup_root) {
        let usage_path = cgroup_root.join("memory/memory.usage_in_bytes");
        let text = read(&usage_path)?;
        // Unparsable is an error (the summary's memory is used), never 0
        // ("all memory free").
        let usage = text.trim().parse().map_err(|e| EvictionError::Notifier {
            path: usage_path.display().to_string(),
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })?;
        let stat = read(&cgroup_root.join("memory/memory.stat"))?;
        let inactive_file = keyed(&stat, "total_inactive_file").unwrap_or(0);
        return Ok(RootMemory {
            capacity,
            usage,
            inactive_file,
        });
    }
    let free = keyed(&meminfo, "MemFree").unwrap_or(0);
    Ok(RootMemory {
        capacity,
        usage: capacity.saturating_sub(free),
        inactive_file: keyed(&meminfo, "Inactive(file)").unwrap_or(0),
    })
}

/// The `memory.usage_in_bytes` value at which `t` is crossed (upstream
/// `UpdateThreshold`): capacity minus the threshold, plus inactive file.
pub fn usage_threshold(t: &Threshold, m: &RootMemory) -> u64 {
    let cap = i64::try_from(m.capacity).unwrap_or(i64::MAX);
    let q = t
        .value
        .quantity(cap, kubelet_types::quantity::Format::BinarySI)
        .value();
    let q = u64::try_from(q).unwrap_or(0);
    m.capacity.saturating_sub(q).saturating_add(m.inactive_file)
}

/// How long one blocking wait lasts before the stop flag is checked, when
/// no stop eventfd could be made (the common case sleeps until an event,
/// the deadline or the stop, with no periodic wake-up).
const POLL_SLICE_MS: u16 = 500;

/// The stop of the blocking thread: a flag, and an eventfd its waits poll
/// beside their own descriptor so a stop ends them at once.
struct StopSignal {
    flag: AtomicBool,
    efd: Option<EventFd>,
}

impl StopSignal {
    fn new() -> Self {
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK);
        if let Err(e) = &efd {
            debug!(error = %e, "Eviction manager: no stop eventfd, waits are sliced");
        }
        Self {
            flag: AtomicBool::new(false),
            efd: efd.ok(),
        }
    }

    fn stop(&self) {
        self.flag.store(true, Ordering::Relaxed);
        if let Some(efd) = &self.efd {
            let _ = efd.write(1);
        }
    }

    fn is_set(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}
/// A cgroup v1 threshold registration; dropping it unregisters it.
struct CgroupV1 {
    efd: EventFd,
    _usage: File,
}

fn register_v1(cgroup_root: &Path, threshold: u64) -> Result<CgroupV1, EvictionError> {
    let dir = cgroup_root.join("memory");
    let usage_path = dir.join("memory.usage_in_bytes");
    let usage = File::open(&usage_path).map_err(io_err(&usage_path))?;
    let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
        .map_err(|e| io_err(&usage_path)(e.into()))?;
    let control_path = dir.join("cgroup.event_control");
    let mut control = OpenOptions::new()
        .write(true)
        .open(&control_path)
        .map_err(io_err(&control_path))?;
    let line = format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), threshold);
    control
        .write_all(line.as_bytes())
        .map_err(io_err(&control_path))?;
    Ok(CgroupV1 { efd, _usage: usage })
}

/// Waits (blocking) until `fd` has `events` or `until` passes or `stop`
/// is set; true when the events came.
fn wait(fd: BorrowedFd<'_>, events: PollFlags, until: Instant, stop: &StopSignal) -> bool {
    wait_counted(fd, events, until, stop).0
}

/// [`wait`], also saying how many `poll` calls it made: one per event,
/// deadline or stop (a slice each 500 ms only without a stop eventfd).
fn wait_counted(
    fd: BorrowedFd<'_>,
    events: PollFlags,
    until: Instant,
    stop: &StopSignal,
) -> (bool, u32) {
    let mut polls = 0u32;
    loop {
        let now = Instant::now();
        if stop.is_set() || now >= until {
            return (false, polls);
        }
        let left = until - now;
        let cap = match &stop.efd {
            Some(_) => u128::from(u16::MAX),
            None => u128::from(POLL_SLICE_MS),
        };
        // Rounded up: a poll that ends just short of the deadline would
        // make a second, empty one.
        let ms = (left.as_nanos().div_ceil(1_000_000)).min(cap);
        let timeout = PollTimeout::from(u16::try_from(ms).unwrap_or(u16::MAX));
        let mut fds = vec![PollFd::new(fd, events)];
        if let Some(efd) = &stop.efd {
            fds.push(PollFd::new(efd.as_fd(), PollFlags::POLLIN));
        }
        polls += 1;
        if let Ok(n) = poll(&mut fds, timeout)
            && n > 0
            && fds[0].revents().is_some_and(|r| r.intersects(events))
        {
            return (true, polls);
        }
    }
}

/// Sleeps (blocking) until `until` or a stop.
fn sleep_until(until: Instant, stop: &StopSignal) {
    match &stop.efd {
        Some(efd) => {
            // Never readable but through the stop itself.
            let _ = wait(efd.as_fd(), PollFlags::POLLIN, until, stop);
        }
        None => {
            while !stop.is_set() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(u64::from(POLL_SLICE_MS)));
            }
        }
    }
}

/// Where the notifier reads.
#[derive(Clone, Debug)]
pub struct Roots {
    /// `/sys/fs/cgroup`.
    pub cgroup: PathBuf,
    /// `/proc`.
    pub proc: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            cgroup: PathBuf::from("/sys/fs/cgroup"),
            proc: PathBuf::from("/proc"),
        }
    }
}

/// Runs the notifier for the `memory.available` thresholds among
/// `thresholds` until `stop`, waking `wake` when memory crosses one. Ends
/// (logged) when the host supports neither mechanism. The waits block a
/// thread of the blocking pool, which wakes only for an event, the 10 s
/// refresh or the stop (an eventfd polled beside the threshold's).
pub async fn run(
    thresholds: Vec<Threshold>,
    roots: Roots,
    wake: Arc<Notify>,
    stop: CancellationToken,
) {
    let memory: Vec<Threshold> = thresholds
        .into_iter()
        .filter(|t| t.signal == Signal::MemoryAvailable)
        .collect();
    if memory.is_empty() {
        return;
    }
    let stopped = Arc::new(StopSignal::new());
    // Also when this future is dropped without `stop` (a runtime shut down
    // under it): the blocking thread must end, or the runtime's drop waits
    // for it forever.
    let _stop_on_drop = StopOnDrop(stopped.clone());
    let flag = stopped.clone();
    let thread_wake = wake.clone();
    let work = tokio::task::spawn_blocking(move || {
        if is_v1(&roots.cgroup) {
            run_v1(&memory, &roots, &thread_wake, &flag);
        } else {
            run_psi(&roots, &thread_wake, &flag);
        }
    });
    stop.cancelled().await;
    stopped.stop();
    let _ = work.await;
}

/// Stops the blocking waits when dropped.
struct StopOnDrop(Arc<StopSignal>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

fn run_v1(memory: &[Threshold], roots: &Roots, wake: &Notify, stop: &StopSignal) {
    let mut failed_once = false;
    while !stop.is_set() {
        let until = Instant::now() + NOTIFIER_REFRESH_INTERVAL;
        let registered = read_root_memory(&roots.cgroup, &roots.proc).and_then(|m| {
            memory
                .iter()
                .map(|t| {
                    let at = usage_threshold(t, &m);
                    register_v1(&roots.cgroup, at).map(|reg| (reg, at))
                })
                .collect::<Result<Vec<_>, _>>()
        });
        let regs = match registered {
            Ok(r) => r,
            Err(e) => {
                if !failed_once {
                    info!(error = %e, "Eviction manager: failed to create memory threshold notifier");
                    failed_once = true;
                }
                sleep_until(until, stop);
                continue;
            }
        };
        debug!(usage_thresholds = ?regs.iter().map(|r| r.1).collect::<Vec<_>>(), "Eviction manager: memory threshold notifier armed");
        // One threshold is the common case; with several, each waits a
        // share of the refresh interval in turn.
        let share = NOTIFIER_REFRESH_INTERVAL / u32::try_from(regs.len()).unwrap_or(1).max(1);
        for (reg, at) in &regs {
            let slice_end = (Instant::now() + share).min(until);
            if wait(reg.efd.as_fd(), PollFlags::POLLIN, slice_end, stop) {
                let _ = reg.efd.read();
                info!(
                    usage_threshold = at,
                    "Eviction manager: memory usage crossed a notifier threshold"
                );
                wake.notify_one();
                break;
            }
        }
    }
}

fn run_psi(roots: &Roots, wake: &Notify, stop: &StopSignal) {
    let path = roots.proc.join("pressure/memory");
    let f = OpenOptions::new().read(true).write(true).open(&path);
    let mut f = match f {
        Ok(f) => f,
        Err(e) => {
            info!(error = %e, path = %path.display(), "Eviction manager: no PSI memory trigger, polling only");
            return;
        }
    };
    // Some task stalled on memory for 100 ms within 1 s.
    if let Err(e) = f.write_all(b"some 100000 1000000\0") {
        info!(error = %e, "Eviction manager: PSI memory trigger refused, polling only");
        return;
    }
    while !stop.is_set() {
        let until = Instant::now() + NOTIFIER_REFRESH_INTERVAL;
        if wait(f.as_fd(), PollFlags::POLLPRI, until, stop) {
            debug!("Eviction manager: memory stall (PSI trigger)");
            wake.notify_one();
            // At most one wake-up per trigger window.
            sleep_until(Instant::now() + Duration::from_secs(1), stop);
        }
    }
}

/// Reads a file fully (tests).
#[allow(dead_code)]
fn read_all(mut f: File) -> io::Result<String> {
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ThresholdValue;

    #[test]
    fn root_memory_v1_as_cadvisor() {
        let dir = std::env::temp_dir().join(format!("evict-notifier-{}", std::process::id()));
        let cg = dir.join("cgroup");
        let proc = dir.join("proc");
        std::fs::create_dir_all(cg.join("memory")).expect("mkdir");
        std::fs::create_dir_all(&proc).expect("mkdir");
        std::fs::write(
            proc.join("meminfo"),
            "MemTotal:       1048576 kB\nMemFree: 1 kB\n",
        )
        .expect("write");
        std::fs::write(cg.join("memory/memory.usage_in_bytes"), "805306368\n").expect("write");
        std::fs::write(
            cg.join("memory/memory.stat"),
            "inactive_file 1\ntotal_inactive_file 268435456\n",
        )
        .expect("write");
        let m = read_root_memory(&cg, &proc).expect("read");
        assert_eq!(m.capacity, 1 << 30);
        assert_eq!(m.working_set(), 512 << 20);
        assert_eq!(m.available(), 512 << 20);
        let t = Threshold {
            signal: Signal::MemoryAvailable,
            value: ThresholdValue::Quantity(
                kubelet_types::quantity::Quantity::parse("100Mi").expect("q"),
            ),
            grace_period: Duration::ZERO,
            min_reclaim: None,
        };
        // Crossed when usage reaches capacity - 100Mi + inactive file.
        assert_eq!(
            usage_threshold(&t, &m),
            (1 << 30) - (100 << 20) + (256 << 20)
        );
        // An unreadable usage is an error, not "all memory free".
        std::fs::write(cg.join("memory/memory.usage_in_bytes"), "garbage\n").expect("write");
        assert!(read_root_memory(&cg, &proc).is_err());
        assert_eq!(
            keyed("MemTotal: 18446744073709551615 kB\n", "MemTotal"),
            Some(u64::MAX)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn event() -> EventFd {
        EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK).expect("eventfd")
    }

    #[test]
    fn a_quiet_wait_is_one_poll_until_its_deadline() {
        // Nothing happens for 1.2 s: one poll (three 500 ms slices before).
        let fd = event();
        let stop = StopSignal::new();
        let t0 = Instant::now();
        let (got, polls) = wait_counted(
            fd.as_fd(),
            PollFlags::POLLIN,
            Instant::now() + Duration::from_millis(1200),
            &stop,
        );
        assert!(!got);
        assert_eq!(polls, 1);
        assert!(t0.elapsed() >= Duration::from_millis(1200));
    }

    #[test]
    fn a_wait_ends_at_once_on_its_event_or_on_the_stop() {
        let fd = event();
        let stop = Arc::new(StopSignal::new());
        fd.write(1).expect("write");
        let until = Instant::now() + Duration::from_secs(60);
        assert_eq!(
            wait_counted(fd.as_fd(), PollFlags::POLLIN, until, &stop),
            (true, 1)
        );
        let _ = fd.read();
        let stopper = stop.clone();
        let t0 = Instant::now();
        let th = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            stopper.stop();
        });
        let (got, polls) = wait_counted(fd.as_fd(), PollFlags::POLLIN, until, &stop);
        th.join().expect("join");
        assert!(!got);
        assert!(polls <= 2, "{polls}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        // Stopped: a sleep returns at once.
        let t1 = Instant::now();
        sleep_until(Instant::now() + Duration::from_secs(60), &stop);
        assert!(t1.elapsed() < Duration::from_secs(1));
    }
}
