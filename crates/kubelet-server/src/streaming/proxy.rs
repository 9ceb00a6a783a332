//! The transparent upgrade proxy to the runtime's streaming server (upstream
//! `proxy.UpgradeAwareHandler.tryUpgrade`, as the kubelet's `proxyStream`
//! uses it): the client's upgrade request goes to the runtime's streaming URL
//! with its headers, the runtime's `101` goes back to the client, and the two
//! upgraded connections are copied into each other until one side ends.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, PROXY_AUTHORIZATION, TRANSFER_ENCODING};
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper::upgrade::{OnUpgrade, Upgraded};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncWriteExt, split};
use tokio::net::TcpStream;
use tracing::{debug, warn};

use super::{StreamError, text_error};
use crate::serve::Sessions;

/// Deadline to connect to the runtime's streaming server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for the runtime's response to the upgrade request.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline to relay a refused upgrade's body (upstream: 10 s).
const ERROR_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The header naming the proxied clients.
const X_FORWARDED_FOR: &str = "x-forwarded-for";
/// Largest refused-upgrade body relayed.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// Dials the runtime's streaming server at `url` and sends an upgrade
/// request with `headers`; returns the runtime's response, whose upgrade is
/// taken with `hyper::upgrade::on` when it is `101`.
pub async fn open_upgrade(
    method: Method,
    url: &Uri,
    mut headers: HeaderMap,
    sessions: &Sessions,
) -> Result<http::Response<Incoming>, StreamError> {
    if url.scheme_str() != Some("http") {
        return Err(StreamError::Url(url.to_string()));
    }
    let Some(authority) = url.authority() else {
        return Err(StreamError::Url(url.to_string()));
    };
    let addr = format!(
        "{}:{}",
        authority.host(),
        authority.port_u16().unwrap_or(80)
    );
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr))
        .await
        .map_err(|_| StreamError::DialTimeout(CONNECT_TIMEOUT))?
        .map_err(StreamError::Dial)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(StreamError::Http)?;
    sessions.spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            debug!(error = %e, "runtime streaming connection ended");
        }
    });
    let path = url
        .path_and_query()
        .map_or_else(|| "/".to_string(), ToString::to_string);
    let mut req = Request::new(Empty::<Bytes>::new());
    *req.method_mut() = method;
    *req.uri_mut() = path
        .parse()
        .map_err(|_| StreamError::Url(url.to_string()))?;
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        headers.insert(HOST, host);
    }
    *req.headers_mut() = headers;
    tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(req))
        .await
        .map_err(|_| StreamError::ResponseTimeout(RESPONSE_TIMEOUT))?
        .map_err(StreamError::Http)
}

/// The client's headers as sent on to the runtime: all of them (as upstream
/// clones the request), except the body framing of a request sent without
/// a body, and the client's credentials, which are the kubelet's business
/// and not the runtime's. The client's address, when the server recorded it
/// (`ConnectInfo`), is appended to `X-Forwarded-For` (upstream
/// `AppendForwardedForHeader`).
pub fn forwarded_headers(client: &HeaderMap, peer: Option<SocketAddr>) -> HeaderMap {
    let mut headers = client.clone();
    if let Some(peer) = peer {
        // Every prior value, folded into one, then the peer.
        let mut value = Vec::new();
        for prior in headers.get_all(X_FORWARDED_FOR) {
            value.extend_from_slice(prior.as_bytes());
            value.extend_from_slice(b", ");
        }
        value.extend_from_slice(peer.ip().to_string().as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&value) {
            headers.insert(X_FORWARDED_FOR, v);
        }
    }
    for h in [
        HOST,
        CONTENT_LENGTH,
        TRANSFER_ENCODING,
        AUTHORIZATION,
        PROXY_AUTHORIZATION,
    ] {
        headers.remove(h);
    }
    headers
}

/// Upstream `tryUpgrade`: proxies the client's upgrade request in `parts`
/// to `url`.
pub async fn transparent(mut parts: Parts, url: Uri) -> Response {
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let headers = forwarded_headers(&parts.headers, peer);
    let sessions = Sessions::of(&parts.extensions);
    let mut resp = match open_upgrade(parts.method.clone(), &url, headers, &sessions).await {
        Ok(r) => r,
        Err(e) => return proxy_error(&e),
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        return refused(resp).await;
    }
    let Some(client) = parts.extensions.remove::<OnUpgrade>() else {
        return proxy_error(&StreamError::NoUpgrade);
    };
    let backend = hyper::upgrade::on(&mut resp);
    sessions.spawn(async move {
        match tokio::try_join!(client, backend) {
            Ok((client, backend)) => splice(client, backend).await,
            Err(e) => debug!(error = %e, "stream upgrade failed"),
        }
    });
    switching(resp.headers())
}

/// A `101` carrying the runtime's upgrade headers.
pub fn switching(headers: &HeaderMap) -> Response {
    let mut out = Response::new(Body::empty());
    *out.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *out.headers_mut() = headers.clone();
    out
}

/// The runtime did not upgrade: an error status is echoed to the client,
/// anything else is upstream's "invalid upgrade response".
pub async fn refused(resp: http::Response<Incoming>) -> Response {
    let status = resp.status();
    if status.as_u16() < 400 {
        return proxy_error(&StreamError::UpgradeStatus(status.as_u16()));
    }
    debug!(%status, "runtime refused the stream upgrade");
    let (parts, body) = resp.into_parts();
    let body = match tokio::time::timeout(
        ERROR_BODY_TIMEOUT,
        Limited::new(body, ERROR_BODY_LIMIT).collect(),
    )
    .await
    {
        Ok(Ok(b)) => b.to_bytes(),
        _ => Bytes::new(),
    };
    let mut headers = parts.headers;
    headers.remove(TRANSFER_ENCODING);
    headers.remove(CONTENT_LENGTH);
    (status, headers, body).into_response()
}

/// Upstream's `responder`: proxy errors are 500 with the error's text.
pub fn proxy_error(e: &StreamError) -> Response {
    warn!(error = %e, "error while proxying request");
    text_error(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n"))
}

/// Copies both ways between the client's and the runtime's upgraded
/// connections; once one direction ends, both are closed (as upstream).
pub async fn splice(client: Upgraded, backend: Upgraded) {
    let (mut client_rx, mut client_tx) = split(TokioIo::new(client));
    let (mut backend_rx, mut backend_tx) = split(TokioIo::new(backend));
    let up = tokio::io::copy(&mut client_rx, &mut backend_tx);
    let down = tokio::io::copy(&mut backend_rx, &mut client_tx);
    tokio::select! {
        r = up => if let Err(e) = r { debug!(error = %e, "copying from client to runtime") },
        r = down => if let Err(e) = r { debug!(error = %e, "copying from runtime to client") },
    }
    // Best effort: let both peers see the end of the stream.
    let _ = tokio::time::timeout(Duration::from_secs(1), client_tx.shutdown()).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), backend_tx.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_headers_keep_the_upgrade_and_drop_credentials() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("Upgrade"));
        h.insert("upgrade", HeaderValue::from_static("SPDY/3.1"));
        h.append(
            "x-stream-protocol-version",
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        h.append(
            "x-stream-protocol-version",
            HeaderValue::from_static("channel.k8s.io"),
        );
        h.insert(AUTHORIZATION, HeaderValue::from_static("Bearer t"));
        h.insert(HOST, HeaderValue::from_static("node:10250"));
        h.insert(X_FORWARDED_FOR, HeaderValue::from_static("10.0.0.1"));
        let peer: SocketAddr = "192.0.2.7:5555".parse().unwrap();
        let out = forwarded_headers(&h, Some(peer));
        assert_eq!(out["upgrade"], "SPDY/3.1");
        assert_eq!(out.get_all("x-stream-protocol-version").iter().count(), 2);
        assert!(out.get(AUTHORIZATION).is_none());
        assert!(out.get(HOST).is_none());
        assert_eq!(out[X_FORWARDED_FOR], "10.0.0.1, 192.0.2.7");
        // Every prior value is kept, folded into one header.
        h.append(
            X_FORWARDED_FOR,
            HeaderValue::from_static("10.0.0.2, 10.0.0.3"),
        );
        let out = forwarded_headers(&h, Some(peer));
        assert_eq!(out.get_all(X_FORWARDED_FOR).iter().count(), 1);
        assert_eq!(
            out[X_FORWARDED_FOR],
            "10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7"
        );
        h.remove(X_FORWARDED_FOR);
        assert_eq!(
            forwarded_headers(&h, Some(peer))[X_FORWARDED_FOR],
            "192.0.2.7"
        );
        assert!(forwarded_headers(&h, None).get(X_FORWARDED_FOR).is_none());
    }
}
