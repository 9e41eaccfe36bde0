//! Test hosts for cluster tests: each broker in a network namespace of its own, joined to the
//! test (root namespace, where etcd and the clients run) by a veth pair on a bridge the harness
//! creates and removes, so every broker has its own address as on separate hosts. Where
//! namespaces cannot be made (no root, no `ip`), every host is 127.0.0.1 and the brokers use
//! distinct ports; the harness says which it used. Traffic never leaves these namespaces.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};

/// Subnets handed out in this process: 10.213.<n>.0/24.
static NEXT_SUBNET: AtomicU8 = AtomicU8::new(0);

/// A set of test hosts.
pub struct Hosts {
    /// Namespace names, one per host (empty in loopback mode).
    namespaces: Vec<String>,
    bridge: Option<String>,
    subnet: u8,
    count: usize,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Hosts {
    /// `count` hosts in namespaces, or on loopback where namespaces cannot be made.
    pub fn new(count: usize) -> Hosts {
        let subnet = (std::process::id() as u8)
            .wrapping_mul(7)
            .wrapping_add(NEXT_SUBNET.fetch_add(1, Ordering::Relaxed));
        let tag = format!("{}{}", std::process::id() % 100_000, subnet);
        let bridge = format!("fxb{tag}");
        let mut hosts = Hosts { namespaces: Vec::new(), bridge: None, subnet, count };
        if std::env::var_os("FELIX_TEST_NO_NETNS").is_some()
            || !ip(&["link", "add", &bridge, "type", "bridge"])
        {
            eprintln!("cluster hosts: network namespaces unavailable; {count} hosts on 127.0.0.1 with distinct ports");
            return hosts;
        }
        hosts.bridge = Some(bridge.clone());
        let gw = format!("10.213.{subnet}.1/24");
        let ok = ip(&["addr", "add", &gw, "dev", &bridge]) && ip(&["link", "set", &bridge, "up"]);
        assert!(ok, "cannot configure bridge {bridge}");
        for i in 0..count {
            let ns = format!("fx{tag}h{i}");
            let (host_end, ns_end) = (format!("fxv{tag}{i}"), format!("fxp{tag}{i}"));
            let addr = format!("10.213.{subnet}.{}/24", 10 + i);
            let steps: [&[&str]; 8] = [
                &["netns", "add", &ns],
                &["link", "add", &host_end, "type", "veth", "peer", "name", &ns_end],
                &["link", "set", &host_end, "master", &bridge],
                &["link", "set", &host_end, "up"],
                &["link", "set", &ns_end, "netns", &ns],
                &["-n", &ns, "addr", "add", &addr, "dev", &ns_end],
                &["-n", &ns, "link", "set", &ns_end, "up"],
                &["-n", &ns, "link", "set", "lo", "up"],
            ];
            hosts.namespaces.push(ns.clone());
            for step in steps {
                assert!(ip(step), "ip {step:?} failed");
            }
        }
        eprintln!(
            "cluster hosts: {count} network namespaces on bridge {bridge} (10.213.{subnet}.0/24)"
        );
        hosts
    }

    /// Whether the hosts are namespaces (else loopback).
    pub fn isolated(&self) -> bool {
        self.bridge.is_some()
    }

    /// The address of host `i`.
    pub fn ip(&self, i: usize) -> IpAddr {
        match self.bridge {
            Some(_) => IpAddr::V4(Ipv4Addr::new(10, 213, self.subnet, 10 + i as u8)),
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// Where services of the test itself (etcd) listen so that every host reaches them.
    pub fn test_ip(&self) -> IpAddr {
        match self.bridge {
            Some(_) => IpAddr::V4(Ipv4Addr::new(10, 213, self.subnet, 1)),
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
        }
    }

    /// A free UDP port for a broker on host `i` (any port works inside a namespace).
    pub fn broker_addr(&self, i: usize) -> SocketAddr {
        let port = match self.bridge {
            Some(_) => 7400,
            None => std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(),
        };
        SocketAddr::new(self.ip(i), port)
    }

    /// A command that runs `program` on host `i`.
    pub fn command(&self, i: usize, program: &str) -> Command {
        match self.namespaces.get(i) {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    /// Cuts host `i` off the network (its link goes down). No-op on loopback (returns false).
    pub fn cut(&self, i: usize) -> bool {
        match self.namespaces.get(i) {
            Some(ns) => ip(&["-n", ns, "link", "set", &self.ns_end(i), "down"]),
            None => false,
        }
    }

    /// Reconnects host `i`.
    pub fn heal(&self, i: usize) -> bool {
        match self.namespaces.get(i) {
            Some(ns) => ip(&["-n", ns, "link", "set", &self.ns_end(i), "up"]),
            None => false,
        }
    }

    fn ns_end(&self, i: usize) -> String {
        let tag =
            self.bridge.as_ref().map_or(String::new(), |b| b.trim_start_matches("fxb").to_owned());
        format!("fxp{tag}{i}")
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            // Deleting the namespace deletes its veth end and so the pair.
            ip(&["netns", "del", ns]);
        }
        if let Some(b) = &self.bridge {
            ip(&["link", "del", b]);
        }
        let _ = self.count;
    }
}
