//! Tests of the device manager against fake device plugins serving the
//! generated `DevicePlugin` service on real unix sockets in a tempdir.

mod admission_tests;
mod manager_tests;
mod stub_tests;
