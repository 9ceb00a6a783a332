//! Container log rotation (upstream `pkg/kubelet/logs/container_log_manager.go`,
//! `ContainerLogManager`): every `containerLogMonitorInterval` the manager
//! looks at the log file of each running container, and when it grew past
//! `containerLogMaxSize` it compresses the older rotated files, removes the
//! oldest beyond `containerLogMaxFiles`, renames the live file with a
//! timestamp suffix and asks the runtime to reopen it (CRI
//! `ReopenContainerLog`), at most `containerLogMaxWorkers` containers at a
//! time.
//!
//! The runtime is read through [`LogRuntime`]; [`CriLogRuntime`] is the real
//! one. File work runs off the async runtime; every runtime call has a
//! deadline.

mod error;
pub mod files;
mod manager;
mod policy;
mod runtime;

pub use error::LogsError;
pub use files::{TIMESTAMP_FORMAT, all_logs};
pub use manager::{ContainerLogManager, RotationStats};
pub use policy::LogRotatePolicy;
pub use runtime::{CriLogRuntime, LogRuntime};
