//! A replicated batch's payload: its timestamp and records, as `felix_replication::Batch`
//! carries them (opaque bytes to the state machine, decoded again where they are written).
//!
//! Layout, big-endian: `timestamp_ms: u64`, then per record `key_len: u32` (`u32::MAX`: no
//! key), the key, `value_len: u32`, the value. Decoding slices the buffer (no copy) and
//! refuses anything malformed with an error: a payload arrives from the network.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use felix_proto::Record;

/// `key_len` of a record without a key.
const NO_KEY: u32 = u32::MAX;

/// A payload that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("malformed replicated batch payload: {0}")]
pub struct PayloadError(&'static str);

/// The payload of a batch of `records` stamped `timestamp_ms`.
pub fn encode(timestamp_ms: u64, records: &[Record]) -> Bytes {
    let len: usize =
        records.iter().map(|r| 8 + r.key.as_ref().map_or(0, Bytes::len) + r.value.len()).sum();
    let mut out = BytesMut::with_capacity(8 + len);
    out.put_u64(timestamp_ms);
    for r in records {
        match &r.key {
            Some(k) => {
                out.put_u32(k.len() as u32);
                out.put_slice(k);
            }
            None => out.put_u32(NO_KEY),
        }
        out.put_u32(r.value.len() as u32);
        for part in r.value.parts() {
            out.put_slice(part);
        }
    }
    out.freeze()
}

/// The timestamp and the records of `payload`, which must hold exactly `count` records.
pub fn decode(payload: &Bytes, count: u32) -> Result<(u64, Vec<Record>), PayloadError> {
    let mut buf = payload.clone();
    let take = |buf: &mut Bytes, n: usize, what: &'static str| {
        if buf.remaining() < n {
            return Err(PayloadError(what));
        }
        Ok(buf.split_to(n))
    };
    if buf.remaining() < 8 {
        return Err(PayloadError("no timestamp"));
    }
    let timestamp_ms = buf.get_u64();
    let mut records = Vec::with_capacity(count.min(1024) as usize);
    for _ in 0..count {
        if buf.remaining() < 4 {
            return Err(PayloadError("record cut short"));
        }
        let key = match buf.get_u32() {
            NO_KEY => None,
            n => Some(take(&mut buf, n as usize, "key cut short")?),
        };
        if buf.remaining() < 4 {
            return Err(PayloadError("record cut short"));
        }
        let n = buf.get_u32() as usize;
        let value = take(&mut buf, n, "value cut short")?;
        records.push(Record { key, value: value.into() });
    }
    if buf.has_remaining() {
        return Err(PayloadError("bytes after the last record"));
    }
    Ok((timestamp_ms, records))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_every_cut_refused() {
        let records = vec![
            Record::keyed(Bytes::from_static(b"k1"), Bytes::from_static(b"value one")),
            Record::unkeyed(Bytes::new()),
            Record::keyed(Bytes::new(), Bytes::from_static(b"v")),
        ];
        let p = encode(1234, &records);
        let (ts, back) = decode(&p, 3).unwrap();
        assert_eq!(ts, 1234);
        assert_eq!(back, records);
        for cut in 0..p.len() {
            assert!(decode(&p.slice(..cut), 3).is_err(), "a payload cut at {cut} is refused");
        }
        assert!(decode(&p, 2).is_err(), "fewer records than the bytes hold");
        assert!(decode(&p, 4).is_err(), "more records than the bytes hold");
    }
}
