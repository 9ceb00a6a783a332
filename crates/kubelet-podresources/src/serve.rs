//! Serving the API on its unix socket (upstream
//! `server.ListenAndServePodResources`): the directory is created 0750 when
//! missing, a stale socket from an earlier kubelet removed, and the gRPC
//! server runs until the kubelet stops.

use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::error::Error;
use crate::pb::pod_resources_lister_server::PodResourcesListerServer;
use crate::pb_v1alpha1::pod_resources_lister_server::PodResourcesListerServer as V1alpha1Server;
use crate::server::PodResourcesServer;
use crate::server_v1alpha1::V1alpha1PodResourcesServer;
use crate::{POD_RESOURCES_DIR_NAME, SOCKET_NAME};

/// Mode of the socket directory when the kubelet creates it.
pub const POD_RESOURCES_DIR_MODE: u32 = 0o750;

/// `<root-dir>/pod-resources/kubelet.sock`.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(POD_RESOURCES_DIR_NAME).join(SOCKET_NAME)
}

/// Creates the socket's directory, removes a stale socket and binds.
pub async fn bind(socket: &Path) -> Result<UnixListener, Error> {
    let path = socket.to_path_buf();
    let prepared = tokio::task::spawn_blocking(move || prepare(&path)).await;
    match prepared {
        Ok(result) => result?,
        Err(join) => {
            return Err(Error::Listen {
                path: socket.to_path_buf(),
                error: std::io::Error::other(join.to_string()),
            });
        }
    }
    UnixListener::bind(socket).map_err(|error| Error::Listen {
        path: socket.to_path_buf(),
        error,
    })
}

fn prepare(socket: &Path) -> Result<(), Error> {
    if let Some(dir) = socket.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(POD_RESOURCES_DIR_MODE)
            .create(dir)
            .map_err(|error| Error::CreateDir {
                path: dir.to_path_buf(),
                error,
            })?;
    }
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(|error| Error::Listen {
                path: socket.to_path_buf(),
                error,
            })
        }
        // Anything else in the way makes bind fail with its own error.
        _ => Ok(()),
    }
}

/// Serves `server` on `listener` until `cancel` fires, as v1 and as the
/// deprecated v1alpha1 (both behind the one rate limit, as upstream).
pub async fn serve(
    listener: UnixListener,
    server: PodResourcesServer,
    cancel: CancellationToken,
) -> Result<(), Error> {
    if let Ok(addr) = listener.local_addr()
        && let Some(path) = addr.as_pathname()
    {
        info!(socket = %path.display(), "Starting to serve the podresources API");
    }
    tonic::transport::Server::builder()
        .add_service(V1alpha1Server::new(V1alpha1PodResourcesServer(
            server.clone(),
        )))
        .add_service(PodResourcesListerServer::new(server))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), cancel.cancelled_owned())
        .await
        .map_err(Error::Serve)
}
