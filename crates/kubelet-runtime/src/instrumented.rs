//! CRI calls counted and timed per operation (upstream
//! `kuberuntime/instrumented_services.go`, `instrumentedRuntimeService` and
//! `instrumentedImageManagerService`): `kubelet_runtime_operations_total`,
//! `kubelet_runtime_operations_errors_total` and
//! `kubelet_runtime_operations_duration_seconds`, labelled with upstream's
//! `operation_type` names; `RunPodSandbox` also feeds
//! `kubelet_run_podsandbox_duration_seconds` and its errors.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cri::{ImageService, Result, RuntimeService, pb};
use kubelet_metrics::KubeletMetrics;
use tokio::time::Instant;

/// A runtime or image service whose calls are recorded in [`KubeletMetrics`].
pub struct Instrumented<T: ?Sized> {
    inner: Arc<T>,
    metrics: Arc<KubeletMetrics>,
}

impl<T: ?Sized> Instrumented<T> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<T>, metrics: Arc<KubeletMetrics>) -> Self {
        Self { inner, metrics }
    }

    async fn op<R>(
        &self,
        operation: &'static str,
        call: impl Future<Output = Result<R>>,
    ) -> Result<R> {
        record(&self.metrics, operation, call).await
    }
}

/// Counts and times one runtime call made outside the traits (the
/// streaming and stats calls the server makes on `cri::RemoteRuntime`),
/// under upstream's `operation_type`: `exec`, `attach`, `port_forward`,
/// `container_stats`, `list_container_stats`, `list_podsandbox_stats`,
/// `image_fs_info`.
pub async fn record<R>(
    metrics: &KubeletMetrics,
    operation: &'static str,
    call: impl Future<Output = Result<R>>,
) -> Result<R> {
    let start = Instant::now();
    let out = call.await;
    metrics.record_runtime_operation(operation, start.elapsed(), out.is_err());
    out
}

#[async_trait::async_trait]
impl<T: RuntimeService + ?Sized> RuntimeService for Instrumented<T> {
    async fn version(&self) -> Result<pb::VersionResponse> {
        self.op("version", self.inner.version()).await
    }
    async fn status(&self) -> Result<pb::StatusResponse> {
        self.op("status", self.inner.status()).await
    }
    async fn run_pod_sandbox(
        &self,
        config: pb::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String> {
        let start = Instant::now();
        let out = self
            .op(
                "run_podsandbox",
                self.inner.run_pod_sandbox(config, runtime_handler),
            )
            .await;
        self.metrics
            .record_run_pod_sandbox(runtime_handler, start.elapsed(), out.is_err());
        out
    }
    async fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        self.op("stop_podsandbox", self.inner.stop_pod_sandbox(id))
            .await
    }
    async fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        self.op("remove_podsandbox", self.inner.remove_pod_sandbox(id))
            .await
    }
    async fn pod_sandbox_status(&self, id: &str) -> Result<pb::PodSandboxStatus> {
        self.op("podsandbox_status", self.inner.pod_sandbox_status(id))
            .await
    }
    async fn list_pod_sandbox(
        &self,
        filter: Option<pb::PodSandboxFilter>,
    ) -> Result<Vec<pb::PodSandbox>> {
        self.op("list_podsandbox", self.inner.list_pod_sandbox(filter))
            .await
    }
    async fn create_container(
        &self,
        sandbox_id: &str,
        config: pb::ContainerConfig,
        sandbox_config: pb::PodSandboxConfig,
    ) -> Result<String> {
        self.op(
            "create_container",
            self.inner
                .create_container(sandbox_id, config, sandbox_config),
        )
        .await
    }
    async fn start_container(&self, id: &str) -> Result<()> {
        self.op("start_container", self.inner.start_container(id))
            .await
    }
    async fn stop_container(&self, id: &str, timeout: Duration) -> Result<()> {
        self.op("stop_container", self.inner.stop_container(id, timeout))
            .await
    }
    async fn remove_container(&self, id: &str) -> Result<()> {
        self.op("remove_container", self.inner.remove_container(id))
            .await
    }
    async fn list_containers(
        &self,
        filter: Option<pb::ContainerFilter>,
    ) -> Result<Vec<pb::Container>> {
        self.op("list_containers", self.inner.list_containers(filter))
            .await
    }
    async fn container_status(&self, id: &str) -> Result<pb::ContainerStatus> {
        self.op("container_status", self.inner.container_status(id))
            .await
    }
    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<pb::ExecSyncResponse> {
        self.op("exec_sync", self.inner.exec_sync(id, cmd, timeout))
            .await
    }
}

#[async_trait::async_trait]
impl<T: ImageService + ?Sized> ImageService for Instrumented<T> {
    async fn image_status(&self, image: &str) -> Result<Option<pb::Image>> {
        self.op("image_status", self.inner.image_status(image))
            .await
    }
    async fn pull_image(
        &self,
        image: &str,
        auth: Option<pb::AuthConfig>,
        sandbox_config: Option<pb::PodSandboxConfig>,
    ) -> Result<String> {
        self.op(
            "pull_image",
            self.inner.pull_image(image, auth, sandbox_config),
        )
        .await
    }
    async fn list_images(&self) -> Result<Vec<pb::Image>> {
        self.op("list_images", self.inner.list_images()).await
    }
    async fn remove_image(&self, image: &str) -> Result<()> {
        self.op("remove_image", self.inner.remove_image(image))
            .await
    }
}

#[cfg(test)]
mod tests {
    use cri::CriError;
    use cri::fake::FakeRuntime;
    use kubelet_metrics::parse::parse;

    use super::*;

    fn value(text: &str, family: &str, op: &str) -> Option<f64> {
        let f = parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        f.get(family)?
            .samples
            .iter()
            .find(|s| s.label("operation_type") == Some(op))
            .map(|s| s.value)
    }

    #[tokio::test]
    async fn calls_and_errors_are_counted_per_operation() {
        let fake = Arc::new(FakeRuntime::new());
        let metrics = Arc::new(KubeletMetrics::new());
        let rt = Instrumented::new(fake.clone(), metrics.clone());
        rt.list_pod_sandbox(None).await.unwrap();
        rt.list_pod_sandbox(None).await.unwrap();
        rt.list_containers(None).await.unwrap();
        fake.fail_next(
            "ListContainers",
            CriError::Unavailable {
                op: "ListContainers",
                message: "connection refused".into(),
            },
        );
        assert!(rt.list_containers(None).await.is_err());
        let sandbox = rt
            .run_pod_sandbox(pb::PodSandboxConfig::default(), "")
            .await
            .unwrap();
        rt.stop_pod_sandbox(&sandbox).await.unwrap();
        ImageService::pull_image(&rt, "busybox", None, None)
            .await
            .unwrap();

        let text = metrics.render();
        let ops = "kubelet_runtime_operations_total";
        let errs = "kubelet_runtime_operations_errors_total";
        assert_eq!(value(&text, ops, "list_podsandbox"), Some(2.0));
        assert_eq!(value(&text, ops, "list_containers"), Some(2.0));
        assert_eq!(value(&text, errs, "list_containers"), Some(1.0));
        assert_eq!(value(&text, errs, "list_podsandbox"), None);
        assert_eq!(value(&text, ops, "run_podsandbox"), Some(1.0));
        assert_eq!(value(&text, ops, "stop_podsandbox"), Some(1.0));
        assert_eq!(value(&text, ops, "pull_image"), Some(1.0));
        assert_eq!(
            fake.call_count("ListPodSandbox"),
            2,
            "calls reach the runtime"
        );
        let f = parse(&text).unwrap();
        let counts: Vec<f64> = f["kubelet_runtime_operations_duration_seconds"]
            .samples
            .iter()
            .filter(|s| {
                s.name.ends_with("_count") && s.label("operation_type") == Some("list_containers")
            })
            .map(|s| s.value)
            .collect();
        assert_eq!(counts, vec![2.0]);
        assert!(f.contains_key("kubelet_run_podsandbox_duration_seconds"));
    }
}
