//! The real provider over libibverbs (rdma-sys).
#![allow(unsafe_code)]
