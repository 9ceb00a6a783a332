//! The kubelet's side of CSI (upstream `KubeletVolumeHost` as a CSI volume host):
//! CSIDriver, VolumeAttachment, CSINode and the Node's metadata read and written
//! over the apiserver client for `kubelet-csi`.
