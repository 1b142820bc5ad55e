//! The command that repairs a mailbox, as `explain` and `verify` print it.

use crate::config::Config;
use crate::model::UserId;

/// The repair: the user's whole retained history on its partition, rebuilt and swapped in.
pub(super) fn repair_command(config: &Config, user: &UserId, partition: Option<i32>) -> String {
    // The oldest day retention can still hold starts `days + 1` days before today's start.
    let now_s = chrono::Utc::now().timestamp();
    let day = now_s.div_euclid(86_400) - i64::from(config.retention.days) - 1;
    let from = chrono::DateTime::from_timestamp(day * 86_400, 0)
        .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "<start of retention>".to_owned());
    let partition = partition.map_or_else(
        || "<P: the partition of the user's records>".to_owned(),
        |p| p.to_string(),
    );
    format!(
        "materializer replay --partition {partition} --from-time {from} --user {} --reset-mailboxes",
        user.as_str()
    )
}
