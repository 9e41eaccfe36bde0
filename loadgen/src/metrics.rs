//! Scraping the broker's `/metrics` (Prometheus text) for the figures the report trusts: bytes
//! stored, flushes, connections accepted and publish errors per core, and the broker's own
//! publish-to-ack p99 per core.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{bail, Context};

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

/// Fetches and parses `http://<addr>/metrics`.
pub fn scrape(addr: &str) -> anyhow::Result<BrokerSample> {
    let sock = addr
        .to_socket_addrs()
        .with_context(|| format!("metrics address {addr}"))?
        .next()
        .with_context(|| format!("metrics address {addr} resolves to nothing"))?;
    let mut s = TcpStream::connect_timeout(&sock, SCRAPE_TIMEOUT)?;
    s.set_read_timeout(Some(SCRAPE_TIMEOUT))?;
    s.set_write_timeout(Some(SCRAPE_TIMEOUT))?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut page = String::new();
    s.take(PAGE_BYTES_MAX).read_to_string(&mut page)?;
    let Some((head, body)) = page.split_once("\r\n\r\n") else {
        bail!("metrics answer without a header end");
    };
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1).is_none_or(|c| c != "200") {
        bail!("metrics answered {:?}", head.lines().next().unwrap_or(""));
    }
    Ok(parse(body))
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
            ("felix_storage_append_bytes_total", None) => "append_bytes",
            ("felix_storage_flushes_total", None) => "flushes",
            ("felix_broker_connections_accepted_total", None) => "connections_accepted",
            ("felix_broker_publish_errors_total", None) => "publish_errors",
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
felix_net_datagrams_in{core=\"0\"} 77
";

    #[test]
    fn parses_per_core_series() {
        let s = parse(PAGE);
        assert_eq!(s.append_bytes, vec![100, 250]);
        assert_eq!(s.flushes, vec![3, 4]);
        assert_eq!(s.connections_accepted, vec![2]);
        assert_eq!(s.publish_errors, vec![0, 1], "missing core 0 reads as 0");
        assert_eq!(s.ack_p99_us, vec![900, 1200], "only the 0.99 quantile");
        assert_eq!(s.ack_p50_us, vec![80]);
        let before = parse(&PAGE.replace("} 250", "} 50"));
        assert_eq!(s.delta(&before, |s| &s.append_bytes), vec![0, 200]);
        assert_eq!(BrokerSample::total(&s.append_bytes), 350);
    }
}
