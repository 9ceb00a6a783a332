//! Clients of the API (upstream `podresources.GetV1Client` and
//! `GetV1alpha1Client`): dial the kubelet's socket within a deadline, as
//! monitoring agents do.

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::Error;
use crate::pb::pod_resources_lister_client::PodResourcesListerClient;

/// Connects to the v1 API on `socket`, failing after `timeout`.
///
/// # Errors
/// [`Error::Dial`] when the socket does not answer in time.
pub async fn v1_client(
    socket: &Path,
    timeout: Duration,
) -> Result<PodResourcesListerClient<Channel>, Error> {
    dial(socket, timeout)
        .await
        .map(PodResourcesListerClient::new)
}

/// Connects to the deprecated v1alpha1 API on `socket`, failing after `timeout`.
///
/// # Errors
/// [`Error::Dial`] when the socket does not answer in time.
pub async fn v1alpha1_client(
    socket: &Path,
    timeout: Duration,
) -> Result<crate::pb_v1alpha1::pod_resources_lister_client::PodResourcesListerClient<Channel>, Error>
{
    dial(socket, timeout)
        .await
        .map(crate::pb_v1alpha1::pod_resources_lister_client::PodResourcesListerClient::new)
}

async fn dial(socket: &Path, timeout: Duration) -> Result<Channel, Error> {
    let path = socket.to_path_buf();
    let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    }));
    let dial = |reason: String| Error::Dial {
        path: socket.to_path_buf(),
        reason,
    };
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(dial(format!("{e:?}"))),
        Err(_) => Err(dial(format!("no answer within {timeout:?}"))),
    }
}
