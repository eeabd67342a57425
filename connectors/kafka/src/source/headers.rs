//! Reading a record's headers without trusting their names to be UTF-8.
//!
//! rdkafka's `Headers::try_get` unwraps the header name as UTF-8 and would panic on a name
//! written by a non-Java producer; the source must never panic on input, so it reads the
//! headers through librdkafka directly and converts names lossily.

use std::ffi::CStr;
use std::ptr;

use rdkafka::message::BorrowedMessage;
use rdkafka_sys as rdsys;

/// The record's headers in order, duplicates kept, names converted lossily.
pub(crate) fn read_headers(msg: &BorrowedMessage<'_>) -> Vec<(String, Option<Vec<u8>>)> {
    let mut headers: *mut rdsys::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: `msg.ptr()` is a live message for the borrow of `msg`; librdkafka parses the
    // headers into storage owned by the message and only writes the out pointer.
    let err = unsafe { rdsys::rd_kafka_message_headers(msg.ptr(), &mut headers) };
    if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || headers.is_null() {
        return Vec::new();
    }
    // SAFETY: `headers` is non-null and owned by the message, alive for this borrow.
    let count = unsafe { rdsys::rd_kafka_header_cnt(headers) };
    let mut out = Vec::with_capacity(count);
    for idx in 0..count {
        let mut name: *const std::os::raw::c_char = ptr::null();
        let mut value: *const std::os::raw::c_void = ptr::null();
        let mut size: usize = 0;
        // SAFETY: `idx < count`; the out pointers are valid locals.
        let err = unsafe {
            rdsys::rd_kafka_header_get_all(headers, idx, &mut name, &mut value, &mut size)
        };
        if err != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
            continue;
        }
        // SAFETY: librdkafka stores names NUL-terminated; both pointers live as long as the
        // message, and `value` points at `size` bytes when non-null.
        let (name, value) = unsafe {
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let value = (!value.is_null())
                .then(|| std::slice::from_raw_parts(value.cast::<u8>(), size).to_vec());
            (name, value)
        };
        out.push((name, value));
    }
    out
}
