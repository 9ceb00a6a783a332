//! Running a plugin (upstream `execPlugin`): `<bin-dir>/<name> args...` with
//! the kubelet's environment plus the provider's `env` (the provider's win),
//! the request as JSON on stdin, the response read from stdout, and one
//! minute before the plugin is killed. The plugin runs in a process group of
//! its own, killed as a whole at the deadline; its stdout and stderr are
//! capped ([`OUTPUT_CAP`]), and an error carries at most
//! [`STDERR_IN_ERROR`] bytes of its stderr, none when it was sent a token.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tracing::{debug, warn};

use crate::Error;
use crate::api::{self, CredentialProviderRequest, CredentialProviderResponse};
use crate::config::{CredentialProvider, ExecEnvVar};

/// Upstream's catch-all deadline for one plugin run.
pub const EXEC_TIMEOUT: Duration = Duration::from_secs(60);

/// The most a plugin may write to stdout, and to stderr; more is an error.
pub const OUTPUT_CAP: usize = 1 << 20;

/// The most of a plugin's stderr an error carries.
pub const STDERR_IN_ERROR: usize = 4096;

/// Reads `from` to its end, failing once it gave more than [`OUTPUT_CAP`].
async fn read_capped(from: Option<impl AsyncRead + Unpin>, what: &str) -> Result<Vec<u8>, String> {
    let Some(from) = from else {
        return Ok(Vec::new());
    };
    let mut buf = Vec::new();
    let cap = u64::try_from(OUTPUT_CAP).unwrap_or(u64::MAX);
    from.take(cap + 1)
        .read_to_end(&mut buf)
        .await
        .map_err(|e| format!("reading the plugin's {what}: {e}"))?;
    if buf.len() > OUTPUT_CAP {
        return Err(format!("the plugin's {what} exceeded {OUTPUT_CAP} bytes"));
    }
    Ok(buf)
}

/// Kills the process group `pgid` (the plugin and whatever it started).
fn kill_group(pgid: Option<u32>) {
    let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 0) else {
        return;
    };
    let pgid = nix::unistd::Pid::from_raw(pgid);
    if let Err(e) = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL)
        && e != nix::errno::Errno::ESRCH
    {
        warn!(%pgid, error = %e, "Failed to kill the credential provider plugin's process group");
    }
}

/// Gets credentials from a plugin (a seam: tests answer without a process).
#[async_trait::async_trait]
pub trait Plugin: Send + Sync {
    /// Runs the plugin for `image` with a service account token and
    /// annotations ("" and empty outside token mode).
    async fn exec_plugin(
        &self,
        image: &str,
        token: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<CredentialProviderResponse, Error>;
}

/// Where plugin runs are recorded (upstream
/// `kubelet_credential_provider_plugin_duration` and
/// `kubelet_credential_provider_plugin_errors`, label `plugin_name`).
pub trait PluginMetrics: Send + Sync {
    /// One run of `plugin` took `took`.
    fn observe_plugin_duration(&self, plugin: &str, took: Duration);
    /// One run of `plugin` failed or ran past its deadline.
    fn inc_plugin_errors(&self, plugin: &str);
}

/// A plugin binary in the bin dir.
#[derive(Clone)]
pub struct ExecPlugin {
    /// The provider's name.
    pub name: String,
    /// The provider's apiVersion.
    pub api_version: String,
    /// `<bin-dir>/<name>`.
    pub bin: PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment over the kubelet's.
    pub env: Vec<ExecEnvVar>,
    /// How long a run may take ([`EXEC_TIMEOUT`]).
    pub timeout: Duration,
    /// Where runs are recorded.
    pub metrics: Option<Arc<dyn PluginMetrics>>,
}

impl std::fmt::Debug for ExecPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecPlugin")
            .field("name", &self.name)
            .field("bin", &self.bin)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl ExecPlugin {
    /// The plugin of `provider`, in `bin_dir`.
    pub fn new(bin_dir: &std::path::Path, provider: &CredentialProvider) -> Self {
        Self {
            name: provider.name.clone(),
            api_version: provider.api_version.clone(),
            bin: bin_dir.join(&provider.name),
            args: provider.args.clone(),
            env: provider.env.clone(),
            timeout: EXEC_TIMEOUT,
            metrics: None,
        }
    }

    fn exec_error(&self, image: &str, why: String, stderr: &[u8]) -> Error {
        let stderr = match stderr.get(..STDERR_IN_ERROR) {
            Some(head) if stderr.len() > STDERR_IN_ERROR => {
                format!("{}... (truncated)", String::from_utf8_lossy(head))
            }
            _ => String::from_utf8_lossy(stderr).into_owned(),
        };
        Error::Exec {
            name: self.name.clone(),
            image: image.into(),
            why,
            stderr,
        }
    }

    /// Runs the binary, recording the run; its stdout, or why it failed.
    /// With `redact` (the request carried a token) no error carries the
    /// plugin's stderr, which may echo it.
    async fn run(&self, image: &str, input: Vec<u8>, redact: bool) -> Result<Vec<u8>, Error> {
        let started = tokio::time::Instant::now();
        let r = self.run_unrecorded(image, input, redact).await;
        if let Some(m) = &self.metrics {
            m.observe_plugin_duration(&self.name, started.elapsed());
            if r.is_err() {
                m.inc_plugin_errors(&self.name);
            }
        }
        r
    }

    async fn run_unrecorded(
        &self,
        image: &str,
        input: Vec<u8>,
        redact: bool,
    ) -> Result<Vec<u8>, Error> {
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|e| (&e.name, &e.value)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .map_err(|e| self.exec_error(image, e.to_string(), b""))?;
        // The plugin leads its own group: the group's ID is its PID.
        let pgid = child.id();
        let stdin = child.stdin.take();
        let feed = async move {
            if let Some(mut stdin) = stdin {
                // A plugin that exits without reading its stdin is no error.
                if let Err(e) = stdin.write_all(&input).await {
                    debug!(error = %e, "Credential provider plugin did not read its request");
                }
            }
            Ok::<(), String>(())
        };
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let run = async {
            let ((), out, err) = tokio::try_join!(
                feed,
                read_capped(stdout, "stdout"),
                read_capped(stderr, "stderr")
            )?;
            let status = child.wait().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((status, out, err))
        };
        let outcome = tokio::time::timeout(self.timeout, run).await;
        let shown = |stderr: &[u8]| if redact { Vec::new() } else { stderr.to_vec() };
        match outcome {
            Err(_) => {
                kill_group(pgid);
                Err(self.exec_error(image, "context deadline exceeded".into(), b""))
            }
            Ok(Err(why)) => {
                kill_group(pgid);
                Err(self.exec_error(image, why, b""))
            }
            Ok(Ok((status, _, stderr))) if !status.success() => {
                let why = match status.code() {
                    Some(c) => format!("exit status {c}"),
                    None => status.to_string(),
                };
                Err(self.exec_error(image, why, &shown(&stderr)))
            }
            Ok(Ok((_, stdout, _))) => Ok(stdout),
        }
    }
}

#[async_trait::async_trait]
impl Plugin for ExecPlugin {
    async fn exec_plugin(
        &self,
        image: &str,
        token: &str,
        annotations: &BTreeMap<String, String>,
    ) -> Result<CredentialProviderResponse, Error> {
        debug!(image, plugin = %self.name, "Getting image credentials from external exec plugin");
        let req = CredentialProviderRequest::new(&self.api_version, image, token, annotations);
        let input = serde_json::to_vec(&req).map_err(Error::Encode)?;
        let out = self.run(image, input, !token.is_empty()).await?;
        let (api_version, _) = api::interpret(&out).map_err(Error::ResponseGvk)?;
        if api_version != self.api_version {
            return Err(Error::ApiVersionMismatch {
                expected: self.api_version.clone(),
                actual: api_version,
            });
        }
        api::decode_response(&out).ok_or(Error::DecodeResponse)
    }
}

#[cfg(test)]
#[path = "exec_tests.rs"]
mod tests;
