//! logind and systemd over the system bus (upstream
//! `pkg/kubelet/nodeshutdown/systemd`, `inhibit_linux.go`): the
//! `InhibitDelayMaxUSec` property, `Inhibit("shutdown", …, "delay")`, the
//! `PrepareForShutdown` signal, the `99-kubelet.conf` drop-in that raises
//! `InhibitDelayMaxSec`, and systemd's `KillUnit` to make logind reload it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tracing::error;
use zbus::proxy::CacheProperties;
use zbus::zvariant::OwnedFd;
use zbus::{Connection, Proxy};

use crate::Error;
use crate::logind::{Connect, InhibitLock, Logind, ShutdownEvents};

/// logind's bus name.
pub const LOGIND_SERVICE: &str = "org.freedesktop.login1";
/// logind's object.
pub const LOGIND_OBJECT: &str = "/org/freedesktop/login1";
/// logind's manager interface.
pub const LOGIND_INTERFACE: &str = "org.freedesktop.login1.Manager";
/// systemd's bus name.
pub const SYSTEMD_SERVICE: &str = "org.freedesktop.systemd1";
/// systemd's object.
pub const SYSTEMD_OBJECT: &str = "/org/freedesktop/systemd1";
/// systemd's manager interface.
pub const SYSTEMD_INTERFACE: &str = "org.freedesktop.systemd1.Manager";
/// Where upstream writes its logind drop-in.
pub const LOGIND_CONFIG_DIRECTORY: &str = "/etc/systemd/logind.conf.d";
/// The drop-in's name.
pub const KUBELET_LOGIND_CONF: &str = "99-kubelet.conf";
/// The system bus when `DBUS_SYSTEM_BUS_ADDRESS` is not set (sd-bus's default).
pub const DEFAULT_SYSTEM_BUS_ADDRESS: &str = "unix:path=/run/dbus/system_bus_socket";
/// Deadline of the connection (authentication and `Hello` included).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Deadline of one method call or property read.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The system bus address as sd-bus picks it: `DBUS_SYSTEM_BUS_ADDRESS`,
/// else [`DEFAULT_SYSTEM_BUS_ADDRESS`].
pub fn default_system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| DEFAULT_SYSTEM_BUS_ADDRESS.to_string())
}

/// Connects to the system bus at `address` (upstream `NewDBusCon`).
#[derive(Clone, Debug)]
pub struct SystemdConnector {
    /// The bus address (`unix:path=…`).
    pub address: String,
    /// Where the logind drop-in goes.
    pub logind_conf_dir: PathBuf,
}

#[async_trait::async_trait]
impl Connect for SystemdConnector {
    async fn connect(&self) -> Result<Arc<dyn Logind>, Error> {
        let connect = async {
            zbus::connection::Builder::address(self.address.as_str())?
                .method_timeout(CALL_TIMEOUT)
                .build()
                .await
        };
        let conn = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(source)) => {
                return Err(Error::Connect {
                    address: self.address.clone(),
                    source,
                });
            }
            Err(_) => {
                return Err(Error::Timeout {
                    what: "connecting to the system bus",
                    after: CONNECT_TIMEOUT,
                });
            }
        };
        Ok(Arc::new(DbusLogind {
            conn,
            logind_conf_dir: self.logind_conf_dir.clone(),
        }))
    }
}

/// logind and systemd on one bus connection (upstream `DBusCon`).
pub struct DbusLogind {
    conn: Connection,
    logind_conf_dir: PathBuf,
}

async fn deadline<T>(
    what: &'static str,
    fut: impl Future<Output = Result<T, zbus::Error>>,
    wrap: fn(zbus::Error) -> Error,
) -> Result<T, Error> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(r) => r.map_err(wrap),
        Err(_) => Err(Error::Timeout {
            what,
            after: CALL_TIMEOUT,
        }),
    }
}

impl DbusLogind {
    async fn proxy(
        &self,
        service: &'static str,
        object: &'static str,
        interface: &'static str,
    ) -> Result<Proxy<'static>, zbus::Error> {
        zbus::proxy::Builder::<Proxy<'static>>::new(&self.conn)
            .destination(service)?
            .path(object)?
            .interface(interface)?
            .cache_properties(CacheProperties::No)
            .build()
            .await
    }

    async fn logind(&self) -> Result<Proxy<'static>, zbus::Error> {
        self.proxy(LOGIND_SERVICE, LOGIND_OBJECT, LOGIND_INTERFACE)
            .await
    }
}

#[async_trait::async_trait]
impl Logind for DbusLogind {
    async fn current_inhibit_delay(&self) -> Result<Duration, Error> {
        let usec = deadline(
            "reading InhibitDelayMaxUSec",
            async {
                self.logind()
                    .await?
                    .get_property::<u64>("InhibitDelayMaxUSec")
                    .await
            },
            Error::InhibitDelay,
        )
        .await?;
        Ok(Duration::from_micros(usec))
    }

    async fn inhibit_shutdown(&self) -> Result<InhibitLock, Error> {
        let fd: OwnedFd = deadline(
            "Inhibit",
            async {
                self.logind()
                    .await?
                    .call(
                        "Inhibit",
                        &(
                            "shutdown",
                            "kubelet",
                            "Kubelet needs time to handle node shutdown",
                            "delay",
                        ),
                    )
                    .await
            },
            Error::Inhibit,
        )
        .await?;
        Ok(InhibitLock::new(std::os::fd::OwnedFd::from(fd)))
    }

    async fn override_inhibit_delay(&self, max: Duration) -> Result<(), Error> {
        let path = self.logind_conf_dir.join(KUBELET_LOGIND_CONF);
        let text = format!(
            "# Kubelet logind override\n[Login]\nInhibitDelayMaxSec={}\n",
            max.as_secs_f64().round()
        );
        let write = async {
            tokio::fs::create_dir_all(&self.logind_conf_dir).await?;
            tokio::fs::write(&path, text).await
        };
        match tokio::time::timeout(CALL_TIMEOUT, write).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(Error::Override { path, source }),
            Err(_) => Err(Error::Timeout {
                what: "writing the logind drop-in",
                after: CALL_TIMEOUT,
            }),
        }
    }

    async fn reload_logind_conf(&self) -> Result<(), Error> {
        deadline(
            "KillUnit",
            async {
                self.proxy(SYSTEMD_SERVICE, SYSTEMD_OBJECT, SYSTEMD_INTERFACE)
                    .await?
                    .call::<_, _, ()>("KillUnit", &("systemd-logind.service", "all", 1i32))
                    .await
            },
            Error::Reload,
        )
        .await
    }

    async fn monitor_shutdown(&self) -> Result<ShutdownEvents, Error> {
        let signals = deadline(
            "watching PrepareForShutdown",
            async {
                self.logind()
                    .await?
                    .receive_signal("PrepareForShutdown")
                    .await
            },
            Error::Monitor,
        )
        .await?;
        Ok(signals
            .filter_map(|m| async move {
                match m.body().deserialize::<bool>() {
                    Ok(active) => Some(active),
                    Err(e) => {
                        error!(error = %e, "Failed obtaining shutdown event, PrepareForShutdown event was not bool type as expected");
                        None
                    }
                }
            })
            .boxed())
    }
}
