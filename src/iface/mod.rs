//! One interface's logic, without threads: what a completion or a TAP frame does, the
//! NAPI budget, the ledger of work requests, the neighbour table and the counters.
//! Nothing here spawns a thread; the clock comes in as `now`.

pub mod interface;
pub mod ledger;
pub mod napi;
pub mod neigh;
pub mod stats;

pub use interface::*;

/// The TAP counts its offload work in the interface's counters.
impl crate::tap::OffloadCounters for stats::Stats {
    fn segmented(&self, frames: u64, segments: u64) {
        stats::add(&self.tso_frames, frames);
        stats::add(&self.tso_segments, segments);
    }
    fn coalesced(&self, frames: u64, segments: u64) {
        stats::add(&self.gro_frames, frames);
        stats::add(&self.gro_segments, segments);
    }
}
