//! Each drop reason and each fact of both directions, from packets built byte by byte.

use std::net::Ipv4Addr;

use proptest::prelude::*;

mod v6;

use super::*;
use crate::wire::arp::{self, EthArp, IpoibArp};
use crate::wire::eth::{self, EthHeader, mac_for_gid, multicast_mac};
use crate::wire::gid::Gid;
use crate::wire::grh::{self, GRH_LEN, GrhKind};
use crate::wire::ipoib;
use crate::wire::ipv4::Ipv4Cidr;
use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, ipv4};

const OWN_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const OWN_IP6_ADDR: &str = "2001:2:0:1::1";
const PEER_IP6_ADDR: &str = "2001:2:0:1::2";
const OWN_IP6: &str = "2001:2:0:1::1/64";
const PEER_IP6: &str = "2001:2:0:1::2/64";
const OWN_QPN: u32 = 0x11;
const PEER_QPN: u32 = 0x22;

fn own_gid() -> Gid {
    Gid::from_ipv4(OWN_IP)
}

fn peer_gid() -> Gid {
    Gid::from_ipv4(PEER_IP)
}

fn peer_hw() -> IpoibAddr {
    IpoibAddr::new(PEER_QPN, peer_gid())
}

fn local() -> Local {
    Local {
        hw: IpoibAddr::new(OWN_QPN, own_gid()),
        mac: mac_for_gid(&own_gid()),
        addr: Ipv4Cidr {
            addr: OWN_IP,
            prefix: 24,
        },
        addr6: Addrs6::new(mac_for_gid(&own_gid()), &[OWN_IP6.parse().unwrap()]),
    }
}

/// An IPv4 packet of `len` bytes (header included) from the peer to `dst`, with a
/// pattern for payload.
fn ip_packet(len: usize, dst: Ipv4Addr) -> Vec<u8> {
    let mut ip = vec![0u8; len];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&PEER_IP.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = ipv4::checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    for (i, b) in ip[20..].iter_mut().enumerate() {
        *b = i as u8;
    }
    ip
}

/// A UD receive: an IB GRH from `sgid` to `dgid`, an IPoIB header and `payload`.
fn recv(sgid: Gid, dgid: Gid, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut b = vec![0u8; GRH_LEN + ipoib::HEADER_LEN + payload.len()];
    grh::emit_ipv6(
        &mut b,
        (ipoib::HEADER_LEN + payload.len()) as u16,
        &sgid,
        &dgid,
    )
    .unwrap();
    ipoib::emit_header(&mut b[GRH_LEN..], ethertype).unwrap();
    b[GRH_LEN + ipoib::HEADER_LEN..].copy_from_slice(payload);
    b
}

fn from_peer(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    recv(peer_gid(), own_gid(), ethertype, payload)
}

fn meta(src_qp: u32) -> RecvMeta {
    RecvMeta {
        src_qp,
        has_grh: true,
    }
}

fn arp_bytes(a: &IpoibArp) -> Vec<u8> {
    let mut b = vec![0u8; arp::IPOIB_ARP_LEN];
    a.emit(&mut b).unwrap();
    b
}

/// An IPoIB ARP from the peer at its real address.
fn peer_arp(op: u16, spa: Ipv4Addr, tha: IpoibAddr, tpa: Ipv4Addr) -> IpoibArp {
    IpoibArp {
        op,
        sha: peer_hw(),
        spa,
        tha,
        tpa,
    }
}

fn rx(buf: &[u8], m: RecvMeta) -> (Received, Vec<u8>) {
    let mut frame = vec![0u8; eth::HEADER_LEN + 4096];
    let r = receive(buf, m, GrhKind::Ipv6, &local(), &mut frame);
    (r, frame)
}

/// [`rx`]'s receive, in place: from the peer's QPN, the frame scratch given.
fn rx_in_place(buf: &mut [u8], frame: &mut [u8]) -> Received {
    receive_in_place(buf, meta(PEER_QPN), GrhKind::Ipv6, &local(), frame)
}

fn refused(why: RxDrop) -> Received {
    Received {
        fact: RxFact::Arp(ArpSender::Refused),
        verdict: RxVerdict::Drop(why),
    }
}

fn nothing(why: RxDrop) -> Received {
    Received {
        fact: RxFact::None,
        verdict: RxVerdict::Drop(why),
    }
}

#[test]
fn every_receive_drop_reason() {
    let ip = ip_packet(60, OWN_IP);
    let good_arp = arp_bytes(&peer_arp(arp::OP_REQUEST, PEER_IP, IpoibAddr::ZERO, OWN_IP));
    let with_sha = |sha: IpoibAddr| {
        arp_bytes(&IpoibArp {
            sha,
            ..peer_arp(arp::OP_REQUEST, PEER_IP, IpoibAddr::ZERO, OWN_IP)
        })
    };
    let mut reserved = from_peer(ETHERTYPE_IPV4, &ip);
    reserved[GRH_LEN + 3] = 1;
    let mut bad_ipv4 = ip.clone();
    bad_ipv4[0] = 0x65;
    let multicast_gid = Gid([0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    let cases: Vec<(&str, Vec<u8>, RecvMeta, Received)> = vec![
        (
            "shorter than GRH and IPoIB header",
            from_peer(ETHERTYPE_IPV4, &ip)[..GRH_LEN + 3].to_vec(),
            meta(PEER_QPN),
            nothing(RxDrop::Short),
        ),
        (
            "no GRH",
            from_peer(ETHERTYPE_IPV4, &ip),
            RecvMeta {
                src_qp: PEER_QPN,
                has_grh: false,
            },
            nothing(RxDrop::NoGrh),
        ),
        (
            "GRH of another layout",
            {
                let mut b = from_peer(ETHERTYPE_IPV4, &ip);
                b[0] = 0x45;
                b
            },
            meta(PEER_QPN),
            nothing(RxDrop::BadGrh),
        ),
        (
            "IPoIB reserved bits set",
            reserved,
            meta(PEER_QPN),
            nothing(RxDrop::BadHeader),
        ),
        (
            "ARP that does not parse",
            from_peer(ETHERTYPE_ARP, &good_arp[..40]),
            meta(PEER_QPN),
            nothing(RxDrop::BadArp),
        ),
        (
            "ARP from a zero sender",
            from_peer(ETHERTYPE_ARP, &with_sha(IpoibAddr::ZERO)),
            meta(PEER_QPN),
            refused(RxDrop::BadArp),
        ),
        (
            "ARP from a multicast GID",
            from_peer(
                ETHERTYPE_ARP,
                &with_sha(IpoibAddr::new(PEER_QPN, multicast_gid)),
            ),
            meta(PEER_QPN),
            refused(RxDrop::BadArp),
        ),
        (
            "ARP from the zero GID",
            from_peer(
                ETHERTYPE_ARP,
                &with_sha(IpoibAddr::new(PEER_QPN, Gid::ZERO)),
            ),
            meta(PEER_QPN),
            refused(RxDrop::BadArp),
        ),
        (
            "ARP from QP1",
            recv(
                peer_gid(),
                own_gid(),
                ETHERTYPE_ARP,
                &with_sha(IpoibAddr::new(1, peer_gid())),
            ),
            meta(1),
            refused(RxDrop::BadArp),
        ),
        (
            "ARP from QP0",
            recv(
                peer_gid(),
                own_gid(),
                ETHERTYPE_ARP,
                &with_sha(IpoibAddr::new(0, peer_gid())),
            ),
            meta(0),
            refused(RxDrop::BadArp),
        ),
        (
            "ARP from the multicast QPN",
            recv(
                peer_gid(),
                own_gid(),
                ETHERTYPE_ARP,
                &with_sha(IpoibAddr::new(ipoib::MULTICAST_QPN, peer_gid())),
            ),
            meta(ipoib::MULTICAST_QPN),
            refused(RxDrop::BadArp),
        ),
        (
            "ARP naming another QP than its source",
            from_peer(ETHERTYPE_ARP, &good_arp),
            meta(PEER_QPN + 1),
            refused(RxDrop::ArpSpoofed),
        ),
        (
            "ARP naming another GID than its source",
            recv(
                Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 3)),
                own_gid(),
                ETHERTYPE_ARP,
                &good_arp,
            ),
            meta(PEER_QPN),
            refused(RxDrop::ArpSpoofed),
        ),
        (
            "ARP from outside the subnet",
            from_peer(
                ETHERTYPE_ARP,
                &arp_bytes(&peer_arp(
                    arp::OP_REPLY,
                    Ipv4Addr::new(10, 0, 0, 2),
                    local().hw,
                    OWN_IP,
                )),
            ),
            meta(PEER_QPN),
            refused(RxDrop::ArpOffSubnet),
        ),
        (
            "IPv4 header that does not parse",
            from_peer(ETHERTYPE_IPV4, &bad_ipv4),
            meta(PEER_QPN),
            nothing(RxDrop::BadIpv4),
        ),
        (
            "IPv4 shorter than its total length",
            from_peer(ETHERTYPE_IPV4, &ip[..59]),
            meta(PEER_QPN),
            nothing(RxDrop::BadIpv4),
        ),
        (
            "an IPv6 EtherType in front of an IPv4 packet",
            from_peer(ETHERTYPE_IPV6, &ip),
            meta(PEER_QPN),
            nothing(RxDrop::BadIpv6),
        ),
        (
            "another EtherType",
            from_peer(0x88cc, &ip),
            meta(PEER_QPN),
            nothing(RxDrop::Unsupported),
        ),
    ];
    for (name, buf, m, want) in cases {
        assert_eq!(rx(&buf, m).0, want, "{name}");
    }
}

#[test]
fn own_loopback_is_consumed_and_only_from_our_own_qp() {
    let buf = recv(own_gid(), own_gid(), ETHERTYPE_IPV4, &ip_packet(60, OWN_IP));
    let (r, _) = rx(&buf, meta(OWN_QPN));
    assert_eq!(
        r,
        Received {
            fact: RxFact::OwnLoopback,
            verdict: RxVerdict::Consumed
        }
    );
    // Loopback is told before the IPoIB header is looked at.
    let mut bad = buf.clone();
    bad[GRH_LEN + 2] = 0xff;
    assert_eq!(rx(&bad, meta(OWN_QPN)).0.fact, RxFact::OwnLoopback);
    // Another QP on our own host is a sender like any other.
    let (r, _) = rx(&buf, meta(OWN_QPN + 1));
    assert_eq!(
        r.fact,
        RxFact::Data {
            from: IpoibAddr::new(OWN_QPN + 1, own_gid())
        }
    );
}

/// (case, op, spa, tha, tpa, the standing it is believed with)
type ArpCase = (&'static str, u16, Ipv4Addr, IpoibAddr, Ipv4Addr, Standing);

#[test]
fn an_arp_that_passes_is_a_claim_with_its_standing() {
    let other = Ipv4Addr::new(198, 18, 0, 9);
    let cases: [ArpCase; 5] = [
        (
            "reply to us",
            arp::OP_REPLY,
            PEER_IP,
            local().hw,
            OWN_IP,
            Standing::Addressed,
        ),
        (
            "reply to anyone",
            arp::OP_REPLY,
            PEER_IP,
            IpoibAddr::new(0x33, Gid::from_ipv4(other)),
            other,
            Standing::Addressed,
        ),
        (
            "request for our address",
            arp::OP_REQUEST,
            PEER_IP,
            IpoibAddr::ZERO,
            OWN_IP,
            Standing::Addressed,
        ),
        (
            "gratuitous announcement",
            arp::OP_REQUEST,
            PEER_IP,
            IpoibAddr::ZERO,
            PEER_IP,
            Standing::Announcement,
        ),
        (
            "request for someone else",
            arp::OP_REQUEST,
            PEER_IP,
            IpoibAddr::ZERO,
            other,
            Standing::Overheard,
        ),
    ];
    for (name, op, spa, tha, tpa, standing) in cases {
        let buf = from_peer(ETHERTYPE_ARP, &arp_bytes(&peer_arp(op, spa, tha, tpa)));
        let (r, _) = rx(&buf, meta(PEER_QPN));
        assert_eq!(
            r.fact,
            RxFact::Arp(ArpSender::Claim {
                ip: spa,
                hw: peer_hw(),
                standing
            }),
            "{name}"
        );
        assert_eq!(
            r.verdict,
            RxVerdict::Deliver(eth::HEADER_LEN + arp::ETH_ARP_LEN)
        );
    }
}

#[test]
fn an_arp_is_written_in_its_ethernet_form() {
    let peer_mac = mac_for_gid(&peer_gid());
    let third = IpoibAddr::new(0x33, Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 9)));
    // (case, op, tha, the frame's destination, the Ethernet tha)
    let cases = [
        (
            "request: to everyone, no target",
            arp::OP_REQUEST,
            IpoibAddr::ZERO,
            Mac::BROADCAST,
            Mac::ZERO,
        ),
        (
            "reply to us: our MAC",
            arp::OP_REPLY,
            local().hw,
            local().mac,
            local().mac,
        ),
        (
            "reply naming our GID at another QPN: still our MAC",
            arp::OP_REPLY,
            IpoibAddr::new(0x99, own_gid()),
            local().mac,
            local().mac,
        ),
        (
            "reply naming a third host: its MAC",
            arp::OP_REPLY,
            third,
            local().mac,
            mac_for_gid(&third.gid),
        ),
    ];
    for (name, op, tha, dst, eth_tha) in cases {
        let buf = from_peer(
            ETHERTYPE_ARP,
            &arp_bytes(&peer_arp(op, PEER_IP, tha, OWN_IP)),
        );
        let (r, frame) = rx(&buf, meta(PEER_QPN));
        let RxVerdict::Deliver(n) = r.verdict else {
            panic!("{name}: {r:?}");
        };
        let (h, body) = eth::parse_frame(&frame[..n]).unwrap();
        assert_eq!(
            h,
            EthHeader {
                dst,
                src: peer_mac,
                ethertype: ETHERTYPE_ARP
            },
            "{name}"
        );
        assert_eq!(
            EthArp::parse(body),
            Ok(EthArp {
                op,
                sha: peer_mac,
                spa: PEER_IP,
                tha: eth_tha,
                tpa: OWN_IP
            }),
            "{name}"
        );
    }
}

#[test]
fn a_probe_is_passed_on_and_never_claims() {
    let probe = peer_arp(
        arp::OP_REQUEST,
        Ipv4Addr::UNSPECIFIED,
        IpoibAddr::ZERO,
        OWN_IP,
    );
    let (r, frame) = rx(
        &from_peer(ETHERTYPE_ARP, &arp_bytes(&probe)),
        meta(PEER_QPN),
    );
    assert_eq!(r.fact, RxFact::Arp(ArpSender::Probe));
    assert_eq!(r.verdict, RxVerdict::Deliver(42));
    let (_, body) = eth::parse_frame(&frame[..42]).unwrap();
    assert_eq!(EthArp::parse(body).unwrap().spa, Ipv4Addr::UNSPECIFIED);
}

#[test]
fn an_arp_that_does_not_fit_the_frame_keeps_its_claim() {
    let buf = from_peer(
        ETHERTYPE_ARP,
        &arp_bytes(&peer_arp(arp::OP_REPLY, PEER_IP, local().hw, OWN_IP)),
    );
    let claim = RxFact::Arp(ArpSender::Claim {
        ip: PEER_IP,
        hw: peer_hw(),
        standing: Standing::Addressed,
    });
    for (len, why) in [(10, RxDrop::Short), (30, RxDrop::BadArp)] {
        let mut frame = vec![0u8; len];
        let r = receive(&buf, meta(PEER_QPN), GrhKind::Ipv6, &local(), &mut frame);
        assert_eq!(
            r,
            Received {
                fact: claim,
                verdict: RxVerdict::Drop(why)
            },
            "frame of {len}"
        );
    }
}

#[test]
fn data_is_written_with_its_real_source_and_trimmed() {
    let mut ip = ip_packet(100, OWN_IP);
    ip.extend_from_slice(&[0xEE; 6]); // link padding past the total length
    let (r, frame) = rx(&from_peer(ETHERTYPE_IPV4, &ip), meta(PEER_QPN));
    assert_eq!(
        r,
        Received {
            fact: RxFact::Data { from: peer_hw() },
            verdict: RxVerdict::Deliver(eth::HEADER_LEN + 100)
        }
    );
    let (h, body) = eth::parse_frame(&frame[..eth::HEADER_LEN + 100]).unwrap();
    assert_eq!(
        h,
        EthHeader {
            dst: local().mac,
            src: mac_for_gid(&peer_gid()),
            ethertype: ETHERTYPE_IPV4
        }
    );
    assert_eq!(body, &ip[..100]);
}

#[test]
fn data_received_in_place_is_the_frame_receive_writes_and_arp_is_not_in_place() {
    let mut ip = ip_packet(100, OWN_IP);
    ip.extend_from_slice(&[0xEE; 6]); // link padding past the total length
    let buf = from_peer(ETHERTYPE_IPV4, &ip);
    let (r, frame) = rx(&buf, meta(PEER_QPN));
    let mut inplace = buf.clone();
    let mut scratch = vec![0u8; eth::HEADER_LEN + 4096];
    let s = rx_in_place(&mut inplace, &mut scratch);
    let n = eth::HEADER_LEN + 100;
    assert_eq!(s.fact, r.fact);
    assert_eq!(s.verdict, RxVerdict::DeliverInPlace(n));
    assert_eq!(&inplace[RX_IN_PLACE_AT..RX_IN_PLACE_AT + n], &frame[..n]);
    assert!(scratch.iter().all(|&b| b == 0), "nothing copied");
    // A frame scratch too small refuses it in place too.
    let mut small = vec![0u8; n - 1];
    let mut inplace = buf.clone();
    let s = rx_in_place(&mut inplace, &mut small);
    assert_eq!(s.verdict, RxVerdict::Drop(RxDrop::Short));
    // ARP changes length: written to the scratch.
    let a = IpoibArp {
        op: arp::OP_REQUEST,
        sha: peer_hw(),
        spa: PEER_IP,
        tha: IpoibAddr::ZERO,
        tpa: OWN_IP,
    };
    let buf = from_peer(ETHERTYPE_ARP, &arp_bytes(&a));
    let (r, frame) = rx(&buf, meta(PEER_QPN));
    let mut inplace = buf.clone();
    let s = rx_in_place(&mut inplace, &mut scratch);
    assert_eq!(s, r);
    let RxVerdict::Deliver(n) = s.verdict else {
        panic!("{s:?}");
    };
    assert_eq!(&scratch[..n], &frame[..n]);
    assert_eq!(inplace, buf, "the receive buffer is left as it was");
}

#[test]
fn the_destination_mac_follows_the_ip_destination_and_the_group() {
    let group = Gid([
        0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff,
    ]);
    let mcast = Ipv4Addr::new(224, 0, 0, 251);
    // (case, IP destination, destination GID, the frame's destination MAC)
    let cases = [
        ("unicast to us", OWN_IP, own_gid(), local().mac),
        (
            "unicast to us, sent to the group",
            OWN_IP,
            group,
            Mac::BROADCAST,
        ),
        (
            "limited broadcast",
            Ipv4Addr::BROADCAST,
            own_gid(),
            Mac::BROADCAST,
        ),
        (
            "subnet broadcast",
            Ipv4Addr::new(198, 18, 0, 255),
            own_gid(),
            Mac::BROADCAST,
        ),
        (
            "another subnet's broadcast",
            Ipv4Addr::new(198, 18, 1, 255),
            own_gid(),
            local().mac,
        ),
        ("IPv4 multicast", mcast, group, multicast_mac(mcast)),
    ];
    for (name, dst, dgid, mac) in cases {
        let buf = recv(peer_gid(), dgid, ETHERTYPE_IPV4, &ip_packet(60, dst));
        let (r, frame) = rx(&buf, meta(PEER_QPN));
        assert_eq!(r.verdict, RxVerdict::Deliver(74), "{name}");
        assert_eq!(eth::parse_frame(&frame[..74]).unwrap().0.dst, mac, "{name}");
    }
    // A /31 has no broadcast address (RFC 3021).
    let l = Local {
        addr: Ipv4Cidr {
            addr: OWN_IP,
            prefix: 31,
        },
        ..local()
    };
    let buf = from_peer(ETHERTYPE_IPV4, &ip_packet(60, Ipv4Addr::new(198, 18, 0, 1)));
    let mut frame = [0u8; 128];
    let r = receive(&buf, meta(PEER_QPN), GrhKind::Ipv6, &l, &mut frame);
    assert_eq!(r.verdict, RxVerdict::Deliver(74));
    assert_eq!(eth::parse_frame(&frame[..74]).unwrap().0.dst, l.mac);
}

#[test]
fn data_larger_than_the_frame_is_short_but_still_seen() {
    let buf = from_peer(ETHERTYPE_IPV4, &ip_packet(200, OWN_IP));
    let mut frame = vec![0u8; eth::HEADER_LEN + 199];
    let r = receive(&buf, meta(PEER_QPN), GrhKind::Ipv6, &local(), &mut frame);
    assert_eq!(
        r,
        Received {
            fact: RxFact::Data { from: peer_hw() },
            verdict: RxVerdict::Drop(RxDrop::Short)
        }
    );
}

#[test]
fn a_rocev2_ipv4_grh_names_the_sender() {
    let ip = ip_packet(60, OWN_IP);
    let mut b = vec![0u8; GRH_LEN + ipoib::HEADER_LEN + ip.len()];
    grh::emit_ipv4(&mut b, 64, &peer_gid(), &own_gid()).unwrap();
    ipoib::emit_header(&mut b[GRH_LEN..], ETHERTYPE_IPV4).unwrap();
    b[GRH_LEN + ipoib::HEADER_LEN..].copy_from_slice(&ip);
    let mut frame = vec![0u8; 256];
    let r = receive(&b, meta(PEER_QPN), GrhKind::Ipv4, &local(), &mut frame);
    assert_eq!(r.fact, RxFact::Data { from: peer_hw() });
    // The same bytes read as an IB GRH are refused.
    let r = receive(&b, meta(PEER_QPN), GrhKind::Ipv6, &local(), &mut frame);
    assert_eq!(r, nothing(RxDrop::BadGrh));
}

// ---- send ----

fn eth_frame(dst: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; eth::HEADER_LEN + payload.len()];
    eth::emit_header(
        &mut f,
        &EthHeader {
            dst,
            src: local().mac,
            ethertype,
        },
    )
    .unwrap();
    f[eth::HEADER_LEN..].copy_from_slice(payload);
    f
}

fn eth_arp(op: u16, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let a = EthArp {
        op,
        sha: local().mac,
        spa: OWN_IP,
        tha,
        tpa,
    };
    let mut b = vec![0u8; arp::ETH_ARP_LEN];
    a.emit(&mut b).unwrap();
    b
}

/// The neighbour table of the send tests: the peer alone.
fn table(mac: &Mac) -> Option<IpoibAddr> {
    (*mac == mac_for_gid(&peer_gid())).then(peer_hw)
}

fn tx(frame: &[u8]) -> Result<TxPlan, TxDrop> {
    plan_send(frame, &local(), 1500, table)
}

#[test]
fn every_send_drop_reason() {
    let peer = mac_for_gid(&peer_gid());
    let stranger = Mac([2, 0, 198, 18, 0, 77]);
    let mut bad_ip = ip_packet(60, PEER_IP);
    bad_ip[0] = 0x46;
    bad_ip[2..4].copy_from_slice(&10u16.to_be_bytes());
    let cases: Vec<(&str, Vec<u8>, TxDrop)> = vec![
        ("shorter than a header", vec![0u8; 13], TxDrop::Short),
        (
            "VLAN-tagged",
            eth_frame(peer, ETHERTYPE_VLAN, &[0; 50]),
            TxDrop::Vlan,
        ),
        (
            "IPv6 header that does not parse",
            eth_frame(peer, ETHERTYPE_IPV6, &[0x60; 50]),
            TxDrop::BadIpv6,
        ),
        (
            "another EtherType",
            eth_frame(peer, 0x88cc, &[0; 50]),
            TxDrop::Unsupported,
        ),
        (
            "over the MTU",
            eth_frame(peer, ETHERTYPE_IPV4, &ip_packet(1501, PEER_IP)),
            TxDrop::Oversized,
        ),
        (
            "IPv4 header that does not parse",
            eth_frame(peer, ETHERTYPE_IPV4, &bad_ip),
            TxDrop::BadIpv4,
        ),
        (
            "ARP that does not parse",
            eth_frame(peer, ETHERTYPE_ARP, &[0; 20]),
            TxDrop::BadArp,
        ),
        (
            "ARP reply to an unknown MAC",
            eth_frame(
                stranger,
                ETHERTYPE_ARP,
                &eth_arp(arp::OP_REPLY, stranger, PEER_IP),
            ),
            TxDrop::NoNeighbour,
        ),
    ];
    for (name, frame, want) in cases {
        assert_eq!(tx(&frame), Err(want), "{name}");
    }
    // Exactly the MTU is carried.
    let f = eth_frame(peer, ETHERTYPE_IPV4, &ip_packet(1500, PEER_IP));
    assert!(tx(&f).is_ok());
}

#[test]
fn ipv4_goes_to_its_peer_or_the_group() {
    let peer = mac_for_gid(&peer_gid());
    let stranger = Mac([2, 0, 198, 18, 0, 77]);
    let m = multicast_mac(Ipv4Addr::new(224, 0, 0, 251));
    let cases = [
        (
            "to a known peer",
            peer,
            PEER_IP,
            Route::Peer {
                mac: peer,
                otherwise: Otherwise::Resolve(PEER_IP.into()),
            },
        ),
        (
            "to a MAC the table does not know: resolve its IP if it stays unknown",
            stranger,
            Ipv4Addr::new(198, 18, 0, 77),
            Route::Peer {
                mac: stranger,
                otherwise: Otherwise::Resolve(Ipv4Addr::new(198, 18, 0, 77).into()),
            },
        ),
        (
            "broadcast",
            Mac::BROADCAST,
            Ipv4Addr::BROADCAST,
            Route::Group,
        ),
        ("multicast", m, Ipv4Addr::new(224, 0, 0, 251), Route::Group),
    ];
    for (name, dst, ip, route) in cases {
        let mut packet = ip_packet(80, ip);
        packet.extend_from_slice(&[0xAB; 3]); // padding is carried as it came
        let f = eth_frame(dst, ETHERTYPE_IPV4, &packet);
        assert_eq!(
            tx(&f),
            Ok(TxPlan {
                route,
                body: Body::Ipv4 { len: 83 }
            }),
            "{name}"
        );
    }
}

#[test]
fn arp_is_rewritten_with_us_as_sender() {
    let peer = mac_for_gid(&peer_gid());
    let stranger = Mac([2, 0, 198, 18, 0, 77]);
    let own = local();
    // (case, frame destination, op, Ethernet tha, route, IPoIB tha)
    let cases = [
        (
            "request to everyone",
            Mac::BROADCAST,
            arp::OP_REQUEST,
            Mac::ZERO,
            Route::Group,
            IpoibAddr::ZERO,
        ),
        (
            "unicast request: to the group if the peer is lost",
            peer,
            arp::OP_REQUEST,
            Mac::ZERO,
            Route::Peer {
                mac: peer,
                otherwise: Otherwise::Group,
            },
            IpoibAddr::ZERO,
        ),
        (
            "reply to a known peer: its IPoIB address",
            peer,
            arp::OP_REPLY,
            peer,
            Route::Peer {
                mac: peer,
                otherwise: Otherwise::Drop,
            },
            peer_hw(),
        ),
        (
            "request naming an unknown target: zero",
            Mac::BROADCAST,
            arp::OP_REQUEST,
            stranger,
            Route::Group,
            IpoibAddr::ZERO,
        ),
        (
            "reply naming our own MAC: our IPoIB address",
            Mac::BROADCAST,
            arp::OP_REPLY,
            own.mac,
            Route::Group,
            own.hw,
        ),
    ];
    for (name, dst, op, tha, route, ib_tha) in cases {
        let f = eth_frame(dst, ETHERTYPE_ARP, &eth_arp(op, tha, PEER_IP));
        assert_eq!(
            tx(&f),
            Ok(TxPlan {
                route,
                body: Body::Arp(IpoibArp {
                    op,
                    sha: own.hw,
                    spa: OWN_IP,
                    tha: ib_tha,
                    tpa: PEER_IP
                })
            }),
            "{name}"
        );
    }
}

#[test]
fn bodies_are_written_behind_the_ipoib_header() {
    let packet = ip_packet(90, PEER_IP);
    let f = eth_frame(mac_for_gid(&peer_gid()), ETHERTYPE_IPV4, &packet);
    let plan = tx(&f).unwrap();
    assert!(!plan.body.is_arp());
    let mut out = vec![0xEEu8; 200];
    assert_eq!(plan.body.emit(&f, &mut out), Ok(90));
    assert_eq!(
        ipoib::parse_header(&out[..94]),
        Ok((ETHERTYPE_IPV4, &packet[..]))
    );
    assert_eq!(out[94], 0xEE, "nothing written past the packet");
    assert_eq!(plan.body.emit(&f, &mut out[..93]), Err(TxDrop::Oversized));

    let msg = arp_request(local().hw, OWN_IP, PEER_IP);
    assert_eq!(
        msg,
        IpoibArp {
            op: arp::OP_REQUEST,
            sha: local().hw,
            spa: OWN_IP,
            tha: IpoibAddr::ZERO,
            tpa: PEER_IP
        }
    );
    let body = Body::Arp(msg);
    assert!(body.is_arp());
    assert_eq!(body.emit(&[], &mut out), Ok(arp::IPOIB_ARP_LEN));
    assert_eq!(
        ipoib::parse_header(&out[..60]),
        Ok((ETHERTYPE_ARP, &arp_bytes(&msg)[..]))
    );
    assert_eq!(emit_arp(&msg, &mut out[..59]), Err(TxDrop::BadArp));
    assert_eq!(emit_arp(&msg, &mut out[..3]), Err(TxDrop::BadArp));
}

#[test]
fn what_is_sent_is_what_the_peer_receives() {
    // The send side's bytes, behind a GRH, come out of the receive side as the frame
    // the kernel sent (with the MACs standing for the two ends).
    let packet = ip_packet(300, PEER_IP);
    let f = eth_frame(mac_for_gid(&peer_gid()), ETHERTYPE_IPV4, &packet);
    let mut wire = vec![0u8; GRH_LEN + 400];
    let n = tx(&f).unwrap().body.emit(&f, &mut wire[GRH_LEN..]).unwrap();
    grh::emit_ipv6(&mut wire, (n + 4) as u16, &own_gid(), &peer_gid()).unwrap();
    let peer = Local {
        hw: peer_hw(),
        mac: mac_for_gid(&peer_gid()),
        addr: local().addr,
        addr6: Addrs6::new(mac_for_gid(&peer_gid()), &[PEER_IP6.parse().unwrap()]),
    };
    let mut frame = vec![0u8; 512];
    let r = receive(
        &wire[..GRH_LEN + 4 + n],
        meta(OWN_QPN),
        GrhKind::Ipv6,
        &peer,
        &mut frame,
    );
    assert_eq!(r.verdict, RxVerdict::Deliver(f.len()));
    assert_eq!(frame[..f.len()], f[..]);
}

proptest! {
    #[test]
    fn arbitrary_receives_never_panic(
        b in proptest::collection::vec(any::<u8>(), 0..200),
        has_grh: bool,
        src_qp in 0u32..0x100_0000,
        frame_len in 0usize..128,
    ) {
        let mut frame = vec![0u8; frame_len];
        for kind in [GrhKind::Ipv4, GrhKind::Ipv6] {
            let r = receive(&b, RecvMeta { src_qp, has_grh }, kind, &local(), &mut frame);
            if let RxVerdict::Deliver(n) = r.verdict {
                prop_assert!(n <= frame.len());
            }
        }
    }

    #[test]
    fn receiving_in_place_finds_what_receive_finds(
        b in proptest::collection::vec(any::<u8>(), 0..200),
        has_grh: bool,
        src_qp in 0u32..0x100_0000,
        frame_len in 0usize..128,
        as_data: bool,
        v6: bool,
    ) {
        // Arbitrary bytes, and (`as_data`) a well-formed data packet behind a GRH: the two
        // ways agree on the fact and the drop, and a frame delivered in place is the frame
        // `receive` writes.
        let mut buf = b.clone();
        if as_data {
            let (ethertype, packet) = if v6 {
                let mut p = vec![0u8; 40 + b.len() % 64];
                p[0] = 0x60;
                let pl = (p.len() - 40) as u16;
                p[4..6].copy_from_slice(&pl.to_be_bytes());
                p[6] = 17;
                p[8..24].copy_from_slice(&PEER_IP6_ADDR.parse::<std::net::Ipv6Addr>().unwrap().octets());
                p[24..40].copy_from_slice(&OWN_IP6_ADDR.parse::<std::net::Ipv6Addr>().unwrap().octets());
                (ETHERTYPE_IPV6, p)
            } else {
                (ETHERTYPE_IPV4, ip_packet(20 + b.len() % 64, OWN_IP))
            };
            buf = vec![0u8; GRH_LEN + 4 + packet.len()];
            grh::emit_ipv6(&mut buf, (4 + packet.len()) as u16, &peer_gid(), &own_gid()).unwrap();
            ipoib::emit_header(&mut buf[GRH_LEN..], ethertype).unwrap();
            buf[GRH_LEN + 4..].copy_from_slice(&packet);
        }
        for kind in [GrhKind::Ipv4, GrhKind::Ipv6] {
            let meta = RecvMeta { src_qp, has_grh };
            let mut copied = vec![0u8; frame_len];
            let r = receive(&buf, meta, kind, &local(), &mut copied);
            let mut inplace = buf.clone();
            let mut scratch = vec![0u8; frame_len];
            let s = receive_in_place(&mut inplace, meta, kind, &local(), &mut scratch);
            prop_assert_eq!(r.fact, s.fact);
            match (r.verdict, s.verdict) {
                (RxVerdict::Deliver(n), RxVerdict::DeliverInPlace(m)) => {
                    prop_assert_eq!(n, m);
                    prop_assert_eq!(&copied[..n], &inplace[RX_IN_PLACE_AT..RX_IN_PLACE_AT + n]);
                }
                (RxVerdict::Deliver(n), RxVerdict::Deliver(m)) => {
                    prop_assert_eq!(n, m);
                    prop_assert_eq!(&copied[..n], &scratch[..n]);
                }
                (x, y) => prop_assert_eq!(x, y),
            }
        }
    }

    #[test]
    fn arbitrary_frames_never_panic(
        f in proptest::collection::vec(any::<u8>(), 0..200),
        mtu in 0usize..200,
    ) {
        if let Ok(p) = plan_send(&f, &local(), mtu, table) {
            let mut out = [0u8; 256];
            let _ = p.body.emit(&f, &mut out);
            let mut g = f.clone();
            let _ = p.body.emit_in_place(&mut g);
        }
    }

    #[test]
    fn a_packet_made_in_place_is_the_one_emit_writes(
        len in 20usize..600,
        v6: bool,
        fill: u8,
    ) {
        // Any IPv4 or IPv6 data frame: the IPoIB packet left in the frame by
        // `emit_in_place` is byte for byte what `emit` writes into another buffer.
        let f = if v6 {
            let mut p = vec![fill; len.max(40)];
            p[..40].fill(0);
            p[0] = 0x60;
            let pl = (p.len() - 40) as u16;
            p[4..6].copy_from_slice(&pl.to_be_bytes());
            p[6] = 17;
            p[8..24].copy_from_slice(&PEER_IP6_ADDR.parse::<std::net::Ipv6Addr>().unwrap().octets());
            p[24..40].copy_from_slice(&PEER_IP6_ADDR.parse::<std::net::Ipv6Addr>().unwrap().octets());
            eth_frame(mac_for_gid(&peer_gid()), ETHERTYPE_IPV6, &p)
        } else {
            let mut p = ip_packet(len, PEER_IP);
            for b in &mut p[20..] {
                *b = fill;
            }
            eth_frame(mac_for_gid(&peer_gid()), ETHERTYPE_IPV4, &p)
        };
        let plan = tx(&f).unwrap();
        let mut out = vec![0u8; f.len()];
        let n = plan.body.emit(&f, &mut out).unwrap();
        let mut g = f.clone();
        let m = plan.body.emit_in_place(&mut g).unwrap();
        prop_assert_eq!(m, Some(n));
        prop_assert_eq!(&g[IN_PLACE_AT..IN_PLACE_AT + ipoib::HEADER_LEN + n], &out[..ipoib::HEADER_LEN + n]);
    }
}
