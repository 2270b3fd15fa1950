//! Configuring a network device from the daemon itself, over rtnetlink: its MAC, MTU and
//! up flag (`RTM_NEWLINK`), its addresses (`RTM_NEWADDR`, replacing an equal one), a move
//! to another network namespace (`IFLA_NET_NS_FD`), and running such work inside a named
//! namespace (`setns` on a thread of its own). Each request waits for the kernel's
//! acknowledgement; a refusal comes back as the errno with the kernel's own message where
//! it gives one (extended acks), e.g. `RTM_NEWLINK: Invalid argument (MTU too big)`.
//!
//! This replaces running `ip` and `sysctl`: a process each, which on a slow host cost
//! seconds in all every time a daemon started.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{last_error, named};

// From <linux/netlink.h> and <linux/rtnetlink.h>.
const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_CREATE: u16 = 0x400;
/// In an error message's header: TLVs follow the `nlmsgerr`.
const NLM_F_ACK_TLVS: u16 = 0x200;
const NETLINK_CAP_ACK: libc::c_int = 10;
const NETLINK_EXT_ACK: libc::c_int = 11;
const NLMSGERR_ATTR_MSG: u16 = 1;
const RTM_NEWLINK: u16 = 16;
const RTM_NEWADDR: u16 = 20;
const IFLA_ADDRESS: u16 = 1;
const IFLA_MTU: u16 = 4;
const IFLA_NET_NS_FD: u16 = 28;
const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFF_UP: u32 = 0x1;
/// In an error message's header: the request was not echoed (`NETLINK_CAP_ACK`).
const NLM_F_CAPPED: u16 = 0x100;
/// Every request goes on a socket of its own, so one sequence number serves.
const SEQ: u32 = 1;
/// How long a request waits for the kernel's answer.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// A link change: any of a new MAC, a new MTU, the up flag set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkChange {
    /// The MAC to set.
    pub mac: Option<[u8; 6]>,
    /// The MTU to set.
    pub mtu: Option<u32>,
    /// Bring the link up (false: leave its up flag as it is, not take it down).
    pub up: bool,
}

/// The index of the device named `name` in the calling thread's network namespace.
pub fn index(name: &str) -> io::Result<u32> {
    let c = std::ffi::CString::new(name).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("device name {name:?} holds a NUL byte"),
        )
    })?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; if_nametoindex reads
    // it and returns 0 on failure with errno set.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(last_error(&format!("no device {name:?}")));
    }
    Ok(i)
}

/// Apply `change` to the device with index `ifindex`, in one request.
pub fn set_link(ifindex: u32, change: LinkChange) -> io::Result<()> {
    request(link_request(ifindex, change), "RTM_NEWLINK")
}

/// Move the device with index `ifindex` into the network namespace open as `ns`.
pub fn move_to_netns(ifindex: u32, ns: &OwnedFd) -> io::Result<()> {
    request(
        netns_request(ifindex, ns.as_raw_fd()),
        "RTM_NEWLINK (IFLA_NET_NS_FD)",
    )
}

/// Give the device with index `ifindex` the address `addr/prefix`, replacing an equal
/// one it has (as `ip addr replace`).
pub fn replace_addr(ifindex: u32, addr: IpAddr, prefix: u8) -> io::Result<()> {
    request(addr_request(ifindex, addr, prefix), "RTM_NEWADDR")
}

/// struct ifinfomsg: family, pad, type, index, flags, change.
fn ifinfomsg(m: &mut Message, ifindex: u32, flags: u32, change: u32) {
    // A change mask of 0 with flags set would make the kernel take them all as given.
    debug_assert!(flags & !change == 0);
    m.put(&[libc::AF_UNSPEC as u8, 0]);
    m.put(&0u16.to_ne_bytes());
    m.put(&(ifindex as i32).to_ne_bytes());
    m.put(&flags.to_ne_bytes());
    m.put(&change.to_ne_bytes());
}

/// `RTM_NEWLINK` for `change`: the up flag in the flags and the change mask, the MAC and
/// MTU as attributes.
fn link_request(ifindex: u32, change: LinkChange) -> Vec<u8> {
    let mut m = Message::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK);
    let up = if change.up { IFF_UP } else { 0 };
    ifinfomsg(&mut m, ifindex, up, up);
    if let Some(mac) = change.mac {
        m.attr(IFLA_ADDRESS, &mac);
    }
    if let Some(mtu) = change.mtu {
        m.attr(IFLA_MTU, &mtu.to_ne_bytes());
    }
    m.finish()
}

/// `RTM_NEWLINK` with `IFLA_NET_NS_FD`.
fn netns_request(ifindex: u32, ns_fd: libc::c_int) -> Vec<u8> {
    let mut m = Message::new(RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK);
    ifinfomsg(&mut m, ifindex, 0, 0);
    m.attr(IFLA_NET_NS_FD, &(ns_fd as u32).to_ne_bytes());
    m.finish()
}

/// `RTM_NEWADDR` that creates or replaces `addr/prefix`: `IFA_LOCAL` and `IFA_ADDRESS`
/// both the address (no peer), as iproute2 sends them.
fn addr_request(ifindex: u32, addr: IpAddr, prefix: u8) -> Vec<u8> {
    let (family, bytes): (u8, Vec<u8>) = match addr {
        IpAddr::V4(a) => (libc::AF_INET as u8, a.octets().to_vec()),
        IpAddr::V6(a) => (libc::AF_INET6 as u8, a.octets().to_vec()),
    };
    let mut m = Message::new(
        RTM_NEWADDR,
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
    );
    // struct ifaddrmsg: family, prefix length, flags, scope (universe), index.
    m.put(&[family, prefix, 0, 0]);
    m.put(&ifindex.to_ne_bytes());
    m.attr(IFA_LOCAL, &bytes);
    m.attr(IFA_ADDRESS, &bytes);
    m.finish()
}

/// Run `f` on a thread of its own that has entered the network namespace open as `ns`
/// ([`open_netns`]), and return what it returns. The calling thread's namespace is left
/// as it was.
pub fn in_netns<T: Send>(ns: &OwnedFd, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    let fd = ns.as_raw_fd();
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("netns".into())
            .spawn_scoped(s, move || {
                // SAFETY: `fd` is an open namespace descriptor, borrowed from `ns`, which
                // outlives this scoped thread; setns(2) only changes this thread's network
                // namespace (the thread ends when `f` returns), and returns -1 with errno
                // on failure.
                if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } < 0 {
                    let e = io::Error::last_os_error();
                    let hint = if e.kind() == io::ErrorKind::PermissionDenied {
                        " (entering a namespace needs CAP_SYS_ADMIN)"
                    } else {
                        ""
                    };
                    return Err(io::Error::new(e.kind(), format!("setns: {e}{hint}")));
                }
                f()
            })
            .map_err(|e| named("starting a thread", e))?
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the namespace thread panicked")))
    })
}

/// Open the network namespace named `ns` (/run/netns/NS).
pub fn open_netns(ns: &str) -> io::Result<OwnedFd> {
    if ns.is_empty() || ns.contains('/') || ns == "." || ns == ".." || ns.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{ns:?} is not a network namespace name (one path component under /run/netns)"),
        ));
    }
    let path = format!("/run/netns/{ns}");
    let f = std::fs::File::open(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("opening network namespace {path}: {e} (made by `ip netns add {ns}`?)"),
        )
    })?;
    Ok(OwnedFd::from(f))
}

/// A request being built: a netlink header whose length is filled in when sent.
struct Message(Vec<u8>);

impl Message {
    fn new(kind: u16, flags: u16) -> Message {
        let mut b = Vec::with_capacity(64);
        b.extend_from_slice(&0u32.to_ne_bytes()); // length, set in `finish`
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&SEQ.to_ne_bytes()); // sequence number
        b.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
        Message(b)
    }

    fn put(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// An attribute (struct rtattr and its payload), padded to 4 bytes.
    fn attr(&mut self, kind: u16, payload: &[u8]) {
        let len = (4 + payload.len()) as u16;
        self.0.extend_from_slice(&len.to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        while !self.0.len().is_multiple_of(4) {
            self.0.push(0);
        }
    }

    fn finish(mut self) -> Vec<u8> {
        let len = self.0.len() as u32;
        self.0[..4].copy_from_slice(&len.to_ne_bytes());
        self.0
    }
}

/// Send `msg` on a new rtnetlink socket and wait for its acknowledgement; an error names
/// `what` and carries the kernel's errno (and message, where it gave one).
fn request(msg: Vec<u8>, what: &str) -> io::Result<()> {
    let sock = socket().map_err(|e| named(&format!("{what}: socket"), e))?;
    // SAFETY: `msg` is a live buffer of `msg.len()` bytes for the duration of the call;
    // send(2) only reads it.
    let n = unsafe { libc::send(sock.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
    if n < 0 {
        return Err(last_error(&format!("{what}: send")));
    }
    let mut buf = vec![0u8; 8192];
    let deadline = std::time::Instant::now() + ANSWER_WITHIN;
    loop {
        // SAFETY: `buf` is a live, writable buffer of `buf.len()` bytes for the duration
        // of the call; recv(2) writes at most that many (MSG_TRUNC only makes it return
        // the datagram's full length, checked below).
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted && std::time::Instant::now() < deadline {
                continue;
            }
            if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: no answer from the kernel within {ANSWER_WITHIN:?}"),
                ));
            }
            return Err(named(&format!("{what}: recv"), e));
        }
        let n = n as usize;
        let outcome = if n == 0 || n > buf.len() {
            Some(Err((
                libc::EPROTO,
                Some(format!(
                    "an answer of {n} bytes (a buffer of {})",
                    buf.len()
                )),
            )))
        } else {
            parse_ack(&buf[..n])
        };
        match outcome {
            Some(Ok(())) => return Ok(()),
            Some(Err((errno, text))) => {
                let e = io::Error::from_raw_os_error(errno);
                let text = text.map(|t| format!(" ({t})")).unwrap_or_default();
                let hint = if errno == libc::EPERM {
                    " (configuring a device needs CAP_NET_ADMIN)"
                } else {
                    ""
                };
                return Err(io::Error::new(e.kind(), format!("{what}: {e}{text}{hint}")));
            }
            None if std::time::Instant::now() < deadline => continue,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: no acknowledgement within {ANSWER_WITHIN:?}"),
                ));
            }
        }
    }
}

/// A rtnetlink socket with capped and extended acks (best effort: a kernel without
/// them still acknowledges).
fn socket() -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; it returns a new descriptor or -1.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: ANSWER_WITHIN.as_secs() as libc::time_t,
        tv_usec: 0,
    };
    // SAFETY: the option value is one live `timeval` whose size is passed; the kernel only
    // reads it.
    if unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    let one: libc::c_int = 1;
    for opt in [NETLINK_CAP_ACK, NETLINK_EXT_ACK] {
        // SAFETY: the option value is one live `c_int` whose size is passed; the kernel
        // only reads it. A failure (an older kernel) is ignored: acks still come.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_NETLINK,
                opt,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }
    Ok(sock)
}

/// The outcome in a datagram from the kernel: `Some(Ok)` for an ack of our request,
/// `Some(Err((errno, message)))` for its refusal (or a malformed answer: `EPROTO`), `None`
/// if it holds neither (read on).
fn parse_ack(mut b: &[u8]) -> Option<Result<(), (i32, Option<String>)>> {
    while b.len() >= NLMSG_HDRLEN {
        let len = u32::from_ne_bytes(b[0..4].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(b[4..6].try_into().ok()?);
        let flags = u16::from_ne_bytes(b[6..8].try_into().ok()?);
        let seq = u32::from_ne_bytes(b[8..12].try_into().ok()?);
        if len < NLMSG_HDRLEN || len > b.len() {
            return Some(Err((
                libc::EPROTO,
                Some(format!(
                    "a reply of {len} bytes in a datagram of {}",
                    b.len()
                )),
            )));
        }
        let body = &b[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_ERROR if seq == SEQ => {
                let Some(code) = body.get(0..4) else {
                    return Some(Err((
                        libc::EPROTO,
                        Some("an error reply without its code".into()),
                    )));
                };
                let errno = i32::from_ne_bytes(code.try_into().ok()?);
                if errno == 0 {
                    return Some(Ok(()));
                }
                // The TLVs follow the error code and the request: its header alone when
                // the ack is capped, the whole request otherwise.
                let echoed = if flags & NLM_F_CAPPED != 0 {
                    NLMSG_HDRLEN
                } else {
                    body.get(4..8)
                        .and_then(|l| l.try_into().ok())
                        .map_or(NLMSG_HDRLEN, |l| u32::from_ne_bytes(l) as usize)
                        .next_multiple_of(4)
                };
                let text = (flags & NLM_F_ACK_TLVS != 0)
                    .then(|| ext_ack_message(body.get(4 + echoed..)?))
                    .flatten();
                let errno = errno
                    .checked_neg()
                    .filter(|e| *e > 0)
                    .unwrap_or(libc::EPROTO);
                return Some(Err((errno, text)));
            }
            _ => {}
        }
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    None
}

/// The kernel's message (`NLMSGERR_ATTR_MSG`) among an extended ack's TLVs.
fn ext_ack_message(mut tlvs: &[u8]) -> Option<String> {
    while tlvs.len() >= 4 {
        let len = u16::from_ne_bytes(tlvs[0..2].try_into().ok()?) as usize;
        let kind = u16::from_ne_bytes(tlvs[2..4].try_into().ok()?);
        if len < 4 || len > tlvs.len() {
            return None;
        }
        if kind == NLMSGERR_ATTR_MSG {
            let s = &tlvs[4..len];
            let s = s.split(|c| *c == 0).next().unwrap_or(s);
            return Some(String::from_utf8_lossy(s).into_owned());
        }
        tlvs = &tlvs[len.next_multiple_of(4).min(tlvs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(len: u32, kind: u16, flags: u16) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&len.to_ne_bytes());
        b.extend_from_slice(&kind.to_ne_bytes());
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(&SEQ.to_ne_bytes());
        b.extend_from_slice(&[0; 4]);
        b
    }

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes(b[at..at + 2].try_into().unwrap())
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    #[test]
    fn a_link_request_is_laid_out_as_the_kernel_reads_it() {
        let b = link_request(
            7,
            LinkChange {
                mac: Some([2, 0, 0x12, 0x34, 0x56, 0x78]),
                mtu: Some(4092),
                up: true,
            },
        );
        // Header 16, ifinfomsg 16, the MAC 4 + 6 padded to 12, the MTU 4 + 4.
        assert_eq!(b.len(), 16 + 16 + 12 + 8);
        assert_eq!(u32_at(&b, 0) as usize, b.len());
        assert_eq!(u16_at(&b, 4), RTM_NEWLINK);
        assert_eq!(u16_at(&b, 6), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32_at(&b, 8), SEQ);
        assert_eq!(b[16], libc::AF_UNSPEC as u8);
        assert_eq!(u32_at(&b, 20), 7, "ifi_index");
        assert_eq!(
            (u32_at(&b, 24), u32_at(&b, 28)),
            (IFF_UP, IFF_UP),
            "flags, change"
        );
        assert_eq!((u16_at(&b, 32), u16_at(&b, 34)), (10, IFLA_ADDRESS));
        assert_eq!(&b[36..44], &[2, 0, 0x12, 0x34, 0x56, 0x78, 0, 0]);
        assert_eq!((u16_at(&b, 44), u16_at(&b, 46)), (8, IFLA_MTU));
        assert_eq!(u32_at(&b, 48), 4092);

        // MAC and MTU alone leave the flags alone: flags and change mask 0.
        let b = link_request(
            7,
            LinkChange {
                mtu: Some(1500),
                ..LinkChange::default()
            },
        );
        assert_eq!(b.len(), 16 + 16 + 8);
        assert_eq!((u32_at(&b, 24), u32_at(&b, 28)), (0, 0));

        let b = netns_request(9, 5);
        assert_eq!(b.len(), 16 + 16 + 8);
        assert_eq!((u32_at(&b, 20), u32_at(&b, 24), u32_at(&b, 28)), (9, 0, 0));
        assert_eq!(
            (u16_at(&b, 32), u16_at(&b, 34), u32_at(&b, 36)),
            (8, IFLA_NET_NS_FD, 5)
        );
    }

    #[test]
    fn an_address_request_creates_or_replaces_it() {
        let b = addr_request(7, "198.18.1.1".parse().unwrap(), 24);
        // Header 16, ifaddrmsg 8, IFA_LOCAL 8, IFA_ADDRESS 8.
        assert_eq!(b.len(), 40);
        assert_eq!(u32_at(&b, 0), 40);
        assert_eq!(u16_at(&b, 4), RTM_NEWADDR);
        assert_eq!(
            u16_at(&b, 6),
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        );
        assert_eq!(&b[16..20], &[libc::AF_INET as u8, 24, 0, 0]);
        assert_eq!(u32_at(&b, 20), 7);
        assert_eq!((u16_at(&b, 24), u16_at(&b, 26)), (8, IFA_LOCAL));
        assert_eq!(&b[28..32], &[198, 18, 1, 1]);
        assert_eq!((u16_at(&b, 32), u16_at(&b, 34)), (8, IFA_ADDRESS));
        assert_eq!(&b[36..40], &[198, 18, 1, 1]);

        let b = addr_request(3, "2001:2::7".parse().unwrap(), 64);
        assert_eq!(b.len(), 16 + 8 + 20 + 20);
        assert_eq!(&b[16..18], &[libc::AF_INET6 as u8, 64]);
        assert_eq!((u16_at(&b, 24), u16_at(&b, 26)), (20, IFA_LOCAL));
        assert_eq!(&b[28..30], &[0x20, 0x01]);
        assert_eq!(b[43], 7);
    }

    /// An error reply with extended-ack TLVs: `flags` besides `NLM_F_ACK_TLVS`, the
    /// error code, the request (its header alone when capped), the message attribute.
    fn refusal(flags: u16, code: i32, request: &[u8], msg: &[u8]) -> Vec<u8> {
        let mut b = header(0, NLMSG_ERROR, NLM_F_ACK_TLVS | flags);
        b.extend_from_slice(&code.to_ne_bytes());
        b.extend_from_slice(request);
        b.extend_from_slice(&(4 + msg.len() as u16).to_ne_bytes());
        b.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        b.extend_from_slice(msg);
        let len = b.len() as u32;
        b[0..4].copy_from_slice(&len.to_ne_bytes());
        b
    }

    #[test]
    fn acks_refusals_and_their_messages_are_read() {
        let mut ok = header(36, NLMSG_ERROR, 0);
        ok.extend_from_slice(&0i32.to_ne_bytes());
        ok.extend_from_slice(&header(16, RTM_NEWLINK, 0));
        assert_eq!(parse_ack(&ok), Some(Ok(())));

        let mut request = header(16, RTM_NEWLINK, 0);
        let no = refusal(NLM_F_CAPPED, -libc::EINVAL, &request, b"MTU too big\0");
        assert_eq!(
            parse_ack(&no),
            Some(Err((libc::EINVAL, Some("MTU too big".to_string()))))
        );

        // Not capped: the whole request is echoed (a 24-byte one here) before the TLVs.
        request = header(24, RTM_NEWADDR, 0);
        request.extend_from_slice(&[0xee; 8]);
        let echoed = refusal(0, -libc::EPERM, &request, b"no\0\0");
        assert_eq!(
            parse_ack(&echoed),
            Some(Err((libc::EPERM, Some("no".to_string()))))
        );

        // An answer to another request is read past; a nonsense error code is EPROTO.
        let mut other = header(36, NLMSG_ERROR, 0);
        other[8..12].copy_from_slice(&(SEQ + 1).to_ne_bytes());
        other.extend_from_slice(&0i32.to_ne_bytes());
        other.extend_from_slice(&header(16, RTM_NEWLINK, 0));
        assert_eq!(parse_ack(&other), None);
        for code in [i32::MIN, 5] {
            let mut odd = header(36, NLMSG_ERROR, 0);
            odd.extend_from_slice(&code.to_ne_bytes());
            odd.extend_from_slice(&header(16, RTM_NEWLINK, 0));
            assert_eq!(parse_ack(&odd), Some(Err((libc::EPROTO, None))), "{code}");
        }

        // Without TLVs: the errno alone.
        let mut bare = header(36, NLMSG_ERROR, 0);
        bare.extend_from_slice(&(-libc::EEXIST).to_ne_bytes());
        bare.extend_from_slice(&header(16, RTM_NEWADDR, 0));
        assert_eq!(parse_ack(&bare), Some(Err((libc::EEXIST, None))));

        // Something else is read past; a truncated reply is an error, not a panic.
        assert_eq!(parse_ack(&header(16, RTM_NEWLINK, 0)), None);
        assert!(matches!(
            parse_ack(&header(400, NLMSG_ERROR, 0)),
            Some(Err((libc::EPROTO, Some(_))))
        ));
        assert_eq!(parse_ack(&[1, 2, 3]), None);
    }

    #[test]
    fn a_namespace_name_is_one_path_component() {
        for bad in ["", ".", "..", "a/b", "../x"] {
            let e = open_netns(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
        }
        let e = open_netns("uipoib-no-such-ns").unwrap_err();
        assert!(
            e.to_string().contains("/run/netns/uipoib-no-such-ns"),
            "{e}"
        );
    }

    /// A network namespace made for a test, deleted when dropped.
    struct Ns(String);

    impl Ns {
        fn new(tag: &str) -> Result<Ns, String> {
            let name = format!("uipnd-{}-{tag}", std::process::id());
            let _ = ip(&["netns", "del", &name]);
            ip(&["netns", "add", &name])?;
            Ok(Ns(name))
        }
    }

    impl Drop for Ns {
        fn drop(&mut self) {
            let _ = ip(&["netns", "del", &self.0]);
        }
    }

    fn ip(args: &[&str]) -> Result<String, String> {
        let out = std::process::Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn a_device_in_a_namespace_gets_its_link_and_addresses_and_moves() {
        let (a, b) = match (Ns::new("a"), Ns::new("b")) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                assert!(
                    !crate::sys::in_ci(),
                    "network namespaces cannot be made: {e}; CI is set, so this fails"
                );
                eprintln!("SKIPPED sys::netdev: {e}");
                return;
            }
        };
        if let Err(e) = ip(&[
            "-n", &a.0, "link", "add", "uipnd0", "type", "veth", "peer", "name", "uipnd1",
        ]) {
            assert!(
                !crate::sys::in_ci(),
                "a veth pair cannot be made: {e}; CI is set"
            );
            eprintln!("SKIPPED sys::netdev: {e}");
            return;
        }
        let mac = [0x02, 0, 0x12, 0x34, 0x56, 0x78];
        let b_fd = open_netns(&b.0).unwrap();
        let a_fd = open_netns(&a.0).unwrap();
        let refused = in_netns(&a_fd, || {
            let i = index("uipnd0")?;
            set_link(
                i,
                LinkChange {
                    mac: Some(mac),
                    mtu: Some(4092),
                    up: true,
                },
            )?;
            let v4: IpAddr = "198.18.7.1".parse().unwrap();
            replace_addr(i, v4, 24)?;
            // Replacing an address the device has is no error, and leaves one.
            replace_addr(i, v4, 24)?;
            replace_addr(i, "2001:2:0:7::1".parse().unwrap(), 64)?;
            let refused = set_link(
                i,
                LinkChange {
                    mtu: Some(1 << 20),
                    ..LinkChange::default()
                },
            )
            .unwrap_err();
            move_to_netns(index("uipnd1")?, &b_fd)?;
            Ok(refused)
        })
        .unwrap();
        // The kernel's refusal, named.
        assert!(
            refused.to_string().starts_with("RTM_NEWLINK: "),
            "{refused}"
        );
        // The kernel's own words came back (extended ack): "mtu greater than device
        // maximum".
        assert!(refused.to_string().contains("(mtu "), "{refused}");
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput, "{refused}");

        let link = ip(&["-n", &a.0, "-o", "link", "show", "uipnd0"]).unwrap();
        assert!(link.contains("mtu 4092"), "{link}");
        let flags = link.split(['<', '>']).nth(1).unwrap_or_default();
        assert!(flags.split(',').any(|f| f == "UP"), "{link}");
        assert!(link.contains("link/ether 02:00:12:34:56:78"), "{link}");
        let addrs = ip(&["-n", &a.0, "-o", "addr", "show", "dev", "uipnd0"]).unwrap();
        assert_eq!(addrs.matches("inet 198.18.7.1/24").count(), 1, "{addrs}");
        assert_eq!(
            addrs.matches("inet6 2001:2:0:7::1/64").count(),
            1,
            "{addrs}"
        );
        // The peer moved to b; the test's own thread never left its namespace.
        assert!(ip(&["-n", &b.0, "-o", "link", "show", "uipnd1"]).is_ok());
        assert!(ip(&["-n", &a.0, "-o", "link", "show", "uipnd1"]).is_err());
        assert!(index("uipnd0").is_err());
    }

    #[test]
    fn a_device_that_is_not_there_is_named() {
        let e = index("uipoib-none0").unwrap_err();
        assert!(e.to_string().contains("uipoib-none0"), "{e}");
        assert!(index("a\0b").is_err());
    }
}
