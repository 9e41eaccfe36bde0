//! Test support: an etcd server of a test's own, started from Debian's `etcd` binary on
//! loopback ports with a temporary data directory, killed and removed on drop. Used by this
//! crate's tests and the broker's cluster tests; never by a broker.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How many times a start is tried (fresh ports and data directory each time) before a test
/// fails: tests run in parallel, and a port another test's etcd took between our probe and
/// its bind makes etcd exit at once.
const START_TRIES: u32 = 5;
/// How long one start may take before it is given up (etcd answers in well under a second on
/// an idle machine; CI machines are loaded).
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// An etcd server of the test's own.
pub struct Etcd {
    child: Option<Child>,
    /// The client URL (`http://127.0.0.1:port`).
    pub client_url: String,
    peer_url: String,
    dir: tempfile::TempDir,
}

/// A fresh data directory, in memory (`/dev/shm`) where the machine has one: etcd fsyncs
/// every write, and on a loaded shared disk that stalled lease expiry for seconds, which the
/// tests' timing bounds (a lease TTL plus a margin) are not about. A killed etcd restarts from
/// it all the same (the data outlives the process).
fn data_dir() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::Builder::new().prefix("felix-etcd").tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    dir.expect("a temporary directory for etcd")
}

/// Whether an etcd on `addr` answers its health check (a listening socket alone is not
/// enough: it could be anything).
fn healthy(addr: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(addr) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let request = format!("GET /health HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut answer = String::new();
    s.write_all(request.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.contains("\"health\":\"true\"")
}

/// Two distinct free ports (both held while the second is chosen).
fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    let b = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a probe port");
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
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
        let mut failures = Vec::new();
        for _ in 0..START_TRIES {
            let (client, peer) = free_ports();
            let mut etcd = Etcd {
                child: None,
                client_url: format!("http://{ip}:{client}"),
                peer_url: format!("http://{ip}:{peer}"),
                dir: data_dir(),
            };
            match etcd.try_spawn() {
                Ok(()) => return Some(etcd),
                Err(why) => {
                    eprintln!("etcd on {ip}:{client} did not start, trying other ports: {why}");
                    failures.push(why);
                }
            }
        }
        panic!("etcd did not start in {START_TRIES} tries:\n{}", failures.join("\n---\n"));
    }

    /// Starts (or restarts, after [`Etcd::kill`]) the server on its ports and data directory.
    /// A restart keeps its ports (clients hold its URL), so it is retried on them.
    pub fn spawn(&mut self) {
        let mut failures = Vec::new();
        for _ in 0..START_TRIES {
            match self.try_spawn() {
                Ok(()) => return,
                Err(why) => failures.push(why),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        panic!(
            "etcd did not restart on {} in {START_TRIES} tries:\n{}",
            self.client_url,
            failures.join("\n---\n")
        );
    }

    /// One start: `Err` with etcd's log when it exits or does not answer in time.
    fn try_spawn(&mut self) -> Result<(), String> {
        let log = std::fs::File::create(self.log_path()).map_err(|e| format!("etcd.log: {e}"))?;
        let mut child = Command::new("etcd")
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("etcd"))
            .args(["--listen-client-urls", &self.client_url])
            .args(["--advertise-client-urls", &self.client_url])
            .args(["--listen-peer-urls", &self.peer_url])
            .args(["--initial-advertise-peer-urls", &self.peer_url])
            .args(["--initial-cluster", &format!("t={}", self.peer_url)])
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("spawn etcd: {e}"))?;
        let addr = self.client_url.trim_start_matches("http://").to_owned();
        let deadline = Instant::now() + START_TIMEOUT;
        // Ours answers: another test's etcd on a port we lost would answer too, so the
        // child must be alive and its own log must say it serves this address.
        let serving = format!("serving insecure client requests on {addr}");
        loop {
            let exited = child.try_wait();
            if matches!(exited, Ok(None)) && healthy(&addr) && self.log().contains(&serving) {
                self.child = Some(child);
                return Ok(());
            }
            if let Ok(Some(status)) = exited {
                return Err(format!("etcd exited ({status}); its log ends:\n{}", self.log_tail()));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "etcd did not answer on {addr} within {START_TIMEOUT:?}; its log ends:\n{}",
                    self.log_tail()
                ));
            }
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

    /// What etcd wrote to stderr so far (for failing tests).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn log_path(&self) -> std::path::PathBuf {
        self.dir.path().join("etcd.log")
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_on_a_taken_port_fails_with_etcds_own_words() {
        let Some(mut etcd) = Etcd::start() else { return };
        etcd.kill();
        // Someone else takes the client port while etcd is down.
        let addr = etcd.client_url.trim_start_matches("http://").to_owned();
        let _squatter = std::net::TcpListener::bind(&addr).expect("the port is free again");
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| etcd.spawn()))
            .expect_err("etcd cannot listen on a taken port");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("did not restart"), "{msg}");
        assert!(msg.contains("address already in use"), "etcd's log is in the message: {msg}");
    }

    #[test]
    fn another_etcd_answering_on_our_port_is_not_taken_for_ours() {
        let Some(other) = Etcd::start() else { return };
        let Some(mut etcd) = Etcd::start() else { return };
        etcd.kill();
        // Our port is now the other server's: it answers health checks there, ours cannot bind.
        etcd.client_url = other.client_url.clone();
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| etcd.spawn()))
            .expect_err("our etcd cannot listen where another one does");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("did not restart"), "{msg}");
    }
}
