//! The TAP device: the ordinary IP interface users see.
//!
//! Created with `IFF_TAP | IFF_NO_PI` through the tun-tap crate (no multi-queue or vnet
//! headers are needed yet), made non-blocking, and configured with iproute2: the MAC that
//! stands for this interface's IPoIB address, the IPoIB MTU, the address, link up. IPv6
//! is switched off on it, because this datapath does not carry IPv6 yet and the kernel
//! would otherwise keep sending router and listener solicitations that can only be
//! dropped.
//!
//! The TAP outlives the verbs objects: it stays up across a restart of the interface.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::process::Command;

use crate::config::Ipv4Cidr;
use crate::datapath::FrameIo;
use crate::wire::eth::Mac;

/// A TAP failure, naming the step.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// Creating the device failed.
    #[error(
        "cannot create TAP device {name:?}: {source} (is /dev/net/tun present, and are you root?)"
    )]
    Create {
        /// The name.
        name: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// A configuration command failed.
    #[error("configuring TAP {name}: `{command}` failed: {why}")]
    Configure {
        /// The name.
        name: String,
        /// The command run.
        command: String,
        /// Its error output.
        why: String,
    },
}

/// A TAP device in non-blocking mode.
pub struct Tap {
    iface: tun_tap::Iface,
    netns: std::sync::Mutex<Option<String>>,
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
    pub fn create(name: &str) -> Result<Tap, TapError> {
        let err = |source| TapError::Create {
            name: name.to_string(),
            source,
        };
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tap).map_err(err)?;
        iface.set_non_blocking().map_err(err)?;
        Ok(Tap {
            iface,
            netns: std::sync::Mutex::new(None),
        })
    }

    /// The kernel's name for it.
    pub fn name(&self) -> &str {
        self.iface.name()
    }

    /// Move it into network namespace `netns` (if given), then set MAC, MTU and address,
    /// switch IPv6 off and bring it up.
    pub fn configure(
        &self,
        mac: Mac,
        mtu: usize,
        addr: Ipv4Cidr,
        netns: Option<&str>,
    ) -> Result<(), TapError> {
        let name = self.name().to_string();
        if let Some(ns) = netns {
            self.ip(None, &["link", "set", "dev", &name, "netns", ns])?;
            if let Ok(mut n) = self.netns.lock() {
                *n = Some(ns.to_string());
            }
        }
        // Best effort: a kernel without IPv6 has no such sysctl.
        let sysctl = format!("net.ipv6.conf.{name}.disable_ipv6=1");
        let _ = match netns {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "sysctl", "-qw", &sysctl])
                .output(),
            None => Command::new("sysctl").args(["-qw", &sysctl]).output(),
        };
        self.set_mac_mtu(netns, mac, mtu)?;
        self.ip(netns, &["addr", "replace", &addr.to_string(), "dev", &name])?;
        self.ip(netns, &["link", "set", "dev", &name, "up"])?;
        Ok(())
    }

    /// Change MAC and MTU after a rebuild found a different GID or port MTU.
    pub fn reconfigure(&self, mac: Mac, mtu: usize) -> Result<(), TapError> {
        let netns = self.netns.lock().ok().and_then(|n| n.clone());
        self.set_mac_mtu(netns.as_deref(), mac, mtu)
    }

    fn set_mac_mtu(&self, netns: Option<&str>, mac: Mac, mtu: usize) -> Result<(), TapError> {
        let name = self.name().to_string();
        let (mac, mtu) = (mac.to_string(), mtu.to_string());
        self.ip(
            netns,
            &["link", "set", "dev", &name, "address", &mac, "mtu", &mtu],
        )
    }

    fn ip(&self, netns: Option<&str>, args: &[&str]) -> Result<(), TapError> {
        let mut cmd = Command::new("ip");
        if let Some(ns) = netns {
            cmd.args(["-n", ns]);
        }
        cmd.args(args);
        let command = format!(
            "ip {}{}",
            netns.map(|n| format!("-n {n} ")).unwrap_or_default(),
            args.join(" ")
        );
        let out = cmd.output().map_err(|e| TapError::Configure {
            name: self.name().to_string(),
            command: command.clone(),
            why: e.to_string(),
        })?;
        if !out.status.success() {
            return Err(TapError::Configure {
                name: self.name().to_string(),
                command,
                why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(())
    }
}

impl FrameIo for Tap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.iface.recv(buf)
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.iface.send(frame)
    }
}

impl TapDevice for Tap {
    fn raw_fd(&self) -> RawFd {
        self.iface.as_raw_fd()
    }

    fn set_carrier(&self, on: bool) -> io::Result<()> {
        crate::sys::tun_set_carrier(self.iface.as_raw_fd(), on)
    }

    fn reconfigure(&self, mac: Mac, mtu: usize) -> Result<(), TapError> {
        Tap::reconfigure(self, mac, mtu)
    }
}
