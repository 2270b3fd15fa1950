//! What the fuzz targets share: splitting an input into records, a TAP double that does
//! what `uipoib::tap::Tap` does with offloads, checks of the offload codecs, a small
//! world of interfaces on the simulated fabric, and builders of real frames for the seed
//! corpus (`examples/seeds.rs`).
//!
//! Every check here panics on a broken invariant: a panic is how a fuzz target reports.

pub mod checks;
#[path = "../../tests/common/frames.rs"]
pub mod frames;
pub mod input;
pub mod tap;
pub mod world;
