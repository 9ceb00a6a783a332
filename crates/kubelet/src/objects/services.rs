//! Every Service of the cluster with a cluster IP, for the service
//! environment variables (upstream: the kubelet's Service informer,
//! `serviceLister` and `serviceHasSynced`). One watch of all namespaces with
//! `fieldSelector=spec.clusterIP!=None` (headless services make no env
//! vars, upstream issue 122394) into a store; containers needing service env
//! wait until it has listed once (upstream's "services have not yet been read
//! at least once, cannot construct envvars").

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::ObjectKey;

/// What [`ServiceLister::has_synced`] being false means for service env
/// (upstream's error text in `getServiceEnvVarMap`).
pub const NOT_SYNCED: &str =
    "services have not yet been read at least once, cannot construct envvars";

#[derive(Default)]
struct Store {
    services: Mutex<HashMap<ObjectKey, Service>>,
    synced: AtomicBool,
}

/// The cluster's Services as a watch keeps them. Cheap to clone.
#[derive(Clone)]
pub struct ServiceLister {
    store: Arc<Store>,
    /// Standalone: no services, and nothing to wait for.
    standalone: bool,
}

impl ServiceLister {
    /// Watches all Services through `client` on `tasks` until `stop`;
    /// `None` (standalone) has no services and counts as synced (upstream).
    pub fn new(client: Option<Client>, tasks: &TaskTracker, stop: &CancellationToken) -> Self {
        let store = Arc::new(Store::default());
        let standalone = client.is_none();
        if let Some(client) = client {
            tasks.spawn(run(Api::all(client), store.clone(), stop.clone()));
        }
        Self { store, standalone }
    }

    /// Whether there is no apiserver to read services from (upstream's nil
    /// `serviceLister`: no service env at all).
    pub fn is_standalone(&self) -> bool {
        self.standalone
    }

    /// Whether the watch has listed at least once (always, standalone).
    pub fn has_synced(&self) -> bool {
        self.standalone || self.store.synced.load(Ordering::Acquire)
    }

    /// A snapshot of every Service but headless ones, sorted by namespace
    /// and name.
    pub fn services(&self) -> Vec<Service> {
        let map = self.store.services.lock();
        let mut keys: Vec<&ObjectKey> = map.keys().collect();
        keys.sort();
        keys.into_iter()
            .filter_map(|k| map.get(k).cloned())
            .collect()
    }
}

fn key(s: &Service) -> ObjectKey {
    ObjectKey::new(s.namespace().unwrap_or_default(), s.name_any())
}

/// The informer: list, watch, relist on 410, backoff on errors.
async fn run(api: Api<Service>, store: Arc<Store>, stop: CancellationToken) {
    let cfg = watcher::Config::default().fields("spec.clusterIP!=None");
    let stream = watcher::watcher(api, cfg).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<HashMap<ObjectKey, Service>> = None;
    let mut healthy = true;
    loop {
        let ev = tokio::select! {
            biased;
            () = stop.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        match ev {
            Ok(Event::Init) => listing = Some(HashMap::new()),
            Ok(Event::InitApply(s)) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(key(&s), s);
                }
            }
            Ok(Event::InitDone) => {
                let listed = listing.take().unwrap_or_default();
                let n = listed.len();
                *store.services.lock() = listed;
                if !store.synced.swap(true, Ordering::AcqRel) {
                    info!(services = n, "Listed services");
                }
            }
            Ok(Event::Apply(s)) => {
                store.services.lock().insert(key(&s), s);
            }
            Ok(Event::Delete(s)) => {
                store.services.lock().remove(&key(&s));
            }
            Err(e) => {
                if healthy {
                    warn!(error = %e, "Service watch failed; retrying with backoff");
                } else {
                    debug!(error = %e, "Service watch still failing");
                }
                healthy = false;
                continue;
            }
        }
        if !healthy {
            info!("Service watch recovered");
            healthy = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn standalone_has_no_services_and_is_synced() {
        let l = ServiceLister::new(None, &TaskTracker::new(), &CancellationToken::new());
        assert!(l.is_standalone());
        assert!(l.has_synced());
        assert!(l.services().is_empty());
    }
}
