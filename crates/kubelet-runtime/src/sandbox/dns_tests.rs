//! Unit tests of sandbox DNS, hostname and sysctls against upstream's
//! `network/dns/dns_test.go`, `kubelet_pods_test.go`
//! (`GeneratePodHostNameAndDomain`) and `util_test.go`
//! (`GetNodenameForKernel`, `ConvertSysctlVariableToDotsSeparator`).

use super::*;

fn pod(json: serde_json::Value) -> Pod {
    serde_json::from_value(json).expect("pod")
}

fn cfg() -> RuntimeConfig {
    RuntimeConfig {
        cluster_dns: vec!["10.96.0.10".into()],
        cluster_domain: "cluster.local".into(),
        resolv_conf: "/etc/resolv.conf".into(),
        ..RuntimeConfig::default()
    }
}

fn host() -> HostDns {
    HostDns::parse("nameserver 192.168.1.1\nsearch corp.example\noptions rotate timeout:2\n")
}

fn spec(spec: serde_json::Value) -> Pod {
    let mut s = spec;
    s["containers"] = serde_json::json!([{"name": "c"}]);
    pod(serde_json::json!({"metadata": {"name": "web", "namespace": "ns1", "uid": "u"}, "spec": s}))
}

#[test]
fn each_dns_policy_with_and_without_host_network() {
    let cluster = |d: &pb::DnsConfig| d.servers == vec!["10.96.0.10"];
    let node = |d: &pb::DnsConfig| d.servers == vec!["192.168.1.1"];
    for (policy, host_net, want_cluster) in [
        ("ClusterFirst", false, true),
        ("ClusterFirst", true, false),
        ("ClusterFirstWithHostNet", true, true),
        ("ClusterFirstWithHostNet", false, true),
        ("Default", false, false),
        ("Default", true, false),
    ] {
        let p = spec(serde_json::json!({"dnsPolicy": policy, "hostNetwork": host_net}));
        let d = dns_config(&cfg(), &p, &host());
        if want_cluster {
            assert!(cluster(&d), "{policy} hostNetwork={host_net}: {d:?}");
            assert_eq!(
                d.searches,
                vec![
                    "ns1.svc.cluster.local",
                    "svc.cluster.local",
                    "cluster.local",
                    "corp.example"
                ]
            );
            assert_eq!(d.options, vec!["ndots:5"]);
        } else {
            assert!(node(&d), "{policy} hostNetwork={host_net}: {d:?}");
            assert_eq!(d.searches, vec!["corp.example"]);
            assert_eq!(d.options, vec!["rotate", "timeout:2"]);
        }
    }
    let p =
        spec(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"]}}));
    let d = dns_config(&cfg(), &p, &host());
    assert_eq!(d.servers, vec!["1.1.1.1"]);
    assert!(d.searches.is_empty() && d.options.is_empty());
}

#[test]
fn cluster_first_without_cluster_dns_falls_back_to_default() {
    let mut c = cfg();
    c.cluster_dns.clear();
    let p = spec(serde_json::json!({}));
    let (d, events) = pod_dns(&c, &p, &host());
    assert_eq!(d.servers, vec!["192.168.1.1"]);
    assert_eq!(
        events,
        vec![(
            "MissingClusterDNS",
            r#"pod: "web_ns1(u)". kubelet does not have ClusterDNS IP configured and cannot create Pod using "ClusterFirst" policy. Falling back to "Default" policy."#.to_string()
        )]
    );
}

#[test]
fn empty_resolv_conf_means_the_local_resolver() {
    let mut c = cfg();
    c.resolv_conf = String::new();
    let p = spec(serde_json::json!({"dnsPolicy": "Default"}));
    let d = dns_config(&c, &p, &HostDns::default());
    assert_eq!(d.servers, vec!["127.0.0.1"]);
    assert_eq!(d.searches, vec!["."]);
}

#[test]
fn dns_config_merges_without_duplicates_and_overrides_options() {
    let p = spec(serde_json::json!({"dnsConfig": {
        "nameservers": ["10.96.0.10", "8.8.8.8"],
        "searches": ["svc.cluster.local", "my.dns.search"],
        "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}}));
    let d = dns_config(&cfg(), &p, &HostDns::default());
    assert_eq!(d.servers, vec!["10.96.0.10", "8.8.8.8"]);
    assert_eq!(
        d.searches,
        vec![
            "ns1.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local",
            "my.dns.search"
        ]
    );
    assert_eq!(d.options, vec!["ndots:2", "edns0"]);
}

#[test]
fn limits_cut_with_dns_config_forming_messages() {
    let searches: Vec<String> = (0..40).map(|i| format!("s{i}.example")).collect();
    let p = spec(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {
        "nameservers": ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"], "searches": searches}}));
    let (d, warnings) = pod_dns(&cfg(), &p, &HostDns::default());
    assert_eq!(d.servers.len(), 3);
    assert_eq!(d.searches.len(), 32);
    assert_eq!(warnings[0].0, "DNSConfigForming");
    assert_eq!(
        warnings[0].1,
        "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 1.1.1.1 2.2.2.2 3.3.3.3"
    );
    assert!(warnings[1].1.starts_with(
        "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: s0.example s1.example"
    ));
    // 2048 characters in all; paths over 253 characters are dropped.
    let long: Vec<String> = (0..12).map(|i| format!("{i:0>200}")).collect();
    let mut all = long.clone();
    all.push("x".repeat(254));
    let p = spec(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"searches": all}}));
    let (d, warnings) = pod_dns(&cfg(), &p, &HostDns::default());
    assert_eq!(d.searches, long[..10].to_vec());
    assert_eq!(warnings.len(), 1);
    let p = spec(serde_json::json!({"dnsPolicy": "None", "dnsConfig": {"searches": ["a.b"]}}));
    assert!(pod_dns(&cfg(), &p, &HostDns::default()).1.is_empty());
}

#[test]
fn hostname_subdomain_and_fqdn() {
    let p = spec(serde_json::json!({"hostname": "h", "subdomain": "sd"}));
    assert_eq!(kernel_hostname(&cfg(), &p), Ok("h".to_string()));
    let p =
        spec(serde_json::json!({"hostname": "h", "subdomain": "sd", "setHostnameAsFQDN": true}));
    assert_eq!(
        kernel_hostname(&cfg(), &p),
        Ok("h.sd.ns1.svc.cluster.local".to_string())
    );
    assert_eq!(
        sandbox_config(&cfg(), &p, 0, &host()).hostname,
        "h.sd.ns1.svc.cluster.local"
    );
    // Without a subdomain there is no domain: the FQDN flag changes nothing.
    let p = spec(serde_json::json!({"setHostnameAsFQDN": true}));
    assert_eq!(kernel_hostname(&cfg(), &p), Ok("web".to_string()));
    let long = "a".repeat(40);
    let p =
        spec(serde_json::json!({"hostname": long, "subdomain": "sd", "setHostnameAsFQDN": true}));
    let err = kernel_hostname(&cfg(), &p).expect_err("too long");
    assert_eq!(
        err.to_string(),
        format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {long}.sd.ns1.svc.cluster.local is too long (64 characters is the max, 65 characters requested)"
        )
    );
    // Until the manager checks first, the runtime gets the FQDN and refuses it.
    assert_eq!(
        sandbox_config(&cfg(), &p, 0, &host()).hostname,
        format!("{long}.sd.ns1.svc.cluster.local")
    );
    // The pod name is cut to 63 characters, then trailing '-' and '.' go.
    let name = format!("{}-x", "b".repeat(62));
    let p = pod(
        serde_json::json!({"metadata": {"name": name, "uid": "u"}, "spec": {"containers": []}}),
    );
    assert_eq!(kernel_hostname(&cfg(), &p), Ok("b".repeat(62)));
}

#[test]
fn sysctls_use_dot_separators() {
    assert_eq!(
        dots_separator("kernel.shm_rmid_forced"),
        "kernel.shm_rmid_forced"
    );
    assert_eq!(
        dots_separator("kernel/shm_rmid_forced"),
        "kernel.shm_rmid_forced"
    );
    assert_eq!(
        dots_separator("net/ipv4/conf/eth0.100/forwarding"),
        "net.ipv4.conf.eth0/100.forwarding"
    );
    assert_eq!(
        dots_separator("net.ipv4.conf.eth0/100.forwarding"),
        "net.ipv4.conf.eth0/100.forwarding"
    );
    let p = spec(
        serde_json::json!({"securityContext": {"sysctls": [{"name": "kernel/shm_rmid_forced", "value": "1"}]}}),
    );
    let c = sandbox_config(&cfg(), &p, 0, &host());
    let sysctls = c.linux.map(|l| l.sysctls).unwrap_or_default();
    assert_eq!(
        sysctls.get("kernel.shm_rmid_forced").map(String::as_str),
        Some("1")
    );
}

#[test]
fn host_resolv_conf_parses_as_upstream() {
    let h = HostDns::parse(
        "# comment\nnameserver 1.1.1.1\nnameserver 2.2.2.2 3.3.3.3\ndomain ignored.example\nsearch old.example\nsearch a.example. . b.example\noptions ndots:1\noptions rotate\n",
    );
    assert_eq!(h.servers, vec!["1.1.1.1", "2.2.2.2"]);
    assert_eq!(h.searches, vec!["a.example", "b.example"]);
    assert_eq!(h.options, vec!["rotate"]);
}
