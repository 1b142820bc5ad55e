//! The daemon run inside the test process (`daemon::run` on a store the test holds), for tests
//! that reach into the store or its clock while the daemon consumes. It commits no offsets: the
//! stores these tests hold do not outlive the test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mailbox_materializer::config::Config;
use mailbox_materializer::daemon::http::Health;
use mailbox_materializer::daemon::{self, DaemonError, DaemonOptions, Progress, RunReport};
use mailbox_materializer::store::MailboxStore;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct InProcessDaemon {
    pub progress: Arc<Progress>,
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<RunReport, DaemonError>>,
}

impl InProcessDaemon {
    pub fn spawn(config: &Config, store: Arc<dyn MailboxStore>) -> Self {
        Self::spawn_with(config, store, Arc::new(Health::default()), None)
    }

    /// [`spawn`](Self::spawn) with the health the daemon reports to and a hook on its
    /// dead-letter producer.
    pub fn spawn_with(
        config: &Config,
        store: Arc<dyn MailboxStore>,
        health: Arc<Health>,
        on_producer: Option<daemon::ProducerHook>,
    ) -> Self {
        let progress = Arc::new(Progress::default());
        let (stop, shutdown) = watch::channel(false);
        let options = DaemonOptions {
            shutdown,
            progress: progress.clone(),
            health,
            commit_offsets: false,
            mock_log: None,
            on_producer,
        };
        let config = config.clone();
        let task = tokio::spawn(async move { daemon::run(&config, store, options).await });
        Self {
            progress,
            stop,
            task,
        }
    }

    /// Waits until `n` records are final; fails the test after `within`.
    pub async fn wait_final(&self, n: u64, within: Duration) {
        let deadline = Instant::now() + within;
        while self.progress.snapshot().final_records < n {
            assert!(
                Instant::now() < deadline,
                "{n} records final within {within:?}: {:?}",
                self.progress.snapshot()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the daemon to end by itself (without a stop), at most `within`.
    pub async fn wait_end(self, within: Duration) -> Result<RunReport, DaemonError> {
        tokio::time::timeout(within, self.task)
            .await
            .expect("the daemon ends by itself")
            .expect("daemon task")
    }

    /// Drains and stops it (as SIGTERM does) and requires a clean exit.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.expect("daemon task").expect("daemon");
    }
}
