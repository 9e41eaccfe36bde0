//! Test hosts for cluster tests: each broker in a network namespace of its own, joined to the
//! test (root namespace, where etcd and the clients run) by a veth pair on a bridge the harness
//! creates and removes, so every broker has its own address as on separate hosts. Where
//! namespaces cannot be made (no root, no `ip`), every host is 127.0.0.1 and the brokers use
//! distinct ports; the harness says which it used. Traffic never leaves these namespaces.
#![allow(dead_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};

use felix_proto::AckMode;
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

    /// Cuts host `i` off the other hosts and from TCP port `etcd_port` (etcd) with nftables
    /// rules in its namespace, leaving it reachable by the test's clients: a broker that
    /// loses its lease and its followers while its clients still reach it. No-op on loopback
    /// or without `nft` (returns false).
    pub fn isolate(&self, i: usize, etcd_port: u16) -> bool {
        let Some(ns) = self.namespaces.get(i) else { return false };
        let others: Vec<String> =
            (0..self.count).filter(|j| *j != i).map(|j| self.ip(j).to_string()).collect();
        let others = others.join(", ");
        let rules = format!(
            "table inet fxisolate {{\n\
             chain out {{ type filter hook output priority 0; policy accept;\n\
               ip daddr {{ {others} }} drop\n\
               tcp dport {etcd_port} drop\n\
             }}\n\
             chain in {{ type filter hook input priority 0; policy accept;\n\
               ip saddr {{ {others} }} drop\n\
               tcp sport {etcd_port} drop\n\
             }}\n\
             }}\n"
        );
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn();
        let Ok(mut child) = child else { return false };
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            let _ = stdin.write_all(rules.as_bytes());
        }
        child.wait().is_ok_and(|s| s.success())
    }

    /// Removes [`Hosts::isolate`]'s rules from host `i`.
    pub fn unisolate(&self, i: usize) -> bool {
        match self.namespaces.get(i) {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "nft", "delete", "table", "inet", "fxisolate"])
                .status()
                .is_ok_and(|s| s.success()),
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

/// The lease TTL test brokers run with, in seconds.
pub const TTL_S: u64 = 2;

/// One broker process.
pub struct Node {
    pub id: String,
    command: Box<dyn Fn() -> Command>,
    pub addr: std::net::SocketAddr,
    pub dir: std::path::PathBuf,
    child: Option<Child>,
    etcd: String,
    metrics: String,
    /// More `felix serve` arguments.
    pub extra: Vec<String>,
}

impl Node {
    pub fn start(
        hosts: &std::rc::Rc<Hosts>,
        host: usize,
        id: &str,
        root: &std::path::Path,
        etcd: &str,
    ) -> Node {
        // These brokers keep unreplicated streams (the cluster's placement and routing);
        // replicated ones are broker/tests/replication.rs's.
        Node::start_with(hosts, host, id, root, etcd, &["--default-replicas", "1"])
    }

    /// [`Node::start`] with more `felix serve` arguments.
    pub fn start_with(
        hosts: &std::rc::Rc<Hosts>,
        host: usize,
        id: &str,
        root: &std::path::Path,
        etcd: &str,
        extra: &[&str],
    ) -> Node {
        let metrics = match hosts.isolated() {
            true => std::net::SocketAddr::new(hosts.ip(host), 9400).to_string(),
            false => {
                let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().to_string()
            }
        };
        let h = hosts.clone();
        let mut node = Node {
            id: id.to_owned(),
            command: Box::new(move || h.command(host, env!("CARGO_BIN_EXE_felix"))),
            addr: hosts.broker_addr(host),
            dir: root.join(id),
            child: None,
            etcd: etcd.to_owned(),
            metrics,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        node.spawn();
        node
    }

    pub fn spawn(&mut self) {
        let mut cmd = (self.command)();
        for (k, _) in std::env::vars().filter(|(k, _)| k.starts_with("FELIX_") && k != "FELIX_LOG")
        {
            cmd.env_remove(k);
        }
        let addr = self.addr.to_string();
        cmd.args(["serve", "--listen", &addr, "--advertise", &addr, "--node-id", &self.id]);
        // One core unless the test asks for more (`extra`).
        if !self.extra.iter().any(|a| a == "--cores") {
            cmd.args(["--cores", "1"]);
        }
        cmd.args(["--no-pin", "--metrics", &self.metrics, "--min-free-bytes", "0"])
            .args(["--cluster-etcd", &self.etcd, "--lease-ttl-s", &TTL_S.to_string()])
            .arg("--allow-anonymous")
            .args(&self.extra)
            .arg("--data-dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(self.log());
        self.child = Some(cmd.spawn().expect("spawn felix"));
    }

    /// The broker's stderr goes to `<data dir>.log` (appended across restarts), shown when
    /// the test fails.
    fn log(&self) -> Stdio {
        let path = self.dir.with_extension("log");
        let f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
        Stdio::from(f)
    }

    /// GETs `path` from the broker's admin endpoint: the whole answer, head and body (empty
    /// if it cannot be read).
    pub fn get(&self, path: &str) -> String {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(&self.metrics) else { return String::new() };
        let _ = s.set_read_timeout(Some(std::time::Duration::from_secs(5)));
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.metrics);
        let mut page = String::new();
        if s.write_all(request.as_bytes()).is_err() || s.read_to_string(&mut page).is_err() {
            return String::new();
        }
        page
    }

    /// The sum of every sample of `metric` on its `/metrics` page (0 if it cannot be read).
    pub fn metric_sum(&self, metric: &str) -> f64 {
        let page = self.get("/metrics");
        page.lines()
            .filter(|l| l.split(['{', ' ']).next() == Some(metric))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    /// The broker's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` (a `kill -s` name: STOP, CONT) to the broker.
    pub fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let ok = Command::new("kill").args(["-s", signal, &pid.to_string()]).status();
            assert!(ok.is_ok_and(|s| s.success()), "kill -s {signal} {pid}");
        }
    }

    /// Waits up to `limit` for the broker to exit by itself (after SIGTERM); whether it did.
    pub fn wait_exit(&mut self, limit: std::time::Duration) -> bool {
        let Some(child) = self.child.as_mut() else { return true };
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                self.child = None;
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        false
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `felix cluster status --json` against the test's etcd.
pub fn status(etcd: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args(["cluster", "status", "--json", "--etcd", etcd])
        .env_remove("FELIX_CLUSTER_NAME")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status is JSON")
}

/// `felix cluster status --json --addr` through `node`'s admin endpoint (no etcd).
pub fn status_via(node: &Node) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args(["cluster", "status", "--json", "--addr", &node.metrics])
        .env_remove("FELIX_CLUSTER_ETCD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("status is JSON")
}

/// `felix cluster status --addr` (the table) through `node`'s admin endpoint.
pub fn status_text_via(node: &Node) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_felix"))
        .args(["cluster", "status", "--addr", &node.metrics])
        .env_remove("FELIX_CLUSTER_ETCD")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A client of the whole cluster through one seed, trusting every broker's certificate.
pub async fn cluster_client(
    nodes: &[Node],
    seed: usize,
    root: &std::path::Path,
) -> felix_client::Client {
    let bundle = root.join("ca-bundle.pem");
    let mut pem = String::new();
    for n in nodes {
        pem.push_str(&std::fs::read_to_string(n.dir.join("dev-cert.pem")).unwrap());
    }
    std::fs::write(&bundle, pem).unwrap();
    let config = felix_client::ClientConfig {
        addr: nodes[seed].addr.to_string(),
        trust: Some(felix_client::Trust::CaFile(bundle)),
        connect_timeout_ms: 2000,
        publish: felix_client::PublishSettings {
            ack_mode: AckMode::Durable,
            linger_us: 200,
            ..felix_client::PublishSettings::default()
        },
        ..felix_client::ClientConfig::default()
    };
    felix_client::Client::connect(config).await.expect("client connects through the seed")
}
