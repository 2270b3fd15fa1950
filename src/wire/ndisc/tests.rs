use super::*;
use crate::wire::gid::Gid;
use crate::wire::ipv6::parse_summary;
use crate::wire::ipv6::test_packets::icmp6 as packet;
use proptest::prelude::*;

fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

const MAC_A: Mac = Mac([0x02, 0x00, 0xc6, 0x12, 0x00, 0x01]);

fn hw_a() -> IpoibAddr {
    IpoibAddr::new(0x11, Gid::from_ipv4(std::net::Ipv4Addr::new(198, 18, 0, 1)))
}

fn mac_opt(kind: u8, m: Mac) -> Vec<u8> {
    let mut o = vec![kind, 1];
    o.extend_from_slice(&m.0);
    o
}

/// What the kernel sends on the TAP to resolve `target`: NS to its solicited-node group
/// with the sender's MAC in a source link-layer option.
fn eth_ns(src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let mut m = vec![NEIGHBOUR_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend(mac_opt(OPT_SOURCE_LL, MAC_A));
    packet(src, ipv6::solicited_node(&target), 255, &m)
}

fn parsed<A: LinkAddr>(p: &[u8]) -> Result<Nd<A>, WireError> {
    let s = parse_summary(p)?;
    let (proto, at) = s.upper.unwrap();
    assert_eq!(proto, PROTO_ICMPV6);
    parse::<A>(p, &s, at)
}

/// TAP form → IPoIB form → TAP form, checking each step.
fn round_trip(p: &[u8], sll: Option<IpoibAddr>, tll: Option<IpoibAddr>) -> Nd<IpoibAddr> {
    let nd = parsed::<Mac>(p).unwrap();
    let mut wire = [0u8; 512];
    let n = nd.translate(p, sll, tll, &mut wire).unwrap();
    let grown = usize::from(nd.source_ll.is_some()) * 16 + usize::from(nd.target_ll.is_some()) * 16;
    assert_eq!(n, p.len() + grown);
    let back = parsed::<IpoibAddr>(&wire[..n]).expect("the IPoIB form parses, checksum and all");
    assert_eq!(back.kind, nd.kind);
    assert_eq!(back.target, nd.target);
    assert_eq!(back.flags, nd.flags);
    assert_eq!(
        back.source_ll,
        if nd.source_ll.is_some() { sll } else { None }
    );
    assert_eq!(
        back.target_ll,
        if nd.target_ll.is_some() { tll } else { None }
    );
    let mut eth = [0u8; 512];
    let m = back
        .translate(&wire[..n], nd.source_ll, nd.target_ll, &mut eth)
        .unwrap();
    assert_eq!(&eth[..m], p, "translated back, the message is the original");
    back
}

#[test]
fn neighbour_solicitation_round_trips_with_a_20_byte_option() {
    let p = eth_ns(ip("2001:2:0:1::1"), ip("2001:2:0:1::2"));
    let nd = round_trip(&p, Some(hw_a()), None);
    assert_eq!(nd.kind, NEIGHBOUR_SOLICIT);
    assert_eq!(nd.target, Some(ip("2001:2:0:1::2")));
    // The option on the wire: type 1, length 3, two zero bytes, the QPN word, the GID.
    let s = parse_summary(&p).unwrap();
    let nd_eth = parse::<Mac>(&p, &s, 40).unwrap();
    let mut wire = [0u8; 128];
    let n = nd_eth.translate(&p, Some(hw_a()), None, &mut wire).unwrap();
    let opt = &wire[n - 24..n];
    assert_eq!(&opt[..4], &[1, 3, 0, 0]);
    assert_eq!(&opt[4..], &hw_a().to_bytes());
}

#[test]
fn advertisement_keeps_its_flags_and_target_option() {
    let mut m = vec![
        NEIGHBOUR_ADVERT,
        0,
        0,
        0,
        NA_SOLICITED | NA_OVERRIDE,
        0,
        0,
        0,
    ];
    m.extend_from_slice(&ip("fe80::1").octets());
    m.extend(mac_opt(OPT_TARGET_LL, MAC_A));
    let p = packet(ip("fe80::1"), ip("fe80::2"), 255, &m);
    let nd = round_trip(&p, None, Some(hw_a()));
    assert_eq!(nd.flags, NA_SOLICITED | NA_OVERRIDE);
    assert_eq!(nd.target_ll, Some(hw_a()));
}

#[test]
fn router_messages_and_redirects_keep_their_other_options() {
    // RA: source LL option, a prefix information option (type 3, 32 bytes) and an MTU
    // option (type 5, 8 bytes), carried byte for byte.
    let mut m = vec![
        ROUTER_ADVERT,
        0,
        0,
        0,
        64,
        0,
        0x07,
        0x08,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        0,
    ];
    m.extend(mac_opt(OPT_SOURCE_LL, MAC_A));
    let mut pio = vec![
        3, 4, 64, 0xc0, 0, 0, 0x0e, 0x10, 0, 0, 0x07, 0x08, 0, 0, 0, 0,
    ];
    pio.extend_from_slice(&ip("2001:2:0:1::").octets());
    m.extend(pio);
    m.extend([5, 1, 0, 0, 0, 0, 0x03, 0xfc]);
    let p = packet(ip("fe80::1"), ip("ff02::1"), 255, &m);
    round_trip(&p, Some(hw_a()), None);
    // RS with no options.
    let p = packet(
        ip("fe80::2"),
        ip("ff02::2"),
        255,
        &[ROUTER_SOLICIT, 0, 0, 0, 0, 0, 0, 0],
    );
    let nd = round_trip(&p, Some(hw_a()), None);
    assert_eq!(nd.source_ll, None);
    // Redirect: target and destination, a target LL option, a redirected header option.
    let mut m = vec![REDIRECT, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&ip("fe80::3").octets());
    m.extend_from_slice(&ip("2001:2:0:9::1").octets());
    m.extend(mac_opt(OPT_TARGET_LL, MAC_A));
    m.extend([4, 2, 0, 0, 0, 0, 0, 0, 0x60, 0, 0, 0, 0, 0, 0, 0]);
    let p = packet(ip("fe80::1"), ip("fe80::2"), 255, &m);
    let nd = round_trip(&p, None, Some(hw_a()));
    assert_eq!(nd.target, Some(ip("fe80::3")));
}

#[test]
fn an_option_with_no_new_address_is_left_out() {
    let p = eth_ns(ip("fe80::1"), ip("fe80::2"));
    let nd = parsed::<Mac>(&p).unwrap();
    let mut out = [0u8; 128];
    let n = nd.translate::<IpoibAddr>(&p, None, None, &mut out).unwrap();
    assert_eq!(n, p.len() - 8);
    let back = parsed::<IpoibAddr>(&out[..n]).unwrap();
    assert_eq!(back.source_ll, None);
}

#[test]
fn refuses_what_rfc_4861_refuses() {
    let good = eth_ns(ip("fe80::1"), ip("fe80::2"));
    let s = parse_summary(&good).unwrap();
    assert!(parse::<Mac>(&good, &s, 40).is_ok());
    let refuse = |p: Vec<u8>, want: &str| {
        let got = parsed::<Mac>(&p);
        assert_eq!(
            got,
            Err(WireError::BadNd(match got {
                Err(WireError::BadNd(w)) => w,
                other => panic!("{want}: got {other:?}"),
            }))
        );
        let Err(WireError::BadNd(why)) = got else {
            unreachable!()
        };
        assert!(why.contains(want), "{why:?} does not say {want:?}");
    };
    // Hop limit 254: forwarded from off-link.
    let mut m = good[40..].to_vec();
    m[2] = 0;
    m[3] = 0;
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 254, &m),
        "hop limit",
    );
    let mut c = m.clone();
    c[1] = 1;
    refuse(packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &c), "code");
    let mut bad = good.clone();
    bad[50] ^= 1;
    refuse(bad, "checksum");
    let mut z = m.clone();
    z[25] = 0;
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &z),
        "length 0",
    );
    let mut long = m.clone();
    long[25] = 2;
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &long),
        "longer than the message",
    );
    let mut rep = m.clone();
    rep.extend(mac_opt(OPT_SOURCE_LL, MAC_A));
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &rep),
        "repeated",
    );
    refuse(packet(ip("::"), ip("ff02::1:ff00:2"), 255, &m), "from ::");
    let mut mc = m.clone();
    mc[8..24].copy_from_slice(&ip("ff02::1").octets());
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &mc),
        "multicast",
    );
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &m[..20]),
        "fixed part",
    );
    refuse(
        packet(ip("fe80::1"), ip("ff02::1:ff00:2"), 255, &m[..25]),
        "truncated",
    );
    let mut na = vec![NEIGHBOUR_ADVERT, 0, 0, 0, NA_SOLICITED, 0, 0, 0];
    na.extend_from_slice(&ip("fe80::1").octets());
    refuse(
        packet(ip("fe80::1"), ip("ff02::1"), 255, &na),
        "solicited advertisement to a multicast",
    );
    assert!(parsed::<Mac>(&packet(ip("fe80::1"), ip("fe80::2"), 255, &na)).is_ok());
    // A 6-byte MAC option arriving where 20-byte addresses are expected.
    assert!(matches!(
        parsed::<IpoibAddr>(&good),
        Err(WireError::BadNd(w)) if w.contains("wrong length")
    ));
    // Reserved bytes of an IPoIB option set.
    let nd = parsed::<Mac>(&good).unwrap();
    let mut wire = [0u8; 128];
    let n = nd.translate(&good, Some(hw_a()), None, &mut wire).unwrap();
    wire[n - 22] = 1;
    let sum = upper_checksum(
        &ip("fe80::1"),
        &ipv6::solicited_node(&ip("fe80::2")),
        PROTO_ICMPV6,
        &{
            let mut w = wire[40..n].to_vec();
            w[2] = 0;
            w[3] = 0;
            w
        },
    );
    wire[42..44].copy_from_slice(&sum.to_be_bytes());
    assert!(matches!(
        parsed::<IpoibAddr>(&wire[..n]),
        Err(WireError::BadNd(w)) if w.contains("reserved")
    ));
}

#[test]
fn duplicate_address_detection_probe_passes() {
    let mut m = vec![NEIGHBOUR_SOLICIT, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&ip("2001:2:0:1::7").octets());
    let p = packet(
        ip("::"),
        ipv6::solicited_node(&ip("2001:2:0:1::7")),
        255,
        &m,
    );
    let nd = round_trip(&p, Some(hw_a()), None);
    assert_eq!(nd.src, ip("::"));
    assert_eq!(nd.source_ll, None);
}

#[test]
fn solicitation_and_advertisement_this_interface_sends() {
    let mut out = [0u8; 128];
    let n = solicit(hw_a(), ip("fe80::1"), ip("fe80::2:3"), &mut out).unwrap();
    let nd = parsed::<IpoibAddr>(&out[..n]).unwrap();
    assert_eq!(nd.kind, NEIGHBOUR_SOLICIT);
    assert_eq!(nd.dst, ip("ff02::1:ff02:3"));
    assert_eq!(nd.target, Some(ip("fe80::2:3")));
    assert_eq!(nd.source_ll, Some(hw_a()));
    let n = advertise(hw_a(), ip("2001:2:0:1::1"), &mut out).unwrap();
    let nd = parsed::<IpoibAddr>(&out[..n]).unwrap();
    assert_eq!(nd.kind, NEIGHBOUR_ADVERT);
    assert_eq!(nd.src, ip("2001:2:0:1::1"));
    assert_eq!(nd.dst, ip("ff02::1"));
    assert_eq!(nd.flags, NA_OVERRIDE);
    assert_eq!(nd.target_ll, Some(hw_a()));
    assert!(solicit(hw_a(), ip("fe80::1"), ip("fe80::2"), &mut out[..60]).is_err());
}

proptest! {
    #[test]
    fn never_panics(body in proptest::collection::vec(any::<u8>(), 4..120), kind in 133u8..=137) {
        let mut m = body;
        if !m.is_empty() { m[0] = kind; }
        if m.len() > 1 { m[1] = 0; }
        let p = packet(ip("fe80::1"), ip("ff02::1"), 255, &m);
        let mut out = [0u8; 512];
        if let Ok(nd) = parsed::<Mac>(&p) {
            let _ = nd.translate(&p, Some(hw_a()), Some(hw_a()), &mut out);
            let _ = nd.translate(&p, Some(hw_a()), Some(hw_a()), &mut out[..50]);
        }
        if let Ok(nd) = parsed::<IpoibAddr>(&p) {
            let _ = nd.translate(&p, Some(MAC_A), Some(MAC_A), &mut out);
        }
    }
}
