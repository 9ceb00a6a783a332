//! What the apiserver is and serves (client-go `discovery`: `ServerVersion`,
//! `ServerGroups`): its version from `/version` and the group versions it
//! serves from `/api` and `/apis`, read at start and again whenever a caller
//! saw the apiserver come back from an outage (it may have been upgraded or
//! rolled back meanwhile).
//!
//! kubelet-rs serves control planes from 1.19 on, older than itself; upstream
//! kubelets only promise to work with an apiserver of their own version or
//! newer. Requests that only newer apiservers accept ask [`Discovery`] first
//! and fall back to what a kubelet of the apiserver's era did
//! (`docs/api-compatibility.md` lists each request with its range).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tracing::{info, warn};

use crate::Error;

/// How often [`Discovery::keep_current`] reads the apiserver again.
pub const REREAD_PERIOD: Duration = Duration::from_secs(600);

/// How long each of the three discovery reads may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The apiserver's version and the group versions it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerInfo {
    /// `gitVersion` (`v1.19.16`).
    pub git_version: String,
    /// `major`.
    pub major: u32,
    /// `minor`, without a provider's `+` suffix (`"19+"` is 19).
    pub minor: u32,
    /// Every served group version: `v1` for the core group, else
    /// `<group>/<version>` (`node.k8s.io/v1beta1`).
    pub group_versions: BTreeSet<String>,
}

impl ServerInfo {
    /// Whether the apiserver is `major.minor` or newer.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }

    /// Whether `group_version` (`v1`, `node.k8s.io/v1`) is served.
    pub fn serves(&self, group_version: &str) -> bool {
        self.group_versions.contains(group_version)
    }
}

/// The leading digits of a `/version` field (`"19+"` → 19).
fn number(field: &str, raw: &str) -> Result<u32, Error> {
    let digits: String = field.chars().take_while(char::is_ascii_digit).collect();
    digits
        .parse()
        .map_err(|_| Error::ServerVersion(raw.to_string()))
}

/// Reads `/version`, `/api` and `/apis`, each with a deadline.
pub async fn discover(client: &kube::Client) -> Result<ServerInfo, Error> {
    let timed = |what: &'static str| {
        move |_| Error::DiscoveryTimeout {
            what,
            after: READ_TIMEOUT,
        }
    };
    let version = tokio::time::timeout(READ_TIMEOUT, client.apiserver_version())
        .await
        .map_err(timed("/version"))??;
    let raw = format!("{}.{}", version.major, version.minor);
    let (major, minor) = (number(&version.major, &raw)?, number(&version.minor, &raw)?);
    let core = tokio::time::timeout(READ_TIMEOUT, client.list_core_api_versions())
        .await
        .map_err(timed("/api"))??;
    let groups = tokio::time::timeout(READ_TIMEOUT, client.list_api_groups())
        .await
        .map_err(timed("/apis"))??;
    let group_versions = core
        .versions
        .into_iter()
        .chain(
            groups
                .groups
                .into_iter()
                .flat_map(|g| g.versions.into_iter().map(|v| v.group_version)),
        )
        .collect();
    Ok(ServerInfo {
        git_version: version.git_version,
        major,
        minor,
        group_versions,
    })
}

/// The last [`ServerInfo`] read, shared by everything that asks; cheap to
/// clone. `None` until a read succeeded (callers then use what works on the
/// newest apiservers and fall back on refusal).
#[derive(Clone)]
pub struct Discovery {
    client: kube::Client,
    info: Arc<watch::Sender<Option<Arc<ServerInfo>>>>,
}

impl Discovery {
    /// A discovery reading through `client`; nothing is read yet.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            info: Arc::new(watch::channel(None).0),
        }
    }

    /// A discovery that already knows `info` (tests, and callers that read
    /// it elsewhere).
    pub fn with_info(client: kube::Client, info: ServerInfo) -> Self {
        Self {
            client,
            info: Arc::new(watch::channel(Some(Arc::new(info))).0),
        }
    }

    /// The last successful read, if any.
    pub fn current(&self) -> Option<Arc<ServerInfo>> {
        self.info.borrow().clone()
    }

    /// Changes of [`Self::current`].
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<ServerInfo>>> {
        self.info.subscribe()
    }

    /// Reads the apiserver again; logs the version when it is the first read
    /// or differs from the last. A failed read keeps the last one.
    pub async fn refresh(&self) -> Result<Arc<ServerInfo>, Error> {
        match discover(&self.client).await {
            Ok(info) => {
                let info = Arc::new(info);
                let before = self.current();
                if before.as_deref().map(|b| &b.git_version) != Some(&info.git_version) {
                    info!(
                        server_version = %info.git_version,
                        previous = ?before.as_ref().map(|b| b.git_version.clone()),
                        group_versions = info.group_versions.len(),
                        "Read the apiserver's version and discovery"
                    );
                }
                self.info.send_replace(Some(info.clone()));
                Ok(info)
            }
            Err(e) => {
                warn!(error = %e, "Cannot read the apiserver's version and discovery");
                Err(e)
            }
        }
    }

    /// Reads at once (until a read succeeds), then again every
    /// [`REREAD_PERIOD`], so that an apiserver upgraded or rolled back
    /// during an outage is seen within that period; never returns.
    pub async fn keep_current(&self) {
        self.refresh_until_known().await;
        loop {
            tokio::time::sleep(REREAD_PERIOD).await;
            let _ = self.refresh().await;
        }
    }

    /// Reads until a read succeeds, backing off from 1 s to 30 s (an
    /// apiserver that is not up yet at start).
    pub async fn refresh_until_known(&self) -> Arc<ServerInfo> {
        let mut delay = Duration::from_secs(1);
        loop {
            if let Ok(info) = self.refresh().await {
                return info;
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(30));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_suffixes_are_dropped_from_the_minor_version() {
        assert_eq!(number("19+", "1.19+").ok(), Some(19));
        assert_eq!(number("35", "1.35").ok(), Some(35));
        assert!(number("", "1.").is_err());
    }

    #[test]
    fn versions_compare_by_major_then_minor() {
        let info = ServerInfo {
            git_version: "v1.30.2".into(),
            major: 1,
            minor: 30,
            group_versions: ["v1".to_string(), "node.k8s.io/v1".to_string()].into(),
        };
        assert!(info.at_least(1, 19) && info.at_least(1, 30));
        assert!(!info.at_least(1, 31));
        assert!(info.serves("node.k8s.io/v1") && !info.serves("node.k8s.io/v1beta1"));
    }
}
