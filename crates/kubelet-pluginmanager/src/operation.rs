//! Registering and unregistering one plugin (upstream
//! `operationexecutor.GenerateRegisterPluginFunc` and
//! `GenerateUnregisterPluginFunc`): `GetInfo`, the handler of the plugin's
//! type, `ValidatePlugin`, `RegisterPlugin`, then `NotifyRegistrationStatus`
//! with upstream's texts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::actual::{ActualStateOfWorld, RegisteredPlugin};
use crate::client::{CallTimeouts, PluginClient};
use crate::error::Error;
use crate::handler::{PluginHandler, PluginRegistration};

/// Handlers by plugin type.
pub type Handlers = HashMap<String, Arc<dyn PluginHandler>>;

/// A plugin the handler was asked to register: it must be deregistered when
/// its socket goes, even when the registration failed (as upstream adds it
/// to the actual state before `RegisterPlugin`).
pub struct Registration {
    handler: Arc<dyn PluginHandler>,
    plugin: RegisteredPlugin,
}

/// What one registration attempt came to.
pub struct Attempt {
    /// Set when the handler was called: no retry until the socket changes.
    pub registration: Option<Registration>,
    /// Why the attempt (or only its notification) failed.
    pub error: Option<Error>,
}

impl Attempt {
    fn retry(error: Error) -> Self {
        Self {
            registration: None,
            error: Some(error),
        }
    }
}

/// Everything a registration needs besides the socket.
pub struct RegisterContext<'a> {
    /// Handlers by type.
    pub handlers: &'a Handlers,
    /// Deadlines of the registration calls.
    pub timeouts: CallTimeouts,
    /// The deadline handed to `PluginHandler::register_plugin`.
    pub register_timeout: Duration,
    /// Where successful registrations are recorded.
    pub actual: &'a ActualStateOfWorld,
}

/// One registration attempt of the plugin serving `socket`.
pub async fn register(socket: &Path, cx: &RegisterContext<'_>) -> Attempt {
    let mut client = match PluginClient::dial(socket, cx.timeouts).await {
        Ok(client) => client,
        Err(e) => return Attempt::retry(e),
    };
    let info = match client.get_info().await {
        Ok(info) => info,
        Err(e) => return Attempt::retry(e),
    };
    let Some(handler) = cx.handlers.get(&info.r#type).cloned() else {
        let refused = Error::NoHandler {
            plugin_type: info.r#type.clone(),
            socket: socket.to_path_buf(),
        };
        return Attempt::retry(notify_failure(&mut client, refused.to_string(), refused).await);
    };
    let endpoint = if info.endpoint.is_empty() {
        socket.to_path_buf()
    } else {
        PathBuf::from(&info.endpoint)
    };
    let registration = PluginRegistration {
        name: &info.name,
        endpoint: &endpoint,
        versions: &info.supported_versions,
    };
    if let Err(e) = handler.validate_plugin(&registration).await {
        let text = format!("RegisterPlugin error -- plugin validation failed with err: {e}");
        return Attempt::retry(notify_failure(&mut client, text, Error::Validation).await);
    }
    let plugin = RegisteredPlugin {
        socket_path: socket.to_path_buf(),
        plugin_type: info.r#type.clone(),
        name: info.name.clone(),
        endpoint: endpoint.clone(),
        versions: info.supported_versions.clone(),
    };
    let registered = handler
        .register_plugin(&registration, cx.register_timeout)
        .await;
    let done = Registration {
        handler,
        plugin: plugin.clone(),
    };
    if let Err(e) = registered {
        let failed = Error::Register(e);
        let text = failed.to_string();
        return Attempt {
            registration: Some(done),
            error: Some(notify_failure(&mut client, text, failed).await),
        };
    }
    cx.actual.add(plugin);
    info!(
        plugin.name = %info.name,
        plugin.type = %info.r#type,
        endpoint = %endpoint.display(),
        versions = ?info.supported_versions,
        "Registered plugin"
    );
    // Upstream notifies after registering, so a failed notification never
    // undoes a registration.
    let error = client.notify(true, "").await.err();
    Attempt {
        registration: Some(done),
        error,
    }
}

/// Tells the plugin why it was refused; the refusal is what the attempt
/// reports, unless the notification itself failed.
async fn notify_failure(client: &mut PluginClient, text: String, refusal: Error) -> Error {
    match client.notify(false, &text).await {
        Ok(()) => refusal,
        Err(notify) => {
            warn!(error = %refusal, "Could not tell the plugin its registration failed");
            notify
        }
    }
}

/// Unregisters a plugin whose socket went away or was replaced.
pub async fn unregister(registration: Registration, actual: &ActualStateOfWorld) {
    let plugin = registration.plugin;
    actual.remove(&plugin.socket_path);
    registration
        .handler
        .deregister_plugin(&plugin.name, &plugin.endpoint)
        .await;
    info!(
        plugin.name = %plugin.name,
        plugin.type = %plugin.plugin_type,
        "DeRegisterPlugin called"
    );
}
