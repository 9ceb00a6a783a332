//! The device manager checkpoint `<root-dir>/device-plugins/kubelet_internal_checkpoint`
//! (upstream `devicemanager/checkpoint` and `checkpointmanager`), in upstream's
//! JSON layout so a kubelet-rs node and an upstream kubelet read each other's file:
//!
//! ```json
//! {"Data":{"PodDeviceEntries":[{"PodUID":"..","ContainerName":"..","ResourceName":"..",
//!   "DeviceIDs":{"-1":["dev0"]},"AllocResp":"<base64 ContainerAllocateResponse>"}],
//!   "RegisteredDevices":{"vendor.com/gpu":["dev0","dev1"]}},"Checksum":1234}
//! ```
//!
//! Upstream's checksum is FNV-32a over `spew.Sprintf("%#v", data)` of the Go
//! `checkpointData` value (`checkpointmanager/checksum`, `util/hash`). [`checksum`]
//! renders the same text for this fixed shape (checked against files written
//! by upstream kubelets), so each kubelet accepts the other's file. A file whose checksum does not
//! match is still used, with a warning: dropping it would hand devices that
//! running containers hold to new pods. Older files whose `DeviceIDs` is a
//! plain list (upstream's v1 layout) are read as devices without topology.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::{DeviceManagerError, Result};
use crate::pod_devices::{DevicesPerNuma, NODE_WITHOUT_TOPOLOGY};

/// File name of the checkpoint in the device-plugins directory.
pub const CHECKPOINT_NAME: &str = "kubelet_internal_checkpoint";

/// One container's devices of one resource (upstream `PodDevicesEntry`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodDevicesEntry {
    /// Pod UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// Container name.
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    /// Resource name.
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// Device ids by NUMA node.
    #[serde(rename = "DeviceIDs", deserialize_with = "de_device_ids")]
    pub device_ids: DevicesPerNuma,
    /// The encoded `ContainerAllocateResponse`.
    #[serde(
        rename = "AllocResp",
        serialize_with = "ser_bytes",
        deserialize_with = "de_bytes"
    )]
    pub alloc_resp: Vec<u8>,
}

/// The checksummed part of the checkpoint (upstream `checkpointData`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CheckpointData {
    /// Allocations; `None` is Go's nil slice (JSON `null`).
    #[serde(rename = "PodDeviceEntries")]
    pub pod_device_entries: Option<Vec<PodDevicesEntry>>,
    /// Healthy device ids per registered resource; `None` is a nil map.
    #[serde(rename = "RegisteredDevices")]
    pub registered_devices: Option<BTreeMap<String, Vec<String>>>,
}

/// The whole file (upstream `checkpoint.Data`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The data.
    #[serde(rename = "Data")]
    pub data: CheckpointData,
    /// FNV-32a of the data's spew rendering.
    #[serde(rename = "Checksum")]
    pub checksum: u64,
    /// Kernel boot id when written (newer upstream kubelets); not checksummed.
    #[serde(rename = "BootID", default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
}

impl Checkpoint {
    /// A checkpoint of `data` with its checksum.
    pub fn new(data: CheckpointData) -> Self {
        let checksum = checksum(&data);
        Self {
            data,
            checksum,
            boot_id: String::new(),
        }
    }

    /// Whether the stored checksum matches the data.
    pub fn verify(&self) -> bool {
        self.checksum == checksum(&self.data)
    }
}

fn ser_bytes<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(b))
}

fn de_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    match s {
        None => Ok(Vec::new()),
        Some(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(serde::de::Error::custom),
    }
}

fn de_device_ids<'de, D: Deserializer<'de>>(d: D) -> Result<DevicesPerNuma, D::Error> {
    use serde::de::Error as _;
    let strings = |v: serde_json::Value| -> Result<Vec<String>, D::Error> {
        serde_json::from_value(v).map_err(D::Error::custom)
    };
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::Null => Ok(BTreeMap::new()),
        // Upstream's v1 layout: a flat list, no topology.
        v @ serde_json::Value::Array(_) => {
            Ok(BTreeMap::from([(NODE_WITHOUT_TOPOLOGY, strings(v)?)]))
        }
        serde_json::Value::Object(m) => m
            .into_iter()
            .map(|(k, v)| {
                let numa = k.parse::<i64>().map_err(|_| {
                    D::Error::custom(format!("NUMA node id {k:?} is not an integer"))
                })?;
                Ok((numa, strings(v)?))
            })
            .collect(),
        other => Err(D::Error::custom(format!(
            "DeviceIDs must be an object or a list, not {other}"
        ))),
    }
}

/// Upstream's checksum of the data: FNV-32a over the text spew's `%#v`
/// prints for a Go `checkpoint.checkpointData` (sorted map keys, types in
/// parentheses where spew prints them, strings unquoted, byte slices as
/// decimal lists, nil as `<nil>`).
pub fn checksum(data: &CheckpointData) -> u64 {
    u64::from(fnv32a(spew(data).as_bytes()))
}

fn fnv32a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in bytes {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

fn spew_strings(out: &mut String, v: &[String]) {
    out.push('[');
    out.push_str(&v.join(" "));
    out.push(']');
}

fn spew(data: &CheckpointData) -> String {
    let mut s =
        String::from("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)");
    match &data.pod_device_entries {
        None => s.push_str("<nil>"),
        Some(entries) => {
            s.push('[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                let _ = write!(
                    s,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)map[",
                    e.pod_uid, e.container_name, e.resource_name
                );
                for (j, (numa, ids)) in e.device_ids.iter().enumerate() {
                    if j > 0 {
                        s.push(' ');
                    }
                    let _ = write!(s, "{numa}:");
                    spew_strings(&mut s, ids);
                }
                s.push_str("] AllocResp:([]uint8)");
                if e.alloc_resp.is_empty() {
                    // Go's json decodes an empty base64 string to an empty, non-nil slice;
                    // the kubelet never writes an entry without a response.
                    s.push_str("[]");
                } else {
                    s.push('[');
                    let bytes: Vec<String> = e.alloc_resp.iter().map(u8::to_string).collect();
                    s.push_str(&bytes.join(" "));
                    s.push(']');
                }
                s.push('}');
            }
            s.push(']');
        }
    }
    s.push_str(" RegisteredDevices:(map[string][]string)");
    match &data.registered_devices {
        None => s.push_str("<nil>"),
        Some(reg) => {
            s.push_str("map[");
            for (i, (name, ids)) in reg.iter().enumerate() {
                if i > 0 {
                    s.push(' ');
                }
                let _ = write!(s, "{name}:");
                spew_strings(&mut s, ids);
            }
            s.push(']');
        }
    }
    s.push('}');
    s
}

/// Reads the checkpoint at `path`; `Ok(None)` when there is none.
///
/// # Errors
/// [`DeviceManagerError::CheckpointRead`] when the file cannot be read or parsed.
pub async fn read(path: &Path) -> Result<Option<Checkpoint>> {
    let fail = |reason: String| DeviceManagerError::CheckpointRead {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = match tokio::fs::read(path).await {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(fail(e.to_string())),
    };
    let cp: Checkpoint = serde_json::from_slice(&bytes).map_err(|e| fail(e.to_string()))?;
    if !cp.verify() {
        tracing::warn!(
            path = %path.display(),
            stored = cp.checksum,
            computed = checksum(&cp.data),
            "Device manager checkpoint checksum does not match; using its allocations anyway so no device is handed out twice"
        );
    }
    Ok(Some(cp))
}

/// Writes the checkpoint atomically (temporary file, fsync, rename, fsync of
/// the directory so the rename survives a crash), off the runtime. A
/// temporary file left by a failed write is removed.
///
/// # Errors
/// [`DeviceManagerError::CheckpointWrite`].
pub async fn write(path: PathBuf, cp: &Checkpoint) -> Result<()> {
    let fail = |e: String| DeviceManagerError::CheckpointWrite(e);
    let json = serde_json::to_vec(cp).map_err(|e| fail(e.to_string()))?;
    tokio::task::spawn_blocking(move || write_blocking(&path, &json))
        .await
        .map_err(|e| fail(e.to_string()))?
        .map_err(|e| fail(e.to_string()))
}

fn write_blocking(path: &Path, json: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or_else(|| Path::new("/"));
    let tmp = dir.join(format!(".{CHECKPOINT_NAME}.tmp"));
    let replaced = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(json)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = replaced {
        if let Err(error) = std::fs::remove_file(&tmp)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %tmp.display(), %error, "Failed to remove the temporary checkpoint file");
        }
        return Err(e);
    }
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> CheckpointData {
        CheckpointData {
            pod_device_entries: Some(vec![PodDevicesEntry {
                pod_uid: "pod1".into(),
                container_name: "con1".into(),
                resource_name: "domain1.com/resource1".into(),
                device_ids: BTreeMap::from([(0, vec!["dev1".to_string(), "dev2".to_string()])]),
                alloc_resp: vec![10, 4, 1, 2],
            }]),
            registered_devices: Some(BTreeMap::from([(
                "domain1.com/resource1".to_string(),
                vec!["dev1".to_string(), "dev2".to_string()],
            )])),
        }
    }

    #[test]
    fn spew_rendering_matches_go_shape() {
        assert_eq!(
            spew(&sample()),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)[{PodUID:(string)pod1 \
             ContainerName:(string)con1 ResourceName:(string)domain1.com/resource1 \
             DeviceIDs:(checkpoint.DevicesPerNUMA)map[0:[dev1 dev2]] AllocResp:([]uint8)[10 4 1 2]}] \
             RegisteredDevices:(map[string][]string)map[domain1.com/resource1:[dev1 dev2]]}"
        );
        let empty = CheckpointData {
            pod_device_entries: None,
            registered_devices: Some(BTreeMap::new()),
        };
        assert_eq!(
            spew(&empty),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)<nil> RegisteredDevices:(map[string][]string)map[]}"
        );
    }

    #[test]
    fn fnv32a_known_vectors() {
        assert_eq!(fnv32a(b""), 0x811c_9dc5);
        assert_eq!(fnv32a(b"a"), 0xe40c_292c);
        assert_eq!(fnv32a(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn json_layout_is_upstreams_and_round_trips() {
        let cp = Checkpoint::new(sample());
        let v: serde_json::Value = serde_json::to_value(&cp).expect("json");
        let e = &v["Data"]["PodDeviceEntries"][0];
        assert_eq!(e["PodUID"], "pod1");
        assert_eq!(e["DeviceIDs"]["0"][1], "dev2");
        assert_eq!(e["AllocResp"], "CgQBAg==");
        assert!(v.get("BootID").is_none());
        assert_eq!(v["Checksum"].as_u64(), Some(cp.checksum));
        let back: Checkpoint = serde_json::from_value(v).expect("parse");
        assert_eq!(back, cp);
        assert!(back.verify());
    }

    #[test]
    fn reads_v1_flat_device_ids_and_nulls() {
        let text = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"p","ContainerName":"c","ResourceName":"r/x","DeviceIDs":["a","b"],"AllocResp":null}],"RegisteredDevices":null},"Checksum":1}"#;
        let cp: Checkpoint = serde_json::from_str(text).expect("parse");
        let entries = cp.data.pod_device_entries.expect("entries");
        assert_eq!(entries[0].device_ids[&-1], vec!["a", "b"]);
        assert!(cp.data.registered_devices.is_none());
    }

    /// Files written by upstream kubelets (published in public docs): their
    /// checksums must verify, so the spew rendering is upstream's.
    #[test]
    fn upstream_written_checkpoints_verify() {
        let modern = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"bf52b2cd-b611-4e79-86b1-280b283185c3","ContainerName":"check","ResourceName":"nvidia.com/gpu","DeviceIDs":{"-1":["tegra"]},"AllocResp":"Ch8KFk5WSURJQV9WSVNJQkxFX0RFVklDRVMSBXRlZ3Jh"}],"RegisteredDevices":{"nvidia.com/gpu":["tegra"]}},"Checksum":3660592824}"#;
        let older = r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-0650a168-e770-3ea8-8ac3-8a1d419763e0"]}},"Checksum":3952659280}"#;
        for text in [modern, older] {
            let cp: Checkpoint = serde_json::from_str(text).expect("parse");
            assert!(cp.verify(), "computed {} for {text}", checksum(&cp.data));
            // What we write for the same data is what upstream wrote.
            assert_eq!(Checkpoint::new(cp.data.clone()).checksum, cp.checksum);
        }
    }

    #[tokio::test]
    async fn write_then_read() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(CHECKPOINT_NAME);
        assert!(read(&path).await.expect("read").is_none());
        let cp = Checkpoint::new(sample());
        write(path.clone(), &cp).await.expect("write");
        assert_eq!(read(&path).await.expect("read"), Some(cp));
        let tmp = dir.path().join(format!(".{CHECKPOINT_NAME}.tmp"));
        assert!(!tmp.exists(), "no temporary file left");
    }

    #[tokio::test]
    async fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(CHECKPOINT_NAME);
        // A non-empty directory where the checkpoint goes: the rename fails.
        std::fs::create_dir(&path).expect("mkdir");
        std::fs::write(path.join("x"), b"x").expect("write");
        let e = write(path.clone(), &Checkpoint::new(sample()))
            .await
            .expect_err("rename onto a directory");
        assert!(
            e.to_string()
                .starts_with("failed to write checkpoint file \"kubelet_internal_checkpoint\""),
            "{e}"
        );
        let tmp = dir.path().join(format!(".{CHECKPOINT_NAME}.tmp"));
        assert!(!tmp.exists(), "the temporary file is removed");
    }
}
