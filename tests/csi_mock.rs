//! Upstream's `test/e2e/storage/csi_mock` specs reproduced with the test
//! CSI driver (see the tests below for which spec each one is).

#[allow(unused_imports)]
use crate::csi_support::*;
