//! The pod-resources API for kubelet-rs (upstream pkg/kubelet/apis/podresources, v1): List, Get, GetAllocatableResources on a unix socket.
