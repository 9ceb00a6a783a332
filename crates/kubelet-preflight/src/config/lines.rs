//! Where a field is in a YAML (or indented JSON) document: the 1-based line
//! of the key at a path such as `authentication.x509.bogus` or
//! `spec.containers[1].ports[0].name`, found by indentation so that a
//! nested key is not confused with a same-named key elsewhere. Flow-style
//! values (`{a: 1}`) and one-line JSON resolve to the deepest block key found.

/// One step of a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// A mapping key.
    Key(String),
    /// A block sequence item (`- …`).
    Index(usize),
}

/// What starts a line: list dashes and a key, with their columns.
#[derive(Debug, Default)]
struct LineTokens {
    /// Columns of the `- ` markers.
    dashes: Vec<usize>,
    /// The key and its column, if the line has one.
    key: Option<(usize, String)>,
}

impl LineTokens {
    /// The column of the first token, if any.
    fn first_col(&self) -> Option<usize> {
        self.dashes
            .first()
            .copied()
            .or(self.key.as_ref().map(|k| k.0))
    }
}

fn parse_key(rest: &str) -> Option<String> {
    let (key, after) = if let Some(q @ ('"' | '\'')) = rest.chars().next() {
        let end = rest[1..].find(q)? + 1;
        (rest[1..end].to_string(), &rest[end + 1..])
    } else {
        let end = rest.find(':')?;
        let key = &rest[..end];
        if key.is_empty() || key.contains(['{', '[', '#', ',']) || key.contains(": ") {
            return None;
        }
        (key.trim_end().to_string(), &rest[end..])
    };
    let after = after.trim_start();
    let tail = after.strip_prefix(':')?;
    (tail.is_empty() || tail.starts_with([' ', '\t'])).then_some(key)
}

fn tokens(line: &str) -> LineTokens {
    let mut t = LineTokens::default();
    let mut col = line.len() - line.trim_start_matches(' ').len();
    let mut rest = &line[col..];
    if rest.starts_with('#') || rest.starts_with("---") {
        return t;
    }
    while rest == "-" || rest.starts_with("- ") {
        t.dashes.push(col);
        let skip = 1 + rest[1..].len() - rest[1..].trim_start_matches(' ').len();
        col += skip;
        rest = &rest[skip.min(rest.len())..];
    }
    if let Some(k) = parse_key(rest) {
        t.key = Some((col, k));
    }
    t
}

/// The 1-based line of the key at `path` in `text`, or of the deepest
/// ancestor found; `None` when not even the first step is found.
pub(crate) fn locate(text: &str, path: &[Step]) -> Option<u32> {
    let lines: Vec<LineTokens> = text.lines().map(tokens).collect();
    let mut start = 0;
    let mut end = lines.len();
    // Tokens must sit right of this column to belong to the current node;
    // a sequence may also sit at its key's column (`key:\n- item`).
    let mut parent: Option<(usize, bool)> = None;
    let mut found: Option<usize> = None;
    for step in path {
        let want_dash = matches!(step, Step::Index(_));
        let deeper = |c: usize| match parent {
            None => true,
            Some((p, parent_is_key)) => c > p || (want_dash && parent_is_key && c == p),
        };
        let col_of = |l: &LineTokens| -> Option<usize> {
            if want_dash {
                l.dashes.iter().copied().find(|c| deeper(*c))
            } else {
                l.key.as_ref().map(|k| k.0).filter(|c| deeper(*c))
            }
        };
        let Some(child) = lines[start..end].iter().filter_map(col_of).min() else {
            break;
        };
        let hit = match step {
            Step::Key(k) => (start..end).find(|&i| {
                lines[i]
                    .key
                    .as_ref()
                    .is_some_and(|(c, name)| *c == child && name == k)
            }),
            Step::Index(n) => (start..end)
                .filter(|&i| lines[i].dashes.contains(&child))
                .nth(*n),
        };
        let Some(i) = hit else { break };
        found = Some(i);
        // The node ends at the next line that starts at or left of it (a
        // key's own sequence items may start at its column).
        let ends = |l: &LineTokens| {
            let dash_first = !l.dashes.is_empty();
            l.first_col()
                .is_some_and(|c| c < child || (c == child && (want_dash || !dash_first)))
        };
        end = (i + 1..end).find(|&j| ends(&lines[j])).unwrap_or(end);
        start = i;
        parent = Some((child, !want_dash));
    }
    found.and_then(|i| u32::try_from(i + 1).ok())
}

/// Splits a dotted config field path (`authentication.x509.clientCAFile`).
pub(crate) fn keys(path: &str) -> Vec<Step> {
    path.split('.').map(|k| Step::Key(k.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(s: &str) -> Step {
        Step::Key(s.into())
    }

    const CONFIG: &str = "\
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# bogus: a comment
webhook: {}
authentication:
  webhook:
    enabled: true
  x509:
    clientCAFile: /ca.crt
    bogus: 1
evictionHard:
  memory.available: 100Mi
  \"foo\": 1%
bogus: top
";

    #[test]
    fn nested_keys_are_found_under_their_parent_not_elsewhere() {
        assert_eq!(locate(CONFIG, &[k("bogus")]), Some(14));
        assert_eq!(locate(CONFIG, &keys("authentication.x509.bogus")), Some(10));
        assert_eq!(locate(CONFIG, &keys("authentication.webhook")), Some(6));
        assert_eq!(locate(CONFIG, &[k("webhook")]), Some(4));
        assert_eq!(
            locate(CONFIG, &[k("evictionHard"), k("memory.available")]),
            Some(12)
        );
        assert_eq!(locate(CONFIG, &[k("evictionHard"), k("foo")]), Some(13));
        // Not there: the deepest ancestor found.
        assert_eq!(locate(CONFIG, &keys("authentication.anonymous")), Some(5));
        assert_eq!(locate(CONFIG, &[k("nothing")]), None);
    }

    #[test]
    fn list_items_and_keys_on_the_dash_line() {
        let pod = "\
apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: a
    image: i
  -   name: b
      ports:
        - containerPort: 80
        - name: http
          containerPort: 81
  volumes:
  - name: v
";
        let p = |steps: &[Step]| locate(pod, steps);
        use Step::Index as I;
        assert_eq!(p(&[k("metadata"), k("name")]), Some(4));
        assert_eq!(p(&[k("spec"), k("containers"), I(0), k("name")]), Some(7));
        assert_eq!(p(&[k("spec"), k("containers"), I(0), k("image")]), Some(8));
        assert_eq!(p(&[k("spec"), k("containers"), I(1), k("name")]), Some(9));
        assert_eq!(
            p(&[
                k("spec"),
                k("containers"),
                I(1),
                k("ports"),
                I(1),
                k("name")
            ]),
            Some(12)
        );
        assert_eq!(
            p(&[
                k("spec"),
                k("containers"),
                I(1),
                k("ports"),
                I(0),
                k("containerPort")
            ]),
            Some(11)
        );
        assert_eq!(p(&[k("spec"), k("volumes"), I(0), k("name")]), Some(15));
        // Flow style: the line of the deepest block key.
        let flow = "kind: Pod\nmetadata: {name: Web}\n";
        assert_eq!(locate(flow, &[k("metadata"), k("name")]), Some(2));
        let json = "{\n  \"kind\": \"KubeletConfiguration\",\n  \"maxPods\": -1\n}\n";
        assert_eq!(locate(json, &[k("maxPods")]), Some(3));
    }
}
