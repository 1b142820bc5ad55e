//! Taking the repair fences (SPEC 7.1): a fence whose outcome is unknown is lifted again, a
//! fence held by another repair is explained (who holds it, and the safe ways on), and a fence
//! whose holder is provably gone can be taken over.

use crate::model::{StoreError, UserId};
use crate::store::repair::this_host;
use crate::store::{MailboxStore, RepairToken};

/// Takes the fence of `user` for `lease`. `take_over` names holders the operator asked to
/// replace: one of them holding the fence is lifted first, only when its process is provably
/// gone (this host, and no process of that pid). Err: the message for the summary, and whether
/// a rerun may succeed.
pub(super) async fn take(
    store: &dyn MailboxStore,
    user: &UserId,
    lease: std::time::Duration,
    take_over: &[String],
) -> Result<RepairToken, (String, bool)> {
    let mut taken_over = false;
    loop {
        let token = RepairToken::new(user.clone());
        match store.repair_fence(&token, lease).await {
            Ok(()) => return Ok(token),
            Err(StoreError::UnderRepair { holder }) => {
                if !taken_over && take_over.contains(&holder) {
                    provably_gone(&holder).map_err(|why| (why, false))?;
                    let dead = RepairToken {
                        user: user.clone(),
                        holder: holder.clone(),
                    };
                    store
                        .repair_abort(&dead)
                        .await
                        .map_err(|e| (format!("taking over the fence of {holder}: {e}"), true))?;
                    tracing::warn!(user = %user.as_str(), holder = %holder, "took over the fence of a repair whose process is gone");
                    taken_over = true;
                    continue;
                }
                return Err((held_by(user, &holder, lease), true));
            }
            Err(e) => {
                // A timeout may have left the fence up: lift it rather than leave the user's
                // writes waiting for a whole lease.
                if matches!(e, StoreError::Unavailable { .. }) {
                    if let Err(abort) = store.repair_abort(&token).await {
                        tracing::warn!(user = %user.as_str(), error = %abort, "a fence that may have been taken could not be lifted; it lapses with its lease");
                    }
                }
                let retryable = matches!(e, StoreError::Unavailable { .. });
                return Err((format!("fence of {}: {e}", user.as_str()), retryable));
            }
        }
    }
}

/// Why a rerun is refused while another repair's fence is up, and what to do.
fn held_by(user: &UserId, holder: &str, lease: std::time::Duration) -> String {
    let process = match RepairToken::holder_process(holder) {
        Some((host, pid)) if host == this_host() && !process_exists(pid) => format!(
            "its process {pid} on this host is gone, so it can be taken over safely: rerun with --take-over-fence {holder}"
        ),
        Some((host, pid)) => format!(
            "it was taken by process {pid} on host {host}; if that repair is still running, wait for it; if it was killed, its fence lapses within its lease (at most {} s after its last renewal), or rerun on {host} with --take-over-fence {holder} once the process is gone",
            lease.as_secs()
        ),
        None => format!(
            "if that repair was killed, its fence lapses within its lease (at most {} s after its last renewal)",
            lease.as_secs()
        ),
    };
    format!(
        "fence of {}: another repair ({holder}) holds the user's fence; {process}",
        user.as_str()
    )
}

/// What can be told of a fence holder's process from here (`materializer explain`): `Ok` with
/// the holder's state, and whether it can be taken over (its process on this host is gone).
pub(crate) fn holder_process_state(holder: &str) -> (String, bool) {
    match RepairToken::holder_process(holder) {
        Some((host, pid)) if host == this_host() => {
            if process_exists(pid) {
                (format!("its process {pid} on this host is running"), false)
            } else {
                (format!("its process {pid} on this host is gone"), true)
            }
        }
        Some((host, pid)) => (format!("it runs as process {pid} on host {host}"), false),
        None => ("its process cannot be told from its id".to_owned(), false),
    }
}

/// Ok when `holder` names a process of this host that no longer exists.
fn provably_gone(holder: &str) -> Result<(), String> {
    let Some((host, pid)) = RepairToken::holder_process(holder) else {
        return Err(format!(
            "--take-over-fence {holder}: not a holder id this version writes; wait for its lease to lapse"
        ));
    };
    if host != this_host() {
        return Err(format!(
            "--take-over-fence {holder}: its process ran on host {host}, not here, so this host cannot prove it gone; run the take-over on {host}, or wait for its lease to lapse"
        ));
    }
    if process_exists(pid) {
        return Err(format!(
            "--take-over-fence {holder}: its process {pid} is still running; wait for that repair to end"
        ));
    }
    Ok(())
}

fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RetentionPolicy;
    use crate::store::memory::MemoryStore;
    use crate::store::wrapper::Wrapper;
    use crate::store::SystemClock;
    use std::sync::Arc;

    /// A store whose fence call takes the fence and then times out: the outcome the caller
    /// sees is unknown although the fence is up.
    struct FenceThenTimeout(Arc<MemoryStore>);

    #[async_trait::async_trait]
    impl Wrapper for FenceThenTimeout {
        fn inner(&self) -> &dyn MailboxStore {
            self.0.as_ref()
        }
        async fn repair_fence(
            &self,
            token: &RepairToken,
            lease: std::time::Duration,
        ) -> Result<(), StoreError> {
            self.0.repair_fence(token, lease).await?;
            Err(StoreError::Unavailable {
                backend: "memory",
                detail: "timed out".to_owned(),
            })
        }
        async fn repair_abort(&self, token: &RepairToken) -> Result<(), StoreError> {
            self.0.repair_abort(token).await
        }
    }

    /// A fence whose outcome is unknown (the call timed out, the fence went up) is lifted again:
    /// the user's writes do not wait for a whole lease for a repair that gave up.
    #[tokio::test]
    async fn a_fence_of_unknown_outcome_is_lifted_again() {
        let inner = Arc::new(MemoryStore::new(
            RetentionPolicy::default(),
            Arc::new(SystemClock),
        ));
        let user = UserId::parse("u").expect("user");
        let lease = std::time::Duration::from_secs(60);
        let failed = take(&FenceThenTimeout(inner.clone()), &user, lease, &[]).await;
        assert!(matches!(failed, Err((_, true))), "{failed:?}");
        assert!(
            inner.repair_begin(&user, lease).await.is_ok(),
            "no fence is left behind"
        );
    }

    #[test]
    fn a_holder_names_its_host_and_process() {
        let token = RepairToken::new(UserId::parse("u").expect("user"));
        let (host, pid) = RepairToken::holder_process(&token.holder).expect("holder form");
        assert_eq!(host, this_host());
        assert_eq!(pid, std::process::id());
        assert_eq!(
            RepairToken::holder_process("repair-db-1.example-42-1a2b-7"),
            Some(("db-1.example", 42))
        );
        assert_eq!(RepairToken::holder_process("someone-else"), None);
        // A live holder on this host is not gone; a dead pid on this host is.
        assert!(provably_gone(&token.holder).is_err());
        let dead = format!("repair-{}-{}-0-0", this_host(), u32::MAX - 1);
        assert!(provably_gone(&dead).is_ok());
        assert!(provably_gone("repair-elsewhere-1-0-0").is_err() || this_host() == "elsewhere");
    }
}
