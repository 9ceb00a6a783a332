//! Waiting for the external attacher (upstream `csi_attacher.go`
//! `WaitForAttach` / `waitForVolumeAttachmentWithLister`): when the driver
//! needs attaching, the kubelet waits until the VolumeAttachment named
//! `csi-<sha256(handle+driver+node)>` reports `status.attached`, and fails
//! with the attacher's `attachError` message or on the deadline.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};

use crate::paths::attachment_name;
use crate::{CsiHost, Error, Result};

/// Whether a volume of `driver` skips attach (upstream `skipAttach`): only
/// when its CSIDriver exists and says `attachRequired: false`.
pub fn skip_attach(driver: Option<&CSIDriver>) -> bool {
    driver.is_some_and(|d| d.spec.attach_required == Some(false))
}

/// Upstream `verifyAttachmentStatus`: attached, still waiting, or failed.
fn attachment_status(va: &VolumeAttachment, volume_handle: &str) -> Result<bool> {
    if va.metadata.deletion_timestamp.is_some() {
        tracing::error!(attachment = ?va.metadata.name, "VolumeAttachment has deletion timestamp, will not continue to wait for attachment");
        return Err(Error::AttachmentDeleted);
    }
    let Some(status) = va.status.as_ref() else {
        return Ok(false);
    };
    if status.attached {
        return Ok(true);
    }
    if let Some(message) = status.attach_error.as_ref().and_then(|e| e.message.clone()) {
        tracing::error!(volume_handle, %message, "attachment failed");
        return Err(Error::AttachError(message));
    }
    Ok(false)
}

/// Polls the VolumeAttachment every `poll` until it is attached, it fails,
/// or `timeout` passes. Returns the attachment's name and its publish
/// context (`status.attachmentMetadata`).
pub async fn wait_for_attach(
    host: &dyn CsiHost,
    driver: &str,
    volume_handle: &str,
    timeout: Duration,
    poll: Duration,
) -> Result<(String, BTreeMap<String, String>)> {
    let name = attachment_name(volume_handle, driver, host.node_name());
    let wait = async {
        loop {
            // Not found yet: the attach/detach controller may not have created it.
            if let Some(va) = host.volume_attachment(&name).await?
                && attachment_status(&va, volume_handle)?
            {
                let context = va
                    .status
                    .and_then(|s| s.attachment_metadata)
                    .unwrap_or_default();
                return Ok(context);
            }
            tokio::time::sleep(poll).await;
        }
    };
    match tokio::time::timeout(timeout, wait).await {
        Ok(Ok(context)) => Ok((name, context)),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            tracing::error!(driver, volume_handle, attachment = %name, ?timeout, "Attach timeout");
            Err(Error::AttachTimeout {
                driver: driver.to_string(),
                volume_handle: volume_handle.to_string(),
            })
        }
    }
}
