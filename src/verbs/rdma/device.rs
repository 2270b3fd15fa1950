//! Device lookup, port query, GID table and MTU: everything read from the device (and
//! sysfs) when an endpoint opens. Nothing here is cached across opens: after a port flap
//! or a device re-add the kernel may register GIDs at other indexes.

use std::ffi::CStr;
use std::os::raw::c_int;
use std::path::PathBuf;

use super::ffi::*;

use super::objects::{Context, TeardownLog, last_errno, zeroed};
use crate::verbs::{Gid, VerbsError};

/// Root of the verbs devices in sysfs.
const SYSFS_IB: &str = "/sys/class/infiniband";

/// `IBV_LINK_LAYER_ETHERNET` from `<infiniband/verbs.h>` (a `#define`-style anonymous
/// enum that bindgen does not emit): the port is RoCE.
pub(super) const LINK_LAYER_ETHERNET: u8 = 2;

/// `IBV_LINK_LAYER_INFINIBAND` (the same enum, counted from 0).
const LINK_LAYER_INFINIBAND: u8 = 1;

/// `IBV_LINK_LAYER_UNSPECIFIED`: what kernels before link layers were reported say of an
/// InfiniBand port (rdma-core's `ibv_devinfo` prints it as InfiniBand too).
const LINK_LAYER_UNSPECIFIED: u8 = 0;

/// Refuse a port whose link layer is not Ethernet (RoCE). An InfiniBand port routes by
/// LID, and its address handles need path records from the subnet administrator; none of
/// that is implemented, and an endpoint opened there would come up and carry nothing.
pub(super) fn check_link_layer(device: &str, port: u8, link_layer: u8) -> Result<(), VerbsError> {
    let name = match link_layer {
        LINK_LAYER_ETHERNET => return Ok(()),
        LINK_LAYER_INFINIBAND | LINK_LAYER_UNSPECIFIED => "InfiniBand".to_string(),
        other => format!("unknown ({other})"),
    };
    Err(VerbsError::UnsupportedLinkLayer {
        device: device.to_string(),
        port,
        link_layer: name,
    })
}

/// GID indexes are `u8` in the configuration; larger tables are scanned up to here.
const MAX_GID_SCAN: usize = 256;

/// Open the device called `name`. `NoDevice` lists the devices that do exist; a device
/// that is listed but vanishes while it is opened (being removed) is `NoDevice` too.
pub(super) fn open_by_name(name: &str, log: &TeardownLog) -> Result<Context, VerbsError> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed by `DeviceList::drop`.
    let raw = unsafe { ibv_get_device_list(&mut n) };
    if raw.is_null() {
        // rdma-core returns NULL (ENOSYS) when the kernel has no verbs support at all.
        let err = std::io::Error::from_raw_os_error(last_errno());
        return Err(VerbsError::NoDevice(format!(
            "{name} (available: none; ibv_get_device_list: {err})"
        )));
    }
    let list = DeviceList(raw);
    let mut names = Vec::new();
    let mut found = None;
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` entries followed by NULL; `i < n`.
        let dev = unsafe { *list.0.add(i) };
        if dev.is_null() {
            break;
        }
        // SAFETY: `dev` is a live list entry; the name is a NUL-terminated string owned
        // by it, copied out before the list is freed.
        let dev_name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        if dev_name == name {
            found = Some(dev);
        }
        names.push(dev_name);
    }
    let Some(dev) = found else {
        let available = if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        };
        return Err(VerbsError::NoDevice(format!(
            "{name} (available: {available})"
        )));
    };
    // The list is freed after the open; the context keeps its own device reference.
    Context::open(dev, log).map_err(|e| match open_errno(&e) {
        Some(errno) if vanished(errno) => {
            let err = std::io::Error::from_raw_os_error(errno);
            VerbsError::NoDevice(format!("{name} (listed, but gone when opened: {err})"))
        }
        _ => e,
    })
}

fn open_errno(e: &VerbsError) -> Option<i32> {
    match e {
        VerbsError::Verb { source, .. } => source.raw_os_error(),
        _ => None,
    }
}

/// Errors of `ibv_open_device` that mean the device is going or gone: its uverbs node was
/// deleted (`ENOENT`, `ENXIO`, `ENODEV`) or the kernel already disassociated it (`EIO`).
fn vanished(errno: i32) -> bool {
    matches!(errno, libc::ENOENT | libc::ENXIO | libc::ENODEV | libc::EIO)
}

/// The name of the device with kernel index `index`, if it is listed.
pub(super) fn name_by_index(index: u32) -> Option<String> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed by `DeviceList::drop`.
    let raw = unsafe { ibv_get_device_list(&mut n) };
    if raw.is_null() {
        return None;
    }
    let list = DeviceList(raw);
    (0..usize::try_from(n).unwrap_or(0)).find_map(|i| {
        // SAFETY: the list holds `n` entries followed by NULL; `i < n`.
        let dev = unsafe { *list.0.add(i) };
        if dev.is_null() {
            return None;
        }
        // SAFETY: `dev` is a live list entry.
        let idx = unsafe { ibv_get_device_index(dev) };
        if u32::try_from(idx).ok() != Some(index) {
            return None;
        }
        // SAFETY: as above; the name is copied out before the list is freed.
        let name = unsafe { CStr::from_ptr(ibv_get_device_name(dev)) };
        Some(name.to_string_lossy().into_owned())
    })
}

/// The interface index of network device `ndev` (from sysfs).
pub(super) fn ifindex(ndev: &str) -> Option<u32> {
    std::fs::read_to_string(PathBuf::from("/sys/class/net").join(ndev).join("ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Frees a device list on drop.
struct DeviceList(*mut *mut ibv_device);

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ibv_get_device_list and is freed once, here; no
        // entry is used afterwards (opened contexts hold their own references).
        unsafe { ibv_free_device_list(self.0) };
    }
}

/// What the endpoint needs from `ibv_query_port`.
#[derive(Clone, Copy, Debug)]
pub(super) struct PortInfo {
    /// Active MTU in bytes.
    pub(super) mtu: u32,
    /// GID table length.
    pub(super) gid_tbl_len: usize,
    /// `IBV_LINK_LAYER_*`.
    pub(super) link_layer: u8,
}

/// Query `port`; it must exist and be ACTIVE.
pub(super) fn query_port(ctx: &Context, device: &str, port: u8) -> Result<PortInfo, VerbsError> {
    let bad = |why: String| VerbsError::BadPort {
        device: device.to_string(),
        port,
        why,
    };
    let mut attr: ibv_port_attr = zeroed();
    // SAFETY: `ctx` is open; `attr` is a valid out-struct of the size the call expects.
    let ret = unsafe { ___ibv_query_port(ctx.as_ptr(), port, &mut attr) };
    if ret != 0 {
        let err = std::io::Error::from_raw_os_error(super::objects::ret_errno(ret));
        return Err(bad(format!(
            "ibv_query_port failed: {err} (does the port exist?)"
        )));
    }
    if attr.state != ibv_port_state::IBV_PORT_ACTIVE {
        return Err(bad(format!(
            "port state is {} (needs ACTIVE)",
            port_state_name(attr.state)
        )));
    }
    let mtu = mtu_bytes(attr.active_mtu)
        .ok_or_else(|| bad(format!("unknown active MTU enum {}", attr.active_mtu)))?;
    Ok(PortInfo {
        mtu,
        gid_tbl_len: usize::try_from(attr.gid_tbl_len).unwrap_or(0),
        link_layer: attr.link_layer,
    })
}

/// `ibv_port_state` as the name `ibv_devinfo` prints.
pub(super) fn port_state_name(state: ibv_port_state::Type) -> String {
    match state {
        ibv_port_state::IBV_PORT_NOP => "NOP".into(),
        ibv_port_state::IBV_PORT_DOWN => "DOWN".into(),
        ibv_port_state::IBV_PORT_INIT => "INIT".into(),
        ibv_port_state::IBV_PORT_ARMED => "ARMED".into(),
        ibv_port_state::IBV_PORT_ACTIVE => "ACTIVE".into(),
        ibv_port_state::IBV_PORT_ACTIVE_DEFER => "ACTIVE_DEFER".into(),
        other => format!("unknown ({other})"),
    }
}

/// `ibv_mtu` to bytes.
pub(super) fn mtu_bytes(mtu: ibv_mtu::Type) -> Option<u32> {
    match mtu {
        ibv_mtu::IBV_MTU_256 => Some(256),
        ibv_mtu::IBV_MTU_512 => Some(512),
        ibv_mtu::IBV_MTU_1024 => Some(1024),
        ibv_mtu::IBV_MTU_2048 => Some(2048),
        ibv_mtu::IBV_MTU_4096 => Some(4096),
        _ => None,
    }
}

/// The type of a GID table entry (`ibv_gid_entry::gid_type`; sysfs `gid_attrs/types/<i>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum GidType {
    /// RoCE v2: UDP/IP encapsulation; IPv4-mapped GIDs give IPv4 GRHs.
    RoceV2,
    /// IB or RoCE v1 (sysfs `IB/RoCE v1`).
    IbRoceV1,
    /// Unreadable or unknown (the text, if any).
    Unknown(String),
}

impl GidType {
    /// From `ibv_gid_entry::gid_type` (`enum ibv_gid_type`).
    pub(super) fn from_verbs(t: u32) -> GidType {
        match t {
            ibv_gid_type::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            ibv_gid_type::IBV_GID_TYPE_IB | ibv_gid_type::IBV_GID_TYPE_ROCE_V1 => GidType::IbRoceV1,
            other => GidType::Unknown(format!("ibv_gid_type {other}")),
        }
    }
}

fn gid_attr_path(device: &str, port: u8, attr: &str, index: u8) -> PathBuf {
    PathBuf::from(SYSFS_IB)
        .join(device)
        .join("ports")
        .join(port.to_string())
        .join("gid_attrs")
        .join(attr)
        .join(index.to_string())
}

/// The network device behind GID `index` (RoCE only), from `gid_attrs/ndevs/<index>`.
pub(super) fn gid_netdev(device: &str, port: u8, index: u8) -> Option<String> {
    let text = std::fs::read_to_string(gid_attr_path(device, port, "ndevs", index)).ok()?;
    let name = text.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// The GID an endpoint uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct GidChoice {
    pub(super) index: u8,
    pub(super) gid: Gid,
    pub(super) gid_type: GidType,
}

impl GidChoice {
    /// True when receives carry an IPv4 header in the GRH area (RoCEv2 over IPv4).
    pub(super) fn is_ipv4_rocev2(&self) -> bool {
        self.gid_type == GidType::RoceV2 && self.gid.as_ipv4().is_some()
    }
}

/// GID entry `index` of `port` as the table holds it now, GID and type in one call
/// (`ibv_query_gid_ex`: one ioctl; reading the type from sysfs instead took ~1 ms per
/// entry in the lab's guests, docs/PERFORMANCE.md). An empty entry reads as the zero
/// GID.
fn gid_entry(ctx: &Context, port: u8, index: u8) -> Result<GidChoice, VerbsError> {
    let mut entry: ibv_gid_entry = zeroed();
    // SAFETY: `ctx` is open; `entry` is a valid out-struct of the size passed.
    let ret = unsafe {
        _ibv_query_gid_ex(
            ctx.as_ptr(),
            u32::from(port),
            u32::from(index),
            &mut entry,
            0,
            size_of::<ibv_gid_entry>(),
        )
    };
    if ret != 0 {
        let errno = super::objects::ret_errno(ret);
        if errno == libc::ENODATA {
            return Ok(GidChoice {
                index,
                gid: Gid::ZERO,
                gid_type: GidType::Unknown("empty".into()),
            });
        }
        return Err(VerbsError::verb("ibv_query_gid_ex", errno));
    }
    // SAFETY: every bit pattern of the union is a valid `[u8; 16]`.
    let gid = Gid(unsafe { entry.gid.raw });
    Ok(GidChoice {
        index,
        gid,
        gid_type: GidType::from_verbs(entry.gid_type),
    })
}

/// Read the port's GID table now and pick the endpoint's GID (see [`select_gid`]).
pub(super) fn choose_gid(
    ctx: &Context,
    device: &str,
    port: u8,
    table_len: usize,
    want: Option<u8>,
) -> Result<GidChoice, VerbsError> {
    select_gid(table_len, want, |i| gid_entry(ctx, port, i)).map_err(|e| match e {
        Selection::Verb(v) => v,
        Selection::NoGid(why) => VerbsError::NoGid {
            device: device.to_string(),
            port,
            why,
        },
    })
}

/// Why no GID was selected.
#[derive(Debug)]
pub(super) enum Selection {
    Verb(VerbsError),
    NoGid(String),
}

/// Pick a GID from the entries `entry_at` reads (each its GID and type, read together).
/// With `want = Some(i)`: entry `i`, which must exist and be non-zero. With `None`: the
/// first RoCEv2 IPv4-mapped entry, else the first non-zero entry. Entries whose read
/// fails during a scan are skipped (and named if nothing is found).
pub(super) fn select_gid(
    table_len: usize,
    want: Option<u8>,
    mut entry_at: impl FnMut(u8) -> Result<GidChoice, VerbsError>,
) -> Result<GidChoice, Selection> {
    if let Some(index) = want {
        if usize::from(index) >= table_len {
            return Err(Selection::NoGid(format!(
                "GID index {index} is beyond the table ({table_len} entries)"
            )));
        }
        let e = entry_at(index).map_err(Selection::Verb)?;
        if e.gid.is_zero() {
            return Err(Selection::NoGid(format!("GID index {index} is empty")));
        }
        return Ok(e);
    }
    let mut first_nonzero: Option<GidChoice> = None;
    let mut last_err = None;
    for i in 0..table_len.min(MAX_GID_SCAN) {
        let Ok(index) = u8::try_from(i) else { break };
        let e = match entry_at(index) {
            Ok(e) => e,
            Err(err) => {
                last_err = Some(format!("index {index}: {err}"));
                continue;
            }
        };
        if e.gid.is_zero() {
            continue;
        }
        if e.is_ipv4_rocev2() {
            return Ok(e);
        }
        if first_nonzero.is_none() {
            first_nonzero = Some(e);
        }
    }
    match first_nonzero {
        Some(e) => Ok(e),
        None => Err(Selection::NoGid(match last_err {
            Some(e) => format!("no non-zero GID in {table_len} entries (last error: {e})"),
            None => format!("no non-zero GID in {table_len} entries"),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<(Gid, GidType)> {
        vec![
            ("fe80::1".parse().unwrap(), GidType::RoceV2),
            ("fe80::1".parse().unwrap(), GidType::IbRoceV1),
            (Gid::ZERO, GidType::Unknown(String::new())),
            ("::ffff:198.18.0.1".parse().unwrap(), GidType::IbRoceV1),
            ("::ffff:198.18.0.1".parse().unwrap(), GidType::RoceV2),
        ]
    }

    fn pick(t: &[(Gid, GidType)], want: Option<u8>) -> Result<GidChoice, Selection> {
        select_gid(t.len(), want, |i| {
            let (gid, gid_type) = t[usize::from(i)].clone();
            Ok(GidChoice {
                index: i,
                gid,
                gid_type,
            })
        })
    }

    #[test]
    fn default_prefers_ipv4_mapped_rocev2() {
        let c = pick(&table(), None).unwrap();
        assert_eq!(c.index, 4);
        assert!(c.is_ipv4_rocev2());
    }

    #[test]
    fn default_falls_back_to_first_nonzero() {
        let mut t = table();
        t.truncate(4);
        let c = pick(&t, None).unwrap();
        assert_eq!(c.index, 0);
        assert!(!c.is_ipv4_rocev2());
        // An IPv4-mapped RoCE v1 GID is not an IPv4 GRH.
        let c = pick(&t, Some(3)).unwrap();
        assert!(!c.is_ipv4_rocev2());
    }

    #[test]
    fn explicit_index_must_exist_and_be_nonzero() {
        let t = table();
        assert_eq!(pick(&t, Some(1)).unwrap().gid_type, GidType::IbRoceV1);
        assert!(matches!(pick(&t, Some(2)), Err(Selection::NoGid(_))));
        assert!(matches!(pick(&t, Some(9)), Err(Selection::NoGid(_))));
    }

    #[test]
    fn empty_table_and_failing_queries_are_no_gid() {
        let r = select_gid(3, None, |_| {
            Err(VerbsError::verb("ibv_query_gid_ex", libc::EINVAL))
        });
        match r {
            Err(Selection::NoGid(why)) => assert!(why.contains("ibv_query_gid_ex"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(pick(&[], None), Err(Selection::NoGid(_))));
    }

    #[test]
    fn vanished_device_errors() {
        for e in [libc::ENOENT, libc::ENXIO, libc::ENODEV, libc::EIO] {
            assert!(vanished(e), "{e}");
        }
        assert!(!vanished(libc::ENOMEM));
        assert!(!vanished(libc::EACCES));
        assert_eq!(ifindex("uipoib-no-such-netdev"), None);
    }

    #[test]
    fn the_verbs_gid_types_are_told_apart() {
        assert_eq!(
            GidType::from_verbs(ibv_gid_type::IBV_GID_TYPE_ROCE_V2),
            GidType::RoceV2
        );
        // RoCE v1 and IB alike (sysfs calls both "IB/RoCE v1"): no IPv4 GRH either way.
        for t in [
            ibv_gid_type::IBV_GID_TYPE_IB,
            ibv_gid_type::IBV_GID_TYPE_ROCE_V1,
        ] {
            assert_eq!(GidType::from_verbs(t), GidType::IbRoceV1);
        }
        assert_eq!(
            GidType::from_verbs(7),
            GidType::Unknown("ibv_gid_type 7".into())
        );
    }

    #[test]
    fn only_an_ethernet_link_layer_is_accepted() {
        assert!(check_link_layer("rxe0", 1, LINK_LAYER_ETHERNET).is_ok());
        for ll in [LINK_LAYER_INFINIBAND, LINK_LAYER_UNSPECIFIED] {
            let e = check_link_layer("mlx5_0", 2, ll).unwrap_err();
            assert_eq!(
                e.to_string(),
                "device mlx5_0 port 2 has an InfiniBand link layer; uipoib supports only \
                 Ethernet (RoCE) link layers for now"
            );
        }
        let e = check_link_layer("x", 1, 7).unwrap_err().to_string();
        assert!(e.contains("unknown (7) link layer"), "{e}");
    }

    #[test]
    fn mtu_enums_read_as_bytes() {
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_1024), Some(1024));
        assert_eq!(mtu_bytes(ibv_mtu::IBV_MTU_4096), Some(4096));
        assert_eq!(mtu_bytes(0), None);
        assert_eq!(port_state_name(ibv_port_state::IBV_PORT_DOWN), "DOWN");
    }
}
