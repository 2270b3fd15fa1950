//! The IPoIB header and hardware address (`wire::ipoib`): parsed from any bytes and
//! written back byte for byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::wire::WireError;
use uipoib::wire::ipoib::{self, IpoibAddr};

fuzz_target!(|data: &[u8]| {
    match ipoib::parse_header(data) {
        Ok((ethertype, payload)) => {
            assert_eq!(payload, &data[ipoib::HEADER_LEN..]);
            let mut out = [0xffu8; ipoib::HEADER_LEN];
            ipoib::emit_header(&mut out, ethertype).expect("4 bytes hold a header");
            assert_eq!(out[..], data[..ipoib::HEADER_LEN]);
        }
        Err(WireError::ReservedNotZero(r)) => assert_ne!(r, 0),
        Err(WireError::Truncated { .. }) => assert!(data.len() < ipoib::HEADER_LEN),
        Err(e) => panic!("parse_header gave {e:?}"),
    }
    match IpoibAddr::parse(data) {
        Ok(a) => {
            assert!(a.qpn <= 0xff_ffff);
            assert_eq!(a.to_bytes()[..], data[..ipoib::HWADDR_LEN]);
            assert_eq!(IpoibAddr::parse(&a.to_bytes()), Ok(a));
            let n = IpoibAddr::new(a.qpn | 0xff00_0000, a.gid);
            assert_eq!((n.qpn, n.flags), (a.qpn, 0));
            assert_eq!(a.is_zero(), a.qpn == 0 && a.gid.is_zero());
        }
        Err(_) => assert!(data.len() < ipoib::HWADDR_LEN),
    }
});
