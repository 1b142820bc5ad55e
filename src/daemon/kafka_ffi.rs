//! What every call into librdkafka's C admin API needs, written once: a guard that destroys
//! each object librdkafka hands out on every path out, the reading of the C strings it owns,
//! the request's options and its one answer, and DescribeTopics itself. The callers (`log_identity`, `kafka_grants`) use the C API for the admin requests
//! rust-rdkafka does not wrap (DescribeTopics with topic IDs and authorized operations,
//! DescribeConsumerGroups).

#![allow(unsafe_code)] // the C admin API's objects, strings and the one DescribeTopics; each unsafe block says why it is sound

use std::ffi::CStr;
use std::os::raw::c_char;

use rdkafka::bindings as rd;

/// Owns one librdkafka object and destroys it on every path out.
pub(crate) struct Owned<T> {
    pub ptr: *mut T,
    pub destroy: unsafe extern "C" fn(*mut T),
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: `ptr` came from the librdkafka constructor paired with `destroy` and is
            // destroyed exactly once, here.
            unsafe { (self.destroy)(self.ptr) }
        }
    }
}

/// Text of a C string librdkafka owns (empty for null).
///
/// # Safety
/// `ptr` is null or a NUL-terminated string valid for the call.
pub(crate) unsafe fn text(ptr: *const c_char) -> String {
    if ptr.is_null() {
        String::new()
    } else {
        CStr::from_ptr(ptr).to_string_lossy().into_owned()
    }
}

/// The log start offset of `topic`'s `partition` as the last fetch response reported it
/// (librdkafka caches it per partition from every FetchResponse), without asking the broker;
/// `None` before the first fetch. The records-lost check reads it for the fetch that brought the
/// record it judges, so it is as fresh as that record.
pub(crate) fn cached_log_start<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let name = std::ffi::CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the handle is the client's live one; the topic name is a valid C string for the
    // call; librdkafka only reads its cached offsets under its own lock and writes the two i64s.
    let code = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            client.native_ptr(),
            name.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (code == rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR && low >= 0)
        .then_some(low)
}

/// Why an admin request got no answer to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AdminError {
    /// No answer within the request's time-out.
    TimedOut,
    /// The request could not be built, or the whole answer is an error: what it said.
    Failed(String),
}

/// One topic as DescribeTopics answered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicDescribed {
    pub name: String,
    /// The topic's own error: its name (`TOPIC_AUTHORIZATION_FAILED`, ...) and text.
    pub error: Option<(String, String)>,
    /// The topic ID as base64 text; `None` for the zero UUID (a broker without topic IDs).
    pub id: Option<String>,
    /// The operations the principal may perform, as the C enum's integer values (a value a
    /// later broker adds is only an unknown number); `None` when not asked for or not reported.
    pub operations: Option<Vec<u32>>,
}

/// Admin options of `op` with the request timeout, and the authorized operations asked for
/// when `authorized_operations`.
///
/// # Safety
/// `rk` is a live client handle.
pub(crate) unsafe fn options(
    rk: *mut rd::rd_kafka_t,
    op: rd::rd_kafka_admin_op_t,
    timeout_ms: i32,
    authorized_operations: bool,
) -> Result<Owned<rd::rd_kafka_AdminOptions_t>, AdminError> {
    let options = Owned {
        ptr: rd::rd_kafka_AdminOptions_new(rk, op),
        destroy: rd::rd_kafka_AdminOptions_destroy,
    };
    if options.ptr.is_null() {
        return Err(AdminError::Failed(
            "librdkafka could not build the request".to_owned(),
        ));
    }
    let mut errstr = [0 as c_char; 256];
    rd::rd_kafka_AdminOptions_set_request_timeout(
        options.ptr,
        timeout_ms,
        errstr.as_mut_ptr(),
        errstr.len(),
    );
    if authorized_operations {
        let error = Owned {
            ptr: rd::rd_kafka_AdminOptions_set_include_authorized_operations(options.ptr, 1),
            destroy: rd::rd_kafka_error_destroy,
        };
        if !error.ptr.is_null() {
            return Err(AdminError::Failed(format!(
                "librdkafka refused to ask for authorized operations: {}",
                text(rd::rd_kafka_error_string(error.ptr))
            )));
        }
    }
    Ok(options)
}

/// Waits for the request's one event on `queue`: a time-out when none came or the answer is
/// librdkafka's own time-out, `Failed` when it carries an error for the whole request.
///
/// # Safety
/// `queue` is a live queue of a live client.
pub(crate) unsafe fn wait(
    queue: *mut rd::rd_kafka_queue_t,
    timeout_ms: i32,
) -> Result<Owned<rd::rd_kafka_event_t>, AdminError> {
    // The request times out on its own after `timeout`; wait a little longer for its answer.
    let event = Owned {
        ptr: rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1_000)),
        destroy: rd::rd_kafka_event_destroy,
    };
    if event.ptr.is_null() {
        return Err(AdminError::TimedOut);
    }
    match rd::rd_kafka_event_error(event.ptr) {
        rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR => Ok(event),
        rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__TIMED_OUT => Err(AdminError::TimedOut),
        _ => Err(AdminError::Failed(text(rd::rd_kafka_event_error_string(
            event.ptr,
        )))),
    }
}

/// A resource's own error as (name, text); `None` for no error.
///
/// # Safety
/// `error` is null or an `rd_kafka_error_t` valid for the call.
pub(crate) unsafe fn resource_error(
    error: *const rd::rd_kafka_error_t,
) -> Option<(String, String)> {
    if error.is_null() {
        return None;
    }
    let name = text(rd::rd_kafka_error_name(error));
    if name.is_empty() || name == "NO_ERROR" {
        return None;
    }
    Some((name, text(rd::rd_kafka_error_string(error))))
}

/// The operations of a list librdkafka returned, as integers (`ops` null: none reported).
///
/// # Safety
/// `ops` is null or points to `count` values of `rd_kafka_AclOperation_t` valid for the call.
pub(crate) unsafe fn operation_values(
    ops: *const rd::rd_kafka_AclOperation_t,
    count: usize,
) -> Option<Vec<u32>> {
    if ops.is_null() {
        return None;
    }
    // Read as the C enum's integers: a value this build does not know stays a number, never a
    // Rust enum out of range.
    Some(std::slice::from_raw_parts(ops.cast::<u32>(), count).to_vec())
}

/// DescribeTopics of `topics` on the client's own handle, with a queue of its own, bounded by
/// `timeout`: the one call behind the log's identity (`log_identity`: the topic ID) and the ACL
/// check (`kafka_grants`: the authorized operations). Blocks. Answers in the broker's order.
pub(crate) fn describe_topics<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topics: &[&str],
    timeout: std::time::Duration,
    authorized_operations: bool,
) -> Result<Vec<TopicDescribed>, AdminError> {
    let names = topics
        .iter()
        .map(|t| {
            std::ffi::CString::new(*t)
                .map_err(|_| AdminError::Failed(format!("the topic name {t:?} holds a NUL")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = client.native_ptr();
    // SAFETY: every pointer below comes from librdkafka for the client's live handle `rk` (or
    // from `names`, alive until the end), is checked for null before use, and is destroyed by
    // its `Owned` guard after the last use; the descriptions belong to the event and are read
    // before it is destroyed.
    unsafe {
        let queue = Owned {
            ptr: rd::rd_kafka_queue_new(rk),
            destroy: rd::rd_kafka_queue_destroy,
        };
        let collection = Owned {
            ptr: rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len()),
            destroy: rd::rd_kafka_TopicCollection_destroy,
        };
        if queue.ptr.is_null() || collection.ptr.is_null() {
            return Err(AdminError::Failed(
                "librdkafka could not build the request".to_owned(),
            ));
        }
        let options = options(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            timeout_ms,
            authorized_operations,
        )?;
        rd::rd_kafka_DescribeTopics(rk, collection.ptr, options.ptr, queue.ptr);
        let event = wait(queue.ptr, timeout_ms)?;
        let result = rd::rd_kafka_event_DescribeTopics_result(event.ptr);
        if result.is_null() {
            return Err(AdminError::Failed(
                "the answer is not a DescribeTopics result".to_owned(),
            ));
        }
        let mut count = 0usize;
        let described = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut answers = Vec::with_capacity(count);
        for i in 0..count {
            let description = *described.add(i);
            if description.is_null() {
                continue;
            }
            let error = resource_error(rd::rd_kafka_TopicDescription_error(description));
            let id = rd::rd_kafka_TopicDescription_topic_id(description);
            let id = (!id.is_null()
                && (rd::rd_kafka_Uuid_most_significant_bits(id) != 0
                    || rd::rd_kafka_Uuid_least_significant_bits(id) != 0))
                .then(|| text(rd::rd_kafka_Uuid_base64str(id)))
                .filter(|id| !id.is_empty());
            let operations = if authorized_operations && error.is_none() {
                let mut n = 0usize;
                let ops = rd::rd_kafka_TopicDescription_authorized_operations(description, &mut n);
                operation_values(ops, n)
            } else {
                None
            };
            answers.push(TopicDescribed {
                name: text(rd::rd_kafka_TopicDescription_name(description)),
                error,
                id,
                operations,
            });
        }
        Ok(answers)
    }
}
