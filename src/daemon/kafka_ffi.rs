//! What every call into librdkafka's C admin API needs, written once: a guard that destroys
//! each object librdkafka hands out on every path out, and the reading of the C strings it
//! owns. The callers (`log_identity`, `kafka_grants`) use the C API for the admin requests
//! rust-rdkafka does not wrap (DescribeTopics with topic IDs and authorized operations,
//! DescribeConsumerGroups).

#![allow(unsafe_code)] // the one Drop of a librdkafka object and the one C-string read; each says why it is sound

use std::ffi::CStr;
use std::os::raw::c_char;

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
