//! One interface's logic, without threads: what a completion or a TAP frame does, the
//! NAPI budget, the ledger of work requests, the neighbour table, the counters and the
//! restart sequence as a state machine. Nothing here spawns a thread, sleeps or reads a
//! clock of its own: the clock comes in as `now` (or, to time an open or a teardown's
//! steps, as a [`Clock`] the caller passes).

pub mod aqm;
pub mod boost;
pub mod interface;
pub mod ledger;
pub mod napi;
pub mod neigh;
pub mod recovery;
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
