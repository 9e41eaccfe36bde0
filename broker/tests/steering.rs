//! SO_REUSEPORT steering on real loopback sockets.
//!
//! Each test binds a group of N UDP sockets to one 127.0.0.1 port (in core order), attaches a
//! steering mode, sends crafted datagrams from many client sockets (so from many source ports,
//! which the kernel's fallback hash would spread), and counts where they arrive.
//!
//! The eBPF tests need CAP_BPF (root), as the broker does for `--steering ebpf`.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use felix_broker::net::cid::{CoreCidGenerator, CID_LEN};
use felix_broker::net::steering::{
    attach, attach_with, AttachOptions, EffectiveSteering, SteeringError, SteeringMode,
};
use felix_proto::CoreId;
use quinn_proto::ConnectionIdGenerator;
use socket2::{Domain, Protocol, Socket, Type};

/// Datagrams per batch, each from its own client socket.
const BATCH: usize = 40;
/// How long a batch may take to arrive on loopback before the test gives up.
const RECEIVE_DEADLINE: Duration = Duration::from_secs(5);

struct Group {
    sockets: Vec<UdpSocket>,
    addr: SocketAddr,
}

impl Group {
    /// Binds `n` sockets to a port no other socket holds (two groups bound to port 0 with
    /// SO_REUSEPORT may be given the same port, and would then share each other's datagrams).
    fn bind(n: usize) -> Group {
        let mut sockets = Vec::new();
        let mut addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        addr.set_port(felix_broker::sys::socket::free_port(addr).unwrap());
        for _ in 0..n {
            let s = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
            s.set_reuse_port(true).unwrap();
            s.set_nonblocking(true).unwrap();
            s.bind(&addr.into()).unwrap();
            addr = s.local_addr().unwrap().as_socket().unwrap();
            sockets.push(UdpSocket::from(s));
        }
        Group { sockets, addr }
    }

    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        self.sockets.iter().map(|s| s.as_fd()).collect()
    }

    /// Sends each datagram from a fresh client socket, then returns how many arrived on each
    /// group socket (waiting until all have arrived or the deadline passed).
    fn send_and_count(&self, datagrams: &[Vec<u8>]) -> Vec<usize> {
        let clients: Vec<UdpSocket> = datagrams
            .iter()
            .map(|d| {
                let c = UdpSocket::bind("127.0.0.1:0").unwrap();
                c.send_to(d, self.addr).unwrap();
                c
            })
            .collect();
        let mut counts = vec![0usize; self.sockets.len()];
        let mut buf = [0u8; 2048];
        let deadline = Instant::now() + RECEIVE_DEADLINE;
        while counts.iter().sum::<usize>() < datagrams.len() && Instant::now() < deadline {
            let mut idle = true;
            for (i, s) in self.sockets.iter().enumerate() {
                while let Ok((len, from)) = s.recv_from(&mut buf) {
                    assert!(clients.iter().any(|c| c.local_addr().unwrap() == from));
                    assert!(datagrams.iter().any(|d| d[..] == buf[..len]));
                    counts[i] += 1;
                    idle = false;
                }
            }
            if idle {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        counts
    }
}

/// A short-header datagram whose DCID is a real CID of `core`.
fn short_header(core: u16, seq: usize) -> Vec<u8> {
    let mut generator = CoreCidGenerator::new(CoreId(core)).unwrap();
    let cid = generator.generate_cid();
    assert_eq!(cid.len(), CID_LEN);
    let mut d = vec![0x40 | (seq as u8 & 0x3f)];
    d.extend_from_slice(&cid);
    d.extend_from_slice(&(seq as u32).to_be_bytes());
    d.extend_from_slice(&[0x5a; 24]);
    d
}

/// A long-header datagram whose bytes 1 and 2 would name `core` if the header bit were ignored.
fn long_header(core: u8, seq: usize) -> Vec<u8> {
    let mut d = vec![0xc0, 0x00, core, 0x00, 0x01, CID_LEN as u8];
    d.extend_from_slice(&(seq as u64).to_be_bytes());
    d.extend_from_slice(&[0x00; 32]);
    d
}

/// A short-header datagram whose DCID names `core` but carries config bits 0b111.
fn foreign_config(core: u8, seq: usize) -> Vec<u8> {
    let mut d = vec![0x40, 0xe0 | (seq as u8 & 0x1f), core];
    d.extend_from_slice(&(seq as u64).to_be_bytes());
    d.extend_from_slice(&[0x11; 20]);
    d
}

/// Asserts that a batch of datagrams aimed at `core` lands only there.
fn assert_steered(group: &Group, core: usize) {
    let batch: Vec<_> = (0..BATCH).map(|i| short_header(core as u16, i)).collect();
    let counts = group.send_and_count(&batch);
    let mut want = vec![0; group.sockets.len()];
    want[core] = BATCH;
    assert_eq!(counts, want, "datagrams for core {core}");
}

/// Asserts that a batch arrives in full and is spread over more than one socket (the kernel's
/// hash decided, not the CID bytes; all 40 on one socket by hash has odds below 2^-39).
fn assert_hashed(group: &Group, batch: &[Vec<u8>], what: &str) {
    let counts = group.send_and_count(batch);
    assert_eq!(counts.iter().sum::<usize>(), batch.len(), "{what}: {counts:?}");
    assert!(counts.iter().filter(|&&c| c > 0).count() > 1, "{what}: all on one socket: {counts:?}");
}

fn check_steering(mode: SteeringMode, effective: EffectiveSteering, n: usize) {
    let group = Group::bind(n);
    let steering = attach(&group.fds(), mode).unwrap();
    assert_eq!(steering.effective(), effective);
    assert_eq!(steering.sockets(), n);
    for core in (0..n).rev() {
        assert_steered(&group, core);
    }
    // Datagrams the program must leave to the hash. Each would name core 0 if a check were
    // missing; a runt too short to hold a core byte would name socket 0 under classic BPF
    // without the length check.
    let long: Vec<_> = (0..BATCH).map(|i| long_header(0, i)).collect();
    assert_hashed(&group, &long, "long headers");
    let foreign: Vec<_> = (0..BATCH).map(|i| foreign_config(0, i)).collect();
    assert_hashed(&group, &foreign, "foreign config bits");
    let out_of_range: Vec<_> = (0..BATCH).map(|i| short_header(n as u16 + 1, i)).collect();
    assert_hashed(&group, &out_of_range, "core without a socket");
    let runts: Vec<_> = (0..BATCH).map(|_| vec![0x40, 0x00]).collect();
    assert_hashed(&group, &runts, "2-byte datagrams");
}

#[test]
fn ebpf_steers_two_cores() {
    check_steering(SteeringMode::Ebpf, EffectiveSteering::Ebpf, 2);
}

#[test]
fn ebpf_steers_four_cores() {
    check_steering(SteeringMode::Ebpf, EffectiveSteering::Ebpf, 4);
}

#[test]
fn cbpf_steers_two_cores() {
    check_steering(SteeringMode::Cbpf, EffectiveSteering::Cbpf, 2);
}

#[test]
fn cbpf_steers_four_cores() {
    check_steering(SteeringMode::Cbpf, EffectiveSteering::Cbpf, 4);
}

#[test]
fn auto_prefers_ebpf() {
    let group = Group::bind(2);
    let steering = attach(&group.fds(), SteeringMode::Auto).unwrap();
    assert_eq!(steering.effective(), EffectiveSteering::Ebpf);
    assert!(steering.ebpf_error().is_none());
    assert_steered(&group, 1);
}

#[test]
fn refused_ebpf_falls_back_to_cbpf() {
    let group = Group::bind(4);
    let options = AttachOptions { refuse_ebpf: true };
    let steering = attach_with(&group.fds(), SteeringMode::Auto, &options).unwrap();
    assert_eq!(steering.effective(), EffectiveSteering::Cbpf);
    assert!(steering.ebpf_error().is_some());
    for core in 0..4 {
        assert_steered(&group, core);
    }
}

#[test]
fn refused_explicit_ebpf_is_an_error() {
    let group = Group::bind(2);
    let options = AttachOptions { refuse_ebpf: true };
    let err = attach_with(&group.fds(), SteeringMode::Ebpf, &options).unwrap_err();
    assert!(matches!(err, SteeringError::Ebpf(_)), "{err}");
    // Nothing was attached: the hash still spreads datagrams aimed at one core.
    let batch: Vec<_> = (0..BATCH).map(|i| short_header(0, i)).collect();
    assert_hashed(&group, &batch, "no program");
}

#[test]
fn off_receives_everything() {
    let group = Group::bind(4);
    let steering = attach(&group.fds(), SteeringMode::Off).unwrap();
    assert_eq!(steering.effective(), EffectiveSteering::Off);
    let mut batch: Vec<_> = (0..BATCH).map(|i| short_header(2, i)).collect();
    batch.extend((0..BATCH).map(|i| long_header(2, i)));
    assert_hashed(&group, &batch, "steering off");
}

#[test]
fn rejects_empty_and_oversized_groups() {
    assert!(matches!(attach(&[], SteeringMode::Auto), Err(SteeringError::NoSockets)));
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let fds = vec![s.as_fd(); 256];
    assert!(matches!(
        attach(&fds, SteeringMode::Off),
        Err(SteeringError::TooManySockets { sockets: 256 })
    ));
}

#[test]
fn ebpf_on_a_socket_without_reuseport_is_an_error() {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let err = attach(&[s.as_fd()], SteeringMode::Ebpf).unwrap_err();
    assert!(matches!(err, SteeringError::Ebpf(_)), "{err}");
}

#[test]
fn verifier_log_is_captured() {
    use felix_broker::sys::bpf::{load_sk_reuseport, BpfError, Insn, Reg};
    // Reads r2, which is uninitialised on entry: the verifier must refuse and say why.
    let bad = [Insn::mov64_reg(Reg::R0, Reg::R2), Insn::exit()];
    match load_sk_reuseport(&bad, "felix_bad") {
        Err(BpfError::ProgLoad { errno, log }) => {
            assert_eq!(errno, libc::EACCES, "{log}");
            assert!(log.contains("R2"), "verifier log: {log}");
        }
        other => panic!("expected a verifier refusal, got {other:?}"),
    }
}
