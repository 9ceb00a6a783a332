//! Fault rules of the CRI proxy: what a rule matches (a CRI method, a pod)
//! and what it does to the call (delay, hang, fail, drop the connection,
//! answer stale or edited data), with hit limits and release handles.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tonic::Code;

use super::pods::{PodIndex, Target};

/// Which pod a rule is about. A call is about a pod when it names the pod's
/// sandbox or one of its containers (the proxy learns which container
/// belongs to which sandbox, and each sandbox's metadata and labels, from
/// the answers it forwards).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodSelector {
    /// The pod sandbox with this ID.
    Sandbox(String),
    /// The container with this ID (only calls naming that container).
    Container(String),
    /// The pod whose sandbox carries label `key=value` (pod labels are
    /// sandbox labels, as upstream's `newPodLabels`).
    Label(String, String),
    /// The pod with this namespace and name (sandbox metadata).
    Name {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
    },
    /// The pod with this UID (sandbox metadata).
    Uid(String),
}

/// An edit applied to a forwarded answer; see [`Action::edit`].
pub type EditFn = Arc<dyn Fn(&mut dyn Any) + Send + Sync>;

/// What a matching rule does to the call.
#[derive(Clone)]
pub enum Action {
    /// Waits this long, then forwards.
    Delay(Duration),
    /// Holds the call until the rule's handle is released or removed, then
    /// forwards. The held call still ends when the client gives up (its
    /// deadline or a cancelled stream drops the proxy's future).
    Hang,
    /// Answers with this gRPC status without forwarding.
    Fail(Code, String),
    /// Shuts down every client connection open on the proxy: the client sees
    /// a transport error, and its next call reconnects.
    DropConnection,
    /// Answers what the method answered last time for the same request
    /// (forwarding when there is no earlier answer).
    Stale,
    /// Forwards, then edits the answer before returning it.
    Edit(EditFn),
}

impl Action {
    /// An [`Action::Edit`] for answers of type `T` (e.g.
    /// `cri::pb::ListContainersResponse`); answers of other types pass
    /// unchanged.
    pub fn edit<T: 'static>(f: impl Fn(&mut T) + Send + Sync + 'static) -> Self {
        Action::Edit(Arc::new(move |any: &mut dyn Any| {
            if let Some(t) = any.downcast_mut::<T>() {
                f(t);
            }
        }))
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Action::Delay(_) => "delay",
            Action::Hang => "hang",
            Action::Fail(..) => "fail",
            Action::DropConnection => "drop-connection",
            Action::Stale => "stale",
            Action::Edit(_) => "edit",
        }
    }
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Delay(d) => write!(f, "Delay({d:?})"),
            Action::Fail(c, m) => write!(f, "Fail({c:?}, {m:?})"),
            other => f.write_str(other.name()),
        }
    }
}

/// A fault rule: methods (CRI names such as `ContainerStatus`; none = any),
/// an optional pod, an action and an optional hit limit.
#[derive(Clone, Debug)]
pub struct Rule {
    methods: Vec<String>,
    pod: Option<PodSelector>,
    action: Action,
    limit: Option<usize>,
}

impl Rule {
    /// A rule applying `action` to every call, until narrowed.
    pub fn new(action: Action) -> Self {
        Self {
            methods: Vec::new(),
            pod: None,
            action,
            limit: None,
        }
    }

    /// Only calls of CRI method `name` (e.g. `"StopContainer"`); may be
    /// given several times.
    #[must_use]
    pub fn method(mut self, name: &str) -> Self {
        self.methods.push(name.to_string());
        self
    }

    /// Only calls of these CRI methods.
    #[must_use]
    pub fn methods(mut self, names: &[&str]) -> Self {
        self.methods.extend(names.iter().map(|n| n.to_string()));
        self
    }

    /// Only calls about this pod.
    #[must_use]
    pub fn pod(mut self, pod: PodSelector) -> Self {
        self.pod = Some(pod);
        self
    }

    /// Only the first `n` matching calls; the rule is removed after.
    #[must_use]
    pub fn times(mut self, n: usize) -> Self {
        self.limit = Some(n);
        self
    }
}

/// One installed rule.
pub(super) struct Installed {
    pub(super) id: u64,
    rule: Rule,
    hits: Arc<AtomicUsize>,
    released: watch::Sender<bool>,
}

/// A rule the table picked for a call.
pub(super) struct Picked {
    pub(super) id: u64,
    pub(super) action: Action,
    pub(super) released: watch::Receiver<bool>,
}

/// The installed rules, first match wins.
#[derive(Default)]
pub(super) struct RuleTable {
    next: AtomicU64,
    rules: Mutex<Vec<Installed>>,
    /// Rules past their hit limit whose held calls still wait for release.
    spent: Mutex<Vec<Installed>>,
}

impl RuleTable {
    pub(super) fn add(&self, rule: Rule) -> (u64, Arc<AtomicUsize>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let hits = Arc::new(AtomicUsize::new(0));
        let (released, _) = watch::channel(false);
        self.rules.lock().push(Installed {
            id,
            rule,
            hits: hits.clone(),
            released,
        });
        (id, hits)
    }

    /// Removes rule `id` and lets its held calls go.
    pub(super) fn remove(&self, id: u64) {
        for list in [&self.rules, &self.spent] {
            let mut rules = list.lock();
            if let Some(i) = rules.iter().position(|r| r.id == id) {
                let r = rules.remove(i);
                r.released.send_replace(true);
            }
        }
    }

    /// The first rule matching a call of `method` about `target`, counted
    /// as a hit (and removed when that was its last).
    pub(super) fn pick(&self, method: &str, target: &Target, pods: &PodIndex) -> Option<Picked> {
        let mut rules = self.rules.lock();
        let i = rules.iter().position(|r| {
            (r.rule.methods.is_empty() || r.rule.methods.iter().any(|m| m == method))
                && r.rule.pod.as_ref().is_none_or(|p| pods.matches(p, target))
        })?;
        let r = &rules[i];
        let hits = r.hits.fetch_add(1, Ordering::Relaxed) + 1;
        let picked = Picked {
            id: r.id,
            action: r.rule.action.clone(),
            released: r.released.subscribe(),
        };
        if r.rule.limit.is_some_and(|n| hits >= n) {
            // The last hit: later calls pass, this one still gets the fault
            // (a hang on it ends only when its client gives up).
            let r = rules.remove(i);
            self.spent.lock().push(r);
        }
        Some(picked)
    }
}

/// A test's hold on an installed rule.
pub struct RuleHandle {
    pub(super) id: u64,
    pub(super) hits: Arc<AtomicUsize>,
    pub(super) table: Arc<RuleTable>,
}

impl RuleHandle {
    /// Calls the rule has applied to so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }

    /// Lets every call the rule holds ([`Action::Hang`]) go on to the
    /// backend, and removes the rule so later calls pass.
    pub fn release(&self) {
        self.table.remove(self.id);
    }

    /// Removes the rule; calls it holds are let go as by
    /// [`RuleHandle::release`] (nothing hangs without a rule).
    pub fn remove(self) {
        self.table.remove(self.id);
    }
}
