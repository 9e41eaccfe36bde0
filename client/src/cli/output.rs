//! The commands' stdout: lines gathered in one buffer and written in chunks, and the JSON they
//! print, written straight into that buffer.
//!
//! A record costs a `memcpy` into [`LineOutput`]'s buffer, not a `write` (the issue that made
//! `subscribe > file` print 60,000 records a second was one `write` and a few futex calls per
//! record). The buffer is written when it holds [`OUTPUT_BUFFER_BYTES`], when the command ends
//! or is interrupted ([`LineOutput::flush`]), and when its input pauses: [`LineOutput::wait`]
//! awaits the next record and flushes once none came for [`OUTPUT_IDLE_FLUSH_MS`], so that a
//! reader at the other end of a pipe sees a slow stream's records within a few milliseconds.

use std::future::Future;
use std::io::Write as _;
use std::task::Poll;
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Bytes gathered before they are written.
pub const OUTPUT_BUFFER_BYTES: usize = 128 * 1024;

/// How long [`LineOutput::wait`] waits for the next record, once none is ready, before it writes
/// what it holds.
pub const OUTPUT_IDLE_FLUSH_MS: u64 = 5;

/// Buffered line output on `W`. Call order: [`LineOutput::line`] for each line (its bytes
/// appended, newline included), [`LineOutput::wait`] around whatever brings the next line,
/// [`LineOutput::flush`] at the end.
pub struct LineOutput<W> {
    out: W,
    buf: Vec<u8>,
}

impl<W: AsyncWrite + Unpin> LineOutput<W> {
    /// Output on `out`, nothing buffered.
    pub fn new(out: W) -> Self {
        LineOutput { out, buf: Vec::with_capacity(OUTPUT_BUFFER_BYTES) }
    }

    /// The buffer to append one line to; written once it holds [`OUTPUT_BUFFER_BYTES`] (at the
    /// next [`LineOutput::line`], [`LineOutput::wait`] or [`LineOutput::flush`]).
    pub async fn line(&mut self) -> std::io::Result<&mut Vec<u8>> {
        if self.buf.len() >= OUTPUT_BUFFER_BYTES {
            self.write_buffered().await?;
        }
        Ok(&mut self.buf)
    }

    /// Awaits `next`. When it is not ready at once and lines are buffered, they are written
    /// after [`OUTPUT_IDLE_FLUSH_MS`] without it (or at once when the buffer is full).
    pub async fn wait<F: Future>(&mut self, next: F) -> std::io::Result<F::Output> {
        tokio::pin!(next);
        let first = std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await;
        if let Poll::Ready(v) = first {
            return Ok(v);
        }
        if self.buf.len() >= OUTPUT_BUFFER_BYTES {
            self.write_buffered().await?;
        }
        if !self.buf.is_empty() {
            let idle = tokio::time::sleep(Duration::from_millis(OUTPUT_IDLE_FLUSH_MS));
            tokio::select! {
                v = &mut next => return Ok(v),
                () = idle => self.flush().await?,
            }
        }
        Ok(next.await)
    }

    /// Writes what is buffered and flushes `W`.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        self.write_buffered().await?;
        self.out.flush().await
    }

    async fn write_buffered(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.out.write_all(&self.buf).await?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Appends `,"name":` and `v` as a JSON string when it is UTF-8, else `"name_b64":` and its
/// standard base64; `"name":null` when absent; after a comma (never the first field).
pub fn push_bytes_field(buf: &mut Vec<u8>, name: &str, v: Option<&[u8]>) {
    buf.push(b',');
    match v {
        None => {
            push_str(buf, name);
            buf.extend_from_slice(b":null");
        }
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => {
                push_str(buf, name);
                buf.push(b':');
                push_str(buf, s);
            }
            Err(_) => {
                push_str(buf, &format!("{name}_b64"));
                buf.push(b':');
                buf.push(b'"');
                let b64 = base64::engine::general_purpose::STANDARD.encode(b);
                buf.extend_from_slice(b64.as_bytes());
                buf.push(b'"');
            }
        },
    }
}

/// Appends `,"name":n`.
pub fn push_u64_field(buf: &mut Vec<u8>, name: &str, n: u64) {
    buf.push(b',');
    push_str(buf, name);
    // Writing to a Vec cannot fail.
    let _ = write!(buf, ":{n}");
}

/// Appends `s` as a JSON string, quoted and escaped.
pub fn push_str(buf: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *buf, s);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(fill: impl FnOnce(&mut Vec<u8>)) -> serde_json::Value {
        let mut buf = b"{\"stream\":\"a/b/c\"".to_vec();
        fill(&mut buf);
        buf.push(b'}');
        serde_json::from_slice(&buf).expect("valid JSON")
    }

    #[test]
    fn fields_are_valid_json_and_binary_goes_to_base64() {
        let v = object(|b| {
            push_u64_field(b, "offset", u64::MAX);
            push_bytes_field(b, "key", None);
            push_bytes_field(b, "value", Some(&[0xff, 0x00]));
            push_bytes_field(b, "text", Some("quote \" and \n newline ü".as_bytes()));
        });
        assert_eq!(
            v,
            serde_json::json!({
                "stream": "a/b/c", "offset": u64::MAX, "key": null, "value_b64": "/wA=",
                "text": "quote \" and \n newline ü",
            })
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lines_wait_in_the_buffer_until_the_input_pauses() {
        let (mut reader, writer) = tokio::io::duplex(1 << 20);
        let mut out = LineOutput::new(writer);
        out.line().await.unwrap().extend_from_slice(b"one\n");
        // Ready at once: nothing is written.
        assert_eq!(out.wait(async { 7 }).await.unwrap(), 7);
        let mut got = [0u8; 16];
        let nothing = tokio::time::timeout(
            Duration::from_millis(1),
            tokio::io::AsyncReadExt::read(&mut reader, &mut got),
        );
        assert!(nothing.await.is_err(), "written before the input paused");
        // A pause longer than the idle limit writes it.
        let later = tokio::time::sleep(Duration::from_millis(OUTPUT_IDLE_FLUSH_MS * 4));
        out.wait(later).await.unwrap();
        let n = tokio::io::AsyncReadExt::read(&mut reader, &mut got).await.unwrap();
        assert_eq!(&got[..n], b"one\n");
    }

    #[tokio::test]
    async fn a_full_buffer_is_written_before_the_next_line() {
        let mut out = LineOutput::new(Vec::new());
        for _ in 0..OUTPUT_BUFFER_BYTES / 4 {
            out.line().await.unwrap().extend_from_slice(b"abc\n");
        }
        assert_eq!(out.out.len(), 0, "not written before it is full");
        out.line().await.unwrap().extend_from_slice(b"abc\n");
        assert_eq!(out.out.len(), OUTPUT_BUFFER_BYTES, "full: written before the next line");
        out.flush().await.unwrap();
        assert_eq!(out.out.len(), OUTPUT_BUFFER_BYTES + 4);
        assert!(out.buf.is_empty());
    }
}
