//! systemd's unit manager over the system bus (upstream: runc's
//! `libcontainer/cgroups/systemd` `dbusConnManager`, `startUnit`,
//! `stopUnit`, `resetFailedUnit`, `setUnitProperties`): the
//! [`SystemdUnits`] the systemd cgroup driver uses for the kubelet's slices.
//!
//! The cgroup manager calls from the blocking pool; each call here runs on
//! the kubelet's runtime and the caller waits for its answer with a
//! deadline, so a bus that hangs never holds a thread for long.

use std::sync::mpsc;
use std::time::Duration;

use tokio::runtime::Handle;
use tracing::debug;
use zbus::Connection;
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};

use crate::CgroupError;
use crate::systemd_unit::{PropertyValue, SystemdUnits, UnitProperty};

const SERVICE: &str = "org.freedesktop.systemd1";
const OBJECT: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const UNIT: &str = "org.freedesktop.systemd1.Unit";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// The system bus when `DBUS_SYSTEM_BUS_ADDRESS` is not set (sd-bus's default).
const DEFAULT_SYSTEM_BUS_ADDRESS: &str = "unix:path=/run/dbus/system_bus_socket";
/// Deadline of the connection and of one method call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a slice's start or stop job may take (runc waits 30 s for any
/// unit; a slice has no process to start or stop). With [`CALL_TIMEOUT`],
/// one operation ends well within the container manager's deadline.
const JOB_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two looks at a unit's state while its job runs.
const JOB_POLL: Duration = Duration::from_millis(20);

/// The system bus address as sd-bus picks it.
pub fn system_bus_address() -> String {
    std::env::var("DBUS_SYSTEM_BUS_ADDRESS")
        .ok()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| DEFAULT_SYSTEM_BUS_ADDRESS.to_string())
}

/// systemd's manager on one bus connection.
#[derive(Debug)]
pub struct DbusUnits {
    conn: Connection,
    handle: Handle,
}

impl DbusUnits {
    /// Connects to the bus at `address` (upstream: the cgroup manager's
    /// first D-Bus call; here at start, so a node without systemd's bus
    /// fails at once with the reason).
    pub async fn connect(address: &str) -> Result<Self, CgroupError> {
        let err = |reason: String| CgroupError::Systemd {
            unit: "-".into(),
            op: "connect to the system bus",
            reason,
        };
        let connect = async {
            zbus::connection::Builder::address(address)?
                .method_timeout(CALL_TIMEOUT)
                .build()
                .await
        };
        let conn = match tokio::time::timeout(CALL_TIMEOUT, connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(err(format!("{address}: {e}"))),
            Err(_) => return Err(err(format!("{address}: no answer within {CALL_TIMEOUT:?}"))),
        };
        Ok(Self {
            conn,
            handle: Handle::current(),
        })
    }

    /// Runs `fut` on the kubelet's runtime and waits for it here.
    fn run<T: Send + 'static>(
        &self,
        unit: &str,
        op: &'static str,
        fut: impl Future<Output = Result<T, CgroupError>> + Send + 'static,
    ) -> Result<T, CgroupError> {
        let (tx, rx) = mpsc::sync_channel(1);
        let deadline = JOB_TIMEOUT + CALL_TIMEOUT;
        self.handle.spawn(async move {
            let r = tokio::time::timeout(deadline, fut).await;
            let _ = tx.send(r);
        });
        let late = || CgroupError::Systemd {
            unit: unit.to_string(),
            op,
            reason: format!("no answer within {deadline:?}"),
        };
        match rx.recv_timeout(deadline + Duration::from_secs(1)) {
            Ok(Ok(r)) => r,
            Ok(Err(_)) | Err(_) => Err(late()),
        }
    }
}

fn to_value(v: &PropertyValue) -> Value<'static> {
    match v {
        PropertyValue::Str(s) => Value::from(s.clone()),
        PropertyValue::Bool(b) => Value::from(*b),
        PropertyValue::U64(n) => Value::from(*n),
        PropertyValue::Strs(l) => Value::from(l.clone()),
    }
}

fn body(properties: &[UnitProperty]) -> Vec<(String, Value<'static>)> {
    properties
        .iter()
        .map(|p| (p.name.to_string(), to_value(&p.value)))
        .collect()
}

/// Whether `e` is the D-Bus error `name`.
fn is_error(e: &zbus::Error, name: &str) -> bool {
    matches!(e, zbus::Error::MethodError(n, _, _) if n.as_str() == name)
}

async fn call<B>(
    conn: &Connection,
    path: &str,
    iface: &str,
    method: &str,
    body: &B,
) -> Result<zbus::Message, zbus::Error>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    conn.call_method(Some(SERVICE), path, Some(iface), method, body)
        .await
}

/// The unit's `ActiveState`, `None` when systemd has no such unit loaded.
async fn active_state(conn: &Connection, unit: &str) -> Result<Option<String>, zbus::Error> {
    let path: OwnedObjectPath = match call(conn, OBJECT, MANAGER, "GetUnit", &(unit,)).await {
        Ok(m) => m.body().deserialize()?,
        Err(e) if is_error(&e, NO_SUCH_UNIT) => return Ok(None),
        Err(e) => return Err(e),
    };
    let v: OwnedValue = call(
        conn,
        path.as_str(),
        PROPERTIES,
        "Get",
        &(UNIT, "ActiveState"),
    )
    .await?
    .body()
    .deserialize()?;
    Ok(String::try_from(v).ok())
}

/// Waits until `done` accepts the unit's state, or the job deadline.
async fn wait_state(
    conn: &Connection,
    unit: &str,
    op: &'static str,
    done: impl Fn(Option<&str>) -> bool,
) -> Result<(), CgroupError> {
    let err = |reason: String| CgroupError::Systemd {
        unit: unit.to_string(),
        op,
        reason,
    };
    let deadline = tokio::time::Instant::now() + JOB_TIMEOUT;
    loop {
        let state = active_state(conn, unit)
            .await
            .map_err(|e| err(e.to_string()))?;
        if done(state.as_deref()) {
            return Ok(());
        }
        match state.as_deref() {
            Some("failed") => return Err(err("the unit failed".into())),
            // Only a start waits for a state an unloaded unit never reaches.
            None => return Err(err("the unit is not loaded".into())),
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(err(format!(
                "still {} after {JOB_TIMEOUT:?}",
                state.as_deref().unwrap_or("unloaded")
            )));
        }
        tokio::time::sleep(JOB_POLL).await;
    }
}

impl SystemdUnits for DbusUnits {
    fn start_slice(&self, unit: &str, properties: &[UnitProperty]) -> Result<(), CgroupError> {
        let (conn, name, props) = (self.conn.clone(), unit.to_string(), body(properties));
        let exists = self.run(unit, "StartTransientUnit", async move {
            let aux: Vec<(String, Vec<(String, Value<'static>)>)> = vec![];
            match call(
                &conn,
                OBJECT,
                MANAGER,
                "StartTransientUnit",
                &(name.as_str(), "replace", props, aux),
            )
            .await
            {
                Ok(_) => {
                    wait_state(&conn, &name, "StartTransientUnit", |s| s == Some("active")).await?;
                    Ok(false)
                }
                Err(e) if is_error(&e, UNIT_EXISTS) => {
                    // Stopped but not unloaded yet (a pod back with its UID):
                    // start it again, as its scopes would.
                    let state = active_state(&conn, &name).await.ok().flatten();
                    if state.as_deref() != Some("active") {
                        call(
                            &conn,
                            OBJECT,
                            MANAGER,
                            "StartUnit",
                            &(name.as_str(), "replace"),
                        )
                        .await
                        .map_err(|e| CgroupError::Systemd {
                            unit: name.clone(),
                            op: "StartUnit",
                            reason: e.to_string(),
                        })?;
                        wait_state(&conn, &name, "StartUnit", |s| s == Some("active")).await?;
                    }
                    Ok(true)
                }
                Err(e) => Err(CgroupError::Systemd {
                    unit: name,
                    op: "StartTransientUnit",
                    reason: e.to_string(),
                }),
            }
        })?;
        if exists {
            debug!(unit, "Slice exists already: setting its properties");
            // The description and dependencies are fixed at creation.
            let resources: Vec<UnitProperty> = properties
                .iter()
                .filter(|p| !matches!(p.name, "Description" | "Wants" | "DefaultDependencies"))
                .cloned()
                .collect();
            self.set_properties(unit, &resources)?;
        }
        Ok(())
    }

    fn set_properties(&self, unit: &str, properties: &[UnitProperty]) -> Result<(), CgroupError> {
        if properties.is_empty() {
            return Ok(());
        }
        let (conn, name, props) = (self.conn.clone(), unit.to_string(), body(properties));
        self.run(unit, "SetUnitProperties", async move {
            call(
                &conn,
                OBJECT,
                MANAGER,
                "SetUnitProperties",
                &(name.as_str(), true, props),
            )
            .await
            .map(|_| ())
            .map_err(|e| CgroupError::Systemd {
                unit: name,
                op: "SetUnitProperties",
                reason: e.to_string(),
            })
        })
    }

    fn stop_slice(&self, unit: &str) -> Result<(), CgroupError> {
        let (conn, name) = (self.conn.clone(), unit.to_string());
        self.run(unit, "StopUnit", async move {
            match call(
                &conn,
                OBJECT,
                MANAGER,
                "StopUnit",
                &(name.as_str(), "replace"),
            )
            .await
            {
                Ok(_) => {
                    wait_state(&conn, &name, "StopUnit", |s| {
                        matches!(s, None | Some("inactive") | Some("failed"))
                    })
                    .await?;
                }
                Err(e) if is_error(&e, NO_SUCH_UNIT) => {}
                Err(e) => {
                    return Err(CgroupError::Systemd {
                        unit: name,
                        op: "StopUnit",
                        reason: e.to_string(),
                    });
                }
            }
            // A failed unit would stay loaded: runc resets it, ignoring errors.
            if let Err(e) = call(&conn, OBJECT, MANAGER, "ResetFailedUnit", &(name.as_str(),)).await
                && !is_error(&e, NO_SUCH_UNIT)
            {
                debug!(unit = %name, error = %e, "ResetFailedUnit failed");
            }
            Ok(())
        })
    }
}
