//! The largest GSO send the net core asks quinn-proto for reaches the peer whole.
//!
//! One `sendmsg` carries at most 64 KiB of UDP payload; a larger GSO send fails with
//! `EMSGSIZE`, which quinn-udp logs and drops, so every segment of it is lost. The core used to
//! ask for the socket's 64 segments whatever the MTU: at 1452 bytes that is 93 KB, so every
//! large transmit of a subscription's data was lost, the congestion window kept collapsing to
//! about 64 KB, and delivery ran at a few MB/s (issue 13, target 5).

use std::net::UdpSocket;
use std::time::Duration;

use felix_broker::net::config::{gso_segments_max, GSO_BYTES_MAX};
use quinn_udp::{Transmit, UdpSocketState};

/// Receive buffer of the test's receiving socket: room for a whole send of small segments.
const RECV_BUFFER_BYTES: usize = 4 << 20;

#[test]
fn the_largest_gso_send_is_delivered_whole_at_every_mtu() {
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind sender");
    let rx = UdpSocket::bind("127.0.0.1:0").expect("bind receiver");
    rx.set_read_timeout(Some(Duration::from_secs(2))).expect("read timeout");
    let state = UdpSocketState::new((&tx).into()).expect("sender state");
    // socket2, not quinn-udp, for the receiver: quinn-udp would turn GRO on.
    socket2::SockRef::from(&rx).set_recv_buffer_size(RECV_BUFFER_BYTES).expect("receive buffer");
    let kernel_max = state.max_gso_segments();
    assert!(kernel_max > 1, "UDP GSO is available on Linux >= 4.18 (got {kernel_max} segments)");
    let to = rx.local_addr().expect("receiver address");
    let mut buf = vec![0u8; 1 << 16];
    for mtu in [1200u16, 1452, 1500, 9000, 65_000] {
        let segments = gso_segments_max(kernel_max, mtu);
        let len = segments * usize::from(mtu);
        assert!(len <= GSO_BYTES_MAX, "{segments} x {mtu} bytes fit one send");
        let contents: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let t = Transmit {
            destination: to,
            ecn: None,
            contents: &contents,
            segment_size: (segments > 1).then_some(usize::from(mtu)),
            src_ip: None,
        };
        state.send((&tx).into(), &t).expect("send");
        // Each segment arrives as its own datagram (the receiver has no GRO), in order.
        let mut got = Vec::with_capacity(len);
        while got.len() < len {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| {
                panic!(
                    "mtu {mtu}: {} of {len} bytes ({segments} segments) arrived ({e})",
                    got.len()
                )
            });
            assert!(n <= usize::from(mtu), "mtu {mtu}: a datagram of {n} bytes");
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, contents, "mtu {mtu}: {segments} segments arrive whole and in order");
    }
}

#[test]
fn the_limit_never_goes_below_one_segment_or_above_the_sockets() {
    assert_eq!(gso_segments_max(64, 1452), GSO_BYTES_MAX / 1452);
    assert_eq!(gso_segments_max(10, 1200), 10);
    assert_eq!(gso_segments_max(64, u16::MAX), 1);
    assert_eq!(gso_segments_max(1, 1200), 1);
    assert_eq!(gso_segments_max(64, 0), 64);
}
