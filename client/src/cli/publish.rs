//! `felix publish`: each stdin line a record, the acks awaited in input order by a receipt
//! task, and a summary on stderr: `N sent, M acked, K failed`, naming the failed records by
//! line and key.
//!
//! Ctrl-C (the first): reading stops, the acks of what was sent are awaited for at most
//! [`PUBLISH_INTERRUPT_WAIT_MS`] (those still unconfirmed then count as failed), the summary
//! is printed, and the exit status is non-zero only if some record failed. The second Ctrl-C
//! exits at once (see `Interrupt`).

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite};
use tokio::sync::{mpsc, watch};

use super::output::{push_bytes_field, push_str, push_u64_field, LineOutput};
use super::{Interrupt, PublishArgs, PublishFailed};
use crate::config::ClientConfig;
use crate::{PublishTicket, Publisher, Record};

/// Tickets awaited by the receipt task before `publish` stops reading input.
const PUBLISH_PENDING_MAX: usize = 65_536;

/// How long `publish` waits, after the first Ctrl-C, for the acks of what it sent.
pub const PUBLISH_INTERRUPT_WAIT_MS: u64 = 5_000;

/// Failed records reported one by one on stderr, and named in the summary; the rest are
/// counted.
pub const PUBLISH_FAILURES_NAMED_MAX: usize = 10;

/// A record on its way: its input line number (from 1, blank lines counted), key and ticket.
type Pending = (u64, Option<Bytes>, PublishTicket);

/// What became of the records the receipt task awaited.
#[derive(Debug, Default)]
struct Tally {
    /// Acked with a position (not with `--ack none`).
    acked: u64,
    /// Failed, or unconfirmed when the wait after Ctrl-C ended.
    failed: u64,
    /// Of `failed`, those still unconfirmed then.
    unconfirmed: u64,
    /// The first [`PUBLISH_FAILURES_NAMED_MAX`] failed: line number and key.
    named: Vec<(u64, Option<Bytes>)>,
}

pub(super) async fn publish<R, W>(
    args: PublishArgs,
    config: ClientConfig,
    mut input: R,
    output: W,
    mut interrupt: Interrupt,
) -> anyhow::Result<()>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let settings = config.publish.clone();
    let client = interrupt.guard(super::connect(config)).await??;
    let publisher = interrupt.guard(client.publisher_with(&args.stream, settings)).await??;
    let (tx, rx) = mpsc::channel(PUBLISH_PENDING_MAX);
    let (give_up, give_up_rx) = watch::channel(false);
    let json = args.json.then(|| json_prefix(&args.stream));
    let mut receipts = tokio::spawn(await_receipts(rx, give_up_rx, json, LineOutput::new(output)));
    let mut line = Vec::new();
    let (mut sent, mut line_no) = (0u64, 0u64);
    let mut interrupted = false;
    loop {
        if interrupt.is_set() {
            interrupted = true;
            break;
        }
        line.clear();
        let step = read_and_send(&mut input, &mut line, &args, &publisher);
        let Some(step) = ready_or_interrupted(step, &mut interrupt).await else {
            interrupted = true;
            break;
        };
        let Some((lines, key, ticket)) = step? else { break };
        line_no += lines;
        sent += 1;
        if tx.send((line_no, key, ticket)).await.is_err() {
            break; // the receipt task failed: its error is returned below
        }
    }
    drop(tx);
    let mut settled = None;
    if !interrupted {
        tokio::select! {
            t = settle(&publisher, &mut receipts) => settled = Some(t?),
            () = interrupt.wait() => interrupted = true,
        }
    }
    let tally = match settled {
        Some(t) => t,
        None => {
            let wait = Duration::from_millis(PUBLISH_INTERRUPT_WAIT_MS);
            match tokio::time::timeout(wait, settle(&publisher, &mut receipts)).await {
                Ok(t) => t?,
                Err(_) => {
                    let _ = give_up.send(true);
                    receipts.await??
                }
            }
        }
    };
    tracing::info!(sent, acked = tally.acked, failed = tally.failed, stream = %args.stream, "published");
    client.close();
    let summary = summary(&args.stream, sent, &tally, interrupted);
    if tally.failed > 0 {
        return Err(PublishFailed(summary).into());
    }
    if !args.quiet || interrupted {
        eprintln!("felix: {summary}");
    }
    Ok(())
}

/// `step`'s output, or `None` once `interrupt` comes while it is not ready. Polled once
/// first, so that a ready step (the usual case when stdin is a pipe) costs no select.
async fn ready_or_interrupted<F: Future>(step: F, interrupt: &mut Interrupt) -> Option<F::Output> {
    tokio::pin!(step);
    if let Poll::Ready(v) = std::future::poll_fn(|cx| Poll::Ready(step.as_mut().poll(cx))).await {
        return Some(v);
    }
    interrupt.guard(step).await.ok()
}

/// Reads lines up to the next one that is not blank and sends it: how many lines were read,
/// its key and ticket; `None` at the end of input.
async fn read_and_send<R: AsyncBufRead + Unpin>(
    input: &mut R,
    line: &mut Vec<u8>,
    args: &PublishArgs,
    publisher: &Publisher,
) -> anyhow::Result<Option<(u64, Option<Bytes>, PublishTicket)>> {
    let mut lines = 0;
    loop {
        line.clear();
        if input.read_until(b'\n', line).await? == 0 {
            return Ok(None);
        }
        lines += 1;
        let text = trim_newline(line);
        if text.is_empty() {
            continue;
        }
        let record = match (&args.key, &args.key_separator) {
            (Some(k), _) => Record::keyed(k.clone().into_bytes(), text.to_vec()),
            (None, Some(sep)) => split_key(text, sep.as_bytes()),
            (None, None) => Record::unkeyed(text.to_vec()),
        };
        let key = record.key.clone();
        let ticket = publisher.send(record).await?;
        return Ok(Some((lines, key, ticket)));
    }
}

/// Sends what lingers and waits for the receipt task to see every ticket settled.
async fn settle(
    publisher: &Publisher,
    receipts: &mut tokio::task::JoinHandle<anyhow::Result<Tally>>,
) -> anyhow::Result<Tally> {
    publisher.flush().await?;
    receipts.await?
}

/// Awaits each ticket in input order, printing its JSON line (`json`: the line's prefix) and
/// reporting a failure on stderr, until the channel closes, or until `give_up`: then the
/// tickets not settled count as failed and unconfirmed.
async fn await_receipts<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Pending>,
    mut give_up: watch::Receiver<bool>,
    json: Option<Vec<u8>>,
    mut out: LineOutput<W>,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    while let Some((line, key, ticket)) = out.wait(rx.recv()).await? {
        let settled = out
            .wait(async {
                tokio::select! {
                    biased;
                    r = ticket => Some(r),
                    _ = give_up.wait_for(|g| *g) => None,
                }
            })
            .await?;
        let Some(result) = settled else {
            rx.close();
            let mut left = 1;
            while rx.recv().await.is_some() {
                left += 1;
            }
            tally.failed += left;
            tally.unconfirmed += left;
            break;
        };
        match result {
            Ok(receipt) => {
                tally.acked += u64::from(receipt.is_some());
                if let Some(prefix) = &json {
                    let buf = out.line().await?;
                    buf.extend_from_slice(prefix);
                    if let Some(r) = receipt {
                        push_u64_field(buf, "shard", r.shard.0.into());
                        push_u64_field(buf, "offset", r.offset.0);
                    }
                    push_bytes_field(buf, "key", key.as_deref());
                    buf.extend_from_slice(b"}\n");
                }
            }
            Err(e) => {
                tally.failed += 1;
                if tally.named.len() < PUBLISH_FAILURES_NAMED_MAX {
                    eprintln!("felix: line {line} ({}): {e}", key_text(key.as_deref()));
                    tally.named.push((line, key));
                }
            }
        }
    }
    out.flush().await?;
    Ok(tally)
}

/// `publish to S: N sent, M acked, K failed`, the failed records named by line and key.
fn summary(stream: &str, sent: u64, t: &Tally, interrupted: bool) -> String {
    let mut s = format!("publish to {stream}");
    if interrupted {
        s.push_str(" interrupted");
    }
    s.push_str(&format!(": {sent} sent, {} acked, {} failed", t.acked, t.failed));
    if t.unconfirmed > 0 {
        let wait_s = PUBLISH_INTERRUPT_WAIT_MS as f64 / 1000.0;
        s.push_str(&format!(" ({} unconfirmed after {wait_s} s)", t.unconfirmed));
    }
    if !t.named.is_empty() {
        let named: Vec<String> = t
            .named
            .iter()
            .map(|(line, key)| format!("line {line} ({})", key_text(key.as_deref())))
            .collect();
        s.push_str(&format!("; failed: {}", named.join(", ")));
        let more = t.failed - t.unconfirmed - t.named.len() as u64;
        if more > 0 {
            s.push_str(&format!(" and {more} more"));
        }
    }
    s
}

/// `key "k"` (lossy UTF-8, escaped), or `no key`.
fn key_text(key: Option<&[u8]>) -> String {
    match key {
        Some(k) => format!("key {:?}", String::from_utf8_lossy(k)),
        None => "no key".into(),
    }
}

/// `{"stream":"<stream>"`, the start of every JSON line.
fn json_prefix(stream: &str) -> Vec<u8> {
    let mut prefix = b"{\"stream\":".to_vec();
    push_str(&mut prefix, stream);
    prefix
}

fn trim_newline(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

fn split_key(line: &[u8], sep: &[u8]) -> Record {
    if !sep.is_empty() {
        if let Some(at) = line.windows(sep.len()).position(|w| w == sep) {
            return Record::keyed(line[..at].to_vec(), line[at + sep.len()..].to_vec());
        }
    }
    Record::unkeyed(line.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_split_at_the_first_separator() {
        let r = split_key(b"k1:v:1", b":");
        assert_eq!((r.key.as_deref(), &r.value.to_bytes()[..]), (Some(&b"k1"[..]), &b"v:1"[..]));
        assert_eq!(split_key(b"novalue", b":").key, None);
        assert_eq!(trim_newline(b"x\r\n"), b"x");
    }

    #[test]
    fn the_summary_names_failed_records_by_line_and_key() {
        let ok = Tally { acked: 3, ..Tally::default() };
        assert_eq!(summary("a/b/c", 3, &ok, false), "publish to a/b/c: 3 sent, 3 acked, 0 failed");
        let failed = Tally {
            acked: 1,
            failed: PUBLISH_FAILURES_NAMED_MAX as u64 + 4,
            unconfirmed: 2,
            named: (0..PUBLISH_FAILURES_NAMED_MAX as u64)
                .map(|i| (i + 2, (i == 0).then(|| Bytes::from_static(b"k\"1"))))
                .collect(),
        };
        let text = summary("a/b/c", 15, &failed, true);
        assert!(
            text.starts_with("publish to a/b/c interrupted: 15 sent, 1 acked, 14 failed (2 unconfirmed after 5 s); failed: line 2 (key \"k\\\"1\"), line 3 (no key)"),
            "{text}"
        );
        assert!(text.ends_with("line 11 (no key) and 2 more"), "{text}");
    }

    #[test]
    fn json_lines_start_with_the_escaped_stream() {
        let mut line = json_prefix("a/b/\"c");
        push_u64_field(&mut line, "offset", 7);
        line.push(b'}');
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v, serde_json::json!({ "stream": "a/b/\"c", "offset": 7 }));
    }
}
