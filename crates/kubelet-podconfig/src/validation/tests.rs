use super::*;

fn pod(yaml: &str) -> Pod {
    let v: serde_json::Value = serde_saphyr::from_str(yaml).expect("yaml");
    serde_json::from_value(v).expect("pod")
}

fn errors(yaml: &str) -> Vec<String> {
    validate_static_pod(&pod(yaml), "node-1")
        .iter()
        .map(ToString::to_string)
        .collect()
}

const BASE: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n";

fn with_spec(spec: &str) -> Vec<String> {
    errors(&format!("{BASE}{spec}"))
}

#[test]
fn the_example_manifests_and_a_full_pod_are_valid() {
    for m in [
        include_str!("../../../../deploy/manifests/web.yaml"),
        include_str!("../../../../deploy/manifests/init-demo.yaml"),
    ] {
        assert_eq!(errors(m), Vec::<String>::new());
    }
    let full = r#"
apiVersion: v1
kind: Pod
metadata: {name: full, namespace: kube-system, labels: {a: b}}
spec:
  restartPolicy: OnFailure
  dnsPolicy: ClusterFirstWithHostNet
  hostNetwork: true
  terminationGracePeriodSeconds: 0
  volumes:
  - {name: data, emptyDir: {}}
  - {name: host, hostPath: {path: /var/log, type: Directory}}
  - {name: cfg, configMap: {name: c}}
  - name: defaulted
  initContainers:
  - name: sidecar
    image: busybox:1
    restartPolicy: Always
    readinessProbe: {exec: {command: ['true']}}
  - name: init
    image: busybox:1
  containers:
  - name: app
    image: busybox:1
    env: [{name: MY_VAR, value: x}, {name: P, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
    ports: [{name: http, containerPort: 80}, {containerPort: 53, protocol: UDP, hostPort: 53}]
    resources:
      limits: {cpu: "1", memory: 128Mi, example.com/gpu: "1"}
      requests: {cpu: 500m, example.com/gpu: "1"}
    volumeMounts:
    - {name: data, mountPath: /data}
    - {name: host, mountPath: /logs, subPath: pods}
    - {name: defaulted, mountPath: /d}
    livenessProbe: {httpGet: {port: http, path: /}, periodSeconds: 0, successThreshold: 0}
    readinessProbe: {tcpSocket: {port: 80}, successThreshold: 3}
    startupProbe: {grpc: {port: 9000}, failureThreshold: 30}
"#;
    assert_eq!(errors(full), Vec::<String>::new());
}

#[test]
fn names_are_dns_subdomains_and_labels() {
    let e = errors(
        "kind: Pod\nmetadata: {name: Web, namespace: Kube_System}\nspec: {containers: [{name: c, image: i}]}\n",
    );
    assert_eq!(e.len(), 2, "{e:?}");
    assert!(
        e[0].starts_with("metadata.name: Invalid value: \"Web-node-1\": a lowercase RFC 1123 subdomain must consist of"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("metadata.namespace: Invalid value: \"Kube_System\": a lowercase RFC 1123 label must consist of"),
        "{e:?}"
    );
    let e = errors(
        "kind: Pod\nmetadata: {name: a, labels: {'bad key!': x, app: 'no spaces'}, annotations: {'kubernetes.io/config.source': file, '/x': z}}\nspec: {containers: [{name: c, image: i}]}\n",
    );
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("metadata.labels: Invalid value: \"no spaces\": a valid label must be"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with("metadata.labels: Invalid value: \"bad key!\": name part must consist of"),
        "{e:?}"
    );
    assert_eq!(
        e[2],
        "metadata.annotations: Invalid value: \"/x\": prefix part must be non-empty"
    );
    let e = errors("kind: Pod\nmetadata: {}\nspec: {containers: [{name: c, image: i}]}\n");
    assert_eq!(
        e,
        ["metadata.name: Required value: name or generateName is required"]
    );
}

#[test]
fn container_names_images_and_duplicates() {
    let e = with_spec(
        "  initContainers: [{name: a, image: i}]\n  containers: [{name: Foo, image: i}, {name: a, image: ' i'}, {name: '', image: i}, {name: b}]\n",
    );
    assert!(
        e[0].starts_with("spec.containers[0].name: Invalid value: \"Foo\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
        "{e:?}"
    );
    assert_eq!(
        e[1..],
        [
            "spec.containers[1].name: Duplicate value: \"a\"",
            "spec.containers[1].image: Invalid value: \" i\": must not have leading or trailing whitespace",
            "spec.containers[2].name: Required value",
            "spec.containers[3].image: Required value",
        ]
    );
    assert_eq!(
        with_spec("  containers: []\n"),
        ["spec.containers: Required value"]
    );
}

#[test]
fn ports_are_checked_for_range_name_and_protocol() {
    let e = with_spec(
        "  containers:\n  - name: c\n    image: i\n    ports:\n    - {name: http, containerPort: 70000}\n    - {name: http, containerPort: 81, protocol: ICMP}\n    - {name: Web_1, containerPort: 82, hostPort: -1}\n",
    );
    assert_eq!(
        e,
        [
            "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
            "spec.containers[0].ports[1].name: Duplicate value: \"http\"",
            "spec.containers[0].ports[1].protocol: Unsupported value: \"ICMP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            "spec.containers[0].ports[2].name: Invalid value: \"Web_1\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            "spec.containers[0].ports[2].hostPort: Invalid value: -1: must be between 1 and 65535, inclusive",
        ]
    );
}

#[test]
fn resources_must_parse_be_non_negative_and_requests_within_limits() {
    let e = with_spec(
        "  containers:\n  - name: c\n    image: i\n    resources:\n      limits: {cpu: 500m, memory: lots, bogus: '1'}\n      requests: {cpu: '1', ephemeral-storage: -1Gi, example.com/gpu: '1'}\n",
    );
    assert_eq!(
        e,
        [
            "spec.containers[0].resources.limits[bogus]: Invalid value: \"bogus\": must be a standard resource for containers",
            "spec.containers[0].resources.limits[memory]: Invalid value: \"lots\": quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
            "spec.containers[0].resources.requests[ephemeral-storage]: Invalid value: \"-1Gi\": must be greater than or equal to 0",
            "spec.containers[0].resources.requests[cpu]: Invalid value: \"1\": must be less than or equal to cpu limit of 500m",
            "spec.containers[0].resources.limits: Forbidden: Limit must be set for non overcommitable resources",
        ]
    );
}

#[test]
fn probes_need_one_handler_and_sane_numbers() {
    let e = with_spec(
        "  containers:\n  - name: c\n    image: i\n    livenessProbe: {exec: {command: [x]}, httpGet: {port: 80}, successThreshold: 2}\n    readinessProbe: {periodSeconds: -1}\n    startupProbe: {tcpSocket: {port: 0}, timeoutSeconds: -5}\n",
    );
    assert_eq!(
        e,
        [
            "spec.containers[0].livenessProbe.httpGet: Forbidden: may not specify more than 1 handler type",
            "spec.containers[0].livenessProbe.successThreshold: Invalid value: 2: must be 1",
            "spec.containers[0].readinessProbe: Required value: must specify a handler type",
            "spec.containers[0].readinessProbe.periodSeconds: Invalid value: -1: must be greater than or equal to 0",
            "spec.containers[0].startupProbe.tcpSocket.port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "spec.containers[0].startupProbe.timeoutSeconds: Invalid value: -5: must be greater than or equal to 0",
        ]
    );
    let e = with_spec(
        "  initContainers: [{name: i, image: i, livenessProbe: {exec: {command: [x]}}}]\n  containers: [{name: c, image: i}]\n",
    );
    assert_eq!(
        e,
        [
            "spec.initContainers[0].livenessProbe: Forbidden: may not be set for init containers without restartPolicy=Always"
        ]
    );
}

#[test]
fn volumes_and_mounts() {
    let e = with_spec(
        "  volumes:\n  - {name: data, emptyDir: {}}\n  - {name: data, hostPath: {path: ''}}\n  - {name: Two, emptyDir: {}, secret: {secretName: s}}\n  - {name: h, hostPath: {path: /x, type: Pipe}}\n  containers:\n  - name: c\n    image: i\n    volumeMounts:\n    - {name: data, mountPath: /d}\n    - {name: nope, mountPath: /d}\n    - {name: data, mountPath: '', subPath: ../x}\n",
    );
    assert_eq!(e.len(), 9, "{e:?}");
    assert_eq!(e[0], "spec.volumes[1].name: Duplicate value: \"data\"");
    assert_eq!(e[1], "spec.volumes[1].hostPath.path: Required value");
    assert!(
        e[2].starts_with("spec.volumes[2].name: Invalid value: \"Two\""),
        "{e:?}"
    );
    assert_eq!(
        e[3..],
        [
            "spec.volumes[2].secret: Forbidden: may not specify more than 1 volume type",
            "spec.volumes[3].hostPath.type: Unsupported value: \"Pipe\": supported values: \"\", \"DirectoryOrCreate\", \"Directory\", \"FileOrCreate\", \"File\", \"Socket\", \"CharDevice\", \"BlockDevice\"",
            "spec.containers[0].volumeMounts[1].name: Not found: \"nope\"",
            "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/d\": must be unique",
            "spec.containers[0].volumeMounts[2].mountPath: Required value",
            "spec.containers[0].volumeMounts[2].subPath: Invalid value: \"../x\": must not contain '..'",
        ]
    );
}

#[test]
fn policies_and_env_names() {
    let e = with_spec(
        "  restartPolicy: Sometimes\n  dnsPolicy: Google\n  containers:\n  - name: c\n    image: i\n    imagePullPolicy: Maybe\n    env: [{name: 'A=B', value: x}, {name: ''}, {name: V, value: x, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]\n",
    );
    assert_eq!(
        e,
        [
            "spec.containers[0].imagePullPolicy: Unsupported value: \"Maybe\": supported values: \"Always\", \"IfNotPresent\", \"Never\"",
            "spec.containers[0].env[0].name: Invalid value: \"A=B\": a valid environment variable name must consist only of printable ASCII characters other than '='",
            "spec.containers[0].env[1].name: Required value",
            "spec.containers[0].env[2].valueFrom: Invalid value: \"\": may not be specified when `value` is not empty",
            "spec.restartPolicy: Unsupported value: \"Sometimes\": supported values: \"Always\", \"OnFailure\", \"Never\"",
            "spec.dnsPolicy: Unsupported value: \"Google\": supported values: \"ClusterFirstWithHostNet\", \"ClusterFirst\", \"Default\", \"None\"",
        ]
    );
    assert_eq!(
        with_spec("  dnsPolicy: None\n  containers: [{name: c, image: i}]\n"),
        ["spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None"]
    );
}

#[test]
fn every_pod_of_the_defaulting_table_is_valid() {
    // Pods an apiserver accepted (tests/fixtures/pod_defaults.json).
    let table: Vec<serde_json::Value> =
        serde_json::from_str(include_str!("../../../../tests/fixtures/pod_defaults.json"))
            .expect("table");
    assert!(table.len() > 3);
    for case in table {
        let p: Pod = serde_json::from_value(case["pod"].clone()).expect("pod");
        let errs: Vec<String> = validate_static_pod(&p, "node-1")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(errs, Vec::<String>::new(), "{}", case["name"]);
    }
}

#[test]
fn the_static_pod_shapes_of_the_integration_suite_are_valid() {
    // tests/harness.rs `pod_yaml` and the inline manifests of tests/static_pods.rs.
    let pod_yaml = |name: &str, image: &str, script: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  restartPolicy: Always\n  terminationGracePeriodSeconds: 2\n  containers:\n  - name: c\n    image: {image}\n    command: [\"sh\", \"-c\", {script:?}]\n"
        )
    };
    let busybox = "localhost:5000/busybox:1.35";
    for m in [
        pod_yaml("web", busybox, "echo hello; sleep 3600"),
        pod_yaml("bad", "localhost:5000/does-not-exist:1", "true"),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: init}}\nspec:\n  terminationGracePeriodSeconds: 2\n  initContainers:\n  - {{name: first, image: {busybox}, command: [sh, -c, 'sleep 1']}}\n  - {{name: second, image: {busybox}, command: [sh, -c, 'sleep 1']}}\n  containers:\n  - {{name: c, image: {busybox}, command: [sh, -c, 'sleep 3600']}}\n"
        ),
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: hn}}\nspec:\n  hostNetwork: true\n  hostPID: true\n  hostIPC: true\n  terminationGracePeriodSeconds: 2\n  containers:\n  - {{name: c, image: {busybox}, command: [sleep, '3600']}}\n"
        ),
    ] {
        let e: Vec<String> = validate_static_pod(&pod(&m), "it-0a1b2c3d")
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(e, Vec::<String>::new(), "{m}");
    }
}

/// Upstream's defaulters fill `""` as they fill an absent field, so these
/// shapes run on an upstream node and must not be refused here.
#[test]
fn empty_strings_upstream_defaults_and_other_shapes_upstream_accepts() {
    let spec = r#"  restartPolicy: ""
  dnsPolicy: ""
  terminationGracePeriodSeconds: -1
  volumes:
  - {name: pd, photonPersistentDisk: {pdID: p1}}
  containers:
  - name: c
    image: i
    imagePullPolicy: ""
    terminationMessagePolicy: ""
    terminationMessagePath: ""
    ports: [{containerPort: 80, protocol: ""}]
    livenessProbe: {httpGet: {port: 80, scheme: ""}}
    lifecycle: {preStop: {httpGet: {port: 80, scheme: ""}}}
"#;
    assert_eq!(with_spec(spec), Vec::<String>::new());
    // Two volume sources are still refused, photonPersistentDisk counted.
    let two = "  volumes:\n  - {name: pd, emptyDir: {}, photonPersistentDisk: {pdID: p1}}\n  containers: [{name: c, image: i}]\n";
    assert_eq!(with_spec(two).len(), 1, "{:?}", with_spec(two));
}

/// Issue 28: an unmasked `/proc` only in the pod's own user namespace, as
/// the apiserver refuses it (a static pod has no apiserver to ask).
#[test]
fn an_unmasked_proc_needs_host_users_false() {
    let c = "  containers:\n  - name: c\n    image: i\n    securityContext: {procMount: PM}\n";
    assert_eq!(
        with_spec(&c.replace("PM", "Unmasked")),
        vec![
            "spec.containers[0].securityContext.procMount: Invalid value: \"Unmasked\": `hostUsers` must be false to use `Unmasked`"
        ]
    );
    assert!(
        with_spec(&format!(
            "  hostUsers: false\n{}",
            c.replace("PM", "Unmasked")
        ))
        .is_empty()
    );
    assert!(with_spec(&c.replace("PM", "Default")).is_empty());
    assert_eq!(
        with_spec(&c.replace("PM", "Open")),
        vec![
            "spec.containers[0].securityContext.procMount: Unsupported value: \"Open\": supported values: \"Default\", \"Unmasked\""
        ]
    );
}
