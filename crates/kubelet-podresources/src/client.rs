//! A client of the API (upstream `podresources.GetV1Client`): dials the
//! kubelet's socket within a deadline, as monitoring agents do.

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
        Ok(Ok(channel)) => Ok(PodResourcesListerClient::new(channel)),
        Ok(Err(e)) => Err(dial(format!("{e:?}"))),
        Err(_) => Err(dial(format!("no answer within {timeout:?}"))),
    }
}
