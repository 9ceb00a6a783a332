//! Object storage with one global resourceVersion and a bounded watch history
//! (the part of etcd + the watch cache the kubelet can observe): every write
//! bumps the revision and appends an event; a watch from a revision older than
//! the oldest kept event gets 410 Gone.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

/// What identifies a stored object.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Plural resource name (`pods`).
    pub resource: String,
    /// Namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// Object name.
    pub name: String,
}

/// Watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// Created.
    Added,
    /// Changed.
    Modified,
    /// Removed.
    Deleted,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as the watch cache keeps it.
#[derive(Debug, Clone)]
pub struct Change {
    /// Revision of the change.
    pub rv: u64,
    /// Which object.
    pub key: Key,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for DELETED: the last state).
    pub object: Value,
    /// The object before the change, if any.
    pub previous: Option<Value>,
}

/// Live changes after a watch started.
pub type Feed = broadcast::Receiver<Arc<Change>>;

/// Objects and their history.
pub struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Revisions up to this one are compacted away.
    compacted: u64,
    live: broadcast::Sender<Arc<Change>>,
}

impl Store {
    /// An empty store keeping `history_limit` events.
    pub fn new(history_limit: usize) -> Self {
        let (live, _) = broadcast::channel(4096);
        Self {
            objects: BTreeMap::new(),
            rv: 1000,
            history: VecDeque::new(),
            history_limit,
            compacted: 1000,
            live,
        }
    }

    /// The current revision.
    pub fn revision(&self) -> u64 {
        self.rv
    }

    /// The oldest revision a watch may start from.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Drops all history: watches from any earlier revision get 410 Gone.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of a resource, optionally in one namespace.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.resource == resource)
            .filter(|(k, _)| namespace.is_none_or(|ns| k.namespace == ns))
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Writes an object: stamps a new resourceVersion and records the change.
    pub fn put(&mut self, key: Key, mut object: Value) -> Value {
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        let previous = self.objects.insert(key.clone(), object.clone());
        let kind = if previous.is_some() {
            EventType::Modified
        } else {
            EventType::Added
        };
        self.record(key, kind, object.clone(), previous);
        object
    }

    /// Removes an object; the DELETED event carries a new resourceVersion.
    pub fn delete(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        self.rv += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.rv.to_string());
        self.record(key.clone(), EventType::Deleted, object.clone(), None);
        Some(object)
    }

    fn record(&mut self, key: Key, kind: EventType, object: Value, previous: Option<Value>) {
        let change = Arc::new(Change {
            rv: self.rv,
            key,
            kind,
            object,
            previous,
        });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.rv;
            }
        }
        // No receiver is fine.
        let _ = self.live.send(change);
    }

    /// Changes after `rv` plus a live feed, taken atomically; `None` when `rv`
    /// is older than the history kept (410 Gone).
    pub fn watch_from(&self, rv: u64) -> Option<(Vec<Arc<Change>>, Feed)> {
        if rv < self.compacted {
            return None;
        }
        let backlog = self.history.iter().filter(|c| c.rv > rv).cloned().collect();
        Some((backlog, self.live.subscribe()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> Key {
        Key {
            resource: "pods".into(),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn every_write_bumps_the_revision_and_is_replayable() {
        let mut s = Store::new(10);
        let start = s.revision();
        let a = s.put(key("a"), json!({"metadata": {"name": "a"}}));
        assert_eq!(a["metadata"]["resourceVersion"], (start + 1).to_string());
        s.put(key("a"), json!({"metadata": {"name": "a"}, "x": 1}));
        s.delete(&key("a"));
        let (backlog, _) = s.watch_from(start + 1).expect("history kept");
        let kinds: Vec<_> = backlog.iter().map(|c| c.kind).collect();
        assert_eq!(kinds, [EventType::Modified, EventType::Deleted]);
    }

    #[test]
    fn a_revision_older_than_the_history_is_gone() {
        let mut s = Store::new(2);
        let start = s.revision();
        for i in 0..5 {
            s.put(key(&format!("p{i}")), json!({"metadata": {}}));
        }
        assert!(s.watch_from(start).is_none(), "evicted history -> 410");
        assert!(s.watch_from(s.revision()).is_some());
        s.compact();
        assert!(s.watch_from(s.revision() - 1).is_none());
    }
}
