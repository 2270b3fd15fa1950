//! The codecs alone (criterion): what the datapath spends on bytes, per packet.
//!
//! - `eth_parse`: Ethernet header of a TAP frame (VLAN check, EtherType);
//! - `ipv4_summary`: the IPv4 header the TX path validates and the RX path trims by;
//! - `ipoib_header`: emitting and parsing the 4-byte IPoIB header;
//! - `grh_parse/ipv4|ipv6`: the 40 bytes in front of every UD receive (RoCEv2-IPv4, as
//!   rxe gives with IPv4-mapped GIDs, and the IB/IPv6 layout);
//! - `arp/eth_to_ipoib`: the shipped send translation ([`translate::plan_send`] and
//!   [`Body::emit`](translate::Body::emit)) of an Ethernet ARP request from the TAP;
//! - `arp/ipoib_to_eth`: the shipped receive translation ([`translate::receive`]) of an
//!   IPoIB ARP request, GRH included;
//! - `eth_to_ipoib/<len>`: the send translation of one IPv4 frame, copy included;
//! - `ipoib_to_eth/<len>`: the receive translation of one IPv4 packet, copy included;
//! - `gso_segment`: the TAP's [`Segmenter`] cutting one 64 KiB TCP super-frame already
//!   read into 16 segments of MSS 4052 (copies, IPv4 and TCP checksums included), per
//!   super-frame;
//! - `gso_join`: the TAP's [`Joiner`] verifying 16 received segments and joining them
//!   into one super-frame, per super-frame;
//! - `gso_segment_v6`, `gso_join_v6`: the same over IPv6 (16 segments of MSS 4032, the
//!   same MTU less IPv6's 20 more header bytes).
//!
//! What the interface does with the translation's facts (the neighbour table, counters,
//! posting) is measured by `benches/datapath.rs` and `benches/neigh.rs`.

#[path = "../tests/common/frames.rs"]
mod frames;
#[path = "support/short.rs"]
mod short;

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use uipoib::verbs::{GRH_LEN, Gid, GrhKind};
use uipoib::wire::eth::{self, Mac, mac_for_gid};
use uipoib::wire::ipoib::{self, IpoibAddr};
use uipoib::wire::ipv4::Ipv4Cidr;
use uipoib::wire::offload::{self, FrameSink, Joiner, Segmenter, Taken, VNET_HDR_LEN, VnetHdr};
use uipoib::wire::translate::{self, Addrs6, Local, RecvMeta, RxVerdict};
use uipoib::wire::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, grh, ipv4};

/// An IPv4 packet of `len` bytes (198.18.1.1 -> 198.18.1.2, TCP, no DF), zeros after
/// its header.
fn ip_packet(len: usize) -> Vec<u8> {
    let (src, dst) = (Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2));
    frames::ipv4_packet_flags(src, dst, 6, 0, 0, &vec![0; len - 20])
}

/// A UD receive: `grh`, then what was sent (IPoIB header and payload).
fn ud_receive(grh: &[u8; GRH_LEN], sent: &[u8]) -> Vec<u8> {
    let mut r = grh.to_vec();
    r.extend_from_slice(sent);
    r
}

/// Two MACs for frames whose addresses do not matter.
const MAC_A: Mac = Mac([2, 0, 198, 18, 1, 1]);
const MAC_B: Mac = Mac([2, 0, 198, 18, 1, 2]);

fn bench_codecs(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    let frame = frames::eth_frame(MAC_B, MAC_A, ETHERTYPE_IPV4, &ip_packet(1500));
    g.bench_function("eth_parse", |b| {
        b.iter(|| eth::parse_frame(black_box(&frame)).unwrap().0.ethertype)
    });
    let ip = ip_packet(1500);
    g.bench_function("ipv4_summary", |b| {
        b.iter(|| ipv4::parse_summary(black_box(&ip)).unwrap().total_len)
    });
    let mut hdr = [0u8; 64];
    g.bench_function("ipoib_header", |b| {
        b.iter(|| {
            ipoib::emit_header(black_box(&mut hdr), ETHERTYPE_IPV4).unwrap();
            ipoib::parse_header(black_box(&hdr)).unwrap().0
        })
    });
    let (sgid, dgid) = (
        Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1)),
        Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 2)),
    );
    let mut g4 = [0u8; GRH_LEN];
    grh::emit_ipv4(&mut g4, 1504, &sgid, &dgid).unwrap();
    let mut g6 = [0u8; GRH_LEN];
    grh::emit_ipv6(&mut g6, 1504, &sgid, &dgid).unwrap();
    g.bench_function("grh_parse/ipv4", |b| {
        b.iter(|| grh::parse(black_box(&g4), GrhKind::Ipv4).unwrap().sgid)
    });
    g.bench_function("grh_parse/ipv6", |b| {
        b.iter(|| grh::parse(black_box(&g6), GrhKind::Ipv6).unwrap().sgid)
    });

    // A (198.18.1.1, QPN 17) sends to B (198.18.1.2, QPN 18); B receives from A.
    let (a_ip, b_ip) = (Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2));
    let a = Local {
        hw: IpoibAddr::new(17, sgid),
        mac: mac_for_gid(&sgid),
        addr: Ipv4Cidr {
            addr: a_ip,
            prefix: 24,
        },
        addr6: Addrs6::new(mac_for_gid(&sgid), &[]),
    };
    let b_local = Local {
        hw: IpoibAddr::new(18, dgid),
        mac: mac_for_gid(&dgid),
        addr: Ipv4Cidr {
            addr: b_ip,
            prefix: 24,
        },
        addr6: Addrs6::new(mac_for_gid(&dgid), &[]),
    };
    let b_hw = b_local.hw;
    let table = |mac: &Mac| (*mac == b_local.mac).then_some(b_hw);
    let from_a = RecvMeta {
        src_qp: 17,
        has_grh: true,
    };
    let arp_frame = frames::arp_request(a.mac, a_ip, b_ip);
    let mut sbuf = vec![0u8; 4096];
    g.bench_function("arp/eth_to_ipoib", |b| {
        b.iter(|| {
            let f = black_box(&arp_frame[..]);
            let p = translate::plan_send(f, &a, 4092, table).unwrap();
            p.body.emit(f, black_box(&mut sbuf)).unwrap()
        })
    });
    let n = translate::plan_send(&arp_frame, &a, 4092, table)
        .unwrap()
        .body
        .emit(&arp_frame, &mut sbuf)
        .unwrap();
    let arp_recv = ud_receive(&g4, &sbuf[..ipoib::HEADER_LEN + n]);
    let mut fbuf = vec![0u8; eth::HEADER_LEN + 4096];
    let delivered = |r: translate::Received| matches!(r.verdict, RxVerdict::Deliver(_));
    assert!(
        delivered(translate::receive(
            &arp_recv,
            from_a,
            GrhKind::Ipv4,
            &b_local,
            &mut fbuf
        )),
        "the ARP is carried: the whole path is measured"
    );
    g.bench_function("arp/ipoib_to_eth", |b| {
        b.iter(|| {
            let r = translate::receive(
                black_box(&arp_recv),
                from_a,
                GrhKind::Ipv4,
                &b_local,
                black_box(&mut fbuf),
            );
            r.verdict
        })
    });

    for len in [52usize, 1500, 4092] {
        g.throughput(Throughput::Bytes(len as u64));
        let frame = frames::eth_frame(b_local.mac, a.mac, ETHERTYPE_IPV4, &ip_packet(len));
        g.bench_with_input(BenchmarkId::new("eth_to_ipoib", len), &len, |b, _| {
            b.iter(|| {
                let f = black_box(&frame[..]);
                let p = translate::plan_send(f, &a, 4092, table).unwrap();
                p.body.emit(f, black_box(&mut sbuf)).unwrap()
            })
        });
        let n = translate::plan_send(&frame, &a, 4092, table)
            .unwrap()
            .body
            .emit(&frame, &mut sbuf)
            .unwrap();
        let rbuf = ud_receive(&g4, &sbuf[..ipoib::HEADER_LEN + n]);
        assert!(delivered(translate::receive(
            &rbuf,
            from_a,
            GrhKind::Ipv4,
            &b_local,
            &mut fbuf
        )));
        g.bench_with_input(BenchmarkId::new("ipoib_to_eth", len), &len, |b, _| {
            b.iter(|| {
                let r = translate::receive(
                    black_box(&rbuf),
                    from_a,
                    GrhKind::Ipv4,
                    &b_local,
                    black_box(&mut fbuf),
                );
                r.verdict
            })
        });
    }
    g.finish();
}

/// A TCP/IPv4 super-frame (DF set, 20-byte TCP header) with `payload` bytes.
fn tcp_super_frame(payload: usize) -> Vec<u8> {
    let total = 40 + payload;
    let mut ip = vec![0u8; total];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total.min(65535) as u16).to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[198, 18, 1, 2]);
    ip[16..20].copy_from_slice(&[198, 18, 1, 1]);
    ip[32] = 5 << 4;
    ip[33] = 0x10;
    for (i, b) in ip[40..].iter_mut().enumerate() {
        *b = i as u8;
    }
    frames::eth_frame(MAC_A, MAC_B, ETHERTYPE_IPV4, &ip)
}

/// A TCP/IPv6 super-frame (20-byte TCP header, no extension headers) with `payload`
/// bytes.
fn tcp6_super_frame(payload: usize) -> Vec<u8> {
    let mut ip = vec![0u8; 60 + payload];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&((20 + payload).min(65535) as u16).to_be_bytes());
    ip[6] = 6;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2).octets());
    ip[24..40].copy_from_slice(&Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1).octets());
    ip[52] = 5 << 4;
    ip[53] = 0x10;
    for (i, b) in ip[60..].iter_mut().enumerate() {
        *b = i as u8;
    }
    frames::eth_frame(MAC_A, MAC_B, ETHERTYPE_IPV6, &ip)
}

struct Discard;

impl FrameSink for Discard {
    fn write(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> std::io::Result<()> {
        black_box((hdr, frame));
        Ok(())
    }
}

fn bench_gso(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    for (suffix, ip_hl, gso_type, mss) in [
        ("", 20u16, offload::GSO_TCPV4, 4052u16),
        ("_v6", 40, offload::GSO_TCPV6, 4032),
    ] {
        let payload = usize::from(mss) * 16;
        let frame = if gso_type == offload::GSO_TCPV6 {
            tcp6_super_frame(payload)
        } else {
            tcp_super_frame(payload)
        };
        let hdr = VnetHdr {
            flags: offload::F_NEEDS_CSUM,
            gso_type,
            hdr_len: 14 + ip_hl + 20,
            gso_size: mss,
            csum_start: 14 + ip_hl,
            csum_offset: 16,
        };
        let mut out = vec![0u8; 4200];
        let mut cut = Segmenter::new();
        let mut h = [0u8; VNET_HDR_LEN];
        hdr.emit(&mut h);
        let read = cut.read_buf();
        read[..VNET_HDR_LEN].copy_from_slice(&h);
        read[VNET_HDR_LEN..VNET_HDR_LEN + frame.len()].copy_from_slice(&frame);
        let n = VNET_HDR_LEN + frame.len();
        g.bench_function(format!("gso_segment{suffix}"), |b| {
            b.iter(|| {
                // The read is taken again each time: planning does not change it.
                let Taken::Cut { first, .. } = cut.take(black_box(n), &mut out).unwrap() else {
                    unreachable!("a TSO read");
                };
                let mut len = first.unwrap();
                while let Some((_, _, r)) = cut.next_segment(&mut out) {
                    len += r.unwrap();
                }
                len
            })
        });
        let p = offload::plan(&frame, &hdr).unwrap();
        assert_eq!(p.segments, 16);
        let segs: Vec<Vec<u8>> = (0..p.segments)
            .map(|i| {
                let n = offload::segment(&frame, &p, i, &mut out).unwrap();
                out[..n].to_vec()
            })
            .collect();
        let mut join = Joiner::new();
        g.bench_function(format!("gso_join{suffix}"), |b| {
            b.iter(|| {
                for s in &segs {
                    join.push(black_box(s), &mut Discard).unwrap();
                }
                let f = join.flush(&mut Discard);
                assert_eq!(f.joined, (1, 16), "all 16 joined");
                f
            })
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = short::short();
    targets = bench_codecs, bench_gso
}
criterion_main!(benches);
