//! Test support: an etcd server of a test's own, started from Debian's `etcd` binary on
//! loopback ports with a temporary data directory, killed and removed on drop. Used by this
//! crate's tests and the broker's cluster tests; never by a broker.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// An etcd server of the test's own.
pub struct Etcd {
    child: Option<Child>,
    /// The client URL (`http://127.0.0.1:port`).
    pub client_url: String,
    peer_url: String,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Etcd {
    /// Starts etcd, or returns `None` (with a message) where it is not installed and this is
    /// not CI. CI installs it (`.ci/run`), so there a missing etcd fails the test.
    pub fn start() -> Option<Etcd> {
        Self::start_on("127.0.0.1")
    }

    /// [`Etcd::start`] on the address `ip` (for test hosts in network namespaces).
    pub fn start_on(ip: &str) -> Option<Etcd> {
        if Command::new("etcd").arg("--version").output().is_err() {
            assert!(
                std::env::var_os("CI").is_none(),
                "etcd is not installed (apt-get install etcd-server)"
            );
            eprintln!("SKIPPED: etcd is not installed (apt-get install etcd-server)");
            return None;
        }
        let mut etcd = Etcd {
            child: None,
            client_url: format!("http://{ip}:{}", free_port()),
            peer_url: format!("http://{ip}:{}", free_port()),
            dir: tempfile::tempdir().unwrap(),
        };
        etcd.spawn();
        Some(etcd)
    }

    /// Starts (or restarts) the server on its ports and data directory.
    pub fn spawn(&mut self) {
        let child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("etcd"))
            .args(["--listen-client-urls", &self.client_url])
            .args(["--advertise-client-urls", &self.client_url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &format!("t={}", self.peer_url)])
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join("etcd.log"))
                    .map_or(Stdio::null(), Stdio::from),
            )
            .spawn()
            .expect("spawn etcd");
        self.child = Some(child);
        let addr = self.client_url.trim_start_matches("http://").to_owned();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Kills the server (its data directory stays for a restart).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Etcd {
    /// What etcd wrote to stderr so far (for failing tests).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
