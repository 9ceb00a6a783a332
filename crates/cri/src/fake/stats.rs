//! The fake's CRI stats calls (cri-api's `FakeRuntimeService` `ContainerStats`,
//! `ListContainerStats`, `PodSandboxStats`, `ListPodSandboxStats` and the
//! image service's `ImageFsInfo`), answered as containerd 1.6 answers them:
//! a list call fails as a whole when it meets one sandbox or container whose
//! metrics the runtime cannot read (`failed to decode sandbox container
//! metrics for sandbox ...`), while the single calls fail only for that one.

use super::{FakeRuntime, not_found, now_ns};
use crate::pb::{self, ContainerState, PodSandboxState};
use crate::{CriError, Result};

/// What a running container reports when the test set nothing else: one
/// core-second of CPU and 1 MiB of working set.
const DEFAULT_USAGE: (u64, u64) = (1_000_000_000, 1 << 20);

fn u64v(value: u64) -> Option<pb::UInt64Value> {
    Some(pb::UInt64Value { value })
}

fn decode_error(op: &'static str, what: &str, id: &str) -> CriError {
    CriError::Rpc {
        op,
        code: tonic::Code::Unknown,
        message: format!(
            "failed to decode {what} metrics for {id}: unexpected metric type \"io.containerd.cgroups.v1.Metrics\""
        ),
    }
}

impl FakeRuntime {
    /// Stats of the sandbox or container `id` fail from now on: its own
    /// `PodSandboxStats`/`ContainerStats`, and every list call that meets it.
    pub fn fail_stats(&self, id: &str) {
        self.state.lock().failing_stats.insert(id.to_string());
    }

    /// Every call of `op` (a CRI method name such as `"ListPodSandboxStats"`)
    /// answers `Unimplemented`, as a runtime older than the method does.
    pub fn set_unimplemented(&self, op: &'static str) {
        self.state.lock().unimplemented.insert(op);
    }

    /// The CPU (core-nanoseconds) and working set (bytes) the stats of
    /// container `id` report from now on.
    pub fn set_container_usage(&self, id: &str, cpu_core_ns: u64, working_set_bytes: u64) {
        self.state
            .lock()
            .usage
            .insert(id.to_string(), (cpu_core_ns, working_set_bytes));
    }

    /// The stats of one container as the runtime reads them, or why not.
    fn stats_of_container(&self, op: &'static str, id: &str) -> Result<pb::ContainerStats> {
        let st = self.state.lock();
        let (c, _) = st.containers.get(id).ok_or_else(|| not_found(op, id))?;
        if st.failing_stats.contains(id) {
            return Err(decode_error(op, "container", id));
        }
        let (cpu, ws) = st.usage.get(id).copied().unwrap_or(DEFAULT_USAGE);
        let now = now_ns();
        Ok(pb::ContainerStats {
            attributes: Some(pb::ContainerAttributes {
                id: id.to_string(),
                metadata: c.metadata.clone(),
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
            }),
            cpu: Some(pb::CpuUsage {
                timestamp: now,
                usage_core_nano_seconds: u64v(cpu),
                usage_nano_cores: None,
            }),
            memory: Some(pb::MemoryUsage {
                timestamp: now,
                working_set_bytes: u64v(ws),
                usage_bytes: u64v(ws),
                ..Default::default()
            }),
            writable_layer: Some(pb::FilesystemUsage {
                timestamp: now,
                fs_id: Some(pb::FilesystemIdentifier {
                    mountpoint: "/".to_string(),
                }),
                used_bytes: u64v(4096),
                inodes_used: u64v(1),
            }),
            swap: None,
        })
    }

    /// Running containers, in ID order.
    fn running_container_ids(&self, sandbox: Option<&str>) -> Vec<String> {
        let st = self.state.lock();
        let running = ContainerState::ContainerRunning as i32;
        let mut ids: Vec<String> = st
            .containers
            .values()
            .filter(|(c, sb)| c.state == running && sandbox.is_none_or(|s| s == sb))
            .map(|(c, _)| c.id.clone())
            .collect();
        ids.sort();
        ids
    }

    /// The stats of one sandbox: the sum of its running containers.
    fn stats_of_sandbox(&self, op: &'static str, id: &str) -> Result<pb::PodSandboxStats> {
        let (metadata, labels, annotations) = {
            let st = self.state.lock();
            let (s, _) = st.sandboxes.get(id).ok_or_else(|| not_found(op, id))?;
            if st.failing_stats.contains(id) {
                return Err(decode_error(
                    op,
                    "sandbox container",
                    &format!("sandbox {id}"),
                ));
            }
            (s.metadata.clone(), s.labels.clone(), s.annotations.clone())
        };
        let mut containers = Vec::new();
        for c in self.running_container_ids(Some(id)) {
            containers.push(self.stats_of_container(op, &c)?);
        }
        let sum = |f: fn(&pb::ContainerStats) -> Option<u64>| -> u64 {
            containers.iter().filter_map(f).sum()
        };
        let cpu = sum(|c| Some(c.cpu.as_ref()?.usage_core_nano_seconds.as_ref()?.value));
        let ws = sum(|c| Some(c.memory.as_ref()?.working_set_bytes.as_ref()?.value));
        let now = now_ns();
        Ok(pb::PodSandboxStats {
            attributes: Some(pb::PodSandboxAttributes {
                id: id.to_string(),
                metadata,
                labels,
                annotations,
            }),
            linux: Some(pb::LinuxPodSandboxStats {
                cpu: Some(pb::CpuUsage {
                    timestamp: now,
                    usage_core_nano_seconds: u64v(cpu),
                    usage_nano_cores: None,
                }),
                memory: Some(pb::MemoryUsage {
                    timestamp: now,
                    working_set_bytes: u64v(ws),
                    usage_bytes: u64v(ws),
                    ..Default::default()
                }),
                network: None,
                process: None,
                containers,
            }),
        })
    }

    /// `ContainerStats`.
    pub async fn container_stats(&self, id: &str) -> Result<Option<pb::ContainerStats>> {
        self.enter("ContainerStats")?;
        self.stats_of_container("ContainerStats", id).map(Some)
    }

    /// `ListContainerStats` of every running container (the filter is ignored).
    pub async fn list_container_stats(
        &self,
        _filter: Option<pb::ContainerStatsFilter>,
    ) -> Result<Vec<pb::ContainerStats>> {
        self.enter("ListContainerStats")?;
        self.running_container_ids(None)
            .iter()
            .map(|id| self.stats_of_container("ListContainerStats", id))
            .collect()
    }

    /// `PodSandboxStats`.
    pub async fn pod_sandbox_stats(&self, id: &str) -> Result<Option<pb::PodSandboxStats>> {
        self.enter("PodSandboxStats")?;
        self.stats_of_sandbox("PodSandboxStats", id).map(Some)
    }

    /// `ListPodSandboxStats` of every ready sandbox (the filter is ignored).
    pub async fn list_pod_sandbox_stats(
        &self,
        _filter: Option<pb::PodSandboxStatsFilter>,
    ) -> Result<Vec<pb::PodSandboxStats>> {
        self.enter("ListPodSandboxStats")?;
        let ready: Vec<String> = {
            let st = self.state.lock();
            let mut ids: Vec<String> = st
                .sandboxes
                .values()
                .filter(|(s, _)| s.state == PodSandboxState::SandboxReady as i32)
                .map(|(s, _)| s.id.clone())
                .collect();
            ids.sort();
            ids
        };
        ready
            .iter()
            .map(|id| self.stats_of_sandbox("ListPodSandboxStats", id))
            .collect()
    }

    /// `ImageFsInfo`: one image filesystem mounted at `/`.
    pub async fn image_fs_info(&self) -> Result<pb::ImageFsInfoResponse> {
        self.enter("ImageFsInfo")?;
        let fs = pb::FilesystemUsage {
            timestamp: now_ns(),
            fs_id: Some(pb::FilesystemIdentifier {
                mountpoint: "/".to_string(),
            }),
            used_bytes: u64v(1 << 30),
            inodes_used: u64v(1000),
        };
        Ok(pb::ImageFsInfoResponse {
            image_filesystems: vec![fs.clone()],
            container_filesystems: vec![fs],
        })
    }
}
