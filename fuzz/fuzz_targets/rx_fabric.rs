//! RX direction of the shipped datapath: each record is one UD payload (IPoIB header
//! and what follows) sent by a raw endpoint on the simulated fabric to interface A
//! (record flag bit 0: to the broadcast group), polled by A and written to its TAP
//! (with the mode's A_OFFLOAD bit: joined by GRO). After every packet: the ledger
//! balances, each receive is written, looped back or dropped (one counter), and what A
//! wrote is the packet, translated; what GRO joined cuts back into what went in.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib_fuzz::{input, world::RxWorld};

fuzz_target!(|data: &[u8]| {
    let (mode, records) = input::split(data);
    let mut w = RxWorld::new(mode);
    for r in records {
        w.step(r.flags, r.bytes);
    }
    w.finish();
});
