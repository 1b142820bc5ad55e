//! Store calls in flight: the one place a delivery meets the store.
//!
//! A [`Runner`] holds every delivery whose store call is running (or waiting out its backoff) as
//! a future in one `FuturesUnordered`, polled by the front end's own loop: no task and no channel
//! round trip per delivery, and as many calls in flight as there are runnable lanes — on Redis
//! they share the multiplexed connection and are pipelined by it. Each future makes exactly one
//! attempt; what happens next (advance, retry, block) is the front end's decision through
//! [`crate::disposition`], so a retry is just another [`Runner::start`] with a delay.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};

use super::{apply_delivery, Delivery, DeliveryOutcome};
use crate::model::StoreError;
use crate::store::MailboxStore;

/// A finished attempt.
#[derive(Debug)]
pub struct Attempt<K> {
    /// The caller's key of the delivery (its partition, generation and place in the window).
    pub key: K,
    pub delivery: Arc<Delivery>,
    /// 0 for the first attempt.
    pub attempt: u32,
    /// `None` when the attempt was cancelled before it reached the store.
    pub result: Option<Result<DeliveryOutcome, StoreError>>,
    /// Time spent in the store call (not in the backoff before it).
    pub elapsed: Duration,
}

/// Cancels the not-yet-started attempts of one source (a revoked partition, a stopping replay):
/// an attempt still waiting out its backoff never reaches the store once cancelled. A call
/// already sent may still land; idempotent replay makes that harmless for the next owner.
#[derive(Debug, Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The store calls in flight.
pub struct Runner<K> {
    inflight: FuturesUnordered<BoxFuture<'static, Attempt<K>>>,
}

impl<K> Default for Runner<K> {
    fn default() -> Self {
        Self {
            inflight: FuturesUnordered::new(),
        }
    }
}

impl<K: Send + 'static> Runner<K> {
    /// Starts one attempt of `delivery` against `target` after `delay`.
    pub fn start(
        &mut self,
        key: K,
        target: Arc<dyn MailboxStore>,
        delivery: Arc<Delivery>,
        attempt: u32,
        delay: Duration,
        cancel: Cancel,
    ) {
        self.inflight.push(Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if cancel.is_cancelled() {
                return Attempt {
                    key,
                    delivery,
                    attempt,
                    result: None,
                    elapsed: Duration::ZERO,
                };
            }
            let started = Instant::now();
            let result = apply_delivery(target.as_ref(), &delivery).await;
            Attempt {
                key,
                delivery,
                attempt,
                result: Some(result),
                elapsed: started.elapsed(),
            }
        }));
    }

    /// The next finished attempt; pending forever while nothing is in flight (so it can sit in
    /// a `select!` next to the source).
    pub async fn next(&mut self) -> Attempt<K> {
        loop {
            match self.inflight.next().await {
                Some(attempt) => return attempt,
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// A finished attempt if one is ready now, without waiting.
    pub fn try_next(&mut self) -> Option<Attempt<K>> {
        use futures::FutureExt;
        self.inflight.next().now_or_never().flatten()
    }

    pub fn len(&self) -> usize {
        self.inflight.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inflight.is_empty()
    }
}
