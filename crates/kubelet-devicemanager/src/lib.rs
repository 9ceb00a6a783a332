//! Device plugins for kubelet-rs (upstream pkg/kubelet/cm/devicemanager, deviceplugin/v1beta1): registration, ListAndWatch, allocation, checkpoint.
