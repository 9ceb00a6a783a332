//! Device plugins in the kubelet (upstream `ContainerManager`'s device manager
//! hooks): admission, container options, node capacity and the pod-resources API
//! over `kubelet-devicemanager`.
