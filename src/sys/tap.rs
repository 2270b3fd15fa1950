//! The TUN/TAP ioctls: open a TAP device, set its carrier.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::last_error;

/// `TUNSETCARRIER` on a TUN/TAP descriptor (Linux 5.0 and later): the link carrier on or
/// off.
pub fn set_carrier(fd: RawFd, on: bool) -> io::Result<()> {
    set_int(fd, libc::TUNSETCARRIER, on.into(), "TUNSETCARRIER")
}

/// One of the TUN/TAP ioctls that read a `c_int` through their argument (`TUNSETCARRIER`,
/// `TUNSETVNETHDRSZ`, `TUNSETVNETLE`), `call` naming it in the error.
fn set_int(fd: RawFd, request: libc::Ioctl, value: libc::c_int, call: &str) -> io::Result<()> {
    // SAFETY: these requests read one `c_int` through the pointer, which points to a live
    // local for the duration of the call; a descriptor that is not an open TUN/TAP fd
    // makes the kernel return an error (EBADF, ENOTTY), never touch other memory.
    if unsafe { libc::ioctl(fd, request, &value as *const libc::c_int) } < 0 {
        return Err(last_error(call));
    }
    Ok(())
}

/// `IFF_VNET_HDR`: every frame carries a `virtio_net_hdr`.
const IFF_VNET_HDR: libc::c_short = 0x4000;
/// `TUNSETOFFLOAD` flags: checksum offload, TCP segmentation offload over IPv4 and over
/// IPv6, and TSO of ECN streams (CWR on the first segment only, `GSO_ECN`); without the
/// last, the kernel cuts such streams itself before the TAP sees them.
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
const TUN_F_TSO_ECN: libc::c_ulong = 0x08;
/// What the TAP is told the datapath can take ([`crate::wire::offload::Segmenter`] cuts
/// all of it).
const OFFLOADS: libc::c_ulong = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;

/// Open a TAP device named `name` (created if it does not exist), non-blocking and
/// close-on-exec, without packet information. With `offload`, frames carry a 10-byte
/// `virtio_net_hdr` and the kernel may hand over TCP super-frames over IPv4 and IPv6 of up
/// to 64 KiB with partial checksums (`TUNSETOFFLOAD` with checksum, TSO4, TSO6 and ECN).
/// Returns the descriptor and the device's name.
pub fn open(name: &str, offload: bool) -> io::Result<(std::os::fd::OwnedFd, String)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("TAP name {name:?} must be 1..{} bytes", libc::IFNAMSIZ - 1),
        ));
    }
    let path = c"/dev/net/tun";
    // SAFETY: `path` is a NUL-terminated string that outlives the call; open(2) returns a
    // new descriptor or -1.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_error("open /dev/net/tun"));
    }
    // SAFETY: `fd` was just returned by open(2) and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data (a name array and a union of integers and
    // pointers); all zeroes is a valid value of it.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    let mut flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    if offload {
        flags |= IFF_VNET_HDR;
    }
    ifr.ifr_ifru.ifru_flags = flags;
    // SAFETY: TUNSETIFF reads and writes one `ifreq` through the pointer, which points to
    // a live local; the name is NUL-terminated (shorter than IFNAMSIZ, zeroed beyond).
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TUNSETIFF,
            &mut ifr as *mut libc::ifreq,
        )
    } < 0
    {
        return Err(last_error("TUNSETIFF"));
    }
    if offload {
        let len = crate::wire::offload::VNET_HDR_LEN as libc::c_int;
        set_int(
            fd.as_raw_fd(),
            libc::TUNSETVNETHDRSZ,
            len,
            "TUNSETVNETHDRSZ",
        )?;
        // The header's fields are little-endian whatever the host's byte order (a legacy
        // TAP header is in the host's order otherwise); `virtio_net_hdr` is read and
        // written little-endian (crate::wire::offload::VnetHdr).
        set_int(fd.as_raw_fd(), libc::TUNSETVNETLE, 1, "TUNSETVNETLE")?;
        // SAFETY: TUNSETOFFLOAD takes its flags by value; no memory is passed.
        if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, OFFLOADS) } < 0 {
            return Err(last_error("TUNSETOFFLOAD"));
        }
    }
    let bytes: Vec<u8> = ifr
        .ifr_name
        .iter()
        .take_while(|c| **c != 0)
        .map(|c| *c as u8)
        .collect();
    Ok((fd, String::from_utf8_lossy(&bytes).into_owned()))
}

/// Whether the TAP behind `fd` reads and writes its `virtio_net_hdr` little-endian
/// (`TUNGETVNETLE`).
pub fn vnet_little_endian(fd: RawFd) -> io::Result<bool> {
    let mut le: libc::c_int = 0;
    // SAFETY: TUNGETVNETLE writes one `c_int` through the pointer, a live local; a
    // descriptor that is not a TUN/TAP fd makes the kernel return an error.
    if unsafe { libc::ioctl(fd, libc::TUNGETVNETLE, &mut le as *mut libc::c_int) } < 0 {
        return Err(last_error("TUNGETVNETLE"));
    }
    Ok(le != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::in_ci;

    /// Skip (outside CI) or fail (in CI) a test that cannot open a TAP, saying why.
    fn cannot_run(why: &str) {
        assert!(
            !in_ci(),
            "a TAP cannot be opened: {why}; CI is set, so this fails instead of skipping"
        );
        eprintln!("SKIPPED sys::tap: {why}");
    }

    #[test]
    fn a_tap_with_offloads_has_its_header_little_endian_on_any_host() {
        // The kernel numbers the name; a TAP closed is gone, so nothing is left behind.
        let (fd, name) = match open("uiple%d", true) {
            Ok(t) => t,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::PermissionDenied | io::ErrorKind::NotFound
                ) =>
            {
                return cannot_run(&format!("opening a TAP: {e}"));
            }
            Err(e) => panic!("open a TAP with offloads: {e}"),
        };
        assert!(name.starts_with("uiple"), "{name}");
        assert!(vnet_little_endian(fd.as_raw_fd()).unwrap());
        drop(fd);
        let (fd, _) = open("uiple%d", false).expect("open a TAP without offloads");
        assert!(!vnet_little_endian(fd.as_raw_fd()).unwrap());
    }

    #[test]
    fn a_failed_call_is_named_in_its_error() {
        let e = vnet_little_endian(-1).unwrap_err();
        let bad_fd = io::Error::from_raw_os_error(libc::EBADF);
        assert_eq!(e.to_string(), format!("TUNGETVNETLE: {bad_fd}"));
        assert_eq!(e.kind(), bad_fd.kind());
    }
}
