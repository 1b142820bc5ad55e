//! Readiness probes: the store answers a ping and the broker answers a metadata request, every
//! two seconds. `/readyz` (and `materializer_ready`) turn false while either fails, and while the
//! engine reports any of the other conditions `Health` holds: a stalled partition (or a consumer
//! that failed fatally), dead letters that keep failing (or a dead-letter producer that failed
//! fatally), and a transient store write failure in the last few seconds (a store that answers
//! pings but refuses writes).

use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::http::Health;
use super::kafka::DaemonContext;
use crate::store::MailboxStore;

/// How often the probes run, and how long each may take.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// Runs the probes until aborted.
pub fn spawn(
    store: Arc<dyn MailboxStore>,
    consumer: Arc<BaseConsumer<DaemonContext>>,
    topic: String,
    health: Arc<Health>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let store_ok = matches!(
                tokio::time::timeout(PROBE_INTERVAL, store.ping()).await,
                Ok(Ok(()))
            );
            if store_ok != health.store_ok() {
                tracing::info!(store_ok, "store readiness changed");
            }
            health.set_store(store_ok);
            let consumer = consumer.clone();
            let topic = topic.clone();
            let broker_ok = tokio::task::spawn_blocking(move || {
                consumer
                    .fetch_metadata(Some(&topic), PROBE_INTERVAL)
                    .is_ok()
            })
            .await
            .unwrap_or(false);
            if broker_ok != health.broker_ok() {
                tracing::info!(broker_ok, "broker readiness changed");
            }
            health.set_broker(broker_ok);
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    })
}
