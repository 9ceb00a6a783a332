//! The `Registration` service on `<root-dir>/device-plugins/kubelet.sock`
//! (upstream `plugin/v1beta1/server.go`): checks the plugin's version and
//! resource name, then connects to the plugin before answering, so a
//! plugin whose `Register` succeeded is already being watched. The
//! `device-plugins` directory itself is not watched: plugins announce
//! themselves through `Register` (or the plugin watcher's registry), and a
//! plugin that goes away ends its `ListAndWatch` stream; nothing the kubelet
//! reads there can wake it.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::checkpoint::CHECKPOINT_NAME;
use crate::error::{DeviceManagerError, Result};
use crate::manager::DeviceManager;
use crate::resource_name::is_extended_resource_name;
use crate::v1beta1::registration_server::{Registration, RegistrationServer};
use crate::v1beta1::{Empty, RegisterRequest, SUPPORTED_VERSIONS};

/// Checks a `Register` request (version, then resource name), as upstream.
pub(crate) fn validate_register(version: &str, resource: &str) -> Result<()> {
    if !SUPPORTED_VERSIONS.contains(&version) {
        return Err(DeviceManagerError::UnsupportedVersion {
            version: version.to_string(),
            supported: SUPPORTED_VERSIONS.iter().map(|s| s.to_string()).collect(),
        });
    }
    if !is_extended_resource_name(resource) {
        return Err(DeviceManagerError::InvalidResourceName(
            resource.to_string(),
        ));
    }
    Ok(())
}

/// The plugin's socket: `endpoint` inside `dir`, as upstream's
/// `filepath.Join(socketDir, endpoint)` (a leading `/` does not leave the
/// directory, `.` and `..` are resolved lexically), except that an endpoint
/// resolving to the directory itself or outside it is refused.
pub(crate) fn plugin_socket(dir: &Path, endpoint: &str) -> Result<PathBuf> {
    let invalid = || DeviceManagerError::InvalidEndpoint {
        endpoint: endpoint.to_string(),
        dir: dir.to_path_buf(),
    };
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in Path::new(endpoint).components() {
        match c {
            Component::Normal(p) => parts.push(p),
            Component::ParentDir => {
                parts.pop().ok_or_else(invalid)?;
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    if parts.is_empty() {
        return Err(invalid());
    }
    Ok(parts.iter().fold(dir.to_path_buf(), |p, c| p.join(c)))
}

struct RegistrationService {
    manager: DeviceManager,
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<RegisterRequest>,
    ) -> std::result::Result<Response<Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, version = %r.version, endpoint = %r.endpoint,
            "Got registration request from device plugin with resource");
        if let Err(e) = validate_register(&r.version, &r.resource_name) {
            tracing::info!(resource = %r.resource_name, error = %e, "Bad registration request from device plugin");
            return Err(Status::unknown(e.to_string()));
        }
        let socket = match plugin_socket(self.manager.socket_dir(), &r.endpoint) {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(resource = %r.resource_name, error = %e, "Bad registration request from device plugin");
                return Err(Status::unknown(e.to_string()));
            }
        };
        if let Err(e) = self.manager.connect_plugin(&r.resource_name, &socket).await {
            tracing::info!(resource = %r.resource_name, error = %e, "Error connecting to device plugin client");
            return Err(Status::unknown(e.to_string()));
        }
        Ok(Response::new(Empty {}))
    }
}

/// Removes the sockets in `dir` other than the checkpoint (upstream
/// `CleanupPluginDirectory`): plugins of an earlier kubelet must register again.
async fn cleanup_plugin_directory(dir: &Path) -> Result<()> {
    let serve_err = |source| DeviceManagerError::Serve {
        path: dir.to_path_buf(),
        source,
    };
    let mut rd = tokio::fs::read_dir(dir).await.map_err(serve_err)?;
    while let Some(entry) = rd.next_entry().await.map_err(serve_err)? {
        if entry.file_name() == CHECKPOINT_NAME {
            continue;
        }
        let path = entry.path();
        match tokio::fs::metadata(&path).await {
            Ok(md) if md.file_type().is_socket() => {
                if let Err(error) = tokio::fs::remove_file(&path).await {
                    tracing::error!(%error, path = %path.display(), "Failed to remove file");
                } else {
                    tracing::info!(path = %path.display(), "Removed stale device plugin socket");
                }
            }
            Ok(_) => {}
            Err(error) => tracing::error!(%error, path = %path.display(), "Failed to stat file"),
        }
    }
    Ok(())
}

/// Creates the directory, cleans stale sockets, binds the registration
/// socket and serves it until the manager stops.
pub(crate) async fn start(manager: DeviceManager) -> Result<()> {
    let dir = manager.socket_dir().to_path_buf();
    let socket = manager.socket_path();
    let serve_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DeviceManagerError::Serve { path, source }
    };
    tokio::fs::create_dir_all(&dir)
        .await
        .map_err(serve_err(&dir))?;
    if let Err(error) =
        tokio::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750)).await
    {
        tracing::warn!(%error, dir = %dir.display(), "Could not set the device plugin directory's mode");
    }
    cleanup_plugin_directory(&dir).await?;
    // Upstream leaves this marker when it takes plugin-watcher registrations;
    // some plugins look for it to choose that path over `Register`.
    let marker = dir.join("DEPRECATION");
    if let Err(error) = tokio::fs::File::create(&marker).await {
        tracing::error!(%error, path = %marker.display(), "Failed to create deprecation file at socket dir");
    }
    match tokio::fs::remove_file(&socket).await {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(serve_err(&socket)(e)),
    }
    let listener = UnixListener::bind(&socket).map_err(serve_err(&socket))?;
    tracing::info!(socket = %socket.display(), "Started device plugin registration server");
    let shutdown = manager.inner.shutdown.clone();
    let svc = RegistrationServer::new(RegistrationService { manager });
    tokio::spawn(async move {
        let res = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(
                UnixListenerStream::new(listener),
                shutdown.cancelled_owned(),
            )
            .await;
        if let Err(error) = res {
            tracing::error!(%error, "Error while serving device plugin registration grpc server");
        }
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_stay_inside_the_device_plugin_directory() {
        let dir = Path::new("/var/lib/kubelet/device-plugins");
        let ok = |e: &str| plugin_socket(dir, e).expect(e);
        assert_eq!(ok("gpu.sock"), dir.join("gpu.sock"));
        // As filepath.Join: a leading slash stays inside, `.`/`..` resolve.
        assert_eq!(ok("/gpu.sock"), dir.join("gpu.sock"));
        assert_eq!(ok("./a/../gpu.sock"), dir.join("gpu.sock"));
        assert_eq!(ok("sub/gpu.sock"), dir.join("sub/gpu.sock"));
        for bad in [
            "../gpu.sock",
            "/../../etc/x.sock",
            "a/../../x.sock",
            "",
            ".",
            "a/..",
        ] {
            let e = plugin_socket(dir, bad).expect_err(bad);
            assert_eq!(
                e.to_string(),
                format!(
                    "invalid endpoint {bad:?}: the plugin socket must be inside /var/lib/kubelet/device-plugins"
                ),
            );
        }
    }
}
