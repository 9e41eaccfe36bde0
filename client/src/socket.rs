//! The client's UDP socket as quinn sees it: quinn's own tokio socket with its GSO sends kept
//! within what the kernel accepts; and [`refused`], which notices that nothing listens on the
//! broker's port.
//!
//! quinn hands the kernel up to 10 datagrams in one GSO send (or fewer, if the socket says so).
//! The kernel refuses a send of more than [`GSO_BYTES_MAX`] bytes with `EMSGSIZE`, and
//! quinn-udp drops such a send after logging it: with datagrams over 6550 bytes every full send
//! was lost, and path MTU discovery took the losses for a black hole and fell back to 1200
//! bytes. [`GsoCapped`] tells quinn how many datagrams of the largest size the client may send
//! fit in one send.

use std::fmt;
use std::io::{self, IoSliceMut};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use quinn::udp::{RecvMeta, Transmit};
use quinn::{AsyncUdpSocket, UdpPoller};
use tokio::io::Interest;

/// Most UDP payload bytes one GSO send may carry (a UDP length field is 16 bits, and IPv4's
/// 20-byte header counts against the same 65,535).
pub const GSO_BYTES_MAX: usize = 65_507;

/// How many datagrams of up to `max_udp_payload` bytes one GSO send may carry; at least one.
pub fn gso_segments_max(max_udp_payload: u16) -> usize {
    (GSO_BYTES_MAX / usize::from(max_udp_payload.max(1))).max(1)
}

/// A quinn socket whose GSO sends stay within [`GSO_BYTES_MAX`] for datagrams of up to the
/// client's `max_udp_payload`; everything else is the wrapped socket's.
pub(crate) struct GsoCapped {
    inner: Arc<dyn AsyncUdpSocket>,
    segments_max: usize,
}

impl GsoCapped {
    pub(crate) fn new(inner: Arc<dyn AsyncUdpSocket>, max_udp_payload: u16) -> Self {
        GsoCapped { inner, segments_max: gso_segments_max(max_udp_payload) }
    }
}

impl fmt::Debug for GsoCapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GsoCapped")
            .field("inner", &self.inner)
            .field("segments_max", &self.segments_max)
            .finish()
    }
}

impl AsyncUdpSocket for GsoCapped {
    fn create_io_poller(self: Arc<Self>) -> Pin<Box<dyn UdpPoller>> {
        self.inner.clone().create_io_poller()
    }

    fn try_send(&self, transmit: &Transmit<'_>) -> io::Result<()> {
        self.inner.try_send(transmit)
    }

    fn poll_recv(
        &self,
        cx: &mut Context<'_>,
        bufs: &mut [IoSliceMut<'_>],
        meta: &mut [RecvMeta],
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_recv(cx, bufs, meta)
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.local_addr()
    }

    fn max_transmit_segments(&self) -> usize {
        self.inner.max_transmit_segments().min(self.segments_max)
    }

    fn max_receive_segments(&self) -> usize {
        self.inner.max_receive_segments()
    }

    fn may_fragment(&self) -> bool {
        self.inner.may_fragment()
    }
}

/// Resolves once the kernel reports the peer's port unreachable on `socket` (a descriptor of a
/// connection's UDP socket, connected to the broker's address): an ICMP port unreachable
/// answered a datagram, so nothing listens there. Never resolves when the socket cannot be
/// watched.
///
/// Only a connected UDP socket hears of such an ICMP (as `ECONNREFUSED`, its pending error),
/// and quinn drops the errors of its sends and receives: this watches the socket's error
/// readiness itself, for as long as the future lives (`Conn::open` races it with the
/// handshake, so that a refused port fails at once instead of at the connect timeout).
pub(crate) async fn refused(socket: std::net::UdpSocket) {
    let watched =
        socket.set_nonblocking(true).and_then(|()| tokio::net::UdpSocket::from_std(socket));
    let socket = match watched {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %e, "cannot watch the UDP socket for a refused port");
            return std::future::pending().await;
        }
    };
    loop {
        if socket.ready(Interest::ERROR).await.is_err() {
            return std::future::pending().await;
        }
        match socket.take_error() {
            Ok(Some(e)) if e.kind() == io::ErrorKind::ConnectionRefused => return,
            Ok(Some(e)) => tracing::debug!(error = %e, "UDP socket error"),
            Ok(None) | Err(_) => {}
        }
        // Taken: wait for the next error.
        let _ = socket.try_io(Interest::ERROR, || Err::<(), _>(io::ErrorKind::WouldBlock.into()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_refused_port_is_noticed_on_a_connected_socket() {
        // A port nothing listens on: bound, then closed.
        let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(closed).unwrap();
        let watch = tokio::spawn(refused(socket.try_clone().unwrap()));
        socket.send(b"anyone?").unwrap();
        let noticed = tokio::time::timeout(std::time::Duration::from_secs(5), watch).await;
        assert!(noticed.is_ok(), "ECONNREFUSED not noticed");
    }

    #[tokio::test]
    async fn a_listening_port_is_not_taken_for_a_refused_one() {
        let open = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket.connect(open.local_addr().unwrap()).unwrap();
        let watch = refused(socket.try_clone().unwrap());
        socket.send(b"anyone?").unwrap();
        let mut got = [0u8; 16];
        assert_eq!(open.recv(&mut got).unwrap(), 7);
        let quiet = tokio::time::timeout(std::time::Duration::from_millis(200), watch).await;
        assert!(quiet.is_err(), "a refusal without one");
    }

    #[test]
    fn a_full_send_of_the_largest_datagrams_fits_the_kernels_limit() {
        for mtu in [1200u16, 1452, 6550, 6551, 8952, 16_000, 65_527] {
            let n = gso_segments_max(mtu);
            assert!(n >= 1, "{mtu}");
            assert!(n == 1 || n * usize::from(mtu) <= GSO_BYTES_MAX, "{n} x {mtu}");
            assert!((n + 1) * usize::from(mtu) > GSO_BYTES_MAX, "{mtu}: {n} is the most that fit");
        }
        assert_eq!(gso_segments_max(8952), 7);
        assert_eq!(gso_segments_max(65_527), 1);
    }
}
