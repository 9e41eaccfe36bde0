//! Datagrams on their way out: [`OutTransmit`], what a core's outbox holds, and the one place a
//! `quinn_udp::Transmit` is built from it.

use std::net::{IpAddr, SocketAddr};

use quinn_proto::{ConnectionHandle, EcnCodepoint};

/// One `sendmsg` worth of datagrams (several when `segment_size` is set: a GSO batch), owned.
#[derive(Debug)]
pub(crate) struct OutTransmit {
    /// The connection that produced it; `None` for endpoint responses (retry, refusal,
    /// stateless reset, version negotiation), which are best-effort: a lost one is repeated by
    /// the peer.
    pub(crate) conn: Option<ConnectionHandle>,
    /// Where it goes.
    pub(crate) destination: SocketAddr,
    /// ECN codepoint for the IP header.
    pub(crate) ecn: Option<EcnCodepoint>,
    /// The UDP payloads back to back.
    pub(crate) contents: Vec<u8>,
    /// Size of each datagram but the last when `contents` holds several (GSO).
    pub(crate) segment_size: Option<usize>,
    /// The local address to send from (the one the peer sent to).
    pub(crate) src_ip: Option<IpAddr>,
}

impl OutTransmit {
    /// Wraps what quinn-proto wrote into `contents` for `t`.
    pub(crate) fn new(
        conn: Option<ConnectionHandle>,
        t: &quinn_proto::Transmit,
        mut contents: Vec<u8>,
    ) -> Self {
        debug_assert!(t.size <= contents.len(), "quinn-proto wrote the transmit into the buffer");
        contents.truncate(t.size);
        Self {
            conn,
            destination: t.destination,
            ecn: t.ecn,
            contents,
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        }
    }

    /// The transmit as quinn-udp sends it (borrowing the contents).
    pub(crate) fn as_udp(&self) -> quinn_udp::Transmit<'_> {
        quinn_udp::Transmit {
            destination: self.destination,
            ecn: self.ecn.and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents: &self.contents,
            segment_size: self.segment_size,
            src_ip: self.src_ip,
        }
    }

    /// The datagrams it holds, one per segment.
    #[cfg(test)]
    pub(crate) fn datagrams(&self) -> impl Iterator<Item = &[u8]> {
        let size = self.segment_size.unwrap_or(self.contents.len()).max(1);
        self.contents.chunks(size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transmit(size: usize, segment_size: Option<usize>) -> quinn_proto::Transmit {
        quinn_proto::Transmit {
            destination: "127.0.0.1:4433".parse().unwrap(),
            ecn: Some(EcnCodepoint::Ect0),
            size,
            segment_size,
            src_ip: None,
        }
    }

    #[test]
    fn keeps_what_quinn_wrote_and_splits_segments() {
        let t = OutTransmit::new(None, &transmit(2500, Some(1200)), vec![7u8; 4096]);
        assert_eq!(t.contents.len(), 2500);
        let sizes: Vec<usize> = t.datagrams().map(<[u8]>::len).collect();
        assert_eq!(sizes, [1200, 1200, 100]);
        let udp = t.as_udp();
        assert_eq!(udp.contents.len(), 2500);
        assert_eq!(udp.segment_size, Some(1200));
        assert_eq!(udp.ecn, Some(quinn_udp::EcnCodepoint::Ect0));
        let single = OutTransmit::new(None, &transmit(40, None), vec![0u8; 40]);
        assert_eq!(single.datagrams().count(), 1);
    }
}
