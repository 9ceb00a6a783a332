//! Volume plugins (upstream `pkg/volume`): how each kind of pod volume is
//! set up in the pod's directory and torn down again.
//!
//! The kubelet's volume manager (`kubelet::volumemanager`) decides *which*
//! volumes a pod needs and *when*; this crate does the setting up. It reads
//! the apiserver only through [`VolumeHost`], which the kubelet implements
//! over its watch-based ConfigMap/Secret managers and its token manager.
//!
//! Layout, as upstream's: a volume of plugin `kubernetes.io/<p>` named `<v>`
//! of pod `<uid>` lives in `<root-dir>/pods/<uid>/volumes/kubernetes.io~<p>/<v>`.

pub mod atomic_writer;
pub mod configmap;
pub mod downwardapi;
pub mod emptydir;
pub mod error;
pub mod host;
pub mod hostpath;
pub mod mount;
pub mod ownership;
pub mod plugin;
pub mod projected;
pub mod pvc;
pub mod removeall;
pub mod secret;
pub mod subpath;

pub use error::{Error, Result};
pub use host::{ObjectError, VolumeHost};

pub use plugin::{MountedVolume, SetUpRequest, plugin_for, set_up, tear_down, volume_dir};
