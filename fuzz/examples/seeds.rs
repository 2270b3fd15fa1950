//! Writes the seed corpus, `fuzz/seeds/<target>/<name>`, from real frames built with the
//! crate's own emitters (each file's name says what it is). Run it from `fuzz/` when a
//! target's input layout changes:
//!
//!     cargo run --example seeds
//!
//! The seeds are committed; `scripts/fuzz` copies them into a scratch corpus.

use std::net::Ipv4Addr;
use std::path::Path;

use uipoib::runtime::config::DEFAULT_GROUP;
use uipoib::verbs::{GRH_LEN, Gid};
use uipoib::wire::arp::{OP_REPLY, OP_REQUEST};
use uipoib::wire::eth::Mac;
use uipoib::wire::ipoib::IpoibAddr;
use uipoib::wire::offload::{self, VnetHdr};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, grh};
use uipoib_fuzz::frames::*;
use uipoib_fuzz::input::join;
use uipoib_fuzz::world::{A_IP, B_IP, RX_HOLD, RX_TO_GROUP, RxWorld, TxWorld, mode, read_for};

const R_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 9);
const MCAST: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 251);

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    std::fs::create_dir_all(&dir).expect("seed dir");
    std::fs::write(dir.join(name), bytes).expect("seed file");
}

/// A TSO super-frame `src -> dst` of `payload` bytes, with the header the kernel gives.
fn tso(dst: Mac, src: Mac, payload: usize, mss: u16) -> Vec<u8> {
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut ip = tcp(A_IP, B_IP, 1000, 0x18, 77, &data);
    // A super-frame's TCP checksum field holds the pseudo-header sum (partial).
    let s = uipoib::wire::ipv4::ones_sum(&ip[12..20], 6 + (ip.len() - 20) as u64);
    let ps = uipoib::wire::ipv4::fold(s);
    ip[36..38].copy_from_slice(&ps.to_be_bytes());
    vnet_read(&tso_hdr(mss), &eth_frame(dst, src, ETHERTYPE_IPV4, &ip))
}

fn main() {
    let a_mac = Mac([2, 0, 198, 18, 0, 1]);
    let b_mac = Mac([2, 0, 198, 18, 0, 2]);

    // wire_eth
    let arp_req = eth_arp_frame(Mac::BROADCAST, OP_REQUEST, a_mac, A_IP, Mac::ZERO, B_IP);
    let ping = eth_frame(
        b_mac,
        a_mac,
        ETHERTYPE_IPV4,
        &icmp_echo(A_IP, B_IP, b"ping"),
    );
    write("wire_eth", "arp-request-frame", &arp_req);
    write("wire_eth", "icmp-echo-frame", &ping);
    write(
        "wire_eth",
        "vlan-tagged-frame",
        &eth_frame(b_mac, a_mac, ETHERTYPE_VLAN, &[0, 5, 8, 0]),
    );
    write("wire_eth", "mac-text", b"02:00:c6:12:00:01");

    // wire_arp
    write(
        "wire_arp",
        "eth-request",
        &eth_arp(OP_REQUEST, a_mac, A_IP, Mac::ZERO, B_IP),
    );
    write(
        "wire_arp",
        "eth-reply",
        &eth_arp(OP_REPLY, b_mac, B_IP, a_mac, A_IP),
    );
    let a_hw = IpoibAddr::new(17, gid(Ipv4Addr::new(198, 18, 0, 1)));
    let b_hw = IpoibAddr::new(18, gid(Ipv4Addr::new(198, 18, 0, 2)));
    write(
        "wire_arp",
        "ipoib-request",
        &ipoib_arp(OP_REQUEST, a_hw, A_IP, IpoibAddr::ZERO, B_IP),
    );
    write(
        "wire_arp",
        "ipoib-reply",
        &ipoib_arp(OP_REPLY, b_hw, B_IP, a_hw, A_IP),
    );

    // wire_ipoib
    let ib_arp = ipoib_packet(
        ETHERTYPE_ARP,
        &ipoib_arp(OP_REQUEST, a_hw, A_IP, IpoibAddr::ZERO, B_IP),
    );
    write("wire_ipoib", "arp-packet", &ib_arp);
    write(
        "wire_ipoib",
        "ipv4-packet",
        &ipoib_packet(ETHERTYPE_IPV4, &icmp_echo(A_IP, B_IP, b"ping")),
    );
    write("wire_ipoib", "hw-address", &a_hw.to_bytes());

    // wire_grh
    let (sg, dg) = (
        gid(Ipv4Addr::new(198, 18, 0, 2)),
        gid(Ipv4Addr::new(198, 18, 0, 1)),
    );
    let mut g6 = [0u8; GRH_LEN];
    grh::emit_ipv6(&mut g6, 88, &sg, &Gid::from_ipv4(DEFAULT_GROUP)).expect("grh");
    write("wire_grh", "ib-grh-to-group", &g6);
    let mut g4 = [0u8; GRH_LEN];
    grh::emit_ipv4(&mut g4, 88, &sg, &dg).expect("grh");
    write("wire_grh", "rocev2-ipv4-grh", &g4);

    // wire_ipv4
    write("wire_ipv4", "icmp-echo", &icmp_echo(A_IP, B_IP, b"ping"));
    write(
        "wire_ipv4",
        "tcp-segment",
        &tcp(A_IP, B_IP, 1, 0x10, 3, &[7; 100]),
    );
    let mut opts = ipv4_packet(A_IP, B_IP, 253, 4, &[0; 8]);
    opts[0] = 0x46;
    write("wire_ipv4", "header-with-options", &opts);

    // wire_gso: even mode byte, TAP reads; odd, frames to join.
    write(
        "wire_gso",
        "tso-3-segments",
        &join(0, &[(0, &tso(b_mac, a_mac, 2500, 1000))]),
    );
    let udp_frame = eth_frame(b_mac, a_mac, ETHERTYPE_IPV4, &udp(A_IP, B_IP, 53, b"query"));
    let csum = VnetHdr {
        flags: offload::F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    write(
        "wire_gso",
        "udp-partial-checksum",
        &join(0, &[(0, &vnet_read(&csum, &udp_frame))]),
    );
    let seg = |seq: u32, flags: u8, n: usize| {
        eth_frame(
            b_mac,
            a_mac,
            ETHERTYPE_IPV4,
            &tcp(A_IP, B_IP, seq, flags, seq as u16, &vec![5; n]),
        )
    };
    let (s1, s2, s3) = (
        seg(1, 0x10, 1000),
        seg(1001, 0x10, 1000),
        seg(2001, 0x18, 300),
    );
    write(
        "wire_gso",
        "gro-3-segments",
        &join(1, &[(0, &s1), (0, &s2), (0, &s3)]),
    );
    write(
        "wire_gso",
        "gro-gap-then-syn",
        &join(1, &[(0, &s1), (0, &s3), (0, &seg(9, 0x12, 0))]),
    );

    // tx_tap: the mode byte, then one TAP read per record.
    for (name, m) in [
        ("plain", 0),
        ("introduced-one-by-one", mode::INTRODUCE | mode::ONE_BY_ONE),
        (
            "link-local-small-mtu",
            mode::INTRODUCE | mode::LINK_LOCAL | mode::SMALL_MTU,
        ),
    ] {
        let w = TxWorld::new(m);
        let (am, bm) = (w.a_mac(), w.b_mac());
        w.finish();
        let f1 = eth_arp_frame(Mac::BROADCAST, OP_REQUEST, am, A_IP, Mac::ZERO, B_IP);
        let f2 = eth_frame(bm, am, ETHERTYPE_IPV4, &icmp_echo(A_IP, B_IP, &[1; 64]));
        let f3 = eth_frame(
            Mac([1, 0, 0x5e, 0, 0, 251]),
            am,
            ETHERTYPE_IPV4,
            &udp(A_IP, MCAST, 5353, b"mdns"),
        );
        let f4 = eth_arp_frame(bm, OP_REPLY, am, A_IP, bm, B_IP);
        let f5 = eth_frame(bm, am, ETHERTYPE_IPV6, &[0x60; 40]);
        write(
            "tx_tap",
            name,
            &join(m, &[(0, &f1), (0, &f2), (0, &f3), (0, &f4), (0, &f5)]),
        );
    }
    for (name, m) in [
        (
            "offload-tso",
            mode::A_OFFLOAD | mode::INTRODUCE | mode::ONE_BY_ONE,
        ),
        (
            "offload-tso-gro",
            mode::A_OFFLOAD | mode::B_OFFLOAD | mode::INTRODUCE,
        ),
    ] {
        let w = TxWorld::new(m);
        let (am, bm) = (w.a_mac(), w.b_mac());
        w.finish();
        let ping = read_for(
            true,
            &eth_frame(bm, am, ETHERTYPE_IPV4, &icmp_echo(A_IP, B_IP, b"x")),
        );
        let mut partial = udp_frame.clone();
        partial[..6].copy_from_slice(&bm.0);
        partial[6..12].copy_from_slice(&am.0);
        write(
            "tx_tap",
            name,
            &join(
                m,
                &[
                    (0, &tso(bm, am, 4000, 1448)),
                    (0, &ping),
                    (0, &vnet_read(&csum, &partial)),
                ],
            ),
        );
    }

    // rx_fabric: the mode byte, then one UD payload per record (flags: to the group; held
    // for the next poll).
    for (name, m) in [
        ("plain", 0),
        ("offload-gro", mode::A_OFFLOAD),
        ("link-local", mode::LINK_LOCAL),
    ] {
        let w = RxWorld::new(m);
        let (r, a) = (w.sender(), w.a_hw());
        w.finish();
        let req = ipoib_packet(
            ETHERTYPE_ARP,
            &ipoib_arp(OP_REQUEST, r, R_IP, IpoibAddr::ZERO, A_IP),
        );
        let rep = ipoib_packet(ETHERTYPE_ARP, &ipoib_arp(OP_REPLY, r, R_IP, a, A_IP));
        let echo = ipoib_packet(ETHERTYPE_IPV4, &icmp_echo(R_IP, A_IP, &[2; 56]));
        let seg = |seq: u32, flags: u8, n: usize| {
            ipoib_packet(
                ETHERTYPE_IPV4,
                &tcp(R_IP, A_IP, seq, flags, seq as u16, &vec![9; n]),
            )
        };
        let mut bad = echo.clone();
        bad[3] = 1;
        let v6 = ipoib_packet(ETHERTYPE_IPV6, &[0x60; 40]);
        write(
            "rx_fabric",
            name,
            &join(
                m,
                &[
                    (RX_TO_GROUP, &req),
                    (0, &rep),
                    (0, &echo),
                    (RX_HOLD, &seg(1, 0x10, 1000)),
                    (RX_HOLD, &seg(1001, 0x10, 1000)),
                    (0, &seg(2001, 0x18, 10)),
                    (
                        RX_TO_GROUP,
                        &ipoib_packet(ETHERTYPE_IPV4, &udp(R_IP, MCAST, 5353, b"mdns")),
                    ),
                    (0, &bad),
                    (0, &v6),
                    (0, &[8, 0]),
                ],
            ),
        );
    }

    // config
    let example =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/uipoib.toml"))
            .expect("config/uipoib.toml");
    write("config", "example-uipoib-toml", &example);
    write("config", "top-level-keys", b"device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nmtu = 2044\ngroup = \"ff12:401b::1\"\n");
    write(
        "config",
        "bad-ring",
        b"[interface]\nrecv-ring = 1000\nbudget = 0\nqkey = 0x80000000\n",
    );
}
