//! PersistentVolumeClaims and PersistentVolumes, read by name when a pod's
//! volumes are set up (upstream: the volume manager's desired-state populator
//! GETs the claim, then its bound volume). One GET each, under a deadline.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::{Api, Client};

use super::{ObjectError, object_error, with_deadline};

/// Reads claims and volumes (`None` client: standalone, every read fails
/// with [`ObjectError::NoClient`]). Cheap to clone.
#[derive(Clone)]
pub struct PersistentVolumeGetter {
    client: Option<Client>,
}

impl PersistentVolumeGetter {
    /// Reads through `client`.
    pub fn new(client: Option<Client>) -> Self {
        Self { client }
    }

    fn client(
        &self,
        resource: &'static str,
        namespace: &str,
        name: &str,
    ) -> Result<Client, ObjectError> {
        self.client.clone().ok_or_else(|| ObjectError::NoClient {
            resource,
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
    }

    /// The claim `namespace/name`.
    pub async fn get_persistent_volume_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<PersistentVolumeClaim, ObjectError> {
        const RESOURCE: &str = "persistentvolumeclaims";
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client(RESOURCE, namespace, name)?, namespace);
        with_deadline(format!("get {RESOURCE} {namespace}/{name}"), async {
            api.get(name)
                .await
                .map_err(|e| object_error(RESOURCE, name, e))
        })
        .await
    }

    /// The (cluster-scoped) volume `name`.
    pub async fn get_persistent_volume(&self, name: &str) -> Result<PersistentVolume, ObjectError> {
        const RESOURCE: &str = "persistentvolumes";
        let api: Api<PersistentVolume> = Api::all(self.client(RESOURCE, "", name)?);
        with_deadline(format!("get {RESOURCE} {name}"), async {
            api.get(name)
                .await
                .map_err(|e| object_error(RESOURCE, name, e))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn standalone_reads_fail_with_no_client() {
        let g = PersistentVolumeGetter::new(None);
        let e = g
            .get_persistent_volume_claim("ns", "claim")
            .await
            .expect_err("no client");
        assert!(
            matches!(&e, ObjectError::NoClient { resource: "persistentvolumeclaims", namespace, name } if namespace == "ns" && name == "claim"),
            "{e:?}"
        );
        let e = g.get_persistent_volume("pv").await.expect_err("no client");
        assert!(
            matches!(&e, ObjectError::NoClient { resource: "persistentvolumes", name, .. } if name == "pv"),
            "{e:?}"
        );
    }
}
