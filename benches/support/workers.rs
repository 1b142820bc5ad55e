//! Many operations in flight from one bench process, the way the store's callers issue them.

use std::sync::Arc;

/// Runs `job(i)` for every `i` in `0..total` on `in_flight` tasks: task `w` runs `w`,
/// `w + in_flight`, ... in that order, so whatever one index stands for (a user, a mailbox)
/// keeps its calls in order while the tasks overlap.
pub async fn striped<F, Fut>(total: u64, in_flight: u64, job: F)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let job = Arc::new(job);
    let mut tasks = Vec::new();
    for worker in 0..in_flight.min(total) {
        let job = job.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while i < total {
                job(i).await;
                i += in_flight;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
}
