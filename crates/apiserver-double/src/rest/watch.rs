//! List and watch (upstream `apiserver/pkg/endpoints/handlers/get.go`
//! `ListResource` and `watch.go`, with the watch cache's filtering: field
//! and label selectors, paging, bookmarks, 410 Gone for a compacted
//! revision).

use super::*;

/// `a.b.c` lookup into JSON.
fn field<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

/// Field and label selectors with `=`, `==`, `!=` (and label existence).
#[derive(Debug, Default, Clone)]
struct Selectors {
    fields: Vec<(String, String, bool)>,
    labels: Vec<(String, Option<String>, bool)>,
}

impl Selectors {
    fn parse(q: &HashMap<String, String>) -> Self {
        let split = |s: &str| -> (String, Option<String>, bool) {
            if let Some((k, v)) = s.split_once("!=") {
                (k.trim().into(), Some(v.trim().into()), false)
            } else if let Some((k, v)) = s.split_once("==").or_else(|| s.split_once('=')) {
                (k.trim().into(), Some(v.trim().into()), true)
            } else {
                (s.trim().into(), None, true)
            }
        };
        let list = |key: &str| -> Vec<(String, Option<String>, bool)> {
            q.get(key)
                .map(|s| s.split(',').filter(|x| !x.is_empty()).map(split).collect())
                .unwrap_or_default()
        };
        Self {
            fields: list("fieldSelector")
                .into_iter()
                .map(|(k, v, eq)| (k, v.unwrap_or_default(), eq))
                .collect(),
            labels: list("labelSelector"),
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        let fields_ok = self.fields.iter().all(|(k, v, eq)| {
            let actual = field(obj, k).and_then(Value::as_str).unwrap_or("");
            (actual == v) == *eq
        });
        let labels = obj.pointer("/metadata/labels");
        let labels_ok = self.labels.iter().all(|(k, v, eq)| {
            let actual = labels.and_then(|l| l.get(k)).and_then(Value::as_str);
            match v {
                None => actual.is_some(),
                Some(v) => (actual == Some(v.as_str())) == *eq,
            }
        });
        fields_ok && labels_ok
    }
}

pub(super) fn list(shared: &Shared, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let sel = Selectors::parse(q);
    let store = shared.store.lock();
    let ns = (!t.namespace.is_empty()).then_some(t.namespace.as_str());
    let mut items: Vec<Value> = store
        .list(t.kind.resource, ns)
        .into_iter()
        .filter(|o| sel.matches(o))
        .collect();
    // Paging: `continue` is the offset into the same snapshot revision.
    let offset: usize = q
        .get("continue")
        .and_then(|c| c.split_once(':'))
        .and_then(|(_, o)| o.parse().ok())
        .unwrap_or(0);
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    items = items.into_iter().skip(offset).collect();
    let mut meta = json!({"resourceVersion": store.revision().to_string()});
    if limit > 0 && items.len() > limit {
        items.truncate(limit);
        meta["continue"] = json!(format!("{}:{}", store.revision(), offset + limit));
    }
    respond(
        StatusCode::OK,
        &json!({"kind": format!("{}List", t.kind.kind), "apiVersion": t.kind.api_version,
            "metadata": meta, "items": items}),
    )
}

fn watch_event(kind: Kind, ty: &str, object: Value) -> Bytes {
    let mut line = json!({"type": ty, "object": with_type(kind, object)}).to_string();
    line.push('\n');
    Bytes::from(line)
}

/// Translates a change for a filtered watch (the cacher's semantics: an
/// object that stops matching is DELETED for this watcher).
fn translate(c: &Change, t: &Target, sel: &Selectors) -> Option<(&'static str, Value)> {
    if c.key.resource != t.kind.resource
        || (!t.namespace.is_empty() && c.key.namespace != t.namespace)
    {
        return None;
    }
    let now = sel.matches(&c.object);
    let before = c.previous.as_ref().is_some_and(|p| sel.matches(p));
    let ty = match (c.kind, before, now) {
        (EventType::Deleted, _, true) => "DELETED",
        (EventType::Added, _, true) => "ADDED",
        (EventType::Modified, true, true) => "MODIFIED",
        (EventType::Modified, false, true) => "ADDED",
        (EventType::Modified, true, false) => "DELETED",
        _ => return None,
    };
    Some((ty, c.object.clone()))
}

pub(super) fn watch(
    shared: &Arc<Shared>,
    t: &Target,
    q: &HashMap<String, String>,
) -> Response<Body> {
    let sel = Selectors::parse(q);
    let kind = t.kind;
    let bookmarks = q.get("allowWatchBookmarks").map(String::as_str) == Some("true");
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .map(std::time::Duration::from_secs);
    let target = Target {
        kind,
        namespace: t.namespace.clone(),
        name: String::new(),
        sub: String::new(),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let requested = q.get("resourceVersion").cloned().unwrap_or_default();
    let (initial, backlog, mut live, start) = {
        let store = shared.store.lock();
        let rv = store.revision();
        if requested.is_empty() || requested == "0" {
            let ns = (!t.namespace.is_empty()).then_some(t.namespace.as_str());
            let objs: Vec<Value> = store
                .list(kind.resource, ns)
                .into_iter()
                .filter(|o| sel.matches(o))
                .collect();
            match store.watch_from(rv) {
                Some((b, l)) => (objs, b, l, rv),
                None => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", "watch"),
            }
        } else {
            let from = requested.parse::<u64>().unwrap_or(0);
            match store.watch_from(from) {
                Some((b, l)) => (vec![], b, l, from),
                None => {
                    let msg = format!(
                        "too old resource version: {from} ({})",
                        store.compacted() + 1
                    );
                    let err = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1",
                        "metadata": {}, "status": "Failure", "message": msg, "reason": "Expired", "code": 410}});
                    let body = Full::new(Bytes::from(format!("{err}\n"))).boxed();
                    return Response::new(body);
                }
            }
        }
    };
    let mut closed = shared.watch_generation.subscribe();
    let interval = shared.options.bookmark_interval;
    tokio::spawn(async move {
        let mut progress = start;
        for o in initial {
            if tx.send(watch_event(kind, "ADDED", o)).await.is_err() {
                return;
            }
        }
        for c in backlog {
            progress = c.rv;
            if let Some((ty, o)) = translate(&c, &target, &sel)
                && tx.send(watch_event(kind, ty, o)).await.is_err()
            {
                return;
            }
        }
        let deadline = timeout.map(|d| tokio::time::Instant::now() + d);
        let mut tick = tokio::time::interval(interval);
        tick.tick().await;
        loop {
            let until_deadline = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = until_deadline => return,
                _ = closed.changed() => return,
                _ = tick.tick(), if bookmarks => {
                    let b = json!({"metadata": {"resourceVersion": progress.to_string()}});
                    if tx.send(watch_event(kind, "BOOKMARK", b)).await.is_err() { return; }
                }
                c = live.recv() => {
                    // A lagging watcher is closed; the client re-watches from its last revision.
                    let Ok(c) = c else { return };
                    if c.rv <= progress { continue; }
                    progress = c.rv;
                    if let Some((ty, o)) = translate(&c, &target, &sel)
                        && tx.send(watch_event(kind, ty, o)).await.is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    let stream = ReceiverStream::new(rx).map(|b| Ok::<_, Infallible>(Frame::data(b)));
    let mut r = Response::new(StreamBody::new(stream).boxed());
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_filter_on_fields_and_labels() {
        let mut q = HashMap::new();
        q.insert("fieldSelector".to_string(), "spec.nodeName=n1".to_string());
        q.insert("labelSelector".to_string(), "app=web,tier!=db".to_string());
        let s = Selectors::parse(&q);
        assert!(
            s.matches(&json!({"spec": {"nodeName": "n1"}, "metadata": {"labels": {"app": "web"}}}))
        );
        assert!(
            !s.matches(
                &json!({"spec": {"nodeName": "n2"}, "metadata": {"labels": {"app": "web"}}})
            )
        );
        assert!(!s.matches(&json!({"spec": {"nodeName": "n1"}, "metadata": {"labels": {"app": "web", "tier": "db"}}})));
    }
}
