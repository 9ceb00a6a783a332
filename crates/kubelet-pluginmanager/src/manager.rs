//! The plugin manager (upstream `pluginmanager.PluginManager`): the
//! desired state of the world is the set of sockets in the registry
//! directory, refreshed on every inotify wake-up (as upstream's fsnotify
//! watcher; the events that count are in [`crate::watcher`]) and, as a safety net, every rescan interval (a minute: an idle
//! node does not walk the directory; an inotify queue overflow asks for a
//! walk at once); each socket's task brings the actual state to it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::actual::ActualStateOfWorld;
use crate::client::CallTimeouts;
use crate::desired::DesiredStateOfWorld;
use crate::error::Error;
use crate::handler::PluginHandler;
use crate::scan::{self, SocketIdentity};
use crate::watcher;
use crate::worker::{self, Desired, MonitorConfig, Shared};

/// How often the directory is walked with no inotify event (upstream
/// never walks it again; inotify reports every change, and asks for a walk
/// when its queue overflowed).
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// The deadline handed to `register_plugin` (upstream passes none and the
/// CSI handler then uses its 2 min `csiTimeout`).
pub const DEFAULT_REGISTER_TIMEOUT: Duration = Duration::from_secs(120);
/// Time between two connection checks of a registered plugin (upstream
/// `connectionCheckInterval`).
pub const DEFAULT_CONNECTION_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Failed checks in a row that unregister a plugin (upstream `maxFailures`).
pub const DEFAULT_MAX_CHECK_FAILURES: u32 = 2;
/// How long events are gathered before the directory is walked.
const DEBOUNCE: Duration = Duration::from_millis(50);
/// Bound on one walk of the directory.
const SCAN_TIMEOUT: Duration = Duration::from_secs(30);

/// Tunables of the manager.
#[derive(Debug, Clone, Copy)]
pub struct PluginManagerConfig {
    /// How often the directory is walked when inotify reports nothing.
    pub rescan_interval: Duration,
    /// Deadlines of the registration calls.
    pub timeouts: CallTimeouts,
    /// The deadline handed to each handler's `register_plugin`.
    pub register_timeout: Duration,
    /// Time between two `GetInfo` checks of a registered plugin; zero turns
    /// the connection monitor off.
    pub connection_check_interval: Duration,
    /// Failed checks in a row after which a plugin is unregistered (until it
    /// answers again).
    pub max_check_failures: u32,
}

impl Default for PluginManagerConfig {
    fn default() -> Self {
        Self {
            rescan_interval: DEFAULT_RESCAN_INTERVAL,
            timeouts: CallTimeouts::default(),
            register_timeout: DEFAULT_REGISTER_TIMEOUT,
            connection_check_interval: DEFAULT_CONNECTION_CHECK_INTERVAL,
            max_check_failures: DEFAULT_MAX_CHECK_FAILURES,
        }
    }
}

/// Watches the plugins registry directory and registers the plugins found
/// there with the handler of their type.
pub struct PluginManager {
    dir: PathBuf,
    shared: Arc<Shared>,
    desired: DesiredStateOfWorld,
    rescan_interval: Duration,
}

impl PluginManager {
    /// A manager for `registry_dir` (`<root-dir>/plugins_registry`) handing
    /// plugins to `handlers` by type ([`crate::CSI_PLUGIN`],
    /// [`crate::DEVICE_PLUGIN`]).
    pub fn new(
        registry_dir: impl Into<PathBuf>,
        handlers: HashMap<&'static str, Arc<dyn PluginHandler>>,
        config: PluginManagerConfig,
    ) -> Self {
        let handlers = handlers
            .into_iter()
            .map(|(kind, handler)| (kind.to_string(), handler))
            .collect();
        Self {
            dir: registry_dir.into(),
            shared: Arc::new(Shared {
                handlers,
                timeouts: config.timeouts,
                register_timeout: config.register_timeout,
                monitor: MonitorConfig {
                    interval: config.connection_check_interval,
                    max_failures: config.max_check_failures.max(1),
                },
                actual: ActualStateOfWorld::default(),
            }),
            desired: DesiredStateOfWorld::default(),
            rescan_interval: config.rescan_interval,
        }
    }

    /// The registered plugins, readable while the manager runs.
    pub fn actual_state(&self) -> ActualStateOfWorld {
        self.shared.actual.clone()
    }

    /// The registration sockets found in the directory, readable while the
    /// manager runs.
    pub fn desired_state(&self) -> DesiredStateOfWorld {
        self.desired.clone()
    }

    /// Creates the directory (0750) when missing, then watches it until
    /// `cancel` fires. Fails only when the directory cannot be created or
    /// watched at the start (upstream `Watcher.Start`).
    pub async fn run(self, cancel: CancellationToken) -> Result<(), Error> {
        let dir = self.dir.clone();
        let ensure = tokio::task::spawn_blocking(move || scan::ensure_dir(&dir));
        match ensure.await {
            Ok(result) => result?,
            Err(join) => {
                return Err(Error::CreateRoot {
                    path: self.dir.clone(),
                    error: std::io::Error::other(join.to_string()),
                });
            }
        }
        let mut fs_watch = watcher::watch(&self.dir)?;
        let adder = fs_watch.adder();
        info!(path = %self.dir.display(), "Plugin Watcher Start");

        let tasks = TaskTracker::new();
        let mut sockets: HashMap<PathBuf, watch::Sender<Desired>> = HashMap::new();
        loop {
            if let Some(found) = self.scan(&adder).await {
                self.desired.replace(found.keys().cloned());
                self.reconcile(&found, &mut sockets, &tasks, &cancel);
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => break,
                () = fs_watch.changed() => {
                    tokio::time::sleep(DEBOUNCE).await;
                    fs_watch.drain();
                }
                () = tokio::time::sleep(self.rescan_interval) => {}
            }
        }
        drop(sockets);
        tasks.close();
        tasks.wait().await;
        info!("Plugin Watcher stopped");
        Ok(())
    }

    async fn scan(&self, adder: &watcher::DirAdder) -> Option<HashMap<PathBuf, SocketIdentity>> {
        let dir = self.dir.clone();
        let adder = adder.clone();
        let walk = tokio::task::spawn_blocking(move || scan::scan(&dir, |d| adder.add(d)));
        match tokio::time::timeout(SCAN_TIMEOUT, walk).await {
            Ok(Ok(Ok(found))) => Some(found),
            Ok(Ok(Err(error))) => {
                warn!(path = %self.dir.display(), %error, "Failed to traverse plugin socket path");
                None
            }
            Ok(Err(error)) => {
                warn!(%error, "Plugin directory walk failed");
                None
            }
            Err(_) => {
                warn!(path = %self.dir.display(), timeout = ?SCAN_TIMEOUT, "Plugin directory walk timed out");
                None
            }
        }
    }

    /// Points each socket's task at what the walk found, starting tasks for
    /// new sockets (and for sockets whose task ended meanwhile).
    fn reconcile(
        &self,
        found: &HashMap<PathBuf, SocketIdentity>,
        sockets: &mut HashMap<PathBuf, watch::Sender<Desired>>,
        tasks: &TaskTracker,
        cancel: &CancellationToken,
    ) {
        for (path, id) in found {
            let live = sockets.get(path).filter(|tx| !tx.is_closed());
            match live {
                Some(tx) => {
                    tx.send_if_modified(|want| {
                        let changed = *want != Some(*id);
                        *want = Some(*id);
                        changed
                    });
                }
                None => {
                    debug!(path = %path.display(), "Adding socket path to desired state cache");
                    let (tx, rx) = watch::channel(Some(*id));
                    let span = info_span!("plugin", socket = %path.display());
                    tasks.spawn(
                        worker::run(path.clone(), rx, self.shared.clone(), cancel.child_token())
                            .instrument(span),
                    );
                    sockets.insert(path.clone(), tx);
                }
            }
        }
        sockets.retain(|path, tx| {
            if found.contains_key(path) {
                return true;
            }
            if tx.is_closed() {
                return false;
            }
            if tx.borrow().is_some() {
                debug!(path = %path.display(), "Removing socket path from desired state cache");
                tx.send_replace(None);
            }
            true
        });
    }

    /// The registry directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
