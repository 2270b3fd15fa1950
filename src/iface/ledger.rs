//! The work-request ledger: every receive and send slot is in exactly one state, and
//! every work request posted is accounted for.
//!
//! A slot is `Free`, `Reserved` (being filled, not yet posted) or `Posted`. A work-request
//! id carries its kind, the interface's epoch, its slot and the slot's generation (bumped
//! each time the slot is reserved), so a completion can be checked against the CQ it came
//! from and the very posting it names: a send id on the receive CQ, an id of an earlier
//! epoch or of an earlier use of the slot is rejected and counted, and never indexes a
//! buffer. Conservation holds at every instant, per ring:
//! `posted = completed + flushed + reaped + outstanding`, and `outstanding` equals the
//! number of slots in the `Posted` state. [`Ledger::check`] verifies it; tests call it
//! after every step.
//!
//! Pure bookkeeping: no verbs, no I/O, no clock.

use std::time::Instant;

use crate::verbs::{AhHandle, WcStatus};

/// Bit 63 of a WR id: set for sends (the kernel's IPoIB marks receives with a bit too).
const SEND_BIT: u64 = 1 << 63;

/// Bits 48..63 of a WR id: the slot's generation.
const GEN_SHIFT: u32 = 48;

/// Generations wrap within 15 bits.
const GEN_MASK: u16 = 0x7FFF;

/// Which ring a work request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ring {
    /// Receive ring.
    Recv,
    /// Send ring.
    Send,
}

/// Decoded work-request id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WrId {
    /// Ring.
    pub ring: Ring,
    /// Epoch of the interface that posted it.
    pub epoch: u16,
    /// Slot index.
    pub slot: u32,
    /// The slot's generation when it was posted (15 bits, wrapping).
    pub generation: u16,
}

impl WrId {
    /// Encode as the 64-bit id handed to the provider.
    pub fn encode(self) -> u64 {
        let kind = if self.ring == Ring::Send { SEND_BIT } else { 0 };
        kind | (u64::from(self.generation & GEN_MASK) << GEN_SHIFT)
            | (u64::from(self.epoch) << 32)
            | u64::from(self.slot)
    }

    /// Decode a provider's id. Every 64-bit value decodes; whether it names a posting is
    /// for [`Ledger::complete`] to say.
    pub fn decode(id: u64) -> WrId {
        WrId {
            ring: if id & SEND_BIT != 0 {
                Ring::Send
            } else {
                Ring::Recv
            },
            generation: ((id >> GEN_SHIFT) as u16) & GEN_MASK,
            epoch: ((id >> 32) & 0xFFFF) as u16,
            slot: id as u32,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Reserved,
    Posted,
}

/// What a send slot carried, kept while it is posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SendMeta {
    /// The address handle the send used (its in-flight count is released on completion).
    pub ah: Option<AhHandle>,
    /// Payload bytes (IPoIB header excluded).
    pub bytes: u32,
    /// Whether it was an ARP message.
    pub arp: bool,
    /// When it was posted (given by the caller; the send-stall watchdog reads it).
    pub posted_at: Option<Instant>,
}

/// Per-ring totals.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RingTotals {
    /// Work requests posted.
    pub posted: u64,
    /// Completed with success or an error status.
    pub completed: u64,
    /// Completed as flushed.
    pub flushed: u64,
    /// Reaped without a completion (after a teardown).
    pub reaped: u64,
    /// Posted and not yet completed.
    pub outstanding: u64,
}

impl RingTotals {
    /// `posted == completed + flushed + reaped + outstanding`.
    pub fn balanced(&self) -> bool {
        self.posted == self.completed + self.flushed + self.reaped + self.outstanding
    }
}

struct SlotRing {
    /// The number of its first slot (a bank of slots starts there; slot numbers are the
    /// endpoint's, indexes into the vectors below are `slot - base`).
    base: u32,
    state: Vec<SlotState>,
    /// Per slot: bumped at every reservation, carried in the WR id.
    generation: Vec<u16>,
    /// Per slot: the number of its posting, counted from 1 in posting order.
    posted_seq: Vec<u64>,
    /// The number the next posting gets.
    next_seq: u64,
    /// The highest posting number completed (0: none yet).
    done_seq: u64,
    free: Vec<u32>,
    totals: RingTotals,
}

impl SlotRing {
    fn new(base: u32, n: u32) -> Self {
        SlotRing {
            base,
            state: vec![SlotState::Free; n as usize],
            generation: vec![0; n as usize],
            posted_seq: vec![0; n as usize],
            next_seq: 1,
            done_seq: 0,
            // Pop from the end: hand out low slots first.
            free: (0..n).rev().collect(),
            totals: RingTotals::default(),
        }
    }

    /// The index of slot number `slot`, if it is one of this ring's.
    fn index(&self, slot: u32) -> Option<usize> {
        let i = slot.checked_sub(self.base)? as usize;
        (i < self.state.len()).then_some(i)
    }

    /// The generation of slot number `slot` (0 for a slot not of this ring).
    fn generation_of(&self, slot: u32) -> u16 {
        self.index(slot).map_or(0, |i| self.generation[i])
    }

    /// A free slot's number, reserved.
    fn reserve(&mut self) -> Option<u32> {
        let i = self.free.pop()?;
        self.state[i as usize] = SlotState::Reserved;
        let g = &mut self.generation[i as usize];
        *g = g.wrapping_add(1) & GEN_MASK;
        Some(self.base + i)
    }

    fn release(&mut self, slot: u32) {
        if let Some(i) = self.index(slot)
            && self.state[i] == SlotState::Reserved
        {
            self.state[i] = SlotState::Free;
            self.free.push(i as u32);
        }
    }

    fn commit(&mut self, slot: u32) -> bool {
        let Some(i) = self.index(slot) else {
            return false;
        };
        match &mut self.state[i] {
            st @ SlotState::Reserved => {
                *st = SlotState::Posted;
                self.posted_seq[i] = self.next_seq;
                self.next_seq += 1;
                self.totals.posted += 1;
                self.totals.outstanding += 1;
                true
            }
            _ => false,
        }
    }

    fn finish(&mut self, slot: u32, flushed: bool) -> bool {
        let Some(i) = self.index(slot) else {
            return false;
        };
        match &mut self.state[i] {
            st @ SlotState::Posted => {
                *st = SlotState::Free;
                self.free.push(i as u32);
                self.done_seq = self.done_seq.max(self.posted_seq[i]);
                self.totals.outstanding -= 1;
                if flushed {
                    self.totals.flushed += 1;
                } else {
                    self.totals.completed += 1;
                }
                true
            }
            _ => false,
        }
    }
}

/// A completion the ledger accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The decoded id.
    pub id: WrId,
    /// For sends: what the slot carried.
    pub send: Option<SendMeta>,
}

/// Why a completion was not accepted. Each is counted; none is delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// The id does not decode or names a slot out of range.
    #[error("completion with unknown work-request id {0:#x}")]
    UnknownId(u64),
    /// The id is from an earlier epoch (posted before a restart).
    #[error("completion from stale epoch {got} (now {now})")]
    StaleEpoch {
        /// Epoch in the id.
        got: u16,
        /// Current epoch.
        now: u16,
    },
    /// The id names the other ring than the CQ it came from (a send id on the receive
    /// CQ, or a receive id on the send CQ).
    #[error("completion on the {cq:?} CQ with a {named:?} work-request id {id:#x}")]
    WrongCq {
        /// The CQ it came from.
        cq: Ring,
        /// The ring its id names.
        named: Ring,
        /// The id.
        id: u64,
    },
    /// The id names an earlier use of the slot (a completion delivered twice, or one
    /// for a posting that was already reaped or flushed).
    #[error("completion for slot {slot} of generation {got}, posted now as generation {now}")]
    StaleGeneration {
        /// The slot.
        slot: u32,
        /// Generation in the id.
        got: u16,
        /// The slot's generation now.
        now: u16,
    },
    /// The slot was not posted (a duplicate completion).
    #[error("completion for slot {0} that is not posted")]
    NotPosted(u32),
}

/// The ledger for one interface epoch.
pub struct Ledger {
    epoch: u16,
    recv: SlotRing,
    send: SlotRing,
    send_meta: Vec<SendMeta>,
    rejected: u64,
}

impl Ledger {
    /// A ledger for rings of these sizes, every slot free.
    pub fn new(epoch: u16, recv_slots: u32, send_slots: u32) -> Self {
        Self::in_bank(epoch, recv_slots, send_slots, 0)
    }

    /// A ledger for rings of these sizes on bank `bank` of the endpoint's slots (see
    /// [`crate::verbs::EndpointAttrs::banks`]): its receive slots are numbered from
    /// `bank * recv_slots`, its send slots from `bank * send_slots`. A completion naming
    /// a slot of another bank is rejected as an unknown id.
    pub fn in_bank(epoch: u16, recv_slots: u32, send_slots: u32, bank: u32) -> Self {
        Ledger {
            epoch,
            recv: SlotRing::new(bank.saturating_mul(recv_slots), recv_slots),
            send: SlotRing::new(bank.saturating_mul(send_slots), send_slots),
            send_meta: vec![SendMeta::default(); send_slots as usize],
            rejected: 0,
        }
    }

    /// The epoch stamped on new work requests.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// Take a free receive slot to post.
    pub fn reserve_recv(&mut self) -> Option<u32> {
        self.recv.reserve()
    }

    /// Take a free send slot to fill.
    pub fn reserve_send(&mut self) -> Option<u32> {
        self.send.reserve()
    }

    /// Free send slots.
    pub fn free_send(&self) -> usize {
        self.send.free.len()
    }

    /// Free receive slots.
    pub fn free_recv(&self) -> usize {
        self.recv.free.len()
    }

    /// Give back a reserved slot that was not posted.
    pub fn release(&mut self, ring: Ring, slot: u32) {
        match ring {
            Ring::Recv => self.recv.release(slot),
            Ring::Send => self.send.release(slot),
        }
    }

    /// The id a reserved slot is posted with (its generation is the one its reservation
    /// gave it).
    pub fn wr_id(&self, ring: Ring, slot: u32) -> u64 {
        let r = match ring {
            Ring::Recv => &self.recv,
            Ring::Send => &self.send,
        };
        WrId {
            ring,
            epoch: self.epoch,
            slot,
            generation: r.generation_of(slot),
        }
        .encode()
    }

    /// Record that a reserved receive slot was posted.
    pub fn posted_recv(&mut self, slot: u32) {
        let ok = self.recv.commit(slot);
        debug_assert!(ok, "recv slot {slot} was not reserved");
    }

    /// Record that a reserved send slot was posted carrying `meta`.
    pub fn posted_send(&mut self, slot: u32, meta: SendMeta) {
        if self.send.commit(slot)
            && let Some(i) = self.send.index(slot)
        {
            self.send_meta[i] = meta;
        } else {
            debug_assert!(false, "send slot {slot} was not reserved");
        }
    }

    /// Account for one completion that came from the `cq` ring's completion queue.
    /// Anything not matching a posted slot of this epoch, of that ring and of the slot's
    /// current generation is rejected (and counted), so it is never delivered.
    pub fn complete(
        &mut self,
        cq: Ring,
        wr_id: u64,
        status: WcStatus,
    ) -> Result<Accepted, Rejected> {
        let r = self.complete_inner(cq, wr_id, status);
        if r.is_err() {
            self.rejected += 1;
        }
        r
    }

    fn complete_inner(
        &mut self,
        cq: Ring,
        wr_id: u64,
        status: WcStatus,
    ) -> Result<Accepted, Rejected> {
        let id = WrId::decode(wr_id);
        if id.ring != cq {
            return Err(Rejected::WrongCq {
                cq,
                named: id.ring,
                id: wr_id,
            });
        }
        if id.epoch != self.epoch {
            return Err(Rejected::StaleEpoch {
                got: id.epoch,
                now: self.epoch,
            });
        }
        let flushed = status == WcStatus::Flushed;
        let ring = match id.ring {
            Ring::Recv => &mut self.recv,
            Ring::Send => &mut self.send,
        };
        let Some(index) = ring.index(id.slot) else {
            return Err(Rejected::UnknownId(wr_id));
        };
        let now = ring.generation[index];
        if id.generation != now {
            return Err(Rejected::StaleGeneration {
                slot: id.slot,
                got: id.generation,
                now,
            });
        }
        if !ring.finish(id.slot, flushed) {
            return Err(Rejected::NotPosted(id.slot));
        }
        let send = (id.ring == Ring::Send).then(|| std::mem::take(&mut self.send_meta[index]));
        Ok(Accepted { id, send })
    }

    /// When the oldest send still outstanding was posted.
    pub fn oldest_send(&self) -> Option<Instant> {
        self.send
            .state
            .iter()
            .zip(self.send_meta.iter())
            .filter(|(st, _)| **st == SlotState::Posted)
            .filter_map(|(_, m)| m.posted_at)
            .min()
    }

    /// Work requests of `ring` still outstanding although one posted after them has
    /// completed. A UD queue completes its work requests in the order they were posted,
    /// so the completions of these were lost: they will never complete (only a reap
    /// accounts for them). O(ring size).
    pub fn behind(&self, ring: Ring) -> u64 {
        let r = match ring {
            Ring::Recv => &self.recv,
            Ring::Send => &self.send,
        };
        r.state
            .iter()
            .zip(&r.posted_seq)
            .filter(|(st, seq)| **st == SlotState::Posted && **seq < r.done_seq)
            .count() as u64
    }

    /// Totals of one ring.
    pub fn totals(&self, ring: Ring) -> RingTotals {
        match ring {
            Ring::Recv => self.recv.totals,
            Ring::Send => self.send.totals,
        }
    }

    /// Completions rejected so far.
    pub fn rejected(&self) -> u64 {
        self.rejected
    }

    /// Mark every posted slot as reaped (its completion will never come) and return the
    /// send metadata of the reaped sends. Used after the QP is destroyed.
    pub fn reap_all(&mut self) -> Vec<SendMeta> {
        let mut metas = Vec::new();
        for (ring, is_send) in [(&mut self.recv, false), (&mut self.send, true)] {
            for (i, st) in ring.state.iter_mut().enumerate() {
                if *st == SlotState::Posted {
                    *st = SlotState::Free;
                    ring.free.push(i as u32);
                    ring.totals.outstanding -= 1;
                    ring.totals.reaped += 1;
                    if is_send {
                        metas.push(std::mem::take(&mut self.send_meta[i]));
                    }
                }
            }
        }
        metas
    }

    /// Verify conservation and slot-state consistency for both rings.
    pub fn check(&self) -> Result<(), String> {
        for (name, ring) in [("recv", &self.recv), ("send", &self.send)] {
            let t = ring.totals;
            if !t.balanced() {
                return Err(format!(
                    "{name}: posted {} != completed {} + flushed {} + reaped {} + outstanding {}",
                    t.posted, t.completed, t.flushed, t.reaped, t.outstanding
                ));
            }
            let posted = ring
                .state
                .iter()
                .filter(|s| **s == SlotState::Posted)
                .count() as u64;
            if posted != t.outstanding {
                return Err(format!(
                    "{name}: {posted} slots posted but {} outstanding",
                    t.outstanding
                ));
            }
            let free = ring.state.iter().filter(|s| **s == SlotState::Free).count();
            if free != ring.free.len() {
                return Err(format!(
                    "{name}: {free} slots free but free list holds {}",
                    ring.free.len()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn behind_counts_what_a_later_completion_passed() {
        let mut l = Ledger::new(1, 4, 2);
        let mut ids = Vec::new();
        for _ in 0..4 {
            let s = l.reserve_recv().unwrap();
            ids.push(l.wr_id(Ring::Recv, s));
            l.posted_recv(s);
        }
        assert_eq!(l.behind(Ring::Recv), 0, "nothing completed yet");
        // The first completes, the second's completion is lost, the third completes.
        l.complete(Ring::Recv, ids[0], WcStatus::Success).unwrap();
        assert_eq!(l.behind(Ring::Recv), 0);
        l.complete(Ring::Recv, ids[2], WcStatus::Success).unwrap();
        assert_eq!(l.behind(Ring::Recv), 1, "the second will never complete");
        // The fourth is still waiting, not behind; a reap clears everything.
        assert_eq!(l.totals(Ring::Recv).outstanding, 2);
        l.reap_all();
        assert_eq!(l.behind(Ring::Recv), 0);
        assert_eq!(l.behind(Ring::Send), 0);
        l.check().unwrap();
    }

    #[test]
    fn a_ledger_on_the_second_bank_numbers_its_slots_after_the_first() {
        let mut l = Ledger::in_bank(3, 4, 2, 1);
        let mut recvs: Vec<u32> = std::iter::from_fn(|| l.reserve_recv()).collect();
        recvs.sort_unstable();
        assert_eq!(recvs, [4, 5, 6, 7], "receive slots of bank 1 of rings of 4");
        let sends: Vec<u32> = std::iter::from_fn(|| l.reserve_send()).collect();
        assert_eq!(sends, [2, 3], "send slots of bank 1 of rings of 2");
        for &s in &recvs {
            l.posted_recv(s);
        }
        l.posted_send(
            3,
            SendMeta {
                bytes: 9,
                ..SendMeta::default()
            },
        );
        l.release(Ring::Send, 2);
        // A completion naming the same slot index of bank 0 is not this ledger's.
        let other_bank = WrId {
            ring: Ring::Recv,
            epoch: 3,
            slot: 0,
            generation: 1,
        }
        .encode();
        assert_eq!(
            l.complete(Ring::Recv, other_bank, WcStatus::Success),
            Err(Rejected::UnknownId(other_bank))
        );
        let id = l.wr_id(Ring::Recv, 6);
        assert_eq!(WrId::decode(id).slot, 6);
        assert!(l.complete(Ring::Recv, id, WcStatus::Success).is_ok());
        let send = l.wr_id(Ring::Send, 3);
        let done = l.complete(Ring::Send, send, WcStatus::Success).unwrap();
        assert_eq!(
            done.send.map(|m| m.bytes),
            Some(9),
            "the send's own metadata"
        );
        assert_eq!(
            l.reserve_recv(),
            Some(6),
            "the completed slot is free again"
        );
        l.release(Ring::Recv, 6);
        assert_eq!(l.reap_all().len(), 0, "no send outstanding");
        assert_eq!(l.totals(Ring::Recv).reaped, 3);
        l.check().unwrap();
        assert_eq!(l.free_recv(), 4);
        assert_eq!(l.rejected(), 1);
    }

    #[test]
    fn wr_id_round_trip() {
        for ring in [Ring::Recv, Ring::Send] {
            let id = WrId {
                ring,
                epoch: 0xBEEF,
                slot: 12345,
                generation: 0x7ABC,
            };
            assert_eq!(WrId::decode(id.encode()), id);
        }
    }

    #[test]
    fn a_send_id_on_the_receive_cq_is_rejected() {
        let mut l = Ledger::new(1, 2, 2);
        let r = l.reserve_recv().unwrap();
        l.posted_recv(r);
        let s = l.reserve_send().unwrap();
        l.posted_send(s, SendMeta::default());
        let send_id = l.wr_id(Ring::Send, s);
        let recv_id = l.wr_id(Ring::Recv, r);
        assert!(matches!(
            l.complete(Ring::Recv, send_id, WcStatus::Success),
            Err(Rejected::WrongCq {
                cq: Ring::Recv,
                named: Ring::Send,
                ..
            })
        ));
        assert!(matches!(
            l.complete(Ring::Send, recv_id, WcStatus::Success),
            Err(Rejected::WrongCq { .. })
        ));
        // Both are still posted: nothing was finished by the wrong completions.
        assert_eq!(l.totals(Ring::Recv).outstanding, 1);
        assert_eq!(l.totals(Ring::Send).outstanding, 1);
        assert_eq!(l.rejected(), 2);
        l.complete(Ring::Recv, recv_id, WcStatus::Success).unwrap();
        l.complete(Ring::Send, send_id, WcStatus::Success).unwrap();
        l.check().unwrap();
    }

    #[test]
    fn a_completion_of_an_earlier_use_of_the_slot_is_rejected() {
        let mut l = Ledger::new(1, 1, 1);
        let s = l.reserve_recv().unwrap();
        l.posted_recv(s);
        let first = l.wr_id(Ring::Recv, s);
        l.complete(Ring::Recv, first, WcStatus::Success).unwrap();
        // The same slot posted again: a late duplicate of the first completion must not
        // finish the second posting.
        let s2 = l.reserve_recv().unwrap();
        assert_eq!(s2, s);
        l.posted_recv(s2);
        let second = l.wr_id(Ring::Recv, s2);
        assert_ne!(first, second, "each posting has its own id");
        assert!(matches!(
            l.complete(Ring::Recv, first, WcStatus::Success),
            Err(Rejected::StaleGeneration { slot: 0, .. })
        ));
        assert_eq!(l.totals(Ring::Recv).outstanding, 1);
        // After a reap, a completion for the reaped posting is refused too.
        l.reap_all();
        let s3 = l.reserve_recv().unwrap();
        l.posted_recv(s3);
        assert!(matches!(
            l.complete(Ring::Recv, second, WcStatus::Success),
            Err(Rejected::StaleGeneration { .. })
        ));
        l.complete(Ring::Recv, l.wr_id(Ring::Recv, s3), WcStatus::Success)
            .unwrap();
        l.check().unwrap();
    }

    #[test]
    fn post_complete_flush_reap_balance() {
        let mut l = Ledger::new(3, 4, 2);
        let mut ids = vec![];
        while let Some(s) = l.reserve_recv() {
            l.posted_recv(s);
            ids.push(l.wr_id(Ring::Recv, s));
        }
        assert_eq!(ids.len(), 4);
        l.check().unwrap();
        let a = l.complete(Ring::Recv, ids[0], WcStatus::Success).unwrap();
        assert_eq!(a.id.slot, 0);
        l.complete(Ring::Recv, ids[1], WcStatus::Flushed).unwrap();
        assert_eq!(
            l.complete(Ring::Recv, ids[1], WcStatus::Success),
            Err(Rejected::NotPosted(1))
        );
        let s = l.reserve_send().unwrap();
        l.posted_send(
            s,
            SendMeta {
                ah: Some(AhHandle(7)),
                bytes: 100,
                arp: false,
                posted_at: None,
            },
        );
        l.check().unwrap();
        let reaped = l.reap_all();
        assert_eq!(reaped.len(), 1);
        assert_eq!(reaped[0].ah, Some(AhHandle(7)));
        let t = l.totals(Ring::Recv);
        assert_eq!(
            (t.posted, t.completed, t.flushed, t.reaped, t.outstanding),
            (4, 1, 1, 2, 0)
        );
        assert_eq!(l.totals(Ring::Send).reaped, 1);
        assert_eq!(l.rejected(), 1);
        l.check().unwrap();
        assert_eq!(l.free_recv(), 4);
        assert_eq!(l.free_send(), 2);
    }

    #[test]
    fn stale_epoch_and_garbage_rejected() {
        let mut l = Ledger::new(2, 2, 2);
        let s = l.reserve_recv().unwrap();
        l.posted_recv(s);
        let stale = WrId {
            ring: Ring::Recv,
            epoch: 1,
            slot: s,
            generation: 1,
        }
        .encode();
        assert_eq!(
            l.complete(Ring::Recv, stale, WcStatus::Success),
            Err(Rejected::StaleEpoch { got: 1, now: 2 })
        );
        let out_of_range = l.wr_id(Ring::Recv, 99);
        assert!(matches!(
            l.complete(Ring::Recv, out_of_range, WcStatus::Success),
            Err(Rejected::UnknownId(_))
        ));
        for garbage in [u64::MAX, 1 << 50, 0x7FFF_FFFF_FFFF_FFFF] {
            assert!(l.complete(Ring::Recv, garbage, WcStatus::Success).is_err());
        }
        l.check().unwrap();
        assert_eq!(l.totals(Ring::Recv).outstanding, 1);
    }

    #[test]
    fn release_returns_reserved_slot() {
        let mut l = Ledger::new(0, 1, 1);
        let s = l.reserve_send().unwrap();
        assert!(l.reserve_send().is_none());
        l.release(Ring::Send, s);
        assert_eq!(l.free_send(), 1);
        l.check().unwrap();
        assert_eq!(l.totals(Ring::Send).posted, 0);
    }

    proptest! {
        /// Any sequence of reserve/post/complete/flush/garbage/reap keeps the ledger
        /// balanced.
        #[test]
        fn always_balanced(ops in proptest::collection::vec((0u8..6, any::<u64>()), 0..400)) {
            let mut l = Ledger::new(5, 8, 8);
            let mut posted: Vec<(Ring, u64)> = vec![];
            for (op, x) in ops {
                match op {
                    0 => if let Some(s) = l.reserve_recv() { l.posted_recv(s); posted.push((Ring::Recv, l.wr_id(Ring::Recv, s))); },
                    1 => if let Some(s) = l.reserve_send() { l.posted_send(s, SendMeta::default()); posted.push((Ring::Send, l.wr_id(Ring::Send, s))); },
                    2 | 3 => if !posted.is_empty() {
                        let (ring, id) = posted.swap_remove(x as usize % posted.len());
                        let st = if op == 2 { WcStatus::Success } else { WcStatus::Flushed };
                        prop_assert!(l.complete(ring, id, st).is_ok());
                    },
                    4 => {
                        let ring = if x & 1 == 0 { Ring::Recv } else { Ring::Send };
                        // Garbage never finishes a posting it does not name exactly.
                        let named = posted.contains(&(ring, x));
                        if l.complete(ring, x, WcStatus::Success).is_ok() {
                            prop_assert!(named, "accepted garbage {x:#x}");
                            posted.retain(|p| *p != (ring, x));
                        }
                    },
                    _ => { l.reap_all(); posted.clear(); },
                }
                prop_assert!(l.check().is_ok(), "{:?}", l.check());
            }
        }
    }
}
