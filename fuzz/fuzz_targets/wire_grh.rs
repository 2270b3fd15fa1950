//! The 40 bytes in front of a UD receive (`wire::grh`), in both layouts: parsed from any
//! bytes, and what the emitters write parses back to the same GIDs.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::verbs::{GRH_LEN, GrhKind};
use uipoib::wire::grh;

fuzz_target!(|data: &[u8]| {
    if let Ok(g) = grh::parse(data, GrhKind::Ipv6) {
        assert_eq!(g.sgid.0[..], data[8..24]);
        assert_eq!(g.dgid.0[..], data[24..40]);
        let mut out = [0u8; GRH_LEN];
        let len = data.len() as u16;
        grh::emit_ipv6(&mut out, len, &g.sgid, &g.dgid).expect("40 bytes hold a GRH");
        assert_eq!(grh::parse(&out, GrhKind::Ipv6), Ok(g));
        assert_eq!(u16::from_be_bytes([out[4], out[5]]), len);
    }
    if let Ok(g) = grh::parse(data, GrhKind::Ipv4) {
        let (s, d) = (g.sgid.as_ipv4(), g.dgid.as_ipv4());
        assert!(
            s.is_some() && d.is_some(),
            "RoCEv2/IPv4 GIDs are IPv4-mapped"
        );
        let mut out = [0u8; GRH_LEN];
        let len = u16::from_be_bytes([data[22], data[23]]);
        match grh::emit_ipv4(&mut out, len, &g.sgid, &g.dgid) {
            Ok(()) => {
                assert_eq!(grh::parse(&out, GrhKind::Ipv4), Ok(g));
                assert_eq!(
                    uipoib::wire::ipv4::checksum(&out[20..]),
                    0,
                    "header checksum"
                );
            }
            Err(_) => assert!(len > 65515, "emit_ipv4 refused a length of {len}"),
        }
    }
    if data.len() < GRH_LEN {
        assert!(grh::parse(data, GrhKind::Ipv4).is_err());
        assert!(grh::parse(data, GrhKind::Ipv6).is_err());
    }
});
