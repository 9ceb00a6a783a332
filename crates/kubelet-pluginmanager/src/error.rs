//! Errors of the plugin manager (upstream `pluginwatcher` and
//! `operationexecutor`). The texts of the registration errors are upstream's,
//! as operators grep the kubelet log for them.

use std::path::PathBuf;

/// What went wrong watching the registry directory or registering a plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The registry directory could not be created. Fatal for the manager.
    #[error("error (re-)creating root {}: {error}", path.display())]
    CreateRoot {
        /// The registry directory.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },

    /// The inotify watcher could not be started or pointed at the
    /// directory. Fatal for the manager.
    #[error("failed to start plugin fsWatcher, err: {error}")]
    Watch {
        /// Why.
        error: std::io::Error,
    },

    /// The plugin's registration socket refused or timed out the
    /// connection. Retried with backoff.
    #[error("RegisterPlugin error -- dial failed at socket {}, err: failed to dial socket {}, err: {reason}", socket.display(), socket.display())]
    Dial {
        /// The registration socket.
        socket: PathBuf,
        /// Why the connection failed.
        reason: DialFailure,
    },

    /// `GetInfo` failed or ran past its deadline. Retried with backoff.
    #[error("RegisterPlugin error -- failed to get plugin info using RPC GetInfo at socket {}, err: {status}", socket.display())]
    GetInfo {
        /// The registration socket.
        socket: PathBuf,
        /// The gRPC status (`DeadlineExceeded` on the deadline).
        status: tonic::Status,
    },

    /// No handler serves the plugin's type. Retried with backoff.
    #[error("RegisterPlugin error -- no handler registered for plugin type: {plugin_type} at socket {}", socket.display())]
    NoHandler {
        /// `PluginInfo.type`.
        plugin_type: String,
        /// The registration socket.
        socket: PathBuf,
    },

    /// The handler refused the plugin. Retried with backoff.
    #[error("RegisterPlugin error -- pluginHandler.ValidatePluginFunc failed")]
    Validation,

    /// The handler failed to register the plugin. Not retried until the
    /// plugin's socket is replaced, as upstream.
    #[error("RegisterPlugin error -- plugin registration failed with err: {0}")]
    Register(crate::HandlerError),

    /// `NotifyRegistrationStatus` failed; carries the status that was to be
    /// sent (empty when the registration succeeded).
    #[error("RegisterPlugin error -- failed to send registration status at socket {}, err: {status}", socket.display())]
    Notify {
        /// The registration socket.
        socket: PathBuf,
        /// The gRPC status of the failed call.
        status: tonic::Status,
    },
}

/// Why dialing a registration socket failed.
#[derive(Debug, thiserror::Error)]
pub enum DialFailure {
    /// The connection was refused or broke during the HTTP/2 handshake.
    #[error("{}", chain(.0))]
    Transport(tonic::transport::Error),
    /// The dial deadline passed.
    #[error("context deadline exceeded")]
    Timeout,
}

/// An error and its causes, as `a: b: c` (tonic's transport error alone
/// only says "transport error").
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
