//! Checks on triage's documentation, run by `cargo test -p triage-docs` (and the whole suite):
//! every Rust block of README.md and of the guide in `docs/` is compiled as a doctest of this
//! crate (blocks that need a broker are `no_run`), and `tests/config_reference.rs` holds the
//! configuration reference to the configuration structs. Nothing here is for use.

#![cfg_attr(doctest, doc = include_str!("../../README.md"))]
#![doc(test(attr(deny(warnings))))]

/// The guide's pages, compiled as doctests.
#[cfg(doctest)]
pub mod guide {
    #[doc = include_str!("../README.md")]
    pub struct Index;
    #[doc = include_str!("../concepts.md")]
    pub struct Concepts;
    #[doc = include_str!("../configuration.md")]
    pub struct Configuration;
    #[doc = include_str!("../operations.md")]
    pub struct Operations;
    #[doc = include_str!("../comparison.md")]
    pub struct Comparison;
    #[doc = include_str!("../reference.md")]
    pub struct Reference;
}
