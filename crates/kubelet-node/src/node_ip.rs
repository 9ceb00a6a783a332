//! The node's IP addresses (upstream `nodeutil.GetNodeHostIPs` and the
//! kubelet's node address setter): `--node-ip` when given, else one address
//! (IPv4 preferred) of the interface that holds the default route, else the
//! first non-loopback address. Read from the kernel; nothing is sent anywhere.

use std::net::IpAddr;

/// The default-route interface from `/proc/net/route` text.
fn default_route_interface(route_table: &str) -> Option<String> {
    route_table.lines().skip(1).find_map(|l| {
        let mut f = l.split_whitespace();
        let iface = f.next()?;
        let dest = f.next()?;
        (dest == "00000000").then(|| iface.to_string())
    })
}

/// Picks node IPs from (interface, address) pairs.
fn pick(addrs: &[(String, IpAddr)], default_iface: Option<&str>) -> Vec<IpAddr> {
    let usable = |ip: &IpAddr| !ip.is_loopback() && !ip.is_unspecified() && !is_link_local(ip);
    if let Some(iface) = default_iface {
        let on_default: Vec<IpAddr> = addrs
            .iter()
            .filter(|(i, ip)| i == iface && usable(ip))
            .map(|(_, ip)| *ip)
            .collect();
        if !on_default.is_empty() {
            return on_default;
        }
    }
    addrs
        .iter()
        .map(|(_, ip)| *ip)
        .find(usable)
        .into_iter()
        .collect()
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The node IPs: `configured` when not empty, else detected.
pub fn node_ips(configured: &[IpAddr]) -> Vec<IpAddr> {
    if !configured.is_empty() {
        return configured.to_vec();
    }
    let iface = std::fs::read_to_string("/proc/net/route")
        .ok()
        .and_then(|t| default_route_interface(&t));
    let addrs: Vec<(String, IpAddr)> = match nix::ifaddrs::getifaddrs() {
        Ok(list) => list
            .filter_map(|a| {
                let sa = a.address?;
                let ip = if let Some(v4) = sa.as_sockaddr_in() {
                    IpAddr::V4(v4.ip())
                } else {
                    IpAddr::V6(sa.as_sockaddr_in6()?.ip())
                };
                Some((a.interface_name, ip))
            })
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "Cannot list network interfaces; node IP unknown (set --node-ip)");
            vec![]
        }
    };
    // Upstream detects one address (ResolveBindAddress), IPv4 first; dual-stack
    // nodes name both families with --node-ip.
    let mut ips = pick(&addrs, iface.as_deref());
    ips.sort_by_key(|ip| ip.is_ipv6());
    ips.truncate(1);
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: &str = "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n\
        kubeletrs0\t0000580A\t00000000\t0001\t0\t0\t0\t0000FFFF\n\
        eth0\t00000000\t0102A8C0\t0003\t0\t0\t0\t00000000\n";

    #[test]
    fn default_route_interface_wins() {
        assert_eq!(default_route_interface(ROUTES).as_deref(), Some("eth0"));
        let addrs = vec![
            ("lo".to_string(), "127.0.0.1".parse().expect("ip")),
            ("kubeletrs0".to_string(), "10.88.0.1".parse().expect("ip")),
            ("eth0".to_string(), "192.168.2.7".parse().expect("ip")),
            ("eth0".to_string(), "fe80::1".parse().expect("ip")),
        ];
        assert_eq!(
            pick(&addrs, Some("eth0")),
            vec!["192.168.2.7".parse::<IpAddr>().expect("ip")]
        );
        // No default route: the first usable address.
        assert_eq!(
            pick(&addrs, None),
            vec!["10.88.0.1".parse::<IpAddr>().expect("ip")]
        );
        assert!(pick(&addrs[..1], None).is_empty());
    }

    #[test]
    fn configured_ips_are_used_as_given() {
        let ip: IpAddr = "10.0.0.9".parse().expect("ip");
        assert_eq!(node_ips(&[ip]), vec![ip]);
    }
}
