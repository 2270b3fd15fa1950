//! tapcopy: the minimal TAP-to-TAP copy loop, the floor any TAP-fronted datapath pays.
//!
//! Creates two TAP devices (through `uipoib::tap::Tap`, exactly as the daemon does:
//! `IFF_TAP | IFF_NO_PI`, non-blocking), moves each into its network namespace, gives
//! them addresses and an MTU, and copies every Ethernet frame read from one into the
//! other, unchanged, until SIGINT/SIGTERM. One thread per direction, each waiting on its
//! source TAP with mio and reading until `WouldBlock`, as uipoib's poller does; no
//! translation, no queue, no verbs. `scripts/perf host` runs iperf3 across it and across
//! `uipoib sim-pair` in the same namespaces and compares.
//!
//! ```sh
//! ip netns add a; ip netns add b
//! cargo run --release --example tapcopy -- --netns-a a --netns-b b
//! ip netns exec b iperf3 -s -B 198.18.3.2 &  ip netns exec a iperf3 -c 198.18.3.2
//! ```

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use uipoib::tap::FrameIo;
use uipoib::tap::{Tap, TapDevice};
use uipoib::wire::eth::Mac;
use uipoib::wire::ipv4::Ipv4Cidr;

#[derive(Parser)]
#[command(about = "Copy Ethernet frames between two TAP devices (the TAP-only floor)")]
struct Args {
    /// Network namespace of TAP a.
    #[arg(long)]
    netns_a: String,
    /// Network namespace of TAP b.
    #[arg(long)]
    netns_b: String,
    /// Name of TAP a.
    #[arg(long, default_value = "tcpa")]
    tap_a: String,
    /// Name of TAP b.
    #[arg(long, default_value = "tcpb")]
    tap_b: String,
    /// Address of TAP a.
    #[arg(long, default_value = "198.18.3.1/24")]
    addr_a: String,
    /// Address of TAP b.
    #[arg(long, default_value = "198.18.3.2/24")]
    addr_b: String,
    /// MTU of both TAPs (uipoib's IPoIB MTU over a 4096-byte port is 4092).
    #[arg(long, default_value_t = 4092)]
    mtu: usize,
    /// Open both TAPs with offloads (`IFF_VNET_HDR`, checksum and TSO) and pass each
    /// read, virtio_net_hdr and super-frame included, unchanged to the other TAP: the
    /// floor with offloads (nothing cut into segments, no checksum computed).
    #[arg(long)]
    offload: bool,
}

/// Copy frames from `from` to `to` until `stop`; returns frames copied.
fn pump(from: &Tap, to: &Tap, stop: &AtomicBool, copied: &AtomicU64) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let fd = from.raw_fd();
    poll.registry()
        .register(&mut SourceFd(&fd), Token(0), Interest::READABLE)?;
    let mut events = Events::with_capacity(4);
    let mut buf = vec![0u8; 65536];
    while !stop.load(Ordering::Relaxed) {
        match poll.poll(&mut events, Some(Duration::from_millis(200))) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        loop {
            let r = if from.offload() {
                from.read_raw(&mut buf)
            } else {
                from.read_frame(&mut buf)
            };
            match r {
                Ok(n) => {
                    // A full TAP queue on the other side drops the frame, as a NIC would.
                    let _ = if to.offload() {
                        to.write_raw(&buf[..n])
                    } else {
                        to.write_frame(&buf[..n])
                    };
                    copied.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;

    let a = Arc::new(Tap::create(&args.tap_a, args.offload)?);
    let b = Arc::new(Tap::create(&args.tap_b, args.offload)?);
    let addr_a: Ipv4Cidr = args.addr_a.parse()?;
    let addr_b: Ipv4Cidr = args.addr_b.parse()?;
    a.configure(
        Mac([0x02, 0, 198, 18, 3, 1]),
        args.mtu,
        addr_a,
        &[],
        Some(&args.netns_a),
    )?;
    b.configure(
        Mac([0x02, 0, 198, 18, 3, 2]),
        args.mtu,
        addr_b,
        &[],
        Some(&args.netns_b),
    )?;
    println!(
        "tapcopy: {} ({addr_a}, netns {}) <-> {} ({addr_b}, netns {}), mtu {}, offload {}",
        args.tap_a, args.netns_a, args.tap_b, args.netns_b, args.mtu, args.offload
    );

    let ab = Arc::new(AtomicU64::new(0));
    let ba = Arc::new(AtomicU64::new(0));
    let spawn = |from: Arc<Tap>, to: Arc<Tap>, n: Arc<AtomicU64>, name: &str| {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || pump(&from, &to, &stop, &n))
    };
    let t1 = spawn(a.clone(), b.clone(), ab.clone(), "copy-ab")?;
    let t2 = spawn(b, a, ba.clone(), "copy-ba")?;
    for t in [t1, t2] {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                eprintln!("tapcopy: {e}");
            }
            Err(_) => eprintln!("tapcopy: a copy thread panicked"),
        }
    }
    println!(
        "tapcopy: copied a->b {} b->a {} frames",
        ab.load(Ordering::Relaxed),
        ba.load(Ordering::Relaxed)
    );
    Ok(())
}
