//! `felix subscribe`: each record a line on stdout (buffered, see `output`), following the
//! stream by default; `--exit-at-end` stops at each shard's end as of the start, `-c` after a
//! count, Ctrl-C at once (what is buffered is written, a group's positions committed).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use felix_proto::{Offset, ShardId, StartAt};
use tokio::io::AsyncWrite;

use super::output::{push_bytes_field, push_str, push_u64_field, LineOutput};
use super::{Interrupt, SubscribeArgs};
use crate::config::ClientConfig;
use crate::{Client, ReceivedRecord, SubscribeOptions, SubscriptionState};

pub(super) async fn subscribe<W: AsyncWrite + Unpin>(
    args: SubscribeArgs,
    config: ClientConfig,
    output: W,
    mut interrupt: Interrupt,
) -> anyhow::Result<()> {
    let client = interrupt.guard(super::connect(config)).await??;
    if !args.shards.is_empty() {
        interrupt.guard(check_shards(&client, &args.stream, &args.shards)).await??;
    }
    let shards =
        (!args.shards.is_empty()).then(|| args.shards.iter().map(|s| ShardId(*s)).collect());
    let ends = match args.exit_at_end {
        true => Some(interrupt.guard(end_offsets(&client, &args.stream, shards.clone())).await??),
        false => None,
    };
    let mut options = SubscribeOptions::new(&args.stream)
        .start(args.from)
        .resume_timeout_ms(args.resume_timeout_ms);
    if let Some(g) = &args.group {
        options = options.group(g.clone());
    }
    if let Some(s) = shards {
        options = options.shards(s);
    }
    let mut sub = interrupt.guard(client.subscribe(options)).await??;
    let mut until = ends.map(|e| AtEnd::new(e, sub.positions()));
    let reporter = tokio::spawn(report_resumes(sub.state()));
    let interval = Duration::from_millis(args.commit_interval_ms);
    let format = Format::new(&args);
    let mut out = LineOutput::new(output);
    let mut last_commit = Instant::now();
    let mut printed = 0u64;
    while args.count.is_none_or(|c| printed < c) && !until.as_ref().is_some_and(AtEnd::done) {
        if interrupt.is_set() {
            break;
        }
        let next = out
            .wait(async {
                tokio::select! {
                    biased;
                    r = sub.next() => Some(r),
                    () = interrupt.wait() => None,
                }
            })
            .await?;
        let Some(Some(record)) = next.transpose()? else { break };
        if let Some(u) = &mut until {
            if !u.take(&record) {
                continue;
            }
        }
        format.write(&record, out.line().await?);
        printed += 1;
        if args.group.is_some() && last_commit.elapsed() >= interval {
            out.flush().await?;
            sub.commit_consumed().await?;
            last_commit = Instant::now();
        }
    }
    out.flush().await?;
    if args.group.is_some() {
        sub.commit_consumed().await?;
    }
    reporter.abort();
    client.close();
    Ok(())
}

/// Refuses a `--shard` the stream does not have, before subscribing (in a cluster the
/// placement has no owner for it, which would read as "unavailable").
async fn check_shards(client: &Client, stream: &str, shards: &[u32]) -> anyhow::Result<()> {
    let d = client.describe_stream(stream).await?;
    if let Some(s) = shards.iter().find(|s| **s >= d.shards) {
        match d.shards {
            0 => anyhow::bail!("shard {s} does not exist: {stream} has no shards"),
            n => anyhow::bail!("shard {s} does not exist: {stream} has {n} shards, 0 to {}", n - 1),
        }
    }
    Ok(())
}

/// Each shard's end as of now: where a subscription at `latest` starts it (the broker says,
/// `SUBSCRIBE_POSITIONS`).
async fn end_offsets(
    client: &Client,
    stream: &str,
    shards: Option<Vec<ShardId>>,
) -> anyhow::Result<BTreeMap<ShardId, Offset>> {
    let mut options = SubscribeOptions::new(stream).start(StartAt::Latest).resume(false);
    if let Some(s) = shards {
        options = options.shards(s);
    }
    let probe = client.subscribe(options).await?;
    let ends = probe.positions().clone();
    anyhow::ensure!(
        probe.shards().iter().all(|s| ends.contains_key(s)),
        "--exit-at-end: the broker does not say where its shards end (SUBSCRIBE_POSITIONS)"
    );
    Ok(ends)
}

/// `--exit-at-end`: the shards not yet read up to their end as of the start, and that end.
struct AtEnd {
    ends: BTreeMap<ShardId, Offset>,
}

impl AtEnd {
    /// `ends`, less the shards that `starts` (the subscription's positions) puts at or past
    /// their end already.
    fn new(mut ends: BTreeMap<ShardId, Offset>, starts: &BTreeMap<ShardId, Offset>) -> Self {
        ends.retain(|s, end| starts.get(s).is_none_or(|start| start < end));
        AtEnd { ends }
    }

    /// Whether `r` is to be printed: it lies before its shard's end. A shard whose last
    /// record before the end is taken, or whose record lies at or past it, is done.
    fn take(&mut self, r: &ReceivedRecord) -> bool {
        let Some(end) = self.ends.get(&r.shard) else { return false };
        let print = r.offset < *end;
        if r.offset.0.saturating_add(1) >= end.0 {
            self.ends.remove(&r.shard);
        }
        print
    }

    /// Whether every shard is done.
    fn done(&self) -> bool {
        self.ends.is_empty()
    }
}

/// How a record becomes a line: the value, `key SEP value`, or a JSON object.
struct Format {
    /// `{"stream":"<stream>"` with `--json`.
    json: Option<Vec<u8>>,
    key_separator: Option<String>,
}

impl Format {
    fn new(args: &SubscribeArgs) -> Self {
        let json = args.json.then(|| {
            let mut prefix = b"{\"stream\":".to_vec();
            push_str(&mut prefix, &args.stream);
            prefix
        });
        Format { json, key_separator: args.key_separator.clone() }
    }

    /// Appends `r`'s line to `buf`.
    fn write(&self, r: &ReceivedRecord, buf: &mut Vec<u8>) {
        if let Some(prefix) = &self.json {
            buf.extend_from_slice(prefix);
            push_u64_field(buf, "shard", r.shard.0.into());
            push_u64_field(buf, "offset", r.offset.0);
            push_u64_field(buf, "timestamp_ms", r.timestamp_ms);
            push_bytes_field(buf, "key", r.key.as_deref());
            push_bytes_field(buf, "value", Some(&r.value));
            buf.extend_from_slice(b"}\n");
            return;
        }
        if let Some(sep) = &self.key_separator {
            let key = r.key.as_deref().unwrap_or(b"");
            buf.extend_from_slice(String::from_utf8_lossy(key).as_bytes());
            buf.extend_from_slice(sep.as_bytes());
        }
        buf.extend_from_slice(String::from_utf8_lossy(&r.value).as_bytes());
        buf.push(b'\n');
    }
}

/// Tells stderr, once each, when the subscription lost its broker and when it is back, as
/// `nats sub` does: `felix: connection lost: timed out; resuming the subscription`, then
/// `felix: subscription resumed after 2.4 s`. Each failed attempt in between is logged at
/// `FELIX_LOG=warn`; a resume that gives up is the command's error.
async fn report_resumes(mut state: tokio::sync::watch::Receiver<SubscriptionState>) {
    // Since when the broker is away, and the resumes before.
    let mut away: Option<(Instant, u64)> = None;
    let mut resumes = 0;
    while state.changed().await.is_ok() {
        let now = state.borrow_and_update().clone();
        match (now, away) {
            (SubscriptionState::Resuming { since, error, .. }, None) => {
                eprintln!("felix: {error}; resuming the subscription");
                away = Some((since, resumes));
            }
            (SubscriptionState::Reading { resumes: after }, Some((since, before))) => {
                if after > before {
                    let secs = since.elapsed().as_secs_f64();
                    eprintln!("felix: subscription resumed after {secs:.1} s");
                }
                (away, resumes) = (None, after);
            }
            (SubscriptionState::Reading { resumes: after }, None) => resumes = after,
            (SubscriptionState::Resuming { .. }, Some(_)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn record(shard: u32, offset: u64) -> ReceivedRecord {
        ReceivedRecord {
            shard: ShardId(shard),
            offset: Offset(offset),
            timestamp_ms: 1,
            key: None,
            value: Bytes::from_static(b"v"),
        }
    }

    #[test]
    fn at_end_stops_each_shard_at_its_end_as_of_the_start() {
        let ends = BTreeMap::from([(ShardId(0), Offset(2)), (ShardId(1), Offset(5))]);
        // Shard 1 starts at its end (nothing to read), shard 0 before it.
        let starts = BTreeMap::from([(ShardId(0), Offset(0)), (ShardId(1), Offset(5))]);
        let mut at = AtEnd::new(ends, &starts);
        assert!(!at.done());
        assert!(at.take(&record(0, 0)));
        assert!(!at.take(&record(1, 5)), "past shard 1's end");
        assert!(at.take(&record(0, 1)));
        assert!(at.done(), "shard 0's last record before its end was taken");
        assert!(!at.take(&record(0, 2)));
        // A record past the end (retention skipped the rest) ends the shard unprinted.
        let mut at = AtEnd::new(BTreeMap::from([(ShardId(3), Offset(4))]), &BTreeMap::new());
        assert!(!at.take(&record(3, 9)));
        assert!(at.done());
    }
}
