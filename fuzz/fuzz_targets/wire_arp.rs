//! ARP in both forms (`wire::arp`): Ethernet (hardware type 1) and IPoIB (type 32)
//! parsed from any bytes, written back byte for byte, and converted into each other.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::wire::arp::{self, EthArp, IpoibArp};
use uipoib::wire::eth::Mac;
use uipoib::wire::ipoib::IpoibAddr;

fuzz_target!(|data: &[u8]| {
    if let Ok(a) = EthArp::parse(data) {
        assert!(a.op == arp::OP_REQUEST || a.op == arp::OP_REPLY);
        let mut out = [0u8; arp::ETH_ARP_LEN];
        assert_eq!(a.emit(&mut out), Ok(arp::ETH_ARP_LEN));
        assert_eq!(
            out[..],
            data[..arp::ETH_ARP_LEN],
            "Ethernet ARP written back differs"
        );
        let sha = IpoibAddr::new(0x12_3456, uipoib::verbs::Gid::from_ipv4(a.spa));
        let i = a.to_ipoib(sha, IpoibAddr::ZERO);
        let mut ib = [0u8; arp::IPOIB_ARP_LEN];
        assert_eq!(i.emit(&mut ib), Ok(arp::IPOIB_ARP_LEN));
        let back = IpoibArp::parse(&ib).expect("a converted ARP parses");
        assert_eq!(back, i);
        assert_eq!(back.to_eth(a.sha, a.tha), a);
    }
    if let Ok(a) = IpoibArp::parse(data) {
        assert!(a.op == arp::OP_REQUEST || a.op == arp::OP_REPLY);
        assert!(a.sha.qpn <= 0xff_ffff && a.tha.qpn <= 0xff_ffff);
        let mut out = [0u8; arp::IPOIB_ARP_LEN];
        assert_eq!(a.emit(&mut out), Ok(arp::IPOIB_ARP_LEN));
        assert_eq!(
            out[..],
            data[..arp::IPOIB_ARP_LEN],
            "IPoIB ARP written back differs"
        );
        let e = a.to_eth(Mac([2, 0, 1, 2, 3, 4]), Mac::ZERO);
        let mut eb = [0u8; arp::ETH_ARP_LEN];
        assert_eq!(e.emit(&mut eb), Ok(arp::ETH_ARP_LEN));
        let back = EthArp::parse(&eb).expect("a converted ARP parses");
        assert_eq!((back.op, back.spa, back.tpa), (a.op, a.spa, a.tpa));
    }
    // Too short to write into: an error, never a panic.
    let n = data.len().min(arp::IPOIB_ARP_LEN - 1);
    let mut short = vec![0u8; n];
    let m = IpoibArp {
        op: arp::OP_REPLY,
        sha: IpoibAddr::ZERO,
        spa: std::net::Ipv4Addr::UNSPECIFIED,
        tha: IpoibAddr::ZERO,
        tpa: std::net::Ipv4Addr::UNSPECIFIED,
    };
    assert!(m.emit(&mut short).is_err());
});
