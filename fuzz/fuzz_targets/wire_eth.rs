//! Ethernet frames from the TAP (`wire::eth`): `parse_frame` on any bytes, the header
//! written back and parsed again, and the MACs that stand for GIDs and IPv4 groups.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::verbs::Gid;
use uipoib::wire::eth::{self, Mac, mac_for_gid, multicast_mac};
use uipoib::wire::{ETHERTYPE_QINQ, ETHERTYPE_VLAN, WireError};

fuzz_target!(|data: &[u8]| {
    match eth::parse_frame(data) {
        Ok((h, payload)) => {
            assert!(data.len() >= eth::HEADER_LEN);
            assert_eq!(payload, &data[eth::HEADER_LEN..]);
            assert!(h.ethertype != ETHERTYPE_VLAN && h.ethertype != ETHERTYPE_QINQ);
            let mut out = [0u8; eth::HEADER_LEN];
            eth::emit_header(&mut out, &h).expect("14 bytes hold a header");
            assert_eq!(out[..], data[..eth::HEADER_LEN]);
            assert_eq!(eth::parse_frame(&out).expect("reparse").0, h);
            // A MAC survives printing and parsing.
            assert_eq!(h.src.to_string().parse::<Mac>(), Ok(h.src));
            assert_eq!(h.dst.is_multicast(), data[0] & 1 == 1);
        }
        Err(WireError::Truncated { need, got, .. }) => {
            assert!(data.len() < eth::HEADER_LEN && need == eth::HEADER_LEN && got == data.len());
        }
        Err(WireError::Vlan) => {
            let t = u16::from_be_bytes([data[12], data[13]]);
            assert!(t == ETHERTYPE_VLAN || t == ETHERTYPE_QINQ);
        }
        Err(e) => panic!("parse_frame gave {e:?}"),
    }
    assert!(
        eth::emit_header(
            &mut [0u8; 13],
            &eth::EthHeader {
                dst: Mac::BROADCAST,
                src: Mac::ZERO,
                ethertype: 0,
            }
        )
        .is_err()
    );
    if let Some(g) = data.first_chunk::<16>() {
        // A peer's MAC is locally administered unicast, whatever its GID.
        let m = mac_for_gid(&Gid(*g));
        assert_eq!(m.0[0], 0x02);
        assert!(!m.is_multicast() && !m.is_broadcast());
        let ip = std::net::Ipv4Addr::new(g[0], g[1], g[2], g[3]);
        let mm = multicast_mac(ip);
        assert!(mm.is_multicast() && !mm.is_broadcast());
    }
    if let Ok(s) = std::str::from_utf8(data)
        && let Ok(m) = s.parse::<Mac>()
    {
        assert_eq!(m.to_string().parse::<Mac>(), Ok(m));
    }
});
