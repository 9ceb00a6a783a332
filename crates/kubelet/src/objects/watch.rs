//! ConfigMaps and Secrets of the node's pods, kept current by one watch per
//! object (upstream `pkg/kubelet/util/manager/watch_based_manager.go` behind
//! `cacheBasedManager`, the `configMapAndSecretChangeDetectionStrategy:
//! Watch` of `pkg/kubelet/configmap` and `pkg/kubelet/secret`).
//!
//! Registering a pod adds a reference, per pod UID, to every object the pod
//! names ([`super::refs`]); the first reference to an object starts a watch of
//! `fieldSelector=metadata.name=<name>` in its namespace, the last one dropped
//! stops it. Reads come from the watch's cache once it has listed; an
//! immutable object's watch is stopped after the first read that sees it
//! (its cached copy stays). Every change a watch sees after its first list is
//! announced on [`WatchBasedManager::subscribe`], so mounted volumes can be
//! rewritten without waiting for a periodic resync.
//!
//! Unlike upstream, which refuses (`object "ns"/"name" not registered`), a read
//! of an object no registered pod references is one direct GET, and a new
//! watch's first list is waited for up to [`REQUEST_DEADLINE`] (upstream: one
//! second) before failing with upstream's `failed to sync <resource> cache`.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use super::{ObjectError, ObjectKey, REQUEST_DEADLINE, object_error, refs, with_deadline};

/// How many change notifications a slow subscriber may fall behind before it
/// sees `Lagged` (and should then resync everything it mounted).
const CHANGES_CAPACITY: usize = 256;

/// An object kind kept by a [`WatchBasedManager`].
pub trait WatchedKind:
    Resource<Scope = NamespaceResourceScope, DynamicType = ()>
    + Clone
    + DeserializeOwned
    + Debug
    + Send
    + Sync
    + 'static
{
    /// The name upstream's managers give the kind in errors (`configmap`,
    /// from `corev1.Resource("configmap")`): `configmap "x" not found`.
    const RESOURCE: &'static str;
    /// Names of the objects of this kind `pod` references.
    fn referenced_names(pod: &Pod) -> BTreeSet<String>;
    /// Whether the object is `immutable: true`.
    fn is_immutable(&self) -> bool;
}

impl WatchedKind for ConfigMap {
    const RESOURCE: &'static str = "configmap";
    fn referenced_names(pod: &Pod) -> BTreeSet<String> {
        refs::config_map_names(pod)
    }
    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

impl WatchedKind for Secret {
    const RESOURCE: &'static str = "secret";
    fn referenced_names(pod: &Pod) -> BTreeSet<String> {
        refs::secret_names(pod)
    }
    fn is_immutable(&self) -> bool {
        self.immutable == Some(true)
    }
}

/// The ConfigMap manager (upstream `configmap.NewWatchingConfigMapManager`).
pub type ConfigMapManager = WatchBasedManager<ConfigMap>;
/// The Secret manager (upstream `secret.NewWatchingSecretManager`).
pub type SecretManager = WatchBasedManager<Secret>;

/// What one object's watch has seen.
struct Cache<K> {
    /// Whether the watch has listed at least once.
    synced: tokio::sync::watch::Sender<bool>,
    /// The object, if it exists.
    object: Mutex<Option<K>>,
    /// Set once a read saw the object immutable (the watch is then stopped).
    immutable: AtomicBool,
}

impl<K: WatchedKind> Cache<K> {
    fn new() -> Self {
        Self {
            synced: tokio::sync::watch::Sender::new(false),
            object: Mutex::new(None),
            immutable: AtomicBool::new(false),
        }
    }

    /// Stores `new`; whether a change was seen that subscribers should hear
    /// of (none before the first list completes).
    fn store(&self, new: Option<K>) -> bool {
        let mut cur = self.object.lock();
        let same = match (cur.as_ref(), new.as_ref()) {
            (None, None) => true,
            (Some(a), Some(b)) => a.resource_version() == b.resource_version(),
            _ => false,
        };
        *cur = new;
        !same && *self.synced.borrow()
    }
}

/// One watched object: who references it and its watch.
struct Item<K> {
    /// Pod UID → references from that pod.
    refs: HashMap<String, usize>,
    cache: Arc<Cache<K>>,
    cancel: CancellationToken,
}

/// A registered pod (upstream keys by namespace, name and UID).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PodKey {
    namespace: String,
    name: String,
    uid: String,
}

impl PodKey {
    fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.namespace().unwrap_or_default(),
            name: pod.name_any(),
            uid: pod.uid().unwrap_or_default(),
        }
    }
}

struct State<K> {
    items: HashMap<ObjectKey, Item<K>>,
    /// Registered pods and the names they reference.
    pods: HashMap<PodKey, BTreeSet<String>>,
}

struct Inner<K> {
    client: Option<Client>,
    state: Mutex<State<K>>,
    changes: broadcast::Sender<ObjectKey>,
    tasks: TaskTracker,
    stop: CancellationToken,
}

/// Objects of kind `K` referenced by registered pods, each watched on its own
/// (upstream `NewWatchBasedManager`). Cheap to clone.
pub struct WatchBasedManager<K> {
    inner: Arc<Inner<K>>,
    /// How long a read waits for a new watch's first list.
    sync_timeout: Duration,
}

impl<K> Clone for WatchBasedManager<K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            sync_timeout: self.sync_timeout,
        }
    }
}

impl<K: WatchedKind> WatchBasedManager<K> {
    /// A manager reading through `client` (`None`: standalone, every read
    /// fails with [`ObjectError::NoClient`]). Watches run on `tasks` until
    /// their last reference goes or `stop` is cancelled.
    pub fn new(client: Option<Client>, tasks: &TaskTracker, stop: &CancellationToken) -> Self {
        let (changes, _) = broadcast::channel(CHANGES_CAPACITY);
        Self {
            inner: Arc::new(Inner {
                client,
                state: Mutex::new(State {
                    items: HashMap::new(),
                    pods: HashMap::new(),
                }),
                changes,
                tasks: tasks.clone(),
                stop: stop.clone(),
            }),
            sync_timeout: REQUEST_DEADLINE,
        }
    }

    /// The same manager, whose reads wait at most `timeout` for a new
    /// watch's first list (default [`REQUEST_DEADLINE`]).
    #[must_use]
    pub fn with_sync_timeout(self, timeout: Duration) -> Self {
        Self {
            sync_timeout: timeout,
            ..self
        }
    }

    /// Change notifications: the key of every object whose watch saw it
    /// added, modified or deleted (after the watch's first list). A receiver
    /// that lags gets `RecvError::Lagged` and should resync all it uses.
    pub fn subscribe(&self) -> broadcast::Receiver<ObjectKey> {
        self.inner.changes.subscribe()
    }

    /// Adds references from `pod` to the objects it names, starting a watch
    /// for each object no other pod references; on a re-registration of the
    /// same pod, only references added or dropped since change (upstream
    /// `cacheBasedManager.RegisterPod`).
    pub fn register_pod(&self, pod: &Pod) {
        if self.inner.client.is_none() {
            return;
        }
        let names = K::referenced_names(pod);
        let key = PodKey::of(pod);
        let mut st = self.inner.state.lock();
        let prev = st.pods.insert(key.clone(), names.clone());
        let prev = prev.unwrap_or_default();
        for n in names.difference(&prev) {
            self.add_reference(&mut st, &key.namespace, n, &key.uid);
        }
        for n in prev.difference(&names) {
            Self::delete_reference(&mut st, &key.namespace, n, &key.uid);
        }
    }

    /// Drops the references of `pod`, stopping watches nothing references
    /// any more (upstream `UnregisterPod`).
    pub fn unregister_pod(&self, pod: &Pod) {
        let key = PodKey::of(pod);
        let mut st = self.inner.state.lock();
        if let Some(prev) = st.pods.remove(&key) {
            for n in &prev {
                Self::delete_reference(&mut st, &key.namespace, n, &key.uid);
            }
        }
    }

    /// Objects with a watch (or an immutable cached copy), sorted.
    pub fn watched(&self) -> Vec<ObjectKey> {
        let mut v: Vec<ObjectKey> = self.inner.state.lock().items.keys().cloned().collect();
        v.sort();
        v
    }

    fn add_reference(&self, st: &mut State<K>, namespace: &str, name: &str, uid: &str) {
        let key = ObjectKey::new(namespace, name);
        let item = st.items.entry(key.clone()).or_insert_with(|| {
            let cache = Arc::new(Cache::new());
            let cancel = self.inner.stop.child_token();
            if let Some(client) = self.inner.client.clone() {
                let api: Api<K> = Api::namespaced(client, namespace);
                self.inner.tasks.spawn(run(
                    api,
                    key.clone(),
                    cache.clone(),
                    self.inner.changes.clone(),
                    cancel.clone(),
                ));
            }
            Item {
                refs: HashMap::new(),
                cache,
                cancel,
            }
        });
        *item.refs.entry(uid.to_string()).or_default() += 1;
    }

    fn delete_reference(st: &mut State<K>, namespace: &str, name: &str, uid: &str) {
        let key = ObjectKey::new(namespace, name);
        let Some(item) = st.items.get_mut(&key) else {
            return;
        };
        if let Some(n) = item.refs.get_mut(uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                item.refs.remove(uid);
            }
        }
        if item.refs.is_empty() {
            item.cancel.cancel();
            st.items.remove(&key);
            debug!(resource = K::RESOURCE, object = %key, "Stopped watching: no pod references it");
        }
    }

    /// The object `namespace/name` (upstream `GetObject`): from its watch's
    /// cache once listed, by a direct GET when no registered pod references it.
    pub async fn get_object(&self, namespace: &str, name: &str) -> Result<K, ObjectError> {
        let Some(client) = &self.inner.client else {
            return Err(ObjectError::NoClient {
                resource: K::RESOURCE,
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        };
        let key = ObjectKey::new(namespace, name);
        let cache = self
            .inner
            .state
            .lock()
            .items
            .get(&key)
            .map(|i| i.cache.clone());
        let Some(cache) = cache else {
            let api: Api<K> = Api::namespaced(client.clone(), namespace);
            let what = format!("get {} {key}", K::RESOURCE);
            let got = with_deadline(what, async {
                api.get_opt(name)
                    .await
                    .map_err(|e| object_error(K::RESOURCE, name, e))
            })
            .await?;
            return got.ok_or_else(|| not_found::<K>(name));
        };
        let mut synced = cache.synced.subscribe();
        let waited = tokio::time::timeout(self.sync_timeout, synced.wait_for(|s| *s)).await;
        if !matches!(waited, Ok(Ok(_))) {
            return Err(ObjectError::Other(format!(
                "failed to sync {} cache: timed out waiting for the condition",
                K::RESOURCE
            )));
        }
        let object = cache.object.lock().clone();
        let object = object.ok_or_else(|| not_found::<K>(name))?;
        if object.is_immutable() && !cache.immutable.swap(true, Ordering::SeqCst) {
            // The watch has nothing more to tell; its copy stays.
            if let Some(item) = self.inner.state.lock().items.get(&key) {
                item.cancel.cancel();
            }
            debug!(resource = K::RESOURCE, object = %key, "Stopped watching for changes - object is immutable");
        }
        Ok(object)
    }
}

fn not_found<K: WatchedKind>(name: &str) -> ObjectError {
    ObjectError::NotFound {
        resource: K::RESOURCE,
        name: name.to_string(),
    }
}

/// One object's watch (upstream's per-object reflector): lists and watches
/// by `metadata.name`, relists on 410, backs off on errors, until `cancel`.
async fn run<K: WatchedKind>(
    api: Api<K>,
    key: ObjectKey,
    cache: Arc<Cache<K>>,
    changes: broadcast::Sender<ObjectKey>,
    cancel: CancellationToken,
) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", key.name));
    let stream = watcher::watcher(api, cfg).default_backoff();
    let mut stream = std::pin::pin!(stream);
    // The object of the list in progress, if any.
    let mut listing: Option<Option<K>> = None;
    let mut healthy = true;
    let mut refusals = kubelet_client::refusal::Refusals::default();
    loop {
        let ev = tokio::select! {
            biased;
            () = cancel.cancelled() => return,
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
        };
        let changed = match ev {
            Ok(Event::Init) => {
                listing = Some(None);
                false
            }
            Ok(Event::InitApply(o)) => {
                if let Some(l) = listing.as_mut()
                    && o.name_any() == key.name
                {
                    *l = Some(o);
                }
                false
            }
            Ok(Event::InitDone) => {
                let changed = cache.store(listing.take().flatten());
                cache.synced.send_replace(true);
                changed
            }
            Ok(Event::Apply(o)) if o.name_any() == key.name => cache.store(Some(o)),
            Ok(Event::Delete(o)) if o.name_any() == key.name => cache.store(None),
            Ok(Event::Apply(_) | Event::Delete(_)) => false,
            Err(e) => {
                match kubelet_client::refusal::refused(&e) {
                    Some(code) if refusals.report(code) => tracing::error!(resource = K::RESOURCE,
                        object = %key, error = %e, code,
                        "The apiserver refuses to list or watch the object; pods that need it wait; retrying with backoff"),
                    Some(_) => {
                        debug!(resource = K::RESOURCE, object = %key, error = %e, "Watch still refused")
                    }
                    None if healthy => warn!(resource = K::RESOURCE, object = %key, error = %e,
                        "Watch failed; retrying with backoff"),
                    None => {
                        debug!(resource = K::RESOURCE, object = %key, error = %e, "Watch still failing")
                    }
                }
                healthy = false;
                continue;
            }
        };
        if !healthy {
            info!(resource = K::RESOURCE, object = %key, "Watch recovered");
            healthy = true;
            refusals.recovered();
        }
        if changed {
            debug!(resource = K::RESOURCE, object = %key, "Object changed");
            // No subscriber is no error.
            let _ = changes.send(key.clone());
        }
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
