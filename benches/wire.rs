//! The codecs alone (criterion): what the datapath spends on bytes, per packet.
//!
//! - `eth_parse`: Ethernet header of a TAP frame (VLAN check, EtherType);
//! - `ipv4_summary`: the IPv4 header the TX path validates and the RX path trims by;
//! - `ipoib_header`: emitting and parsing the 4-byte IPoIB header;
//! - `grh_parse/ipv4|ipv6`: the 40 bytes in front of every UD receive (RoCEv2-IPv4, as
//!   rxe gives with IPv4-mapped GIDs, and the IB/IPv6 layout);
//! - `arp`: Ethernet ARP → IPoIB ARP (TX) and back (RX), parse + translate + emit;
//! - `eth_to_ipoib/<len>`: the TX translation of one IPv4 frame, copy included;
//! - `ipoib_to_eth/<len>`: the RX translation of one received IPv4 packet, copy included;
//! - `gso_segment`: cutting one 64 KiB TCP super-frame from the TAP into 16 segments of
//!   MSS 4052 (copies, IPv4 and TCP checksums included), per super-frame;
//! - `gso_join`: verifying 16 received segments and joining them into one super-frame
//!   for the TAP, per super-frame.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use uipoib::verbs::{GRH_LEN, Gid, GrhKind};
use uipoib::wire::arp::{self, EthArp, IpoibArp};
use uipoib::wire::eth::{self, EthHeader, Mac, mac_for_gid};
use uipoib::wire::ipoib::{self, IpoibAddr};
use uipoib::wire::offload::{self, Coalescer, FrameSink, VNET_HDR_LEN, VnetHdr};
use uipoib::wire::{ETHERTYPE_IPV4, grh, ipv4};

fn ip_packet(len: usize) -> Vec<u8> {
    let mut ip = vec![0u8; len];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&[198, 18, 1, 1]);
    ip[16..20].copy_from_slice(&[198, 18, 1, 2]);
    let c = ipv4::checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip
}

fn eth_frame(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; eth::HEADER_LEN + payload.len()];
    eth::emit_header(
        &mut f,
        &EthHeader {
            dst: Mac([2, 0, 198, 18, 0, 2]),
            src: Mac([2, 0, 198, 18, 0, 1]),
            ethertype,
        },
    )
    .unwrap();
    f[eth::HEADER_LEN..].copy_from_slice(payload);
    f
}

fn bench_codecs(c: &mut Criterion) {
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(1));
    let frame = eth_frame(ETHERTYPE_IPV4, &ip_packet(1500));
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

    let own = IpoibAddr::new(17, sgid);
    let req = EthArp {
        op: arp::OP_REQUEST,
        sha: mac_for_gid(&sgid),
        spa: Ipv4Addr::new(198, 18, 1, 1),
        tha: Mac::ZERO,
        tpa: Ipv4Addr::new(198, 18, 1, 2),
    };
    let mut eth_arp = [0u8; arp::ETH_ARP_LEN];
    req.emit(&mut eth_arp).unwrap();
    let mut ib_arp = [0u8; 128];
    g.bench_function("arp/eth_to_ipoib", |b| {
        b.iter(|| {
            let a = EthArp::parse(black_box(&eth_arp)).unwrap();
            a.to_ipoib(own, IpoibAddr::ZERO)
                .emit(black_box(&mut ib_arp))
                .unwrap()
        })
    });
    let n = req
        .to_ipoib(own, IpoibAddr::ZERO)
        .emit(&mut ib_arp)
        .unwrap();
    let wire_arp = ib_arp[..n].to_vec();
    let mut out = [0u8; 64];
    g.bench_function("arp/ipoib_to_eth", |b| {
        b.iter(|| {
            let a = IpoibArp::parse(black_box(&wire_arp)).unwrap();
            a.to_eth(mac_for_gid(&a.sha.gid), Mac::ZERO)
                .emit(black_box(&mut out))
                .unwrap()
        })
    });

    for len in [52usize, 1500, 4092] {
        g.throughput(Throughput::Bytes(len as u64));
        let frame = eth_frame(ETHERTYPE_IPV4, &ip_packet(len));
        let mut sbuf = vec![0u8; 4096];
        g.bench_with_input(BenchmarkId::new("eth_to_ipoib", len), &len, |b, _| {
            b.iter(|| {
                let (h, payload) = eth::parse_frame(black_box(&frame)).unwrap();
                let s = ipv4::parse_summary(payload).unwrap();
                ipoib::emit_header(&mut sbuf, h.ethertype).unwrap();
                sbuf[ipoib::HEADER_LEN..ipoib::HEADER_LEN + payload.len()].copy_from_slice(payload);
                s.total_len
            })
        });
        let mut rbuf = vec![0u8; GRH_LEN + ipoib::HEADER_LEN + len];
        rbuf[..GRH_LEN].copy_from_slice(&g4);
        ipoib::emit_header(&mut rbuf[GRH_LEN..], ETHERTYPE_IPV4).unwrap();
        rbuf[GRH_LEN + ipoib::HEADER_LEN..].copy_from_slice(&ip_packet(len));
        let mut fbuf = vec![0u8; eth::HEADER_LEN + 4096];
        g.bench_with_input(BenchmarkId::new("ipoib_to_eth", len), &len, |b, _| {
            b.iter(|| {
                let buf = black_box(&rbuf[..]);
                let gi = grh::parse(&buf[..GRH_LEN], GrhKind::Ipv4).unwrap();
                let (_, payload) = ipoib::parse_header(&buf[GRH_LEN..]).unwrap();
                let s = ipv4::parse_summary(payload).unwrap();
                let h = EthHeader {
                    dst: Mac([2, 0, 198, 18, 0, 2]),
                    src: mac_for_gid(&gi.sgid),
                    ethertype: ETHERTYPE_IPV4,
                };
                eth::emit_header(&mut fbuf, &h).unwrap();
                fbuf[eth::HEADER_LEN..eth::HEADER_LEN + s.total_len]
                    .copy_from_slice(&payload[..s.total_len]);
                s.total_len
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
    eth_frame(ETHERTYPE_IPV4, &ip)
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
    let mss = 4052u16;
    let frame = tcp_super_frame(usize::from(mss) * 16);
    let hdr = VnetHdr {
        flags: offload::F_NEEDS_CSUM,
        gso_type: offload::GSO_TCPV4,
        hdr_len: 54,
        gso_size: mss,
        csum_start: 34,
        csum_offset: 16,
    };
    let mut out = vec![0u8; 4200];
    g.bench_function("gso_segment", |b| {
        b.iter(|| {
            let p = offload::plan(black_box(&frame), &hdr).unwrap();
            let mut n = 0;
            for i in 0..p.segments {
                n += offload::segment(&frame, &p, i, &mut out).unwrap();
            }
            n
        })
    });
    let p = offload::plan(&frame, &hdr).unwrap();
    let segs: Vec<Vec<u8>> = (0..p.segments)
        .map(|i| {
            let n = offload::segment(&frame, &p, i, &mut out).unwrap();
            out[..n].to_vec()
        })
        .collect();
    let mut co = Coalescer::new();
    g.bench_function("gso_join", |b| {
        b.iter(|| {
            for s in &segs {
                co.push(black_box(s), &mut Discard).unwrap();
            }
            co.flush(&mut Discard).unwrap();
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = bench_codecs, bench_gso
}
criterion_main!(benches);
