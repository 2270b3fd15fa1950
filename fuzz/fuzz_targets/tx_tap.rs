//! TX direction of the shipped datapath: each record is one read of interface A's TAP
//! (with the mode's A_OFFLOAD bit: a `virtio_net_hdr` first, super-frames cut into
//! segments), translated to IPoIB and sent over the simulated fabric to interface B.
//! After every read: both ledgers balance, every frame taken is dropped (one counter) or
//! posted, B got what was posted, and (one frame per turn) B's frame is A's, translated.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib_fuzz::{input, world::TxWorld};

fuzz_target!(|data: &[u8]| {
    let (mode, records) = input::split(data);
    let mut w = TxWorld::new(mode);
    for r in records {
        w.step(r.bytes);
    }
    w.finish();
});
