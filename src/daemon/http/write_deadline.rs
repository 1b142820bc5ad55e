//! A socket whose writes may not stall longer than a deadline: hyper has a timeout for reading
//! a request head but none for a client that stops reading its response (a stuck scraper, a tap
//! left in a paused terminal). Without one, such a client would hold a connection slot forever.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner`, with every write, flush and shutdown failing `TimedOut` once it has made no
/// progress for `limit`.
pub(crate) struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// Armed when a write first returns `Pending`; cleared by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> WriteDeadline<S> {
    pub(crate) fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// Passes `result` on; a `Pending` arms the deadline, or fails once it has passed.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let limit = self.limit;
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no data for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, result)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, result)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let result = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_reader_that_stops_reading_fails_the_write_and_one_that_reads_does_not() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut socket = WriteDeadline::new(ours, Duration::from_millis(200));
        socket
            .write_all(&[0u8; 64])
            .await
            .expect("the buffer takes 64");
        let stalled = socket.write_all(&[0u8; 1]).await;
        assert_eq!(
            stalled.map_err(|e| e.kind()),
            Err(io::ErrorKind::TimedOut),
            "a write with no progress fails once the limit passes"
        );
        let mut drained = [0u8; 64];
        theirs.read_exact(&mut drained).await.expect("drain");
        // Progress clears the deadline: many limits' worth of slow but steady reading succeeds.
        let reader = tokio::spawn(async move {
            let mut total = 0;
            let mut chunk = [0u8; 64];
            while total < 64 * 8 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                total += theirs.read(&mut chunk).await.expect("read");
            }
        });
        socket
            .write_all(&[0u8; 64 * 8])
            .await
            .expect("a slow reader is served");
        reader.await.expect("reader");
    }
}
