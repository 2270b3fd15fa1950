//! Tearing an interface down on the wall clock: the drain of flush completions is
//! polled here, bounded by a deadline and napping while none has arrived yet; the
//! interface ([`Interface::begin_close`], [`Closing`]) only polls when asked.

use std::time::{Duration, Instant};

use crate::iface::neigh::Neighbours;
use crate::iface::{Closed, Closing, DrainStep, Interface, KeptEndpoint};
use crate::tap::FrameIo;

/// How long a teardown sleeps when a drain poll finds no flush completion yet (rxe
/// generates them in the kernel after the QP went to error). Was 1 ms; a restart's
/// drain takes 2-4 ms in the lab, so a finer nap notices the flushes sooner.
pub const DRAIN_NAP: Duration = Duration::from_micros(200);

/// Poll the drain until nothing is outstanding, a poll fails, or `deadline` has passed
/// since `start`, napping [`DRAIN_NAP`] when a poll finds nothing.
pub fn drain(c: &mut Closing, tap: Option<&dyn FrameIo>, start: Instant, deadline: Duration) {
    while c.pending() && start.elapsed() < deadline {
        match c.drain_step(tap, Instant::now()) {
            DrainStep::Idle => std::thread::sleep(DRAIN_NAP),
            DrainStep::Progress => {}
            DrainStep::Done => break,
        }
    }
}

/// Tear `iface` down: QP to error, flushes drained for at most `deadline` (none after a
/// failed poll), then destroyed, or with `keep` its endpoint kept with a new QP and CQs
/// ([`Closing::finish`]), timed on the wall clock.
pub fn close_timed(
    iface: Interface,
    deadline: Duration,
    tap: Option<&dyn FrameIo>,
    keep: bool,
) -> (Closed, Neighbours, Option<KeptEndpoint>) {
    let start = Instant::now();
    let mut c = iface.begin_close();
    drain(&mut c, tap, start, deadline);
    let drained = start.elapsed();
    let (mut t, neigh, kept) = c.finish(tap, keep, Some(&Instant::now));
    t.drain = drained;
    (t, neigh, kept)
}

/// Closing an interface with its drain on the wall clock.
pub trait Close {
    /// Tear down in order: QP to error, drain flushes (bounded by `deadline`), detach
    /// the group, destroy AHs, destroy the endpoint, reap what never completed, check
    /// the ledger. Receives that complete during the drain have nowhere to go and are
    /// counted as dropped (`rx_teardown`): use [`Close::close_into`] where the TAP is
    /// still there. The neighbour table is handed back for the next epoch.
    fn close(self, deadline: Duration) -> (Closed, Neighbours);

    /// [`Close::close`], delivering the receives that complete during the drain to
    /// `tap`.
    fn close_into(self, deadline: Duration, tap: &dyn FrameIo) -> (Closed, Neighbours);

    /// Like [`Close::close_into`], but the endpoint is kept with a new QP and CQs and
    /// handed back for [`Interface::open_on`] (`None` if the renewal failed); see
    /// [`Closing::finish`]. After a failed poll there is no drain and the old QP is
    /// destroyed first. Not for a lost device.
    fn close_keeping(
        self,
        deadline: Duration,
        tap: &dyn FrameIo,
    ) -> (Closed, Neighbours, Option<KeptEndpoint>);
}

impl Close for Interface {
    fn close(self, deadline: Duration) -> (Closed, Neighbours) {
        let (t, neigh, _) = close_timed(self, deadline, None, false);
        (t, neigh)
    }

    fn close_into(self, deadline: Duration, tap: &dyn FrameIo) -> (Closed, Neighbours) {
        let (t, neigh, _) = close_timed(self, deadline, Some(tap), false);
        (t, neigh)
    }

    fn close_keeping(
        self,
        deadline: Duration,
        tap: &dyn FrameIo,
    ) -> (Closed, Neighbours, Option<KeptEndpoint>) {
        close_timed(self, deadline, Some(tap), true)
    }
}
