//! Upstream's `test/e2e/storage/csi_mock` specs reproduced with the test
//! CSI driver: the driver's recorded calls play the mock driver's call log
//! the specs read, its faults play their pre-hooks, and the test plays the
//! control plane (CSIDriver object, bound claims, attach, resize). Each
//! test names the specs it reproduces; what each asserts is the kubelet's
//! part of them.
//!
//! This file: "CSI Mock volume node stage" (NodeStage and NodeUnstage error
//! cases). The other contexts are in the modules below.

#[path = "csi_mock_workload.rs"]
mod workload;

#[path = "csi_mock_volume.rs"]
mod volume;

use std::time::Duration;

use kubelet_rs_integration::cluster::phase;
use kubelet_test_util::csi_driver::Fault;
use kubelet_test_util::csi_driver::api::DriverSpec;
use tonic::Code;

use crate::csi_support::*;

const STAGE: &str = "NodeStageVolume";
const UNSTAGE: &str = "NodeUnstageVolume";

/// One spec of "CSI NodeStage error cases": the fault on NodeStage, the
/// squashed calls expected, after how many of them the pod is deleted,
/// and whether it runs first.
struct StageCase {
    name: &'static str,
    fault: Option<Fault>,
    running: bool,
    expected: &'static [(&'static str, Code)],
    delete_after: usize,
}

fn no_attach() -> DriverSpec {
    DriverSpec {
        attach_required: Some(false),
        ..DriverSpec::default()
    }
}

/// csi_mock "CSI NodeStage error cases": a NodeStage final error
/// (`InvalidArgument`) is retried while the pod exists and, when the pod
/// goes before a stage succeeded, needs no NodeUnstage; an ephemeral one
/// (`DeadlineExceeded`) leaves the device uncertain, so the pod's removal
/// unstages it; a stage that finally succeeded is unstaged with the pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stage_error_cases() {
    let fake = |code| Some(Fault::Fail(code, "fake error".into()));
    let cases = [
        StageCase {
            name: "should call NodeUnstage after NodeStage success",
            fault: None,
            running: true,
            expected: &[(STAGE, Code::Ok), (UNSTAGE, Code::Ok)],
            delete_after: 1,
        },
        StageCase {
            name: "should retry NodeStage after NodeStage final error",
            fault: Some(Fault::FailTimes(
                3,
                Code::InvalidArgument,
                "fake error".into(),
            )),
            running: true,
            expected: &[
                (STAGE, Code::InvalidArgument),
                (STAGE, Code::Ok),
                (UNSTAGE, Code::Ok),
            ],
            delete_after: 2,
        },
        StageCase {
            name: "should retry NodeStage after NodeStage ephemeral error",
            fault: Some(Fault::FailTimes(
                3,
                Code::DeadlineExceeded,
                "fake error".into(),
            )),
            running: true,
            expected: &[
                (STAGE, Code::DeadlineExceeded),
                (STAGE, Code::Ok),
                (UNSTAGE, Code::Ok),
            ],
            delete_after: 2,
        },
        StageCase {
            name: "should call NodeUnstage after NodeStage ephemeral error",
            fault: fake(Code::DeadlineExceeded),
            running: false,
            expected: &[(STAGE, Code::DeadlineExceeded), (UNSTAGE, Code::Ok)],
            delete_after: 1,
        },
        StageCase {
            name: "should not call NodeUnstage after NodeStage final error",
            fault: fake(Code::InvalidArgument),
            running: false,
            expected: &[(STAGE, Code::InvalidArgument)],
            delete_after: 1,
        },
    ];
    let env = Env::start(no_attach()).await;
    let tracked = [STAGE, UNSTAGE];
    for (i, case) in cases.iter().enumerate() {
        let (claim, pv, handle, pod) = (
            format!("claim-st{i}"),
            format!("pv-st{i}"),
            format!("vol-st{i}"),
            format!("stage{i}"),
        );
        env.driver.clear_calls();
        if let Some(f) = &case.fault {
            env.driver.set_fault(STAGE, f.clone());
        }
        env.bound_claim(&claim, &pv, &handle, case.name).await;
        env.j.create_pod(&pod, claim_pod(&claim)).await;
        env.wait_calls(&tracked, case.expected, case.delete_after)
            .await;
        if case.running {
            env.j
                .wait_api(&pod, T, "Running", |p| phase(p) == Some("Running"))
                .await;
        }
        env.delete_pod(&pod).await;
        env.wait_calls(&tracked, case.expected, case.expected.len())
            .await;
        // Nothing more comes (no unstage after a final stage error).
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            env.compare_calls(&tracked, case.expected),
            Ok(case.expected.len()),
            "{}",
            case.name
        );
        assert!(
            !env.staging(&handle).exists(),
            "{}: staging path left",
            case.name
        );
        assert!(env.driver.staged().is_empty(), "{}", case.name);
        env.driver.clear_fault(STAGE);
    }
    env.j.cleanup().await;
}

/// csi_mock "CSI NodeUnstage error cases": two pods use one claim in turn;
/// the first pod's NodeUnstage succeeds, fails finally or fails
/// transiently (the driver did unstage, as the mock driver, which mounts
/// nothing, leaves nothing staged), and the second pod's volume is staged
/// again before it runs, then unstaged when it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_unstage_error_cases() {
    let cases = [
        ("should call NodeStage after NodeUnstage success", Code::Ok),
        (
            "two pods: should call NodeStage after previous NodeUnstage final error",
            Code::InvalidArgument,
        ),
        (
            "two pods: should call NodeStage after previous NodeUnstage transient error",
            Code::DeadlineExceeded,
        ),
    ];
    let env = Env::start(no_attach()).await;
    let tracked = [STAGE, UNSTAGE];
    for (i, (name, code)) in cases.into_iter().enumerate() {
        let expected = [
            (STAGE, Code::Ok),
            (UNSTAGE, code),
            (STAGE, Code::Ok),
            (UNSTAGE, Code::Ok),
        ];
        let (claim, handle) = (format!("claim-un{i}"), format!("vol-un{i}"));
        env.driver.clear_calls();
        if code != Code::Ok {
            env.driver.set_fault(
                UNSTAGE,
                Fault::FailAfterWork(code, "fake unstage error".into()),
            );
        }
        env.bound_claim(&claim, &format!("pv-un{i}"), &handle, name)
            .await;
        let first = format!("first{i}");
        env.j.create_pod(&first, claim_pod(&claim)).await;
        env.j
            .wait_api(&first, T, "Running", |p| phase(p) == Some("Running"))
            .await;
        env.delete_pod(&first).await;
        env.wait_calls(&tracked, &expected, 2).await;

        let second = format!("second{i}");
        env.j.create_pod(&second, claim_pod(&claim)).await;
        env.j
            .wait_api(&second, T, "Running", |p| phase(p) == Some("Running"))
            .await;
        // The hook fails only the first pod's unstage.
        env.driver.clear_fault(UNSTAGE);
        env.delete_pod(&second).await;
        env.wait_calls(&tracked, &expected, expected.len()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            env.compare_calls(&tracked, &expected),
            Ok(expected.len()),
            "{name}"
        );
        wait_gone(&env.staging(&handle)).await;
    }
    env.j.cleanup().await;
}
