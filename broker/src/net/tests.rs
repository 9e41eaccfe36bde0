//! The net layer's limits and routing on the in-memory pair ([`super::pair`]): handshake
//! budget and stateless retry, connection and stream limits, the idle timeout, misrouted
//! datagrams, migration and a socket that refuses sends. Deterministic and fast: simulated
//! time, no socket. The same behaviours have loopback tests in `broker/tests/net_*.rs`.

use std::task::Poll;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use felix_proto::cid::cid_for_core;
use felix_proto::CoreId;
use quinn_proto::{ConnectionError, ConnectionHandle, Dir, StreamId, TransportErrorCode, VarInt};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cid::{core_of, CHECK_BYTE_INDEX, CID_LEN};
use super::conn::{Connection, RecvStream};
use super::core::Datagram;
use super::pair::{client_addr, poll_once, Pair, Steer};

/// Generous bound on one exchange in simulated time (a handshake takes a few round trips of
/// 2 x `LATENCY`).
const EXCHANGE: Duration = Duration::from_millis(200);

/// Reads what `recv` has now; true when the stream ended.
fn read_available(recv: &mut RecvStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        match poll_once(recv.read_chunk(usize::MAX)) {
            Poll::Ready(Ok(Some(chunk))) => out.extend_from_slice(&chunk),
            Poll::Ready(Ok(None)) => return (out, true),
            Poll::Ready(Err(e)) => panic!("read failed: {e}"),
            Poll::Pending => return (out, false),
        }
    }
}

/// The client opens a unidirectional stream on `ch`, writes `data` and maybe finishes it.
fn send_uni(p: &mut Pair, ch: quinn_proto::ConnectionHandle, data: &[u8], finish: bool) {
    let conn = p.client(ch);
    let id = conn.streams().open(Dir::Uni).expect("stream credit");
    assert_eq!(conn.send_stream(id).write(data).expect("write"), data.len());
    if finish {
        conn.send_stream(id).finish().expect("finish");
    }
}

#[test]
fn a_handshake_lands_on_the_core_the_kernel_picked() {
    let mut p = Pair::new(2, |_| {});
    let addr = client_addr(5001); // odd port: core 1
    let ch = p.connect_and_wait(addr);
    assert_eq!(p.cores[1].stats().handshakes, 1);
    assert_eq!(p.cores[1].stats().connections, 1);
    assert_eq!(p.cores[0].stats().handshakes, 0);
    assert_eq!(p.cores[0].state.conn_count(), 0);
    assert!(p.cores[0].accept().is_none());

    let conn = p.cores[1].accept().expect("the application gets the connection");
    assert_eq!(conn.core(), CoreId(1));
    assert_eq!(conn.peer(), addr);
    send_uni(&mut p, ch, b"hello core 1", true);
    p.run_for(EXCHANGE);
    let Poll::Ready(Ok(mut recv)) = poll_once(conn.accept_uni()) else {
        panic!("the stream reached the application");
    };
    assert_eq!(read_available(&mut recv), (b"hello core 1".to_vec(), true));
    assert_eq!(p.cores[1].stats().streams_accepted, 1);
}

#[test]
fn past_the_handshake_budget_clients_are_retried_then_accepted() {
    let mut p = Pair::new(1, |c| c.handshakes_per_sec_per_core = 2);
    let chs: Vec<_> = (0..4).map(|i| p.connect(client_addr(6000 + i))).collect();
    let all = p.run_until(Duration::from_secs(2), |p| {
        p.handshakes() == 4 && chs.iter().all(|ch| p.clients[ch].is_connected())
    });
    assert!(all, "every client connects, retried or not");
    let s = p.cores[0].stats();
    assert_eq!(s.retries, 2, "the bucket holds two handshakes; the other two are retried");
    assert_eq!(s.handshakes, 4);
    assert_eq!(s.refused_conn_limit, 0);

    // The bucket refills at its rate: a second later a new client needs no retry.
    p.run_for(Duration::from_secs(1));
    p.connect_and_wait(client_addr(6010));
    assert_eq!(p.cores[0].stats().retries, 2);
    assert_eq!(p.cores[0].stats().handshakes, 5);
}

#[test]
fn past_max_conns_a_core_refuses_and_has_room_again_after_a_close() {
    let mut p = Pair::new(1, |c| c.max_conns_per_core = 2);
    let a = p.connect_and_wait(client_addr(7000));
    p.connect_and_wait(client_addr(7001));
    let c = p.connect(client_addr(7002));
    assert!(p.run_until(EXCHANGE, |p| p.clients[&c].lost().is_some()));
    assert!(
        matches!(
            p.clients[&c].lost(),
            Some(ConnectionError::ConnectionClosed(close))
                if close.error_code == TransportErrorCode::CONNECTION_REFUSED
        ),
        "refused: {:?}",
        p.clients[&c].lost()
    );
    let s = p.cores[0].stats();
    assert_eq!((s.refused_conn_limit, s.connections), (1, 2));

    let now = p.now;
    p.client(a).close(now, VarInt::from_u32(0), Bytes::new());
    assert!(p.run_until(Duration::from_secs(2), |p| p.cores[0].state.conn_count() == 1));
    p.connect_and_wait(client_addr(7003));
    let s = p.cores[0].stats();
    assert_eq!((s.refused_conn_limit, s.connections, s.handshakes), (1, 2, 3));
}

#[test]
fn a_peer_opens_no_more_streams_than_the_limit_until_one_ends() {
    let mut p = Pair::new(1, |c| c.max_streams_per_conn = 2);
    let ch = p.connect_and_wait(client_addr(7100));
    let conn = p.cores[0].accept().expect("connection");
    send_uni(&mut p, ch, b"one", true);
    send_uni(&mut p, ch, b"two", false);
    assert!(p.client(ch).streams().open(Dir::Uni).is_none(), "two streams is the limit");
    p.run_for(EXCHANGE);
    assert!(p.client(ch).streams().open(Dir::Uni).is_none(), "no credit while both live");

    // The application reads the first stream to its end: its credit goes back to the peer.
    let Poll::Ready(Ok(mut first)) = poll_once(conn.accept_uni()) else {
        panic!("first stream");
    };
    let Poll::Ready(Ok(mut second)) = poll_once(conn.accept_uni()) else {
        panic!("second stream");
    };
    assert_eq!(read_available(&mut first), (b"one".to_vec(), true));
    assert_eq!(read_available(&mut second), (b"two".to_vec(), false));
    p.run_for(EXCHANGE);
    assert!(p.client(ch).streams().open(Dir::Uni).is_some(), "one stream ended: one more");
    assert!(p.client(ch).streams().open(Dir::Uni).is_none());
    assert_eq!(p.cores[0].stats().streams_accepted, 2);
}

#[test]
fn a_silent_connection_is_closed_at_the_idle_timeout() {
    let mut p = Pair::new(1, |c| c.idle_timeout = Duration::from_secs(2));
    let ch = p.connect_and_wait(client_addr(7200));
    let conn = p.cores[0].accept().expect("connection");
    p.run_for(Duration::from_millis(1500));
    assert_eq!(p.cores[0].state.conn_count(), 1);
    assert!(poll_once(conn.closed()).is_pending());

    p.run_for(Duration::from_millis(1000));
    let s = p.cores[0].stats();
    assert_eq!((s.idle_timeouts, s.connections), (1, 0));
    assert_eq!(p.cores[0].state.conn_count(), 0);
    assert!(matches!(poll_once(conn.closed()), Poll::Ready(ConnectionError::TimedOut)));
    assert!(matches!(p.clients[&ch].lost(), Some(ConnectionError::TimedOut)));
}

#[test]
fn datagrams_steered_to_the_wrong_core_reach_their_owner() {
    let mut p = Pair::new(2, |_| {});
    let ch = p.connect_and_wait(client_addr(7300)); // even port: core 0
    let conn = p.cores[0].accept().expect("connection");
    p.steer = Steer::Core(1); // from now on the kernel hands everything to core 1
    send_uni(&mut p, ch, b"misrouted but delivered", true);
    p.run_for(EXCHANGE);

    let Poll::Ready(Ok(mut recv)) = poll_once(conn.accept_uni()) else {
        panic!("the stream reached the owner core");
    };
    assert_eq!(read_available(&mut recv), (b"misrouted but delivered".to_vec(), true));
    let (s0, s1) = (p.cores[0].stats(), p.cores[1].stats());
    assert!(s1.misrouted > 0);
    assert_eq!(s1.forwarded_out, s1.misrouted);
    assert_eq!(s0.forwarded_in, s1.misrouted);
    assert_eq!(s1.dropped_bad_core + s1.dropped_mesh_full, 0);
    assert_eq!(p.cores[1].state.conn_count(), 0, "the wrong core holds no state for it");
    assert!(p.clients[&ch].lost().is_none(), "no stateless reset from the wrong core");
}

#[test]
fn a_migrated_client_stays_on_its_core() {
    for steer in [Steer::Port, Steer::Cid] {
        let mut p = Pair::new(2, |_| {});
        p.steer = steer;
        let ch = p.connect_and_wait(client_addr(7400)); // core 0
        let conn = p.cores[0].accept().expect("connection");
        let id = p.client(ch).streams().open(Dir::Uni).expect("stream");
        p.client(ch).send_stream(id).write(b"before ").expect("write");
        p.run_for(EXCHANGE);

        let moved = client_addr(7401); // the kernel's hash says core 1
        p.migrate(ch, moved);
        p.client(ch).send_stream(id).write(b"after").expect("write");
        p.client(ch).send_stream(id).finish().expect("finish");
        p.run_for(EXCHANGE);

        let Poll::Ready(Ok(mut recv)) = poll_once(conn.accept_uni()) else {
            panic!("{steer:?}: stream");
        };
        assert_eq!(read_available(&mut recv), (b"before after".to_vec(), true), "{steer:?}");
        assert_eq!(conn.peer(), moved, "{steer:?}: the owner core follows the new path");
        assert!(p.clients[&ch].lost().is_none(), "{steer:?}");
        let (s0, s1) = (p.cores[0].stats(), p.cores[1].stats());
        assert_eq!((s1.handshakes, p.cores[1].state.conn_count()), (0, 0), "{steer:?}");
        match steer {
            Steer::Port => {
                assert!(s1.misrouted > 0, "the new 4-tuple hashes to core 1");
                assert_eq!(s0.forwarded_in, s1.misrouted);
            }
            _ => assert_eq!(s1.datagrams_in, 0, "CID steering keeps every datagram on core 0"),
        }
    }
}

#[test]
fn a_short_header_naming_a_core_that_does_not_exist_is_dropped() {
    let mut p = Pair::new(2, |_| {});
    let mut data = vec![0x40u8]; // short header
    data.extend_from_slice(&cid_for_core(CoreId(5), [0; CID_LEN]).unwrap());
    data.extend_from_slice(&[0xAA; 32]);
    let now = p.now;
    p.cores[0].state.handle_datagram(now, datagram(&data, 7600));
    assert!(p.cores[0].state.poll_forward().is_none());
    assert!(p.cores[0].state.poll_transmit().is_none(), "no stateless reset either");
    let s = p.cores[0].stats();
    assert_eq!((s.misrouted, s.dropped_bad_core, s.forwarded_out), (1, 1, 0));
    assert_eq!(s.kept_bad_core, 0);
}

fn datagram(data: &[u8], port: u16) -> Datagram {
    Datagram { data: BytesMut::from(data), remote: client_addr(port), local_ip: None, ecn: None }
}

/// An Initial's long header with destination CID `dcid`, padded to 1200 bytes; its payload
/// is not a real one (the endpoint cannot decrypt it and drops it without an answer).
fn initial_with_dcid(dcid: &[u8]) -> Vec<u8> {
    let mut d = vec![0xc3, 0x00, 0x00, 0x00, 0x01, dcid.len() as u8];
    d.extend_from_slice(dcid);
    d.extend_from_slice(&[0x00, 0x00, 0x44, 0xd0]); // no SCID, no token, length 1232
    d.resize(1200, 0xAA);
    d
}

#[test]
fn no_initial_is_dropped_for_its_dcid() {
    // 4,096 seeded random 8-byte DCIDs (as aioquic and Chromium send) and CIDs in the layout
    // naming each of the 255 cores: core 0 forwards an Initial only to a core that exists and
    // that its DCID names (`core_of`), and keeps every other one; it drops none.
    const CORES: u16 = 4;
    let seed = 0x1a17_1a1d;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut dcids: Vec<[u8; CID_LEN]> = (0..4096).map(|_| rng.gen()).collect();
    dcids.extend((0..=254).map(|c| cid_for_core(CoreId(c), rng.gen()).unwrap()));
    let mut p = Pair::new(usize::from(CORES), |_| {});
    let (mut forwarded, mut kept) = (0u64, 0u64);
    for dcid in &dcids {
        let now = p.now;
        p.cores[0].state.handle_datagram(now, datagram(&initial_with_dcid(dcid), 7900));
        let forward = p.cores[0].state.poll_forward().map(|(owner, _)| owner);
        assert!(p.cores[0].state.poll_forward().is_none());
        while p.cores[0].state.poll_transmit().is_some() {}
        let counted = p.cores[0].stats().kept_bad_core;
        match core_of(dcid) {
            Some(c) if c.0 != 0 && c.0 < CORES => {
                assert_eq!(forward, Some(c), "seed {seed:#x}, DCID {dcid:02x?}");
                forwarded += 1;
            }
            Some(c) if c.0 >= CORES => {
                assert_eq!(forward, None, "seed {seed:#x}, DCID {dcid:02x?}");
                kept += 1;
            }
            _ => assert_eq!(forward, None, "seed {seed:#x}, DCID {dcid:02x?}"),
        }
        assert_eq!(counted, kept, "seed {seed:#x}, DCID {dcid:02x?}: kept_bad_core");
    }
    let s = p.cores[0].stats();
    assert_eq!((s.dropped_bad_core, s.misrouted, s.forwarded_out), (0, forwarded, 0));
    assert!(kept >= 251 && forwarded >= 3, "kept {kept}, forwarded {forwarded}");
}

#[test]
fn an_initial_naming_a_core_that_does_not_exist_is_served_where_it_landed() {
    for steer in [Steer::Port, Steer::Cid] {
        let mut p = Pair::new(2, |_| {});
        p.steer = steer;
        // The client believes in more cores than the broker has (or reuses a DCID meant for
        // another broker): a real handshake, its Initial naming core 5.
        let dcid = cid_for_core(CoreId(5), [0x5A; CID_LEN]).unwrap();
        let ch = p.connect_with_dcid(client_addr(7801), &dcid); // odd port: core 1
        let done = p.run_until(Duration::from_secs(5), |p| {
            p.clients[&ch].is_connected() && p.handshakes() == 1
        });
        assert!(done, "{steer:?}: the handshake completes");
        let conn = p.cores[1].accept().expect("core 1, where the Initial landed, accepts");
        assert_eq!(conn.core(), CoreId(1));
        let (s0, s1) = (p.cores[0].stats(), p.cores[1].stats());
        assert!(s1.kept_bad_core >= 1, "{steer:?}: {s1:?}");
        assert_eq!((s1.dropped_bad_core, s1.misrouted, s0.datagrams_in), (0, 0, 0), "{steer:?}");
        // The connection's own CIDs name core 1, and the rest of it stays there.
        send_uni(&mut p, ch, b"served", true);
        p.run_for(EXCHANGE);
        let Poll::Ready(Ok(mut recv)) = poll_once(conn.accept_uni()) else {
            panic!("{steer:?}: the stream reached core 1");
        };
        assert_eq!(read_available(&mut recv), (b"served".to_vec(), true));
    }
}

#[test]
fn an_initial_naming_a_core_is_handed_to_it_and_a_random_one_stays() {
    let mut p = Pair::new(2, |_| {});
    // A Felix client names core 1; the Initial lands on core 0 (even port).
    let named = cid_for_core(CoreId(1), [0x17; CID_LEN]).unwrap();
    let ch = p.connect_with_dcid(client_addr(7900), &named);
    assert!(p.run_until(Duration::from_secs(5), |p| {
        p.clients[&ch].is_connected() && p.handshakes() == 1
    }));
    assert!(p.cores[1].accept().is_some(), "the named core accepts");
    assert!(p.cores[0].accept().is_none());
    assert!(p.cores[0].stats().misrouted >= 1);
    // 8 random bytes that the layout without a check value read as core 1: they stay on core 0.
    let mut p = Pair::new(2, |_| {});
    let mut random = named;
    random[CHECK_BYTE_INDEX] ^= 0xFF;
    assert_eq!(core_of(&random), None);
    let ch = p.connect_with_dcid(client_addr(7902), &random);
    assert!(p.run_until(Duration::from_secs(5), |p| {
        p.clients[&ch].is_connected() && p.handshakes() == 1
    }));
    assert!(p.cores[0].accept().is_some(), "the core it landed on accepts");
    let s0 = p.cores[0].stats();
    assert_eq!((s0.misrouted, s0.kept_bad_core, p.cores[1].stats().datagrams_in), (0, 0, 0));
}

#[test]
fn a_send_the_socket_refuses_is_retried_after_the_back_off() {
    let mut p = Pair::new(1, |_| {});
    let ch = p.connect_and_wait(client_addr(7700));
    let conn = p.cores[0].accept().expect("connection");
    p.cores[0].socket_full = true;
    send_uni(&mut p, ch, b"acked late", true);
    p.run_for(Duration::from_millis(20));
    let blocked = p.cores[0].stats();
    assert!(blocked.send_would_block > 0, "the core tried to acknowledge");

    p.cores[0].socket_full = false;
    p.run_for(Duration::from_millis(1));
    assert!(p.cores[0].stats().datagrams_out > blocked.datagrams_out, "the kept sends left");
    p.run_for(EXCHANGE);
    let Poll::Ready(Ok(mut recv)) = poll_once(conn.accept_uni()) else {
        panic!("stream");
    };
    assert_eq!(read_available(&mut recv), (b"acked late".to_vec(), true));
    assert!(p.clients[&ch].lost().is_none());
    assert_eq!(p.client(ch).stats().path.lost_packets, 0, "the client lost nothing");
}

#[test]
fn shutdown_closes_every_connection_and_refuses_new_ones() {
    let mut p = Pair::new(1, |_| {});
    let queued = p.connect_and_wait(client_addr(7800));
    let taken = p.connect_and_wait(client_addr(7801));
    let conn = p.cores[0].accept().expect("connection");
    let now = p.now;
    let never_accepted = p.cores[0].state.begin_shutdown(now);
    assert_eq!(never_accepted.len(), 1, "one connection was still in the accept queue");
    assert!(matches!(
        poll_once(std::future::poll_fn(|cx| p.cores[0].state.poll_accept(cx))),
        Poll::Ready(None)
    ));

    let late = p.connect(client_addr(7802));
    assert!(p.run_until(Duration::from_secs(2), |p| p.cores[0].state.is_finished()));
    for ch in [queued, taken] {
        assert!(
            matches!(
                p.clients[&ch].lost(),
                Some(ConnectionError::ApplicationClosed(close))
                    if close.error_code == VarInt::from_u32(0) && &close.reason[..] == b"shutdown"
            ),
            "{:?}",
            p.clients[&ch].lost()
        );
    }
    assert!(p.clients[&late].lost().is_some(), "a handshake after shutdown is refused");
    assert_eq!(p.cores[0].stats().refused_conn_limit, 1);
    assert!(matches!(poll_once(conn.closed()), Poll::Ready(_)));
}

#[test]
fn chunks_larger_than_the_flow_control_window_arrive_whole_and_in_order() {
    let mut p = Pair::new(1, |_| {});
    let ch = p.connect_and_wait(client_addr(7800));
    let conn = p.cores[0].accept().expect("connection");
    let Poll::Ready(Ok(mut send)) = poll_once(conn.open_uni()) else {
        panic!("the core opens a stream");
    };
    // More than the client's stream window (1.25 MB by default), so the write waits for
    // credit and takes the big chunk in parts; an empty chunk on the way is skipped.
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let mut chunks =
        [Bytes::from_static(b"first"), Bytes::new(), Bytes::from(big.clone()), Bytes::from("end")];
    let mut want = b"first".to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(b"end");

    let mut got = Vec::new();
    let mut stream = None;
    let mut waits = 0;
    {
        let mut write = std::pin::pin!(send.write_all_chunks(&mut chunks));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        loop {
            match std::future::Future::poll(write.as_mut(), &mut cx) {
                Poll::Ready(r) => break r.expect("written"),
                Poll::Pending => waits += 1,
            }
            assert!(waits < 10_000, "the write made no progress");
            p.run_for(Duration::from_millis(1));
            read_uni(&mut p, ch, &mut stream, &mut got);
        }
    }
    assert!(waits > 0, "the window made the write wait");
    assert!(chunks.iter().all(Bytes::is_empty), "every chunk was taken");
    send.finish().expect("finish");
    p.run_until(EXCHANGE, |p| p.clients.values().all(|c| c.lost().is_none()));
    for _ in 0..200 {
        p.run_for(Duration::from_millis(1));
        read_uni(&mut p, ch, &mut stream, &mut got);
        if got.len() == want.len() {
            break;
        }
    }
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the bytes arrive in order, unchanged");
}

/// Writes `bytes` on a new stream of `conn` and runs the pair until the client has read them
/// all (or the steps run out); returns how many it read.
fn send_to_client(p: &mut Pair, ch: ConnectionHandle, conn: &Connection, bytes: usize) -> usize {
    let Poll::Ready(Ok(mut send)) = poll_once(conn.open_uni()) else {
        panic!("the core opens a stream");
    };
    let mut chunks = [Bytes::from(vec![7u8; bytes])];
    let mut got = Vec::new();
    let mut stream = None;
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut write = std::pin::pin!(send.write_all_chunks(&mut chunks));
    let mut written = false;
    for _ in 0..20_000 {
        if !written {
            written = std::future::Future::poll(write.as_mut(), &mut cx).is_ready();
        }
        p.run_for(Duration::from_millis(1));
        read_uni(p, ch, &mut stream, &mut got);
        if written && got.len() == bytes {
            break;
        }
    }
    got.len()
}

/// Appends to `out` what the client's unidirectional stream `stream` holds now, accepting the
/// stream first when it has not been yet.
fn read_uni(p: &mut Pair, ch: ConnectionHandle, stream: &mut Option<StreamId>, out: &mut Vec<u8>) {
    let client = p.client(ch);
    if stream.is_none() {
        *stream = client.streams().accept(Dir::Uni);
    }
    let Some(id) = *stream else { return };
    let mut recv = client.recv_stream(id);
    let mut chunks_in = recv.read(true).expect("readable");
    while let Ok(Some(c)) = chunks_in.next(usize::MAX) {
        out.extend_from_slice(&c.bytes);
    }
    let _ = chunks_in.finalize();
}

#[test]
fn the_quic_counters_count_the_packets_a_core_sent_and_lost() {
    const BYTES: usize = 300_000;
    // A clean network: packets sent, none lost.
    let mut p = Pair::new(1, |_| {});
    let ch = p.connect_and_wait(client_addr(7900));
    let conn = p.cores[0].accept().expect("connection");
    assert_eq!(send_to_client(&mut p, ch, &conn, BYTES), BYTES);
    let clean = p.cores[0].state.sample_paths();
    assert!(clean.packets_sent > (BYTES / 1500) as u64, "{clean:?}");
    assert_eq!((clean.packets_lost, clean.bytes_lost, clean.congestion_events), (0, 0, 0));
    assert_eq!(p.cores[0].stats().quic_packets_sent, clean.packets_sent);
    assert_eq!(clean.black_holes, 0, "{clean:?}");
    let mtu = p.cores[0].stats().quic_mtu_min;
    assert!(mtu >= 1200, "the live connection's path MTU: {mtu}");

    // Every 20th datagram from the core lost: the core's loss detection counts them.
    let mut p = Pair::new(1, |_| {});
    let ch = p.connect_and_wait(client_addr(7901));
    let conn = p.cores[0].accept().expect("connection");
    p.wire.lose_every_nth_from_cores = Some(20);
    assert_eq!(send_to_client(&mut p, ch, &conn, BYTES), BYTES, "QUIC resends what was lost");
    let lossy = p.cores[0].state.sample_paths();
    assert!(p.wire.lost > 0);
    assert!(
        lossy.packets_lost > 0 && lossy.packets_lost <= p.wire.lost,
        "{lossy:?}, {}",
        p.wire.lost
    );
    assert!(lossy.bytes_lost >= lossy.packets_lost * 1000, "{lossy:?}");
    assert!(lossy.congestion_events > 0, "{lossy:?}");
    let snap = p.cores[0].stats();
    assert_eq!(
        (snap.quic_packets_lost, snap.quic_congestion_events),
        (lossy.packets_lost, lossy.congestion_events)
    );

    // The connection ends: what it counted stays in the totals.
    p.wire.lose_every_nth_from_cores = None;
    let now = p.now;
    p.client(ch).close(now, VarInt::from_u32(0), Bytes::new());
    assert!(p.run_until(EXCHANGE, |p| p.cores[0].state.conn_count() == 0), "the connection ends");
    let after = p.cores[0].state.sample_paths();
    assert_eq!(p.cores[0].stats().quic_mtu_min, 0, "no live connection, no path MTU");
    assert!(
        after.packets_sent >= lossy.packets_sent && after.packets_lost == lossy.packets_lost,
        "{after:?} vs {lossy:?}"
    );
}

/// `read_chunks` hands over every chunk that has arrived in one call, up to its byte limit,
/// in order and without copying; the next call gets the rest, and the end comes as `false`.
#[test]
fn read_chunks_takes_what_has_arrived_up_to_its_limit() {
    let mut p = Pair::new(1, |_| {});
    let ch = p.connect_and_wait(client_addr(7600));
    let conn = p.cores[0].accept().expect("connection");
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    send_uni(&mut p, ch, &data, true);
    p.run_for(EXCHANGE);
    let Poll::Ready(Ok(mut recv)) = poll_once(conn.accept_uni()) else {
        panic!("stream");
    };
    let mut first = Vec::new();
    let mut calls = 0;
    let r = poll_once(recv.read_chunks(12_000, |c| {
        calls += 1;
        first.push(c);
    }));
    assert!(matches!(r, Poll::Ready(Ok(true))), "{r:?}");
    let got: usize = first.iter().map(Bytes::len).sum();
    assert_eq!(got, 12_000, "up to the limit, in one call");
    assert!(calls > 1, "several datagrams' chunks in one call: {calls}");
    let mut rest = Vec::new();
    let r = poll_once(recv.read_chunks(usize::MAX, |c| rest.push(c)));
    assert!(matches!(r, Poll::Ready(Ok(true))), "{r:?}");
    let all: Vec<u8> = first.iter().chain(&rest).flat_map(|c| c.iter().copied()).collect();
    assert_eq!(all, data, "every byte, in order");
    let r = poll_once(recv.read_chunks(usize::MAX, |_| panic!("no data after the end")));
    assert!(matches!(r, Poll::Ready(Ok(false))), "the end: {r:?}");
}

#[test]
fn by_default_a_peer_may_open_no_unidirectional_streams_and_send_no_datagrams() {
    // Nothing in the broker accepts a peer's unidirectional stream or reads a DATAGRAM frame:
    // without these limits either would sit in the connection's buffers for its life.
    let mut p = Pair::new(1, |c| c.peer_uni_streams = false);
    let ch = p.connect_and_wait(client_addr(7200));
    let _conn = p.cores[0].accept().expect("connection");
    p.run_for(EXCHANGE);
    assert!(p.client(ch).streams().open(Dir::Uni).is_none(), "no unidirectional credit");
    assert!(p.client(ch).streams().open(Dir::Bi).is_some(), "bidirectional streams as before");
    assert_eq!(p.client(ch).datagrams().max_size(), None, "DATAGRAM support not advertised");
    let refused = p.client(ch).datagrams().send(bytes::Bytes::from_static(b"x"), false);
    assert!(refused.is_err(), "the client's stack refuses to send one");
}
