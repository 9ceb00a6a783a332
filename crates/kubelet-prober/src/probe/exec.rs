//! Exec probes (upstream `pkg/probe/exec` with the kubelet's
//! `execInContainer` and the CRI `ExecSync` error mapping): run the command
//! in the container under the probe's timeout; exit code 0 succeeds, any
//! other fails with the combined output; a timeout fails with
//! `command "<cmd>" timed out`.

use std::time::Duration;

use cri::{CriError, RuntimeService};
use k8s_openapi::api::core::v1::EnvVar;

use super::{MAX_OUTPUT, Output, ProbeError, ProbeOutcome};

/// Runs `cmd` in container `container_id` (the bare runtime ID).
pub async fn probe(
    runtime: &dyn RuntimeService,
    container_id: &str,
    cmd: Vec<String>,
    timeout: Duration,
) -> Result<Output, ProbeError> {
    let joined = cmd.join(" ");
    match runtime.exec_sync(container_id, cmd, timeout).await {
        Ok(resp) => {
            // Upstream writes stdout then stderr into one 10 KiB buffer.
            let mut data = resp.stdout;
            data.extend_from_slice(&resp.stderr);
            data.truncate(MAX_OUTPUT);
            let output = String::from_utf8_lossy(&data).into_owned();
            let outcome = if resp.exit_code == 0 {
                ProbeOutcome::Success
            } else {
                ProbeOutcome::Failure
            };
            Ok((outcome, output))
        }
        // The runtime's DeadlineExceeded is a timed-out probe (upstream
        // remote runtime turns it into exec.TimeoutError).
        Err(CriError::Timeout { .. }) => Ok((
            ProbeOutcome::Failure,
            format!("command {joined:?} timed out"),
        )),
        Err(e) => Err(ProbeError::Exec(e)),
    }
}

/// Expands `$(VAR)` in the probe's command with the container's env vars
/// that have a literal value (upstream `ExpandContainerCommandOnlyStatic`):
/// `$$` is a literal `$`, unknown references stay as written.
pub fn expand_static(cmd: &[String], env: &[EnvVar]) -> Vec<String> {
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|e| e.name == name && e.value_from.is_none())
            .map(|e| e.value.clone().unwrap_or_default())
    };
    cmd.iter().map(|s| expand(s, &lookup)).collect()
}

fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match lookup(name) {
                        Some(v) => out.push_str(&v),
                        None => {
                            out.push_str("$(");
                            out.push_str(name);
                            out.push(')');
                        }
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_env_expansion() {
        let env = vec![
            EnvVar {
                name: "A".into(),
                value: Some("x".into()),
                ..Default::default()
            },
            EnvVar {
                name: "B".into(),
                value_from: Some(Default::default()),
                ..Default::default()
            },
        ];
        let cmd: Vec<String> = ["sh", "-c", "echo $(A) $(B) $$(A) $(C) $x $("]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(expand_static(&cmd, &env)[2], "echo x $(B) $(A) $(C) $x $(");
    }
}
