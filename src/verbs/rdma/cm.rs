//! Device-removal watcher: one rdma_cm id bound to the endpoint's address.
//!
//! rxe (Linux 6.1) raises nothing on the verbs async fd when its link is deleted, and
//! `rdma link delete` then waits in the kernel until every verbs context on the device is
//! closed. The RDMA connection manager does announce the removal at once
//! (`RDMA_CM_EVENT_DEVICE_REMOVAL`) to every cm id bound to the device. This module owns
//! one such id and the fd it reports on; the endpoint polls it next to the async fd.
//!
//! It speaks the kernel's rdma_cm ABI (`<rdma/rdma_user_cm.h>`, version 4) on
//! `/dev/infiniband/rdma_cm` directly instead of going through librdmacm, because
//! librdmacm opens a verbs context of its own on the device an id binds to and closes it
//! only when a later device-list refresh no longer finds the device, which never happens
//! when the removed device was the only one (rdma-core 44 returns early on an empty
//! list). Seen in the lab (rxe, Linux 6.1, rdma-core 44): after `rdma_destroy_id`,
//! `rdma_destroy_event_channel` and `ibv_close_device` the process still held
//! `/dev/infiniband/uverbs0 (deleted)` and `rdma link delete rxe0` stayed blocked. With
//! the commands written to the fd as below (`verbs_checks --mode removal`) the removal
//! event arrived 0.06–0.14 s after `rdma link delete` was started and the delete returned
//! 0.03–0.05 s after the endpoint was dropped (four lab runs, TCG guests).
//! The commands used are CREATE_ID, BIND_IP, QUERY (address), GET_EVENT and DESTROY_ID:
//! what librdmacm itself sends for `rdma_create_id`, `rdma_bind_addr` (BIND_IP, or its
//! AF_IB-capable twin BIND), `rdma_get_cm_event` and `rdma_destroy_id`.
//!
//! What it must not do: block (the fd is nonblocking, GET_EVENT answers `EAGAIN`), open
//! any verbs context, or own anything but the fd and the one id.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::net::{Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::io::RawFd;

use crate::verbs::{AsyncEvent, Gid, VerbsError};

use super::objects::last_errno;

/// The rdma_cm character device (module `rdma_ucm`).
const RDMA_CM_DEV: &CStr = c"/dev/infiniband/rdma_cm";

/// Where the kernel publishes the ABI version of that device.
const ABI_VERSION_FILES: [&str; 2] = [
    "/sys/class/misc/rdma_cm/abi_version",
    "/sys/class/infiniband_ucma/abi_version",
];

/// The ABI the structures below follow (`RDMA_USER_CM_ABI_VERSION`).
const ABI_VERSION: u32 = 4;

// Commands (`RDMA_USER_CM_CMD_*`, an enum counted from 0 in the header).
const CMD_CREATE_ID: u32 = 0;
const CMD_DESTROY_ID: u32 = 1;
const CMD_BIND_IP: u32 = 2;
const CMD_GET_EVENT: u32 = 12;
const CMD_QUERY: u32 = 19;
/// `RDMA_USER_CM_QUERY_ADDR`.
const QUERY_ADDR: u32 = 0;
/// `RDMA_PS_UDP`: the id only watches, any port space that binds to an IP address does.
const PS_UDP: u16 = 0x0111;
/// `IB_QPT_UD`, what librdmacm passes with `RDMA_PS_UDP`.
const QPT_UD: u8 = 4;
/// Any non-zero value: the kernel drops events of ids whose uid is 0.
const WATCHER_UID: u64 = 1;

/// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
pub(super) const CM_EVENT_DEVICE_REMOVAL: u32 = 11;

/// Added to an rdma_cm event type reported as [`AsyncEvent::Other`], so that it cannot be
/// read as an `ibv_event_type` (those stay below 0x100).
pub const CM_EVENT_OTHER_BASE: u32 = 0x100;

/// `struct rdma_ucm_cmd_hdr`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CmdHdr {
    cmd: u32,
    in_len: u16,
    out_len: u16,
}

/// `struct rdma_ucm_create_id`.
#[repr(C)]
#[derive(Clone, Copy)]
struct CreateId {
    uid: u64,
    response: u64,
    ps: u16,
    qp_type: u8,
    reserved: [u8; 5],
}

/// `struct rdma_ucm_create_id_resp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CreateIdResp {
    id: u32,
}

/// `struct rdma_ucm_destroy_id`.
#[repr(C)]
#[derive(Clone, Copy)]
struct DestroyId {
    response: u64,
    id: u32,
    reserved: u32,
}

/// `struct rdma_ucm_destroy_id_resp`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct DestroyIdResp {
    events_reported: u32,
}

/// `struct rdma_ucm_bind_ip`; `addr` is a `struct sockaddr_in6` (a `sockaddr_in` fits).
#[repr(C)]
#[derive(Clone, Copy)]
struct BindIp {
    response: u64,
    addr: [u8; SOCKADDR_IN6_LEN],
    id: u32,
}

/// `struct rdma_ucm_query`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Query {
    response: u64,
    id: u32,
    option: u32,
}

/// `struct rdma_ucm_query_addr_resp`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code)] // written by the kernel; every field is part of the layout
struct QueryAddrResp {
    node_guid: u64,
    port_num: u8,
    reserved: u8,
    pkey: u16,
    src_size: u16,
    dst_size: u16,
    src_addr: [u8; 128],
    dst_addr: [u8; 128],
    ibdev_index: u32,
    reserved1: u32,
}

/// `struct rdma_ucm_get_event`.
#[repr(C)]
#[derive(Clone, Copy)]
struct GetEvent {
    response: u64,
}

/// `struct rdma_ucm_event_resp`: the fields read here, then the parameters (unused).
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code)] // written by the kernel; every field is part of the layout
struct EventResp {
    uid: u64,
    id: u32,
    event: u32,
    status: i32,
    rest: [u8; 316],
}

/// A command as written: header, then the command structure.
#[repr(C)]
#[derive(Clone, Copy)]
struct Msg<T> {
    hdr: CmdHdr,
    body: T,
}

/// `sizeof(struct sockaddr_in6)`.
const SOCKADDR_IN6_LEN: usize = 28;

// Sizes as gcc gives them for <rdma/rdma_user_cm.h> (x86_64, rdma-core 44 headers). No
// structure has implicit padding, so no uninitialised byte is ever written to the kernel.
const _: () = assert!(size_of::<CmdHdr>() == 8);
const _: () = assert!(size_of::<CreateId>() == 24);
const _: () = assert!(size_of::<CreateIdResp>() == 4);
const _: () = assert!(size_of::<DestroyId>() == 16);
const _: () = assert!(size_of::<DestroyIdResp>() == 4);
const _: () = assert!(size_of::<BindIp>() == 40);
const _: () = assert!(size_of::<Query>() == 16);
const _: () = assert!(size_of::<QueryAddrResp>() == 280);
const _: () = assert!(size_of::<GetEvent>() == 8);
const _: () = assert!(size_of::<EventResp>() == 336);
const _: () = assert!(size_of::<Msg<CreateId>>() == 32);

/// What the kernel says the id is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Binding {
    /// Node GUID of the device (big-endian, as `ibv_get_device_guid` returns it).
    pub(super) node_guid: u64,
    /// Kernel device index, `None` on kernels that do not report it.
    pub(super) ibdev_index: Option<u32>,
    /// Port.
    pub(super) port: u8,
}

/// One rdma_cm event, provider independent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CmEvent {
    /// `rdma_cm_event_type`.
    pub(super) event: u32,
    /// The event's status (0 for a removal).
    pub(super) status: i32,
}

/// The rdma_cm fd and one id bound to the endpoint's address. Dropping it destroys the id
/// and closes the fd.
pub(super) struct RemovalWatcher {
    /// `None` once closed.
    fd: Option<OwnedFd>,
    /// The kernel's handle of the id; `None` once destroyed.
    id: Option<u32>,
}

impl RemovalWatcher {
    /// Open the rdma_cm device, create an id and bind it to `addr`. Returns the watcher
    /// and what the kernel bound it to.
    pub(super) fn open(addr: &SocketAddr) -> Result<(Self, Binding), VerbsError> {
        if let Some(v) = abi_version().filter(|&v| v != ABI_VERSION) {
            return Err(VerbsError::Invalid {
                field: "rdma_cm ABI",
                why: format!("kernel rdma_cm ABI version {v}, this code speaks {ABI_VERSION}"),
            });
        }
        let fd = open_cm_device()?;
        let mut watcher = RemovalWatcher {
            fd: Some(fd),
            id: None,
        };
        let mut created = CreateIdResp::default();
        watcher.call(
            CMD_CREATE_ID,
            |response| CreateId {
                uid: WATCHER_UID,
                response,
                ps: PS_UDP,
                qp_type: QPT_UD,
                reserved: [0; 5],
            },
            &mut created,
            "rdma_create_id (rdma_cm CREATE_ID)",
        )?;
        watcher.id = Some(created.id);
        let id = created.id;
        let bind = BindIp {
            response: 0,
            addr: sockaddr_bytes(addr),
            id,
        };
        watcher.call(
            CMD_BIND_IP,
            |_| bind,
            &mut (),
            "rdma_bind_addr (rdma_cm BIND_IP)",
        )?;
        let mut q = QueryAddrResp {
            node_guid: 0,
            port_num: 0,
            reserved: 0,
            pkey: 0,
            src_size: 0,
            dst_size: 0,
            src_addr: [0; 128],
            dst_addr: [0; 128],
            // Left untouched by kernels that do not report the index.
            ibdev_index: u32::MAX,
            reserved1: 0,
        };
        watcher.call(
            CMD_QUERY,
            |response| Query {
                response,
                id,
                option: QUERY_ADDR,
            },
            &mut q,
            "rdma_cm QUERY(addr)",
        )?;
        let binding = Binding {
            node_guid: q.node_guid,
            ibdev_index: (q.ibdev_index != u32::MAX).then_some(q.ibdev_index),
            port: q.port_num,
        };
        Ok((watcher, binding))
    }

    /// The fd to poll (readable when an event is pending); -1 once closed.
    pub(super) fn fd(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Take one pending event without blocking (`None` when none is pending).
    ///
    /// The kernel hands each event over exactly once; there is nothing to acknowledge
    /// (librdmacm's `rdma_ack_cm_event` only counts events for its own `rdma_destroy_id`).
    pub(super) fn next_event(&mut self) -> Result<Option<CmEvent>, VerbsError> {
        if self.fd.is_none() {
            return Ok(None);
        }
        let mut ev = EventResp {
            uid: 0,
            id: 0,
            event: 0,
            status: 0,
            rest: [0; 316],
        };
        loop {
            match self.call(
                CMD_GET_EVENT,
                |response| GetEvent { response },
                &mut ev,
                "rdma_get_cm_event (rdma_cm GET_EVENT)",
            ) {
                Ok(()) => {
                    return Ok(Some(CmEvent {
                        event: ev.event,
                        status: ev.status,
                    }));
                }
                Err(e) => match verb_errno(&e) {
                    Some(libc::EAGAIN) => return Ok(None),
                    Some(libc::EINTR) => continue,
                    _ => return Err(e),
                },
            }
        }
    }

    /// Destroy the id, then close the fd (idempotent). The first failure is returned; the
    /// fd is closed either way (closing it alone also destroys every id on it).
    pub(super) fn close(&mut self) -> Result<(), VerbsError> {
        let mut result = Ok(());
        if let Some(id) = self.id.take() {
            let mut resp = DestroyIdResp::default();
            let r = self.call(
                CMD_DESTROY_ID,
                |response| DestroyId {
                    response,
                    id,
                    reserved: 0,
                },
                &mut resp,
                "rdma_destroy_id (rdma_cm DESTROY_ID)",
            );
            match &r {
                Ok(()) => tracing::debug!(
                    events_reported = resp.events_reported,
                    "rdma_cm watcher id destroyed"
                ),
                Err(e) => tracing::warn!(error = %e, "destroying the rdma_cm watcher id failed"),
            }
            result = r;
        }
        // Dropping the OwnedFd closes it.
        self.fd = None;
        result
    }

    /// Write command `cmd` (body built from the address of `resp`) and let the kernel fill
    /// `resp`.
    fn call<T: Copy, R>(
        &self,
        cmd: u32,
        body: impl FnOnce(u64) -> T,
        resp: &mut R,
        verb: &'static str,
    ) -> Result<(), VerbsError> {
        let Some(fd) = self.fd.as_ref() else {
            return Err(VerbsError::verb(verb, libc::EBADF));
        };
        let (Ok(in_len), Ok(out_len)) =
            (u16::try_from(size_of::<T>()), u16::try_from(size_of::<R>()))
        else {
            return Err(VerbsError::verb(verb, libc::EINVAL));
        };
        let msg = Msg {
            hdr: CmdHdr {
                cmd,
                in_len,
                out_len,
            },
            body: body(resp as *mut R as u64),
        };
        let len = size_of::<Msg<T>>();
        // SAFETY: `msg` is a live, fully initialised `repr(C)` value of `len` bytes with no
        // padding (sizes asserted above); the kernel writes at most `out_len =
        // size_of::<R>()` bytes through the response pointer inside it, which points to
        // `*resp`, exclusively borrowed for the duration of this call. `R` is a plain
        // `repr(C)` struct of integers (or `()`), valid for any bytes the kernel writes.
        let n = unsafe { libc::write(fd.as_raw_fd(), (&msg as *const Msg<T>).cast(), len) };
        if n < 0 {
            return Err(VerbsError::verb(verb, last_errno()));
        }
        if usize::try_from(n).ok() != Some(len) {
            return Err(VerbsError::Verb {
                verb,
                source: io::Error::other(format!("short write: {n} of {len} bytes")),
            });
        }
        Ok(())
    }
}

impl Drop for RemovalWatcher {
    fn drop(&mut self) {
        // Logged inside close.
        let _ = self.close();
    }
}

/// Open `/dev/infiniband/rdma_cm` nonblocking and close-on-exec.
fn open_cm_device() -> Result<OwnedFd, VerbsError> {
    // SAFETY: the path is a NUL-terminated string; no memory is handed over.
    let fd = unsafe {
        libc::open(
            RDMA_CM_DEV.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return Err(VerbsError::verb(
            "open /dev/infiniband/rdma_cm (is rdma_ucm loaded?)",
            last_errno(),
        ));
    }
    // SAFETY: `fd` was just opened and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The kernel's rdma_cm ABI version, if published.
fn abi_version() -> Option<u32> {
    ABI_VERSION_FILES
        .iter()
        .find_map(|f| std::fs::read_to_string(f).ok())
        .and_then(|s| s.trim().parse().ok())
}

/// The errno inside a [`VerbsError::Verb`].
fn verb_errno(e: &VerbsError) -> Option<i32> {
    match e {
        VerbsError::Verb { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// The address to bind the watcher to for the endpoint's GID: the IPv4 address of an
/// IPv4-mapped GID, else the GID as an IPv6 address (with `scope_id`, the interface index
/// of the GID's netdev, when it is link-local).
pub(super) fn bind_addr(gid: &Gid, scope_id: u32) -> SocketAddr {
    if let Some(v4) = gid.as_ipv4() {
        return SocketAddr::V4(SocketAddrV4::new(v4, 0));
    }
    let v6 = Ipv6Addr::from(gid.0);
    let scope = if v6.is_unicast_link_local() {
        scope_id
    } else {
        0
    };
    SocketAddr::V6(SocketAddrV6::new(v6, 0, 0, scope))
}

/// `addr` as a `struct sockaddr_in` / `struct sockaddr_in6` in the 28 bytes of
/// `rdma_ucm_bind_ip.addr` (family in host order, port in network order).
fn sockaddr_bytes(addr: &SocketAddr) -> [u8; SOCKADDR_IN6_LEN] {
    let mut b = [0u8; SOCKADDR_IN6_LEN];
    match addr {
        SocketAddr::V4(a) => {
            let family = libc::AF_INET as u16;
            b[0..2].copy_from_slice(&family.to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            let family = libc::AF_INET6 as u16;
            b[0..2].copy_from_slice(&family.to_ne_bytes());
            b[2..4].copy_from_slice(&a.port().to_be_bytes());
            b[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&a.ip().octets());
            b[24..28].copy_from_slice(&a.scope_id().to_ne_bytes());
        }
    }
    b
}

/// An rdma_cm event as the datapath sees it.
pub(super) fn map_cm_event(event: u32) -> AsyncEvent {
    if event == CM_EVENT_DEVICE_REMOVAL {
        AsyncEvent::DeviceRemoved
    } else {
        AsyncEvent::Other(CM_EVENT_OTHER_BASE + event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn bind_addr_follows_the_gid() {
        let v4: Gid = "::ffff:198.18.0.1".parse().unwrap();
        assert_eq!(bind_addr(&v4, 7), "198.18.0.1:0".parse().unwrap());
        let ll: Gid = "fe80::5054:ff:fec6:1201".parse().unwrap();
        match bind_addr(&ll, 7) {
            SocketAddr::V6(a) => {
                assert_eq!(a.scope_id(), 7);
                assert_eq!(a.ip().octets(), ll.0);
            }
            other => panic!("{other}"),
        }
        let global: Gid = "2001:db8::1".parse().unwrap();
        match bind_addr(&global, 7) {
            SocketAddr::V6(a) => assert_eq!(a.scope_id(), 0),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn sockaddr_layouts_match_libc() {
        let a = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 0x1234));
        let b = sockaddr_bytes(&a);
        let mut sin: libc::sockaddr_in = zero_sin();
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_port = 0x1234u16.to_be();
        sin.sin_addr.s_addr = u32::from_ne_bytes([198, 18, 0, 1]);
        assert_eq!(&b[..16], &as_bytes(&sin)[..]);
        assert!(b[16..].iter().all(|&x| x == 0));

        let ip: Ipv6Addr = "fe80::1".parse().unwrap();
        let a = SocketAddr::V6(SocketAddrV6::new(ip, 0x1234, 5, 9));
        let b = sockaddr_bytes(&a);
        assert_eq!(size_of::<libc::sockaddr_in6>(), SOCKADDR_IN6_LEN);
        assert_eq!(&b[0..2], &(libc::AF_INET6 as u16).to_ne_bytes());
        assert_eq!(&b[2..4], &[0x12, 0x34]);
        assert_eq!(&b[4..8], &5u32.to_be_bytes());
        assert_eq!(&b[8..24], &ip.octets());
        assert_eq!(&b[24..28], &9u32.to_ne_bytes());
    }

    fn zero_sin() -> libc::sockaddr_in {
        libc::sockaddr_in {
            sin_family: 0,
            sin_port: 0,
            sin_addr: libc::in_addr { s_addr: 0 },
            sin_zero: [0; 8],
        }
    }

    fn as_bytes(sin: &libc::sockaddr_in) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&sin.sin_family.to_ne_bytes());
        v.extend_from_slice(&sin.sin_port.to_ne_bytes());
        v.extend_from_slice(&sin.sin_addr.s_addr.to_ne_bytes());
        v.extend_from_slice(&sin.sin_zero);
        v
    }

    #[test]
    fn cm_events_map_apart_from_verbs_events() {
        assert_eq!(map_cm_event(11), AsyncEvent::DeviceRemoved);
        assert_eq!(map_cm_event(14), AsyncEvent::Other(0x10e));
        assert_eq!(
            CM_EVENT_DEVICE_REMOVAL,
            crate::verbs::rdma::ffi::rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
        );
        assert_eq!(
            u32::from(PS_UDP),
            crate::verbs::rdma::ffi::rdma_port_space::RDMA_PS_UDP
        );
        assert_eq!(
            u32::from(QPT_UD),
            crate::verbs::rdma::ffi::ibv_qp_type::IBV_QPT_UD
        );
    }

    #[test]
    fn closed_watcher_is_inert() {
        let mut w = RemovalWatcher { fd: None, id: None };
        assert_eq!(w.fd(), -1);
        assert_eq!(w.next_event().unwrap(), None);
        assert!(w.close().is_ok());
    }

    #[test]
    fn open_without_rdma_cm_fails_cleanly() {
        // Holds on any machine: either there is no rdma_cm device (the build hosts) or
        // nothing owns TEST-NET-1's 192.0.2.1, so the bind fails; no hang, no panic.
        let addr = "192.0.2.1:0".parse().unwrap();
        match RemovalWatcher::open(&addr) {
            Ok(_) => panic!("bound the watcher to an address no interface has"),
            Err(e) => assert!(matches!(e, VerbsError::Verb { .. }), "{e}"),
        }
    }
}
