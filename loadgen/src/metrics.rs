//! Scraping the broker's `/metrics` (Prometheus text) for the figures the report trusts: bytes
//! stored, flushes, connections accepted and publish errors per core, and the broker's own
//! publish-to-ack and flush (fdatasync) p50/p99 per core since it started; and its
//! `/histograms` (the histograms themselves), whose difference between two scrapes gives the
//! quantiles of the window alone ([`HistogramSample::since`]). With several brokers (a
//! cluster), [`scrape_all`] scrapes each one and lays their cores end to end, so that totals
//! count every broker.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};
use hdrhistogram::Histogram;

/// The most metrics addresses one run scrapes.
pub const METRICS_ADDRS_MAX: usize = 16;
/// The longest a scrape may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest metrics page read.
pub const PAGE_BYTES_MAX: u64 = 8 << 20;

/// One scrape, per broker core.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BrokerSample {
    /// `felix_storage_append_bytes_total` per core: bytes stored.
    pub append_bytes: Vec<u64>,
    /// `felix_storage_flushes_total` per core.
    pub flushes: Vec<u64>,
    /// `felix_broker_connections_accepted_total` per core.
    pub connections_accepted: Vec<u64>,
    /// `felix_broker_publish_errors_total` per core.
    pub publish_errors: Vec<u64>,
    /// `felix_publish_ack_latency_us{quantile="0.5"}` per core (the broker's histogram).
    #[serde(default)]
    pub ack_p50_us: Vec<u64>,
    /// `felix_publish_ack_latency_us{quantile="0.99"}` per core (the broker's histogram).
    pub ack_p99_us: Vec<u64>,
    /// `felix_publish_receive_span_us{quantile="0.5"}` per core: how long a Publish frame
    /// took to arrive (empty from a broker without it).
    #[serde(default)]
    pub receive_p50_us: Vec<u64>,
    /// `felix_publish_receive_span_us{quantile="0.99"}` per core.
    #[serde(default)]
    pub receive_p99_us: Vec<u64>,
    /// `felix_storage_flush_latency_us{quantile="0.5"}` per core (fdatasync, its histogram).
    #[serde(default)]
    pub flush_p50_us: Vec<u64>,
    /// `felix_storage_flush_latency_us{quantile="0.99"}` per core.
    #[serde(default)]
    pub flush_p99_us: Vec<u64>,
    /// `felix_storage_write_latency_us{quantile="0.99"}` per core (one O_DIRECT write).
    #[serde(default)]
    pub write_p99_us: Vec<u64>,
    /// `felix_net_quic_packets_sent` per core (QUIC packets its connections sent).
    #[serde(default)]
    pub quic_packets_sent: Vec<u64>,
    /// `felix_net_quic_packets_lost` per core (declared lost by QUIC's loss detection).
    #[serde(default)]
    pub quic_packets_lost: Vec<u64>,
    /// `felix_net_quic_congestion_events` per core.
    #[serde(default)]
    pub quic_congestion_events: Vec<u64>,
    /// `felix_broker_event_bytes_total` per core: EventBatch bytes the core's connections sent
    /// to subscribers.
    #[serde(default)]
    pub event_bytes: Vec<u64>,
}

impl BrokerSample {
    /// Sum of a per-core series.
    pub fn total(series: &[u64]) -> u64 {
        series.iter().sum()
    }

    /// Per-core differences `self - before` of a series picked by `f` (0 where it went back).
    pub fn delta(&self, before: &Self, f: fn(&Self) -> &Vec<u64>) -> Vec<u64> {
        let (a, b) = (f(self), f(before));
        a.iter()
            .enumerate()
            .map(|(i, v)| v.saturating_sub(b.get(i).copied().unwrap_or(0)))
            .collect()
    }
}

impl BrokerSample {
    /// The samples of several brokers as one: each broker's cores after the previous
    /// broker's (every series padded to the broker's core count, so indices stay aligned).
    /// One sample is returned as it is.
    pub fn concat(mut samples: Vec<BrokerSample>) -> BrokerSample {
        if samples.len() == 1 {
            return samples.remove(0);
        }
        let mut out = BrokerSample::default();
        for s in samples {
            let series = [
                &s.append_bytes,
                &s.flushes,
                &s.connections_accepted,
                &s.publish_errors,
                &s.ack_p50_us,
                &s.ack_p99_us,
                &s.receive_p50_us,
                &s.receive_p99_us,
                &s.flush_p50_us,
                &s.flush_p99_us,
                &s.write_p99_us,
                &s.quic_packets_sent,
                &s.quic_packets_lost,
                &s.quic_congestion_events,
                &s.event_bytes,
            ];
            let cores = series.iter().map(|v| v.len()).max().unwrap_or(0);
            let put = |dst: &mut Vec<u64>, src: &[u64]| {
                dst.extend(src.iter().copied().chain(std::iter::repeat(0)).take(cores));
            };
            put(&mut out.append_bytes, &s.append_bytes);
            put(&mut out.flushes, &s.flushes);
            put(&mut out.connections_accepted, &s.connections_accepted);
            put(&mut out.publish_errors, &s.publish_errors);
            put(&mut out.ack_p50_us, &s.ack_p50_us);
            put(&mut out.ack_p99_us, &s.ack_p99_us);
            put(&mut out.receive_p50_us, &s.receive_p50_us);
            put(&mut out.receive_p99_us, &s.receive_p99_us);
            put(&mut out.flush_p50_us, &s.flush_p50_us);
            put(&mut out.flush_p99_us, &s.flush_p99_us);
            put(&mut out.write_p99_us, &s.write_p99_us);
            put(&mut out.quic_packets_sent, &s.quic_packets_sent);
            put(&mut out.quic_packets_lost, &s.quic_packets_lost);
            put(&mut out.quic_congestion_events, &s.quic_congestion_events);
            put(&mut out.event_bytes, &s.event_bytes);
        }
        out
    }
}

/// The addresses of a comma-separated list, trimmed, empty parts dropped.
pub fn addresses(list: &str) -> Vec<&str> {
    list.split(',').map(str::trim).filter(|a| !a.is_empty()).collect()
}

/// [`addresses`], refused when empty or longer than [`METRICS_ADDRS_MAX`].
fn checked_addresses(list: &str) -> anyhow::Result<Vec<&str>> {
    let addrs = addresses(list);
    anyhow::ensure!(!addrs.is_empty(), "no metrics address");
    anyhow::ensure!(
        addrs.len() <= METRICS_ADDRS_MAX,
        "more than {METRICS_ADDRS_MAX} metrics addresses"
    );
    Ok(addrs)
}

/// Scrapes every address of the comma-separated `list` (one per broker) and concatenates
/// their cores in list order; fails if any broker cannot be scraped (a total that misses a
/// broker would understate what was stored).
pub fn scrape_all(list: &str) -> anyhow::Result<BrokerSample> {
    let addrs = checked_addresses(list)?;
    let samples = addrs.iter().map(|a| scrape(a)).collect::<anyhow::Result<Vec<_>>>()?;
    Ok(BrokerSample::concat(samples))
}

/// Fetches and parses `http://<addr>/metrics`.
pub fn scrape(addr: &str) -> anyhow::Result<BrokerSample> {
    Ok(parse(&get(addr, "/metrics")?))
}

/// The broker's published latency histograms (its `/histograms` page), per core: what they
/// held when each core last published them.
#[derive(Clone, Debug, Default)]
pub struct HistogramSample {
    /// When each core last published, Unix ms (0: not yet).
    pub published_unix_ms: Vec<u64>,
    /// Publish-to-ack, microseconds.
    pub ack_us: Vec<Histogram<u64>>,
    /// Publish-to-ack counted once per record, microseconds (empty histograms from a broker
    /// without it).
    pub ack_record_us: Vec<Histogram<u64>>,
    /// Publish receive span, microseconds (empty histograms from a broker without it).
    pub receive_us: Vec<Histogram<u64>>,
    /// Flush (fdatasync), microseconds.
    pub flush_us: Vec<Histogram<u64>>,
    /// One O_DIRECT write, microseconds.
    pub write_us: Vec<Histogram<u64>>,
}

/// The quantiles of the span between two histogram scrapes, per core.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WindowLatency {
    /// Milliseconds between the two publications, per core.
    pub span_ms: Vec<u64>,
    /// Publish-to-ack p50 per core.
    pub ack_p50_us: Vec<u64>,
    /// Publish-to-ack p99 per core.
    pub ack_p99_us: Vec<u64>,
    /// Publish-to-ack p99 per core, counted once per record (0 from a broker without it).
    pub ack_record_p99_us: Vec<u64>,
    /// Publish receive span p50 per core.
    pub receive_p50_us: Vec<u64>,
    /// Publish receive span p99 per core.
    pub receive_p99_us: Vec<u64>,
    /// Flush p50 per core.
    pub flush_p50_us: Vec<u64>,
    /// Flush p99 per core.
    pub flush_p99_us: Vec<u64>,
    /// Write p99 per core.
    pub write_p99_us: Vec<u64>,
}

impl HistogramSample {
    /// The earliest publication of any core (0 when a core has not published yet).
    pub fn oldest_unix_ms(&self) -> u64 {
        self.published_unix_ms.iter().copied().min().unwrap_or(0)
    }

    /// The quantiles of what was recorded between `before` and `self` (both of one broker set,
    /// cores in the same order). `None` when the core counts differ or some core has not
    /// published since `before`.
    pub fn since(&self, before: &Self) -> Option<WindowLatency> {
        let n = self.published_unix_ms.len();
        if n == 0 || before.published_unix_ms.len() != n {
            return None;
        }
        let mut w = WindowLatency::default();
        for c in 0..n {
            let (a, b) = (before.published_unix_ms[c], self.published_unix_ms[c]);
            if b <= a {
                return None;
            }
            w.span_ms.push(b - a);
            let ack = difference(self.ack_us.get(c)?, before.ack_us.get(c)?);
            let ack_record = difference(self.ack_record_us.get(c)?, before.ack_record_us.get(c)?);
            let receive = difference(self.receive_us.get(c)?, before.receive_us.get(c)?);
            let flush = difference(self.flush_us.get(c)?, before.flush_us.get(c)?);
            let write = difference(self.write_us.get(c)?, before.write_us.get(c)?);
            w.ack_p50_us.push(ack.value_at_quantile(0.5));
            w.ack_p99_us.push(ack.value_at_quantile(0.99));
            w.ack_record_p99_us.push(ack_record.value_at_quantile(0.99));
            w.receive_p50_us.push(receive.value_at_quantile(0.5));
            w.receive_p99_us.push(receive.value_at_quantile(0.99));
            w.flush_p50_us.push(flush.value_at_quantile(0.5));
            w.flush_p99_us.push(flush.value_at_quantile(0.99));
            w.write_p99_us.push(write.value_at_quantile(0.99));
        }
        Some(w)
    }
}

/// What `end` recorded beyond `start`, bucket by bucket (a bucket that went down, as when a
/// log whose histogram was part of a core's sum is deleted, counts as empty).
pub fn difference(end: &Histogram<u64>, start: &Histogram<u64>) -> Histogram<u64> {
    let mut d = Histogram::new_from(end);
    for v in end.iter_recorded() {
        let value = v.value_iterated_to();
        let more = v.count_at_value().saturating_sub(start.count_at(value));
        if more > 0 {
            let _ = d.record_n(value, more);
        }
    }
    d
}

/// Scrapes `/histograms` of every address of `list` and lays their cores end to end (see
/// [`scrape_all`]).
pub fn scrape_histograms_all(list: &str) -> anyhow::Result<HistogramSample> {
    let addrs = checked_addresses(list)?;
    let mut all = HistogramSample::default();
    for a in addrs {
        let one = parse_histograms(&get(a, "/histograms")?)?;
        all.published_unix_ms.extend(one.published_unix_ms);
        all.ack_us.extend(one.ack_us);
        all.ack_record_us.extend(one.ack_record_us);
        all.receive_us.extend(one.receive_us);
        all.flush_us.extend(one.flush_us);
        all.write_us.extend(one.write_us);
    }
    Ok(all)
}

/// Parses the JSON of the broker's `/histograms` page.
pub fn parse_histograms(body: &str) -> anyhow::Result<HistogramSample> {
    use base64::Engine;
    let v: serde_json::Value = serde_json::from_str(body).context("histograms page")?;
    let cores = v.get("cores").and_then(|c| c.as_array()).context("histograms: no cores")?;
    let decode = |core: &serde_json::Value, name: &str| -> anyhow::Result<Histogram<u64>> {
        let b64 = core.get(name).and_then(|h| h.as_str()).with_context(|| format!("no {name}"))?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(b64)?;
        hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(|e| anyhow::anyhow!("{name}: {e:?}"))
    };
    let mut out = HistogramSample::default();
    for core in cores {
        let published = core.get("published_unix_ms").and_then(|t| t.as_u64()).unwrap_or(0);
        out.published_unix_ms.push(published);
        out.ack_us.push(decode(core, "ack_latency_us")?);
        // Older brokers have neither the per-record ack latency nor the receive span: an
        // empty histogram keeps the cores aligned.
        out.ack_record_us.push(match core.get("ack_record_latency_us") {
            Some(_) => decode(core, "ack_record_latency_us")?,
            None => Histogram::new_from(out.ack_us.last().context("just pushed")?),
        });
        out.receive_us.push(match core.get("receive_span_us") {
            Some(_) => decode(core, "receive_span_us")?,
            None => Histogram::new_from(out.ack_us.last().context("just pushed")?),
        });
        out.flush_us.push(decode(core, "flush_latency_us")?);
        out.write_us.push(decode(core, "write_latency_us")?);
    }
    Ok(out)
}

/// GETs `http://<addr><path>` and returns the body of a 200 answer.
fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    let sock = addr
        .to_socket_addrs()
        .with_context(|| format!("metrics address {addr}"))?
        .next()
        .with_context(|| format!("metrics address {addr} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&sock, SCRAPE_TIMEOUT)?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    s.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut page = String::new();
    s.take(PAGE_BYTES_MAX).read_to_string(&mut page)?;
    let Some((head, body)) = page.split_once("\r\n\r\n") else {
        bail!("{path}: answer without a header end");
    };
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        bail!("{path} answered {:?}", head.lines().next().unwrap_or(""));
    }
    Ok(body.to_owned())
}

/// Parses the Prometheus text of the broker's metrics page.
pub fn parse(text: &str) -> BrokerSample {
    let mut series: BTreeMap<&str, BTreeMap<usize, u64>> = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some((name_labels, value)) = line.rsplit_once(' ') else { continue };
        let Some((name, labels)) = name_labels.split_once('{') else { continue };
        let Some(core) = label(labels, "core").and_then(|c| c.parse::<usize>().ok()) else {
            continue;
        };
        let key = match (name, label(labels, "quantile")) {
            ("felix_publish_ack_latency_us", Some("0.99")) => "ack_p99_us",
            ("felix_publish_ack_latency_us", Some("0.5")) => "ack_p50_us",
            ("felix_publish_receive_span_us", Some("0.5")) => "receive_p50_us",
            ("felix_publish_receive_span_us", Some("0.99")) => "receive_p99_us",
            ("felix_storage_flush_latency_us", Some("0.99")) => "flush_p99_us",
            ("felix_storage_flush_latency_us", Some("0.5")) => "flush_p50_us",
            ("felix_storage_write_latency_us", Some("0.99")) => "write_p99_us",
            ("felix_storage_append_bytes_total", None) => "append_bytes",
            ("felix_storage_flushes_total", None) => "flushes",
            ("felix_broker_connections_accepted_total", None) => "connections_accepted",
            ("felix_broker_publish_errors_total", None) => "publish_errors",
            ("felix_net_quic_packets_sent", None) => "quic_packets_sent",
            ("felix_net_quic_packets_lost", None) => "quic_packets_lost",
            ("felix_net_quic_congestion_events", None) => "quic_congestion_events",
            ("felix_broker_event_bytes_total", None) => "event_bytes",
            _ => continue,
        };
        let Ok(v) = value.trim().parse::<f64>() else { continue };
        series.entry(key).or_default().insert(core, v as u64);
    }
    let take = |key: &str| -> Vec<u64> {
        series
            .get(key)
            .map(|m| {
                let n = m.keys().max().map_or(0, |k| k + 1);
                (0..n).map(|i| m.get(&i).copied().unwrap_or(0)).collect()
            })
            .unwrap_or_default()
    };
    BrokerSample {
        append_bytes: take("append_bytes"),
        flushes: take("flushes"),
        connections_accepted: take("connections_accepted"),
        publish_errors: take("publish_errors"),
        ack_p99_us: take("ack_p99_us"),
        ack_p50_us: take("ack_p50_us"),
        receive_p50_us: take("receive_p50_us"),
        receive_p99_us: take("receive_p99_us"),
        flush_p50_us: take("flush_p50_us"),
        flush_p99_us: take("flush_p99_us"),
        write_p99_us: take("write_p99_us"),
        quic_packets_sent: take("quic_packets_sent"),
        event_bytes: take("event_bytes"),
        quic_packets_lost: take("quic_packets_lost"),
        quic_congestion_events: take("quic_congestion_events"),
    }
}

fn label<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.trim_end_matches('}').split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "\
# TYPE felix_storage_append_bytes_total counter
felix_storage_append_bytes_total{core=\"0\"} 100
felix_storage_append_bytes_total{core=\"1\"} 250
felix_storage_flushes_total{core=\"0\"} 3
felix_storage_flushes_total{core=\"1\"} 4
felix_broker_connections_accepted_total{core=\"0\"} 2
felix_broker_publish_errors_total{core=\"1\"} 1
felix_publish_ack_latency_us{core=\"0\",quantile=\"0.5\"} 80
felix_publish_ack_latency_us{core=\"0\",quantile=\"0.99\"} 900
felix_publish_ack_latency_us{core=\"1\",quantile=\"0.99\"} 1200
felix_publish_ack_latency_us_count{core=\"0\"} 5
felix_publish_receive_span_us{core=\"1\",quantile=\"0.5\"} 40
felix_publish_receive_span_us{core=\"1\",quantile=\"0.99\"} 410
felix_storage_flush_latency_us{core=\"0\",quantile=\"0.5\"} 300
felix_storage_flush_latency_us{core=\"0\",quantile=\"0.99\"} 700
felix_storage_flush_latency_us{core=\"1\",quantile=\"0.99\"} 650
felix_storage_write_latency_us{core=\"0\",quantile=\"0.99\"} 250
felix_net_datagrams_in{core=\"0\"} 77
felix_net_quic_packets_sent{core=\"0\"} 5000
felix_net_quic_packets_sent{core=\"1\"} 6000
felix_net_quic_packets_lost{core=\"1\"} 12
felix_net_quic_congestion_events{core=\"1\"} 2
";

    #[test]
    fn parses_per_core_series() {
        let s = parse(PAGE);
        assert_eq!(s.append_bytes, vec![100, 250]);
        assert_eq!(s.flushes, vec![3, 4]);
        assert_eq!(s.quic_packets_sent, vec![5000, 6000]);
        assert_eq!(s.quic_packets_lost, vec![0, 12]);
        assert_eq!(s.quic_congestion_events, vec![0, 2]);
        assert_eq!(s.connections_accepted, vec![2]);
        assert_eq!(s.publish_errors, vec![0, 1], "missing core 0 reads as 0");
        assert_eq!(s.ack_p99_us, vec![900, 1200], "only the 0.99 quantile");
        assert_eq!(s.ack_p50_us, vec![80]);
        assert_eq!(s.flush_p50_us, vec![300]);
        assert_eq!(s.flush_p99_us, vec![700, 650]);
        assert_eq!(s.write_p99_us, vec![250]);
        assert_eq!((&s.receive_p50_us, &s.receive_p99_us), (&vec![0, 40], &vec![0, 410]));
        let before = parse(&PAGE.replace("} 250", "} 50"));
        assert_eq!(s.delta(&before, |s| &s.append_bytes), vec![0, 200]);
        assert_eq!(BrokerSample::total(&s.append_bytes), 350);
    }

    fn histogram(values: &[(u64, u64)]) -> Histogram<u64> {
        let mut h = Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for &(v, n) in values {
            h.record_n(v, n).unwrap();
        }
        h
    }

    /// A `/histograms` page as the broker writes it (app::stats::render_histograms).
    fn page(cores: &[(u64, &Histogram<u64>, &Histogram<u64>)]) -> String {
        use base64::Engine;
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
        let enc = |h: &Histogram<u64>| {
            let mut buf = Vec::new();
            V2DeflateSerializer::new().serialize(h, &mut buf).unwrap();
            base64::engine::general_purpose::STANDARD.encode(&buf)
        };
        let cores: Vec<serde_json::Value> = cores
            .iter()
            .enumerate()
            .map(|(i, (t, ack, flush))| {
                serde_json::json!({"core": i, "published_unix_ms": t, "ack_latency_us": enc(ack),
                    "flush_latency_us": enc(flush), "write_latency_us": enc(flush), "fan_in": enc(flush)})
            })
            .collect();
        serde_json::json!({ "cores": cores }).to_string()
    }

    #[test]
    fn the_window_quantiles_leave_out_what_was_recorded_before_it() {
        // Warm-up: 1000 slow acks (50 ms) and flushes (20 ms); then 10,000 acks at 1 ms with
        // 100 at 3 ms, flushes at 500 us.
        let ack0 = histogram(&[(50_000, 1000), (900, 10)]);
        let flush0 = histogram(&[(20_000, 1000)]);
        let ack1 = histogram(&[(50_000, 1000), (900, 10), (1_000, 9_900), (3_000, 100)]);
        let flush1 = histogram(&[(20_000, 1000), (500, 2000)]);
        let before = parse_histograms(&page(&[(1_000, &ack0, &flush0)])).unwrap();
        let after = parse_histograms(&page(&[(3_000, &ack1, &flush1)])).unwrap();
        assert_eq!(after.oldest_unix_ms(), 3_000);
        let w = after.since(&before).expect("two publications");
        assert_eq!(w.span_ms, vec![2_000]);
        assert_eq!(w.ack_p50_us, vec![1_000]);
        // 9,900 + 100: the 99th percentile is the last 1 ms ack, the warm-up's 50 ms gone.
        assert!((999..=1_001).contains(&w.ack_p99_us[0]), "{w:?}");
        assert!((499..=501).contains(&w.flush_p99_us[0]), "{w:?}");
        // Since start, the warm-up dominates the tail.
        assert!(ack1.value_at_quantile(0.99) > 40_000);
        // The same publication twice, or another broker set: no window.
        assert_eq!(after.since(&after), None);
        let two = parse_histograms(&page(&[(1_000, &ack0, &flush0), (1_000, &ack0, &flush0)]));
        assert_eq!(after.since(&two.unwrap()), None);
        // A bucket that went down (a deleted log's histogram left the sum) counts as empty.
        let d = difference(&histogram(&[(700, 5)]), &histogram(&[(700, 9), (800, 1)]));
        assert_eq!(d.len(), 0);
        // A broker without the receive span or the per-record ack latency: empty histograms,
        // quantiles 0.
        assert_eq!(w.receive_p99_us, vec![0]);
        assert_eq!(w.ack_record_p99_us, vec![0]);
        assert!(parse_histograms("{}").is_err());
        assert!(parse_histograms("{\"cores\":[{\"ack_latency_us\":\"!!\"}]}").is_err());
    }

    #[test]
    fn the_receive_span_and_the_per_record_ack_latency_are_read_over_the_window_too() {
        use base64::Engine;
        use hdrhistogram::serialization::{Serializer, V2DeflateSerializer};
        let enc = |h: &Histogram<u64>| {
            let mut buf = Vec::new();
            V2DeflateSerializer::new().serialize(h, &mut buf).unwrap();
            base64::engine::general_purpose::STANDARD.encode(&buf)
        };
        let with = |name: &str, t: u64, h: &Histogram<u64>| {
            let empty = histogram(&[]);
            let mut v: serde_json::Value =
                serde_json::from_str(&page(&[(t, &empty, &empty)])).unwrap();
            v["cores"][0][name] = enc(h).into();
            v.to_string()
        };
        // Before the window: 100 spans of 90 ms; in it: 1000 of 200 us and 20 of 3 ms.
        let before = histogram(&[(90_000, 100)]);
        let after = histogram(&[(90_000, 100), (200, 1_000), (3_000, 20)]);
        let a = parse_histograms(&with("receive_span_us", 1_000, &before)).unwrap();
        let b = parse_histograms(&with("receive_span_us", 2_000, &after)).unwrap();
        let w = b.since(&a).expect("two publications");
        assert_eq!(w.receive_p50_us, vec![200]);
        assert!((2_990..=3_010).contains(&w.receive_p99_us[0]), "{w:?}");
        assert_eq!(w.ack_record_p99_us, vec![0], "{w:?}");
        // The same for the ack latency counted per record.
        let a = parse_histograms(&with("ack_record_latency_us", 1_000, &before)).unwrap();
        let b = parse_histograms(&with("ack_record_latency_us", 2_000, &after)).unwrap();
        let w = b.since(&a).expect("two publications");
        assert!((2_990..=3_010).contains(&w.ack_record_p99_us[0]), "{w:?}");
        assert_eq!(w.receive_p99_us, vec![0], "{w:?}");
    }

    #[test]
    fn several_brokers_lay_their_cores_end_to_end() {
        let a = parse(PAGE);
        let b = parse("felix_storage_append_bytes_total{core=\"0\"} 7\n");
        let all = BrokerSample::concat(vec![a.clone(), b]);
        assert_eq!(all.append_bytes, vec![100, 250, 7]);
        assert_eq!(all.connections_accepted, vec![2, 0, 0], "padded to each broker's cores");
        assert_eq!(all.ack_p50_us, vec![80, 0, 0]);
        assert_eq!(all.flush_p99_us, vec![700, 650, 0]);
        assert_eq!(BrokerSample::total(&all.append_bytes), 357);
        assert_eq!(BrokerSample::concat(vec![a.clone()]), a, "one broker: unchanged");
        assert_eq!(addresses(" a:1, ,b:2 "), ["a:1", "b:2"]);
        assert!(scrape_all(" , ").is_err());
    }
}
