//! The project's own libibverbs binding, loaded at run time (as NCCL's `ibvwrap` and PyTorch's
//! tensorpipe do): [`library`] opens `libibverbs.so.1` with `dlopen` and resolves the functions
//! the verbs layer calls; [`types`] holds `#[repr(C)]` copies of just the structs used. So
//! `cargo build` needs no rdma-core headers, cmake or libclang, and one binary runs on machines
//! with and without RDMA.
//!
//! Public (but hidden from the docs) only so the layout test can compare every declaration with
//! the real `<infiniband/verbs.h>`; use the safe layer in [`crate::verbs`] instead.

pub mod library;
pub mod types;

pub use library::{available, ibverbs, Ibverbs, LoadError, IBVERBS_LIB_ENV, IBVERBS_SONAME};
