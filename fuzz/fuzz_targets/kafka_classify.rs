#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| triage_fuzz::kafka::run(data));
