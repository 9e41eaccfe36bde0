//! Raw-fd plumbing between socket2, quinn-udp and glommio.
//!
//! Every core owns one UDP socket of a SO_REUSEPORT group. The socket is created and bound here,
//! on the main thread, in core order (so the kernel's group index, which classic BPF steering
//! returns, equals the core index). The driver then needs the same socket twice:
//! - as a plain non-blocking socket that `quinn_udp::UdpSocketState` drains with `recvmmsg`
//!   (GRO) and writes with `sendmsg` (GSO);
//! - as a `glommio::net::UdpSocket` on a `dup`ed descriptor, whose `peek_from` (io_uring
//!   `recvmsg` with `MSG_PEEK`) is the readiness signal.
//!
//! Both descriptors share one open file description, so the non-blocking flag and the receive
//! queue are shared.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};

use socket2::{Domain, Protocol, Socket, Type};

/// Socket buffer size asked for on every core socket (the kernel caps it at `rmem_max`).
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

/// Creates `count` non-blocking UDP sockets with SO_REUSEPORT, all bound to `addr`, in order.
///
/// When `addr` has port 0, a port no socket uses is taken first (see [`free_port`]) and the
/// group binds to it: a SO_REUSEPORT socket bound to port 0 may be given the port of another
/// group of the same user, and the two would then share datagrams.
pub fn bind_reuseport_group(addr: SocketAddr, count: usize) -> io::Result<Vec<Socket>> {
    let mut sockets = Vec::with_capacity(count);
    let mut bind_addr = addr;
    if addr.port() == 0 {
        bind_addr.set_port(free_port(addr)?);
    }
    for _ in 0..count {
        let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            socket.set_only_v6(false).ok();
        }
        socket.set_reuse_port(true)?;
        socket.set_nonblocking(true)?;
        // Best effort: a smaller buffer only costs drops under bursts, which QUIC recovers.
        socket.set_recv_buffer_size(SOCKET_BUFFER_BYTES).ok();
        socket.set_send_buffer_size(SOCKET_BUFFER_BYTES).ok();
        socket.bind(&bind_addr.into())?;
        sockets.push(socket);
    }
    Ok(sockets)
}

/// A UDP port on `addr`'s address that no socket is bound to now: bound without
/// SO_REUSEPORT (which the kernel never gives a port in use), read back, and released.
pub fn free_port(addr: SocketAddr) -> io::Result<u16> {
    let probe = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    if addr.is_ipv6() {
        probe.set_only_v6(false).ok();
    }
    let mut any = addr;
    any.set_port(0);
    probe.bind(&any.into())?;
    let local =
        probe.local_addr()?.as_socket().ok_or_else(|| io::Error::other("no inet address"))?;
    Ok(local.port())
}

/// Duplicates `socket`'s descriptor and wraps the copy as a glommio socket, used only to await
/// readability. Must be called on a glommio executor thread.
pub fn glommio_readiness_socket(socket: &Socket) -> io::Result<glommio::net::UdpSocket> {
    let dup: OwnedFd = socket.as_fd_dup()?;
    let raw = dup.into_raw_fd();
    // SAFETY: `raw` is a freshly duplicated, open UDP socket descriptor that nothing else owns
    // (`into_raw_fd` released it from the `OwnedFd`); glommio's socket takes ownership and
    // closes it on drop.
    Ok(unsafe { glommio::net::UdpSocket::from_raw_fd(raw) })
}

/// `dup(2)` for a socket2 socket, returning an owned descriptor.
trait AsFdDup {
    fn as_fd_dup(&self) -> io::Result<OwnedFd>;
}

impl AsFdDup for Socket {
    fn as_fd_dup(&self) -> io::Result<OwnedFd> {
        // SAFETY: `dup` on a descriptor we hold open has no memory-safety preconditions.
        let fd = unsafe { libc::dup(self.as_raw_fd()) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by a successful `dup`, so it is open and owned by us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Thread CPU time (user + system) of the calling thread, in microseconds.
pub fn thread_cpu_time_us() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is always supported
    // on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    (ts.tv_sec as u64) * 1_000_000 + (ts.tv_nsec as u64) / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_shares_one_port() {
        let sockets = bind_reuseport_group("127.0.0.1:0".parse().unwrap(), 3).unwrap();
        let ports: Vec<u16> =
            sockets.iter().map(|s| s.local_addr().unwrap().as_socket().unwrap().port()).collect();
        assert_ne!(ports[0], 0);
        assert!(ports.iter().all(|p| *p == ports[0]));
    }
}
