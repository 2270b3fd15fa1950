//! The TAP device: the ordinary IP interface users see.
//!
//! Opened with `IFF_TAP | IFF_NO_PI` ([`crate::sys::tap`]), non-blocking, and configured by
//! the daemon itself over rtnetlink and /proc/sys ([`crate::sys::netdev`]): the MAC that
//! stands for this interface's IPoIB address, the IPoIB MTU, the IPv4 address and any IPv6 addresses, link up. IPv6 is on (dual stack): the kernel
//! derives the TAP's link-local address from its MAC (EUI-64), and the configured
//! addresses are added with duplicate address detection left on. Only an IPv4-only
//! interface whose MTU is below IPv6's 1280 bytes, or on a kernel without IPv6, has it
//! off.
//!
//! With offloads (`tap-offload`, on by default) the TAP also has `IFF_VNET_HDR` with
//! checksum and TCP segmentation offload: the kernel's TCP hands over super-frames of up
//! to 64 KiB in one read, which are cut here into MTU-sized segments (src/wire/offload.rs),
//! and partial checksums are completed. The datapath sees ordinary frames either way.
//!
//! The TAP outlives the verbs objects: it stays up across a restart of the interface.

use std::fs::File;
use std::io::{self, IoSlice, Read, Write};
use std::net::IpAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

/// The least MTU IPv6 runs over (RFC 8200 §5); below it the kernel takes IPv6 off a link.
const MIN_IPV6_MTU: usize = 1280;

use crate::sys::netdev::{self, LinkChange};
use crate::wire::eth::Mac;
use crate::wire::ipv4::Ipv4Cidr;
use crate::wire::ipv6::Ipv6Cidr;
use crate::wire::offload::{FrameSink, Joiner, Segmenter, Taken, VNET_HDR_LEN};

/// A TAP failure, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// Creating the device failed.
    #[error(
        "cannot create TAP device {name:?}: {source} (is /dev/net/tun present, and does uipoib run as root or with CAP_NET_ADMIN?)"
    )]
    Create {
        /// The name.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// IPv6 addresses were asked for on a link too small for IPv6.
    #[error(
        "TAP {name}: MTU {mtu} is below the {MIN_IPV6_MTU} bytes IPv6 needs, and the interface \
         has IPv6 addresses (raise the MTU or give no IPv6 address)"
    )]
    Ipv6Mtu {
        /// The name.
        name: String,
        /// The MTU the interface has.
        mtu: usize,
    },
    /// A configuration step failed.
    #[error("configuring TAP {name}: {step} failed: {why}")]
    Configure {
        /// The name.
        name: String,
        /// The step (what was being set).
        step: String,
        /// The kernel's answer.
        why: String,
    },
}

/// A TAP device in non-blocking mode.
pub struct Tap {
    file: File,
    name: String,
    /// With offloads: super-frames read from the TAP, cut into frames.
    offload: Option<Mutex<Segmenter>>,
    /// With offloads: received frames joined before they are written.
    gro: Option<Mutex<Joiner>>,
    /// The network namespace it was moved to: its name and an open descriptor.
    netns: Mutex<Option<Arc<(String, OwnedFd)>>>,
    /// The IPv6 addresses [`Tap::configure`] added, added again by [`Tap::reconfigure`].
    addr6: Mutex<Vec<Ipv6Cidr>>,
    stats: Option<Arc<dyn OffloadCounters>>,
}

/// Writes a frame behind its `virtio_net_hdr` with one `writev`.
struct Sink<'a>(&'a File);

impl FrameSink for Sink<'_> {
    fn write(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> io::Result<()> {
        let n = self
            .0
            .write_vectored(&[IoSlice::new(hdr), IoSlice::new(frame)])?;
        if n != VNET_HDR_LEN + frame.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("the TAP took {n} of {} bytes", VNET_HDR_LEN + frame.len()),
            ));
        }
        Ok(())
    }
}

fn bad_offload(e: crate::wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Frames in and out of the TAP. Implemented by the real TAP device and by test doubles.
pub trait FrameIo: Send + Sync {
    /// Read one Ethernet frame; `WouldBlock` when none is waiting.
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Write one Ethernet frame (a TAP with offloads may hold it back to join it with the
    /// next ones, until [`FrameIo::flush`]).
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize>;
    /// Write out the frames held back; returns how many frames, since the last call, were
    /// accepted by `write_frame` but then could not be written.
    fn flush(&self) -> usize {
        0
    }
}

/// Where a TAP counts its offload work: TCP super-frames cut into segments on the way
/// out, received frames joined into super-frames on the way in. The interface's counters
/// implement it.
pub trait OffloadCounters: Send + Sync {
    /// `frames` super-frames from the TAP were cut into `segments` segments.
    fn segmented(&self, frames: u64, segments: u64);
    /// `frames` super-frames were written to the TAP, joined from `segments` frames.
    fn coalesced(&self, frames: u64, segments: u64);
}

/// What the poller and the supervisor need of a TAP: frames, a descriptor to wait on,
/// and the carrier.
pub trait TapDevice: FrameIo {
    /// The descriptor that becomes readable when frames wait.
    fn raw_fd(&self) -> RawFd;
    /// Set the link carrier: off while the interface is restarting or its port is down
    /// (the kernel then queues or drops cleanly and the address stays), on when it
    /// carries traffic again.
    fn set_carrier(&self, on: bool) -> io::Result<()>;
    /// Set a new MAC and MTU (after a rebuild found a different GID or port MTU).
    fn reconfigure(&self, mac: Mac, mtu: usize) -> Result<(), TapError>;
}

impl Tap {
    /// Create (or attach to) the TAP named `name`.
    pub fn create(name: &str, offload: bool) -> Result<Tap, TapError> {
        let (fd, real) =
            crate::sys::tap::open(name, offload).map_err(|source| TapError::Create {
                name: name.to_string(),
                source,
            })?;
        Ok(Tap {
            file: File::from(fd),
            name: real,
            offload: offload.then(|| Mutex::new(Segmenter::new())),
            gro: offload.then(|| Mutex::new(Joiner::new())),
            netns: Mutex::new(None),
            addr6: Mutex::new(Vec::new()),
            stats: None,
        })
    }

    /// Count offload work (super-frames cut and joined) in `stats`.
    pub fn with_stats(mut self, stats: Arc<dyn OffloadCounters>) -> Tap {
        self.stats = Some(stats);
        self
    }

    /// With offloads: (super-frames written, received frames joined into them).
    pub fn coalesced(&self) -> (u64, u64) {
        self.gro.as_ref().map_or((0, 0), |g| {
            g.lock().unwrap_or_else(|e| e.into_inner()).coalesced()
        })
    }

    /// Whether frames come and go with a `virtio_net_hdr` (segmentation offload on).
    pub fn offload(&self) -> bool {
        self.offload.is_some()
    }

    /// Read what the TAP has, as it is (with offloads, its `virtio_net_hdr` first).
    pub fn read_raw(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Write `bytes` to the TAP as they are (with offloads, a `virtio_net_hdr` first).
    pub fn write_raw(&self, bytes: &[u8]) -> io::Result<usize> {
        (&self.file).write(bytes)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Move it into network namespace `netns` (if given), then set MAC and MTU, with IPv6
    /// addresses (`addr6`) enable IPv6 and add them, add the IPv4 address and bring it up.
    /// All of it is done by the daemon itself, over rtnetlink and /proc/sys
    /// ([`crate::sys::netdev`]; in `netns`, from a thread that entered it), not by running
    /// `ip` or `sysctl`.
    ///
    /// The order matters for IPv6: it is switched off while the MAC and MTU are set and
    /// on afterwards, so that the link-local address the kernel derives (EUI-64,
    /// `addr_gen_mode` 0) comes from the final MAC, also on a TAP that existed before.
    /// The IPv6 addresses keep duplicate address detection. Without IPv6 addresses IPv6
    /// stays off (best effort: a kernel without IPv6 has no such sysctl); with them, a
    /// kernel that cannot enable it is an error naming the sysctl, as is an MTU below
    /// the 1280 bytes IPv6 needs.
    pub fn configure(
        &self,
        mac: Mac,
        mtu: usize,
        addr: Ipv4Cidr,
        addr6: &[Ipv6Cidr],
        netns: Option<&str>,
    ) -> Result<(), TapError> {
        let name = self.name().to_string();
        if !addr6.is_empty() && mtu < MIN_IPV6_MTU {
            return Err(TapError::Ipv6Mtu { name, mtu });
        }
        let ns = match netns {
            Some(ns) => {
                let fail = self.failed(format!("moving it to network namespace {ns}"));
                let fd = netdev::open_netns(ns).map_err(&fail)?;
                netdev::index(&name)
                    .and_then(|i| netdev::move_to_netns(i, &fd))
                    .map_err(&fail)?;
                Some(Arc::new((ns.to_string(), fd)))
            }
            None => None,
        };
        if let Ok(mut n) = self.netns.lock() {
            n.clone_from(&ns);
        }
        if let Ok(mut a) = self.addr6.lock() {
            *a = addr6.to_vec();
        }
        self.in_netns(ns.as_deref(), || {
            let i = self.set_link(mac, mtu, addr6)?;
            netdev::replace_addr(i, IpAddr::V4(addr.addr), addr.prefix)
                .map_err(self.failed(format!("adding address {addr}")))?;
            netdev::set_link(
                i,
                LinkChange {
                    up: true,
                    ..LinkChange::default()
                },
            )
            .map_err(self.failed("bringing it up".to_string()))
        })
    }

    /// Change MAC and MTU after a rebuild found a different GID or port MTU. IPv6 is
    /// switched off and on around it, as in [`Tap::configure`], so that the link-local
    /// address follows the new MAC (the kernel does not derive it again on a MAC
    /// change); the IPv6 addresses are added again. The IPv4 address stays.
    pub fn reconfigure(&self, mac: Mac, mtu: usize) -> Result<(), TapError> {
        let netns = self.netns.lock().ok().and_then(|n| n.clone());
        let addr6 = self.addr6.lock().map(|a| a.clone()).unwrap_or_default();
        self.in_netns(netns.as_deref(), || {
            self.set_link(mac, mtu, &addr6).map(drop)
        })
    }

    /// Run `f` in the TAP's network namespace `netns` (its name and an open descriptor;
    /// on a thread that entered it), or here.
    fn in_netns(
        &self,
        netns: Option<&(String, OwnedFd)>,
        f: impl FnOnce() -> Result<(), TapError> + Send,
    ) -> Result<(), TapError> {
        let Some((ns, fd)) = netns else {
            return f();
        };
        // `f`'s own error comes back as the thread's result, inside Ok.
        netdev::in_netns(fd, || Ok(f()))
            .unwrap_or_else(|e| Err(self.failed(format!("entering network namespace {ns}"))(e)))
    }

    /// The TAP's interface index (in the namespace of the calling thread).
    fn index(&self) -> Result<u32, TapError> {
        netdev::index(self.name()).map_err(self.failed("finding its index".to_string()))
    }

    /// A [`TapError::Configure`] for `step`, from its I/O error.
    fn failed(&self, step: String) -> impl Fn(io::Error) -> TapError + '_ {
        move |e| TapError::Configure {
            name: self.name().to_string(),
            step: step.clone(),
            why: e.to_string(),
        }
    }

    /// IPv6 off, MAC and MTU, then IPv6 on (the link-local address derived from `mac`)
    /// and the `addr6` addresses added. Without `addr6`, IPv6 is switched on where the
    /// kernel and the MTU allow it (the link-local address alone), and left off
    /// otherwise. Runs in the TAP's namespace; returns the TAP's index there.
    fn set_link(&self, mac: Mac, mtu: usize, addr6: &[Ipv6Cidr]) -> Result<u32, TapError> {
        let name = self.name().to_string();
        // Best effort: without IPv6 there is nothing to clear.
        let _ = self.sysctl("disable_ipv6", "1");
        let i = self.index()?;
        let mtu32 = u32::try_from(mtu).unwrap_or(u32::MAX);
        netdev::set_link(
            i,
            LinkChange {
                mac: Some(mac.0),
                mtu: Some(mtu32),
                up: false,
            },
        )
        .map_err(self.failed(format!("setting MAC {mac} and MTU {mtu}")))?;
        if mtu < MIN_IPV6_MTU {
            if addr6.is_empty() {
                // IPv6 needs 1280 bytes: an IPv4-only interface on a smaller MTU keeps
                // it off.
                tracing::warn!(tap = %name, mtu, "MTU below 1280: IPv6 stays off on the TAP");
                return Ok(i);
            }
            return Err(TapError::Ipv6Mtu { name, mtu });
        }
        // EUI-64 from the MAC, the kernel's default, made explicit (best effort: older
        // kernels have no such sysctl).
        let _ = self.sysctl("addr_gen_mode", "0");
        let on = self.sysctl("disable_ipv6", "0");
        match on {
            // Without IPv6 addresses asked for, a kernel without IPv6 is not an error.
            Err(e) if addr6.is_empty() => {
                tracing::warn!(tap = %name, error = %e, "IPv6 could not be switched on on the TAP");
                return Ok(i);
            }
            r => r?,
        }
        for a in addr6 {
            netdev::replace_addr(i, IpAddr::V6(a.addr), a.prefix)
                .map_err(self.failed(format!("adding address {a}")))?;
        }
        Ok(i)
    }

    /// Write `value` to /proc/sys/net/ipv6/conf/NAME/`key` (the sysctl of the calling
    /// thread's network namespace).
    fn sysctl(&self, key: &str, value: &str) -> Result<(), TapError> {
        let path = format!("/proc/sys/net/ipv6/conf/{}/{key}", self.name());
        let fail = self.failed(format!("writing {value} to {path}"));
        // Opened for writing only: /proc/sys refuses to create, and a missing key opened
        // with O_CREAT would read as "Permission denied".
        let write = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        match write {
            Err(e)
                if e.kind() == io::ErrorKind::NotFound
                    && !std::path::Path::new("/proc/sys/net/ipv6").exists() =>
            {
                Err(fail(io::Error::new(
                    e.kind(),
                    "this kernel has no IPv6 (booted with ipv6.disable=1?)",
                )))
            }
            r => r.map_err(fail),
        }
    }
}

impl FrameIo for Tap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(cut) = &self.offload else {
            return (&self.file).read(buf);
        };
        let mut cut = cut.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, r)) = cut.next_segment(buf) {
            return r.map_err(bad_offload);
        }
        let n = (&self.file).read(cut.read_buf())?;
        match cut.take(n, buf).map_err(bad_offload)? {
            Taken::Frame(len) => Ok(len),
            Taken::Cut { plan, first } => {
                if let Some(s) = &self.stats {
                    s.segmented(1, plan.segments as u64);
                }
                first.map_err(bad_offload)
            }
        }
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        let Some(gro) = &self.gro else {
            return (&self.file).write(frame);
        };
        let mut g = gro.lock().unwrap_or_else(|e| e.into_inner());
        // A frame that could not be written is counted by the joiner and reported (as a
        // drop) at the next flush.
        let _ = g.push(frame, &mut Sink(&self.file));
        Ok(frame.len())
    }

    fn flush(&self) -> usize {
        let Some(gro) = &self.gro else {
            return 0;
        };
        let mut g = gro.lock().unwrap_or_else(|e| e.into_inner());
        let f = g.flush(&mut Sink(&self.file));
        if let Some(s) = &self.stats
            && f.joined != (0, 0)
        {
            s.coalesced(f.joined.0, f.joined.1);
        }
        f.lost
    }
}

impl TapDevice for Tap {
    fn raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    fn set_carrier(&self, on: bool) -> io::Result<()> {
        crate::sys::tap::set_carrier(self.file.as_raw_fd(), on)
    }

    fn reconfigure(&self, mac: Mac, mtu: usize) -> Result<(), TapError> {
        Tap::reconfigure(self, mac, mtu)
    }
}
