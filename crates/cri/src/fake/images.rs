//! The fake's CRI image service: images kept in a map, pulls recorded with
//! their credentials, a private image refused without them (containerd's
//! 401), a missing one `NotFound`, and a pull that hangs on request.

use crate::pb;
use crate::service::ImageService;
use crate::{CriError, Result};

use super::FakeRuntime;

#[async_trait::async_trait]
impl ImageService for FakeRuntime {
    async fn image_status(&self, image: &str) -> Result<Option<pb::Image>> {
        self.enter("ImageStatus")?;
        Ok(self.state.lock().images.get(image).cloned())
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<pb::AuthConfig>,
        _sandbox_config: Option<pb::PodSandboxConfig>,
    ) -> Result<String> {
        self.enter("PullImage")?;
        let denied = {
            let mut st = self.state.lock();
            st.pulls.push((image.to_string(), auth.clone()));
            st.private_images
                .get(image)
                .is_some_and(|want| auth.as_ref() != Some(want))
        };
        if denied {
            return Err(CriError::Rpc {
                op: "PullImage",
                code: tonic::Code::Unknown,
                message: format!(
                    "failed to pull and unpack image \"{image}\": failed to resolve reference \"{image}\": unexpected status from HEAD request: 401 Unauthorized"
                ),
            });
        }
        let hang = self.state.lock().hang_pull.contains(image);
        if hang {
            std::future::pending::<()>().await;
        }
        if self.state.lock().missing_images.contains(image) {
            return Err(CriError::Rpc {
                op: "PullImage",
                code: tonic::Code::NotFound,
                message: format!("failed to resolve reference \"{image}\": not found"),
            });
        }
        self.add_image(image);
        Ok(format!("sha256:{image}"))
    }

    async fn list_images(&self) -> Result<Vec<pb::Image>> {
        self.enter("ListImages")?;
        Ok(self.state.lock().images.values().cloned().collect())
    }

    async fn remove_image(&self, image: &str) -> Result<()> {
        self.enter("RemoveImage")?;
        self.state.lock().images.remove(image);
        Ok(())
    }
}
