//! Every Service of the cluster with a cluster IP, for the service
//! environment variables (upstream: the kubelet's Service informer,
//! `serviceLister` and `serviceHasSynced`). One watch of all namespaces into
//! a store; containers needing service env wait until it has listed once
//! (upstream's "services have not yet been read at least once, cannot
//! construct envvars").
//!
//! Headless services make no env vars. Apiservers from 1.31 filter them
//! with `fieldSelector=spec.clusterIP!=None` (kubernetes/kubernetes#123905
//! added the selector to the apiserver and the kubelet together); older ones
//! answer that selector with 400 BadRequest, so there the watch lists every
//! Service and drops headless ones here, as kubelets before 1.31 did. The
//! form is chosen from the server's version when [`Discovery`] knows it, and
//! a refusal of the selector switches to the older form whatever the version
//! said. The choice is logged once and exposed as
//! `kubelet_apiserver_fallback_info{request="services_list_watch"}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use kubelet_client::discovery::{Discovery, ServerInfo};
use kubelet_metrics::KubeletMetrics;
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

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

/// What the watch reads the apiserver's version from and reports its
/// choice to.
#[derive(Clone)]
pub struct Compat {
    /// The apiserver's version and groups.
    pub discovery: Discovery,
    /// Where the choice is exposed.
    pub metrics: Option<Arc<KubeletMetrics>>,
    /// Where a lasting refusal is told as a Warning event on the Node
    /// (the recorder and the node's name).
    pub events: Option<(Arc<dyn kubelet_types::events::Recorder>, String)>,
}

/// The reason of the Node event for a Services list the apiserver refuses
/// (a kubelet-rs addition: upstream's reflector only logs).
pub const FAILED_TO_LIST_SERVICES: &str = "FailedToListServices";

impl ServiceLister {
    /// Watches all Services through `client` on `tasks` until `stop`;
    /// `None` (standalone) has no services and counts as synced (upstream).
    pub fn new(
        client: Option<(Client, Compat)>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> Self {
        let store = Arc::new(Store::default());
        let standalone = client.is_none();
        if let Some((client, compat)) = client {
            tasks.spawn(run(Api::all(client), compat, store.clone(), stop.clone()));
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

/// The two forms of the Services list and watch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// `fieldSelector=spec.clusterIP!=None` (apiservers 1.31 and newer).
    ClusterIpSelector,
    /// Every Service, headless ones dropped here (kubelets before 1.31).
    AllServices,
}

impl Form {
    /// The form for an apiserver: the selector unless it is known to
    /// predate 1.31.
    fn for_server(info: Option<&ServerInfo>) -> Self {
        match info {
            Some(i) if !i.at_least(1, 31) => Self::AllServices,
            _ => Self::ClusterIpSelector,
        }
    }

    fn choice(self) -> &'static str {
        match self {
            Self::ClusterIpSelector => "field_selector_spec_cluster_ip",
            Self::AllServices => "all_services_headless_dropped_by_kubelet",
        }
    }

    fn config(self) -> watcher::Config {
        match self {
            Self::ClusterIpSelector => watcher::Config::default().fields("spec.clusterIP!=None"),
            Self::AllServices => watcher::Config::default(),
        }
    }
}

/// Whether the apiserver refused the `spec.clusterIP` field selector (400
/// BadRequest: `"spec.clusterIP" is not a known field selector: ...`).
fn selector_refused(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => {
            s.code == 400 && s.message.contains("spec.clusterIP")
        }
        _ => false,
    }
}

fn headless(s: &Service) -> bool {
    s.spec
        .as_ref()
        .and_then(|spec| spec.cluster_ip.as_deref())
        .is_some_and(|ip| ip == "None")
}

/// The informer: picks the form, then lists and watches until `stop`;
/// starts over in the older form when the apiserver refuses the selector.
async fn run(api: Api<Service>, compat: Compat, store: Arc<Store>, stop: CancellationToken) {
    let info = tokio::select! {
        () = stop.cancelled() => return,
        info = async {
            match compat.discovery.current() {
                Some(i) => Some(i),
                None => compat.discovery.refresh().await.ok(),
            }
        } => info,
    };
    let mut form = Form::for_server(info.as_deref());
    let mut version = info.map(|i| i.git_version.clone()).unwrap_or_default();
    // The version of the apiserver that refused the selector: it is not
    // asked again until the version changes.
    let mut refused_by: Option<String> = None;
    loop {
        if form == Form::AllServices {
            warn!(server_version = %version,
                "The apiserver predates the Services spec.clusterIP field selector (1.31): watching every Service and dropping headless ones in the kubelet");
        } else {
            debug!(server_version = %version, "Watching Services with fieldSelector=spec.clusterIP!=None");
        }
        if let Some(m) = &compat.metrics {
            m.set_apiserver_fallback("services_list_watch", form.choice(), &version);
        }
        match watch(&api, form, &version, &compat, &store, &stop).await {
            Ended::Stopped => return,
            Ended::SelectorRefused => {
                form = Form::AllServices;
                let refreshed = tokio::select! {
                    () = stop.cancelled() => return,
                    r = compat.discovery.refresh() => r,
                };
                if let Ok(i) = refreshed {
                    version = i.git_version.clone();
                }
                refused_by = Some(version.clone());
            }
            Ended::ServerChanged(i) => {
                version = i.git_version.clone();
                form = if refused_by.as_deref() == Some(version.as_str()) {
                    Form::AllServices
                } else {
                    Form::for_server(Some(&i))
                };
            }
        }
    }
}

/// Whether `info`, read after the watch started against `version`, is
/// another release that wants the other form; says so.
fn changed_form(info: &ServerInfo, version: &str, form: Form) -> bool {
    let changed = info.git_version != version && Form::for_server(Some(info)) != form;
    if changed {
        info!(server_version = %info.git_version, previous = %version,
            "The apiserver is another release now; choosing the Services watch form again");
    }
    changed
}

enum Ended {
    Stopped,
    SelectorRefused,
    /// The apiserver came back as another version (upgraded or rolled
    /// back during an outage): the form is chosen again.
    ServerChanged(Arc<ServerInfo>),
}

/// One list-and-watch in `form`: relist on 410, backoff on errors.
async fn watch(
    api: &Api<Service>,
    form: Form,
    version: &str,
    compat: &Compat,
    store: &Store,
    stop: &CancellationToken,
) -> Ended {
    let stream = watcher::watcher(api.clone(), form.config()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut listing: Option<HashMap<ObjectKey, Service>> = None;
    let mut healthy = true;
    let mut refusals = kubelet_client::refusal::Refusals::default();
    // Whoever reads the apiserver again (this watch after a failure, the
    // periodic discovery) may find another release.
    let mut server = compat.discovery.subscribe();
    server.mark_unchanged();
    loop {
        let ev = tokio::select! {
            biased;
            () = stop.cancelled() => return Ended::Stopped,
            Ok(()) = server.changed() => {
                let info = server.borrow_and_update().clone();
                if let Some(i) = info.filter(|i| changed_form(i, version, form)) {
                    return Ended::ServerChanged(i);
                }
                continue;
            }
            ev = stream.next() => match ev { Some(ev) => ev, None => return Ended::Stopped },
        };
        match ev {
            Ok(Event::Init) => listing = Some(HashMap::new()),
            Ok(Event::InitApply(s)) => {
                if let Some(l) = listing.as_mut()
                    && !headless(&s)
                {
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
            Ok(Event::Apply(s)) if headless(&s) => {
                store.services.lock().remove(&key(&s));
            }
            Ok(Event::Apply(s)) => {
                store.services.lock().insert(key(&s), s);
            }
            Ok(Event::Delete(s)) => {
                store.services.lock().remove(&key(&s));
            }
            Err(e) if form == Form::ClusterIpSelector && selector_refused(&e) => {
                warn!(error = %e, "The apiserver refused the Services field selector");
                return Ended::SelectorRefused;
            }
            Err(e) => {
                match kubelet_client::refusal::refused(&e) {
                    // A refusal does not go away by waiting: say so, and again
                    // every few minutes while it lasts.
                    Some(code) if refusals.report(code) => {
                        error!(error = %e, code,
                            "The apiserver refuses to list Services; containers needing service environment variables wait; retrying with backoff");
                        if let Some((recorder, node)) = &compat.events {
                            recorder.event(
                                &kubelet_types::events::node_ref(node),
                                kubelet_types::events::EventType::Warning,
                                FAILED_TO_LIST_SERVICES,
                                format!("the apiserver refuses to list Services ({code}): {e}; containers that need service environment variables wait"),
                            );
                        }
                    }
                    Some(_) => debug!(error = %e, "Service watch still refused"),
                    None if healthy => {
                        warn!(error = %e, "Service watch failed; retrying with backoff")
                    }
                    None => debug!(error = %e, "Service watch still failing"),
                }
                healthy = false;
                continue;
            }
        }
        if !healthy {
            info!("Service watch recovered");
            healthy = true;
            refusals.recovered();
            // The apiserver may have been upgraded or rolled back meanwhile.
            let refreshed = tokio::select! {
                () = stop.cancelled() => return Ended::Stopped,
                r = compat.discovery.refresh() => r,
            };
            if let Ok(i) = refreshed
                && changed_form(&i, version, form)
            {
                return Ended::ServerChanged(i);
            }
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
