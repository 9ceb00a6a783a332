//! `$(VAR)` references in `command`, `args` and `env` values (upstream
//! `third_party/forked/golang/expansion`): `$(NAME)` becomes the variable's
//! value when it is defined, stays as written when it is not, and `$$` is a
//! literal `$`.

use std::collections::HashMap;

/// Expands `$(NAME)` references in `input` from `vars`.
pub fn expand(input: &str, vars: &HashMap<String, String>) -> String {
    expand_with(input, |name| vars.get(name).cloned())
}

/// Expands `$(NAME)` references in `input` through `mapping`; a name it
/// maps to `None` stays as written (upstream `expansion.Expand` with
/// `MappingFuncFor`).
pub fn expand_with(input: &str, mut mapping: impl FnMut(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            match bytes[i + 1] {
                b'$' => {
                    out.push('$');
                    i += 2;
                    continue;
                }
                b'(' => {
                    if let Some(close) = input[i + 2..].find(')') {
                        let name = &input[i + 2..i + 2 + close];
                        match mapping(name) {
                            Some(v) => out.push_str(&v),
                            None => out.push_str(&input[i..i + 3 + close]),
                        }
                        i += 3 + close;
                        continue;
                    }
                }
                _ => {}
            }
        }
        let ch = input[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8().max(1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_expansion_rules() {
        let vars = HashMap::from([
            ("A".to_string(), "1".to_string()),
            ("B".to_string(), "two".to_string()),
        ]);
        assert_eq!(expand("x$(A)y", &vars), "x1y");
        assert_eq!(expand("$(A)$(B)", &vars), "1two");
        assert_eq!(expand("$(MISSING)", &vars), "$(MISSING)");
        assert_eq!(expand("$$(A)", &vars), "$(A)");
        assert_eq!(expand("cost: $5", &vars), "cost: $5");
        assert_eq!(expand("$(unclosed", &vars), "$(unclosed");
        assert_eq!(expand("é$(A)ü", &vars), "é1ü");
    }
}
