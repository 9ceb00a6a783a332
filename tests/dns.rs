//! Upstream `test/e2e/network/dns.go` checks that need no DNS server
//! ("should support configurable pod DNS nameservers", `/etc/resolv.conf` per
//! `dnsPolicy`) and `test/e2e/common/node/pod_hostnameasfqdn.go` ("Hostname of
//! Pod [NodeConformance]"), on real containerd.

use std::time::Duration;

use cri::RuntimeService;
use kubelet_rs_integration::*;

const T: Duration = Duration::from_secs(90);

async fn exec(node: &Node, pod: &str, script: &str) -> anyhow::Result<String> {
    let s = node.status(pod).ctx("status")?;
    let id = container_id(&s, "c").ctx("container id")?;
    let out = node
        .runtime
        .exec_sync(
            id.trim_start_matches("containerd://"),
            vec!["sh".into(), "-c".into(), script.into()],
            Duration::from_secs(10),
        )
        .await?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn sleeper(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  terminationGracePeriodSeconds: 1\n{spec}  containers:\n  - name: c\n    image: {BUSYBOX}\n    command: [sleep, '3600']\n"
    )
}

fn lines(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_policies_and_pod_hostnames() -> anyhow::Result<()> {
    let node = Node::start(|f| {
        f.cluster_dns = Some("10.96.0.10".into());
        f.cluster_domain = Some("cluster.local".into());
    })
    .await;
    let pods = [
        ("cf", String::new()),
        (
            "none",
            "  dnsPolicy: None\n  dnsConfig: {nameservers: [1.1.1.1], searches: [resolv.conf.local], options: [{name: ndots, value: '2'}, {name: edns0}]}\n".to_string(),
        ),
        (
            "merged",
            "  dnsConfig: {nameservers: [10.0.0.53], searches: [my.dns.search.list], options: [{name: ndots, value: '3'}]}\n".to_string(),
        ),
        ("plain", "  setHostnameAsFQDN: true\n".to_string()),
        ("short", "  hostname: h\n  subdomain: t\n".to_string()),
        (
            "fqdn",
            "  hostname: h\n  subdomain: t\n  setHostnameAsFQDN: true\n".to_string(),
        ),
    ];
    for (name, spec) in &pods {
        node.write_manifest(&format!("{name}.yaml"), &sleeper(name, spec));
    }
    for (name, _) in &pods {
        node.wait_status(name, T, "running", |s| is_running(s, "c"))
            .await?;
    }
    let ns = "default";

    // ClusterFirst: cluster DNS, the cluster search paths, ndots:5.
    let rc = exec(&node, "cf", "cat /etc/resolv.conf").await?;
    assert_eq!(lines(&rc, "nameserver"), vec!["nameserver 10.96.0.10"]);
    let search = lines(&rc, "search");
    assert!(
        search.first().is_some_and(|s| s.starts_with(&format!(
            "search {ns}.svc.cluster.local svc.cluster.local cluster.local"
        ))),
        "{rc}"
    );
    assert_eq!(lines(&rc, "options"), vec!["options ndots:5"]);

    // "should support configurable pod DNS nameservers": dnsPolicy None.
    let rc = exec(&node, "none", "cat /etc/resolv.conf").await?;
    assert_eq!(lines(&rc, "nameserver"), vec!["nameserver 1.1.1.1"]);
    assert_eq!(lines(&rc, "search"), vec!["search resolv.conf.local"]);
    assert_eq!(lines(&rc, "options"), vec!["options ndots:2 edns0"]);

    // ClusterFirst with a dnsConfig: appended, ndots overridden.
    let rc = exec(&node, "merged", "cat /etc/resolv.conf").await?;
    assert_eq!(
        lines(&rc, "nameserver"),
        vec!["nameserver 10.96.0.10", "nameserver 10.0.0.53"]
    );
    assert!(
        lines(&rc, "search")
            .first()
            .is_some_and(|s| s.ends_with(" my.dns.search.list")),
        "{rc}"
    );
    assert_eq!(lines(&rc, "options"), vec!["options ndots:3"]);

    // "a pod without FQDN is not affected by SetHostnameAsFQDN field".
    let plain = node.pod_name("plain");
    assert_eq!(exec(&node, "plain", "hostname").await?, plain);
    // "a pod with subdomain field has FQDN, hostname is shortname".
    assert_eq!(exec(&node, "short", "hostname").await?, "h");
    // "a pod with subdomain field has FQDN, when setHostnameAsFQDN is set to
    // true, the FQDN is set as hostname".
    let fqdn = format!("h.t.{ns}.svc.cluster.local");
    assert_eq!(exec(&node, "fqdn", "hostname").await?, fqdn);
    assert_eq!(exec(&node, "fqdn", "cat /etc/hostname").await?, fqdn);
    node.cleanup().await;
    Ok(())
}
