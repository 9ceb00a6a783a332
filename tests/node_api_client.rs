//! A client of the kubelet's node API for tests and benchmarks, speaking to
//! it as the apiserver and metrics-server do: HTTPS, with the kubelet's
//! serving certificate trusted from its CA bundle, and optionally a client
//! certificate or a bearer token. HTTP/1.1, one connection per request (as
//! the apiserver's proxy opens them), or h2 when asked.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// How a test client proves who it is.
#[derive(Clone, Default)]
pub enum Credentials {
    /// Nothing (anonymous).
    #[default]
    None,
    /// A client certificate chain and key (PEM).
    Cert {
        /// PEM certificate chain.
        cert_pem: Vec<u8>,
        /// PEM private key.
        key_pem: Vec<u8>,
    },
    /// `Authorization: Bearer <token>`.
    Token(String),
}

/// The node API client.
#[derive(Clone)]
pub struct NodeApiClient {
    addr: SocketAddr,
    authority: String,
    server_name: ServerName<'static>,
    tls: TlsConnector,
    token: Option<String>,
    h2: bool,
}

/// A response read to the end.
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body.
    pub body: Bytes,
}

impl Answer {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).to_string()
    }

    /// The body as JSON.
    pub fn json(&self) -> anyhow::Result<serde_json::Value> {
        serde_json::from_slice(&self.body).with_context(|| format!("not JSON: {}", self.text()))
    }
}

impl NodeApiClient {
    /// A client trusting every certificate in the PEM bundle `ca` (the
    /// kubelet's `kubelet.crt` holds its self-signed CA), verifying the
    /// server as `server_name`.
    pub fn new(
        addr: SocketAddr,
        ca: &Path,
        server_name: &str,
        creds: Credentials,
    ) -> anyhow::Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(ca).context("CA bundle")? {
            roots.add(c?)?;
        }
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
        let (mut config, token) = match creds {
            Credentials::None => (builder.with_no_client_auth(), None),
            Credentials::Token(t) => (builder.with_no_client_auth(), Some(t)),
            Credentials::Cert { cert_pem, key_pem } => {
                let certs = CertificateDer::pem_slice_iter(&cert_pem)
                    .collect::<Result<Vec<_>, _>>()
                    .context("client cert")?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem).context("client key")?;
                (builder.with_client_auth_cert(certs, key)?, None)
            }
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            authority: addr.to_string(),
            addr,
            server_name: ServerName::try_from(server_name.to_string())?,
            tls: TlsConnector::from(Arc::new(config)),
            token,
            h2: false,
        })
    }

    /// The same client speaking h2 (ALPN `h2`).
    pub fn http2(&self) -> anyhow::Result<Self> {
        let mut c = self.clone();
        c.h2 = true;
        Ok(c)
    }

    /// A TLS connection to the kubelet (HTTP/1.1 ALPN), for protocols the
    /// test drives itself (WebSocket, SPDY).
    pub async fn connect(&self) -> anyhow::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = tokio::time::timeout(Duration::from_secs(10), TcpStream::connect(self.addr))
            .await
            .context("connect timed out")??;
        let tls = tokio::time::timeout(
            Duration::from_secs(10),
            self.tls.connect(self.server_name.clone(), tcp),
        )
        .await
        .context("TLS handshake timed out")??;
        Ok(tls)
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Request<Full<Bytes>>> {
        let uri = if self.h2 {
            format!("https://{}{path}", self.addr)
        } else {
            path.to_string()
        };
        let mut b = Request::builder().method(method).uri(uri);
        if !self.h2 {
            b = b.header(http::header::HOST, self.addr.to_string());
        }
        if let Some(t) = &self.token {
            b = b.header(http::header::AUTHORIZATION, format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        Ok(b.body(Full::new(body))?)
    }

    /// Sends a request and returns the response with its body unread.
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> anyhow::Result<Response<Incoming>> {
        let mut io = self.connect().await?;
        let req = self.request(method, path, headers, body)?;
        if self.h2 {
            // ALPN must offer h2 for an h2 connection: reconnect with it.
            drop(io);
            let mut cfg = (*self.tls_config()).clone();
            cfg.alpn_protocols = vec![b"h2".to_vec()];
            let tls = TlsConnector::from(Arc::new(cfg));
            let tcp = TcpStream::connect(self.addr).await?;
            io = tls.connect(self.server_name.clone(), tcp).await?;
            if io.get_ref().1.alpn_protocol() != Some(b"h2") {
                bail!("the server did not negotiate h2");
            }
            let (mut send, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(io))
                    .await?;
            tokio::spawn(conn);
            return Ok(send.send_request(req).await?);
        }
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        tokio::spawn(conn.with_upgrades());
        Ok(send.send_request(req).await?)
    }

    /// `host:port` of the kubelet.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The bearer token, if the client has one.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    fn tls_config(&self) -> Arc<rustls::ClientConfig> {
        self.tls.config().clone()
    }

    /// GET `path`, read to the end (with a deadline).
    pub async fn get(&self, path: &str) -> anyhow::Result<Answer> {
        self.call(Method::GET, path, Bytes::new()).await
    }

    /// Any method, read to the end (with a deadline).
    pub async fn call(&self, method: Method, path: &str, body: Bytes) -> anyhow::Result<Answer> {
        tokio::time::timeout(Duration::from_secs(60), async {
            let resp = self.send(method, path, &[], body).await?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await?.to_bytes();
            Ok(Answer {
                status,
                headers,
                body,
            })
        })
        .await
        .context("request timed out")?
    }
}
