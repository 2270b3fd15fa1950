//! Owning wrappers for verbs objects, the registered buffer region, errno helpers.
//!
//! Each wrapper owns exactly one verbs object and destroys it once, in `close` or, if
//! nobody called `close`, in `Drop`. The wrappers do not know their dependants: the
//! owner ([`super::RdmaEndpoint`]) closes them in order (attachments and AHs, QP, CQs,
//! channel, MR, PD, context). A failed destroy is logged and counted in the
//! [`TeardownLog`]; the raw pointer is forgotten either way, so nothing is destroyed
//! twice. Once the endpoint has seen its device go (`DEVICE_FATAL`, rdma_cm
//! `DEVICE_REMOVAL`), `EIO` from a destroy means "already destroyed" and is counted apart
//! (see [`teardown_outcome`]).

use std::io;
use std::os::raw::c_int;
use std::os::unix::io::RawFd;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::ffi::*;

use crate::verbs::{GRH_LEN, SEND_HEADROOM, SEND_TAILROOM, VerbsError};

/// C structs from `<infiniband/verbs.h>` for which the all-zero byte pattern is a valid
/// value (the C code builds them with `memset(0)` / `= {}` too).
///
/// # Safety
/// Implement only for `repr(C)` types made of integers, raw pointers, `Option` of
/// function pointers and unions/arrays of those.
pub(super) unsafe trait Pod: Sized {}

// SAFETY: each of these is a bindgen-generated `repr(C)` struct/union of integers,
// raw pointers and unions of those; all-zero is a valid value (null pointers, 0 ints).
unsafe impl Pod for ibv_port_attr {}
// SAFETY: as above.
unsafe impl Pod for ibv_qp_attr {}
// SAFETY: as above.
unsafe impl Pod for ibv_qp_init_attr {}
// SAFETY: as above.
unsafe impl Pod for ibv_send_wr {}
// SAFETY: as above.
unsafe impl Pod for ibv_recv_wr {}
// SAFETY: as above.
unsafe impl Pod for ibv_sge {}
// SAFETY: as above.
unsafe impl Pod for ibv_wc {}
// SAFETY: as above.
unsafe impl Pod for ibv_ah_attr {}
// SAFETY: as above (a 16-byte union of a byte array and two u64).
unsafe impl Pod for ibv_gid {}
// SAFETY: as above (an `ibv_gid` and four u32).
unsafe impl Pod for ibv_gid_entry {}

/// A zeroed C struct.
pub(super) fn zeroed<T: Pod>() -> T {
    // SAFETY: `T: Pod` promises that all-zero bytes are a valid `T`.
    unsafe { std::mem::zeroed() }
}

/// The errno left by the last failed call on this thread; `EIO` if the call failed
/// without setting one (so that a failure never reads as "Success").
pub(super) fn last_errno() -> i32 {
    match io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

/// The errno of a verb that returns 0 or an error code. rdma-core returns the positive
/// errno (`ibv_post_send`, `ibv_modify_qp`, destroys); a few legacy paths return -1 and
/// set `errno`; anything else negative is taken as `-errno`.
pub(super) fn ret_errno(ret: c_int) -> i32 {
    if ret > 0 {
        ret
    } else if ret == -1 {
        last_errno()
    } else {
        ret.checked_neg().unwrap_or(libc::EIO)
    }
}

/// Set `O_NONBLOCK` on `fd` (completion channel, async event fd).
pub(super) fn set_nonblocking(fd: RawFd, what: &'static str) -> Result<(), VerbsError> {
    // SAFETY: F_GETFL on an fd owned by a live verbs object; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(VerbsError::verb(what, last_errno()));
    }
    // SAFETY: as above; F_SETFL with an integer argument.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(VerbsError::verb(what, last_errno()));
    }
    Ok(())
}

/// Closed counters shared by a provider and every endpoint it opened.
#[derive(Debug, Default)]
pub(super) struct TeardownCounters {
    /// Destroy/detach verbs that failed (logged with `warn!`).
    pub(super) failed: AtomicU64,
    /// Destroy/detach verbs that returned `EIO` after the device was lost: taken as
    /// already destroyed (see [`teardown_outcome`]).
    pub(super) already_gone: AtomicU64,
}

/// What a failed destroy means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TeardownOutcome {
    /// A real failure: logged, counted in `failed`, returned.
    Failed,
    /// The kernel object went with the device: counted in `already_gone`, not an error.
    AlreadyGone,
}

/// Classify a failed destroy (`errno`) given whether the device was already lost.
///
/// After `IBV_EVENT_DEVICE_FATAL` (drivers with disassociate support, e.g. mlx5) the kernel
/// has released the hardware objects and answers every later command with `EIO`, while
/// rdma-core still frees the userspace side (libvma relies on this). Before a loss, `EIO`
/// is an ordinary failure; any other errno is always one.
pub(super) fn teardown_outcome(device_lost: bool, errno: i32) -> TeardownOutcome {
    if device_lost && errno == libc::EIO {
        TeardownOutcome::AlreadyGone
    } else {
        TeardownOutcome::Failed
    }
}

/// Where failed destroys are logged and counted: the provider's counters, plus whether
/// this endpoint's device is known to be gone (set by the endpoint when it reports
/// `DeviceFatal` or `DeviceRemoved`).
#[derive(Clone, Debug)]
pub(super) struct TeardownLog {
    counters: Arc<TeardownCounters>,
    device_lost: Arc<AtomicBool>,
}

impl TeardownLog {
    /// A log for one endpoint (its own device-lost flag, the provider's counters).
    pub(super) fn new(counters: Arc<TeardownCounters>) -> Self {
        TeardownLog {
            counters,
            device_lost: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Remember that the device is gone: from now on `EIO` from a destroy is
    /// [`TeardownOutcome::AlreadyGone`].
    pub(super) fn mark_device_lost(&self) {
        self.device_lost.store(true, Ordering::Relaxed);
    }

    pub(super) fn device_lost(&self) -> bool {
        self.device_lost.load(Ordering::Relaxed)
    }

    /// The result of a destroy/detach verb that returned `ret` (0 or an error code, see
    /// [`ret_errno`]): `Ok` when it worked or the object is already gone with the device
    /// (counted), else the error, logged and counted as a failed teardown step.
    pub(super) fn destroyed(&self, verb: &'static str, ret: c_int) -> Result<(), VerbsError> {
        self.excused(verb, ret).inspect_err(|err| self.record(err))
    }

    /// Like [`Self::destroyed`] but a failure is only returned, not logged or counted
    /// (for calls whose caller reports failures itself).
    pub(super) fn excused(&self, verb: &'static str, ret: c_int) -> Result<(), VerbsError> {
        if ret == 0 {
            return Ok(());
        }
        let errno = ret_errno(ret);
        match teardown_outcome(self.device_lost(), errno) {
            TeardownOutcome::AlreadyGone => {
                self.counters.already_gone.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(verb, "EIO after the device was lost: taken as destroyed");
                Ok(())
            }
            TeardownOutcome::Failed => Err(VerbsError::verb(verb, errno)),
        }
    }

    /// Log and count one failed teardown step.
    pub(super) fn record(&self, err: &VerbsError) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %err, "verbs teardown step failed (object forgotten)");
    }

    /// Failed teardown steps so far (all endpoints of the provider).
    pub(super) fn count(&self) -> u64 {
        self.counters.failed.load(Ordering::Relaxed)
    }

    /// Destroys taken as done after a device loss (all endpoints of the provider).
    pub(super) fn already_gone(&self) -> u64 {
        self.counters.already_gone.load(Ordering::Relaxed)
    }
}

/// Defines an owning wrapper around `*mut $raw` destroyed by `$destroy`.
macro_rules! verbs_object {
    ($(#[$doc:meta])* $name:ident, $raw:ty, $destroy:ident) => {
        $(#[$doc])*
        pub(super) struct $name {
            /// Null once closed.
            ptr: *mut $raw,
            log: TeardownLog,
        }

        impl $name {
            /// Own `ptr`, which a create verb just returned (non-null, owned nowhere
            /// else).
            fn from_raw(ptr: NonNull<$raw>, log: &TeardownLog) -> Self {
                $name { ptr: ptr.as_ptr(), log: log.clone() }
            }

            /// The raw object, for verbs calls. Null after [`Self::close`]; the owner
            /// makes no verbs call after closing.
            #[allow(dead_code)] // not every object type is passed to a verb
            pub(super) fn as_ptr(&self) -> *mut $raw {
                self.ptr
            }

            /// Destroy the object now (idempotent). A failure is logged, counted and
            /// returned (unless it is `EIO` after a device loss, see
            /// [`TeardownLog::destroyed`]); the object is forgotten either way.
            pub(super) fn close(&mut self) -> Result<(), VerbsError> {
                let ptr = std::mem::replace(&mut self.ptr, ptr::null_mut());
                if ptr.is_null() {
                    return Ok(());
                }
                // SAFETY: `ptr` came from the matching create verb, is owned by this
                // value only and was cleared above, so it is destroyed exactly once; the
                // owner has already closed every object that depends on it.
                let ret = unsafe { $destroy(ptr) };
                self.log.destroyed(stringify!($destroy), ret)
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // Logged and counted inside close.
                let _ = self.close();
            }
        }
    };
}

verbs_object!(
    /// An open device (`ibv_open_device`); closed last.
    Context,
    ibv_context,
    ibv_close_device
);
verbs_object!(
    /// A protection domain.
    Pd,
    ibv_pd,
    ibv_dealloc_pd
);
verbs_object!(
    /// The memory registration of the endpoint's buffer region.
    Mr,
    ibv_mr,
    ibv_dereg_mr
);
verbs_object!(
    /// A completion channel (its fd is nonblocking).
    CompChannel,
    ibv_comp_channel,
    ibv_destroy_comp_channel
);
verbs_object!(
    /// A completion queue. Every event taken from the channel for it is acknowledged in
    /// the same call that took it (`take_cq_events`), so none is outstanding when it is
    /// destroyed (`ibv_destroy_cq` would wait for them forever).
    Cq,
    ibv_cq,
    ibv_destroy_cq
);
verbs_object!(
    /// A queue pair. Detach its multicast groups before closing it (rxe: EBUSY).
    Qp,
    ibv_qp,
    ibv_destroy_qp
);
verbs_object!(
    /// An address handle.
    Ah,
    ibv_ah,
    ibv_destroy_ah
);

/// A non-null result of a create verb, or the verb's errno.
fn created<T>(ptr: *mut T, verb: &'static str) -> Result<NonNull<T>, VerbsError> {
    // Read errno before anything else can overwrite it.
    let errno = last_errno();
    NonNull::new(ptr).ok_or_else(|| VerbsError::verb(verb, errno))
}

impl Context {
    /// Open `dev` (an entry of a live device list).
    pub(super) fn open(dev: *mut ibv_device, log: &TeardownLog) -> Result<Self, VerbsError> {
        // SAFETY: `dev` is an entry of a device list that the caller keeps alive for the
        // duration of this call; the context holds its own reference afterwards.
        let ptr = unsafe { ibv_open_device(dev) };
        Ok(Context::from_raw(created(ptr, "ibv_open_device")?, log))
    }

    /// The device's node GUID (as the kernel stores it, big-endian) and its kernel index
    /// (`None` when libibverbs does not know it), to recognise the device elsewhere.
    pub(super) fn identity(&self) -> (u64, Option<u32>) {
        // SAFETY: the context is open; `device` is set by ibv_open_device and stays valid
        // while the context lives (libibverbs holds a reference for it).
        let dev = unsafe { (*self.ptr).device };
        // SAFETY: `dev` is the live device of this context.
        let guid = unsafe { ibv_get_device_guid(dev) };
        // SAFETY: as above; returns -1 when the index is unknown.
        let index = unsafe { ibv_get_device_index(dev) };
        (guid, u32::try_from(index).ok())
    }

    /// The async event fd.
    pub(super) fn async_fd(&self) -> RawFd {
        // SAFETY: the context is open (callers use it only before teardown), and
        // `async_fd` is a plain int field set by ibv_open_device and never changed.
        unsafe { (*self.ptr).async_fd }
    }
}

impl Pd {
    pub(super) fn alloc(ctx: &Context, log: &TeardownLog) -> Result<Self, VerbsError> {
        // SAFETY: `ctx` is an open context.
        let ptr = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        Ok(Pd::from_raw(created(ptr, "ibv_alloc_pd")?, log))
    }
}

impl Mr {
    /// Register all of `region` for local write (the device writes receives into it).
    pub(super) fn register(
        pd: &Pd,
        region: &Region,
        log: &TeardownLog,
    ) -> Result<Self, VerbsError> {
        let access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as c_int;
        // SAFETY: `region` is a live mapping of `region.len()` bytes that the endpoint
        // keeps mapped until after this MR is deregistered (field/teardown order).
        let ptr = unsafe { ibv_reg_mr(pd.as_ptr(), region.base().cast(), region.len(), access) };
        match created(ptr, "ibv_reg_mr") {
            Ok(mr) => Ok(Mr::from_raw(mr, log)),
            // Pinning more than RLIMIT_MEMLOCK without CAP_IPC_LOCK: say so.
            Err(VerbsError::Verb { source, .. }) if source.raw_os_error() == Some(libc::ENOMEM) => {
                Err(VerbsError::Verb {
                    verb: "ibv_reg_mr (the rings are pinned memory: raise RLIMIT_MEMLOCK, e.g. LimitMEMLOCK= or ulimit -l, or run with CAP_IPC_LOCK)",
                    source,
                })
            }
            Err(e) => Err(e),
        }
    }

    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: the MR is registered (used only before teardown); `lkey` is a plain
        // field written once by ibv_reg_mr.
        unsafe { (*self.ptr).lkey }
    }
}

impl CompChannel {
    /// A completion channel with a nonblocking fd.
    pub(super) fn create(ctx: &Context, log: &TeardownLog) -> Result<Self, VerbsError> {
        // SAFETY: `ctx` is an open context.
        let ptr = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = CompChannel::from_raw(created(ptr, "ibv_create_comp_channel")?, log);
        set_nonblocking(ch.fd(), "fcntl(O_NONBLOCK) on the completion channel")?;
        Ok(ch)
    }

    pub(super) fn fd(&self) -> RawFd {
        // SAFETY: the channel is live (used only before teardown); `fd` is a plain field
        // set at creation and never changed.
        unsafe { (*self.ptr).fd }
    }
}

impl Cq {
    /// Try to destroy the CQ, keeping it when the device refuses: `Err(errno)` leaves it
    /// live and owned here (a CQ a QP still uses is refused, IBTA C11-17; rxe: EBUSY),
    /// to be closed once that QP is gone.
    pub(super) fn try_close(&mut self) -> Result<(), i32> {
        if self.ptr.is_null() {
            return Ok(());
        }
        // SAFETY: `ptr` is live and owned by this value only; the destroy either frees it
        // (then it is cleared below and never used again) or fails and leaves it intact
        // (rdma-core frees nothing when the kernel refuses).
        let ret = unsafe { ibv_destroy_cq(self.ptr) };
        if ret == 0 {
            self.ptr = ptr::null_mut();
            return Ok(());
        }
        Err(if ret > 0 { ret } else { -ret })
    }

    /// A CQ of at least `depth` entries whose events go to `channel`.
    pub(super) fn create(
        ctx: &Context,
        depth: u32,
        channel: &CompChannel,
        log: &TeardownLog,
    ) -> Result<Self, VerbsError> {
        let cqe = c_int::try_from(depth).map_err(|_| VerbsError::Invalid {
            field: "cq depth",
            why: format!("{depth} does not fit a C int"),
        })?;
        // SAFETY: `ctx` and `channel` are live and belong together; no cq_context.
        let ptr = unsafe { ibv_create_cq(ctx.as_ptr(), cqe, ptr::null_mut(), channel.as_ptr(), 0) };
        Ok(Cq::from_raw(created(ptr, "ibv_create_cq")?, log))
    }
}

/// What [`Qp::create_ud`] asks for.
pub(super) struct QpRequest {
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    pub(super) max_inline_data: u32,
}

impl Qp {
    /// A UD QP with one SGE per WR. Returns the capabilities the device granted.
    pub(super) fn create_ud(
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        req: &QpRequest,
        log: &TeardownLog,
    ) -> Result<(Self, ibv_qp_cap), VerbsError> {
        let mut init: ibv_qp_init_attr = zeroed();
        init.send_cq = send_cq.as_ptr();
        init.recv_cq = recv_cq.as_ptr();
        init.cap = ibv_qp_cap {
            max_send_wr: req.max_send_wr,
            max_recv_wr: req.max_recv_wr,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: req.max_inline_data,
        };
        init.qp_type = ibv_qp_type::IBV_QPT_UD;
        init.sq_sig_all = 0;
        // SAFETY: `pd` and both CQs are live objects of one context; `init` is a valid,
        // initialised attribute struct that ibv_create_qp may update (granted caps).
        let ptr = unsafe { ibv_create_qp(pd.as_ptr(), &mut init) };
        let qp = Qp::from_raw(created(ptr, "ibv_create_qp")?, log);
        Ok((qp, init.cap))
    }

    pub(super) fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live (used only before teardown); `qp_num` is set at creation.
        unsafe { (*self.ptr).qp_num }
    }

    /// `ibv_modify_qp` with `attr` under `mask`; `verb` names the transition in errors.
    pub(super) fn modify(
        &self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        verb: &'static str,
    ) -> Result<(), VerbsError> {
        // SAFETY: the QP is live; `attr` is a valid attribute struct for `mask`.
        let ret = unsafe { ibv_modify_qp(self.ptr, attr, mask.0 as c_int) };
        if ret == 0 {
            Ok(())
        } else {
            Err(VerbsError::verb(verb, ret_errno(ret)))
        }
    }
}

impl Ah {
    pub(super) fn create(
        pd: &Pd,
        attr: &mut ibv_ah_attr,
        log: &TeardownLog,
    ) -> Result<Self, VerbsError> {
        // SAFETY: `pd` is live; `attr` is a fully initialised ibv_ah_attr.
        let ptr = unsafe { ibv_create_ah(pd.as_ptr(), attr) };
        Ok(Ah::from_raw(created(ptr, "ibv_create_ah")?, log))
    }
}

/// Alignment of every slot: one cache line, so that the device writing one receive slot
/// and the CPU reading its neighbour never share a line.
const SLOT_ALIGN: usize = 64;

/// Where the slots live in the region: all receive slots, then all send slots, each send
/// slot between its head- and tailroom ([`SEND_HEADROOM`], [`SEND_TAILROOM`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SlotLayout {
    /// Usable bytes of a receive slot (`GRH_LEN + max_payload`).
    pub(super) recv_len: usize,
    /// Usable bytes of a send slot (`max_payload`).
    pub(super) send_len: usize,
    recv_stride: usize,
    send_stride: usize,
    recv_slots: usize,
    send_slots: usize,
}

impl SlotLayout {
    /// The layout for the given slot counts and payload size; `Invalid` if the region
    /// would not fit the address space.
    pub(super) fn new(
        recv_slots: u32,
        send_slots: u32,
        max_payload: u32,
    ) -> Result<Self, VerbsError> {
        let too_big = || VerbsError::Invalid {
            field: "recv_slots/send_slots",
            why: format!(
                "{recv_slots} receive and {send_slots} send slots of {max_payload} bytes \
                 do not fit in memory"
            ),
        };
        let payload = usize::try_from(max_payload).map_err(|_| too_big())?;
        let recv_len = payload.checked_add(GRH_LEN).ok_or_else(too_big)?;
        let round = |n: usize| n.checked_next_multiple_of(SLOT_ALIGN);
        let layout = SlotLayout {
            recv_len,
            send_len: payload,
            recv_stride: round(recv_len).ok_or_else(too_big)?,
            send_stride: round(
                payload
                    .checked_add(SEND_HEADROOM + SEND_TAILROOM)
                    .ok_or_else(too_big)?,
            )
            .ok_or_else(too_big)?,
            recv_slots: usize::try_from(recv_slots).map_err(|_| too_big())?,
            send_slots: usize::try_from(send_slots).map_err(|_| too_big())?,
        };
        layout.total_len().ok_or_else(too_big)?;
        Ok(layout)
    }

    fn recv_area(&self) -> Option<usize> {
        self.recv_stride.checked_mul(self.recv_slots)
    }

    /// Bytes the region needs.
    pub(super) fn total_len(&self) -> Option<usize> {
        self.recv_area()?
            .checked_add(self.send_stride.checked_mul(self.send_slots)?)
    }

    /// Offset of receive slot `slot`, `None` if out of range.
    pub(super) fn recv_offset(&self, slot: u32) -> Option<usize> {
        let s = usize::try_from(slot).ok()?;
        (s < self.recv_slots).then(|| s * self.recv_stride)
    }

    /// Offset of send slot `slot` (what a send carries starts there), `None` if out of
    /// range.
    pub(super) fn send_offset(&self, slot: u32) -> Option<usize> {
        Some(self.send_room_offset(slot)? + SEND_HEADROOM)
    }

    /// Offset of send slot `slot`'s room ([`SEND_HEADROOM`] before [`Self::send_offset`]),
    /// `None` if out of range.
    pub(super) fn send_room_offset(&self, slot: u32) -> Option<usize> {
        let s = usize::try_from(slot).ok()?;
        (s < self.send_slots).then(|| self.recv_stride * self.recv_slots + s * self.send_stride)
    }

    /// Bytes of a send slot with its room.
    pub(super) fn send_room_len(&self) -> usize {
        SEND_HEADROOM + self.send_len + SEND_TAILROOM
    }
}

/// Page-aligned anonymous memory holding every slot, registered as one MR.
///
/// It is an `mmap` rather than a heap allocation on purpose: should deregistration ever
/// fail, unmapping does not hand pages the device may still hold back to the allocator
/// for reuse by other data.
pub(super) struct Region {
    base: NonNull<u8>,
    len: usize,
}

impl Region {
    /// Map `len` zeroed bytes (`len > 0`).
    pub(super) fn map(len: usize) -> Result<Self, VerbsError> {
        if len == 0 {
            return Err(VerbsError::Invalid {
                field: "recv_slots/send_slots",
                why: "empty buffer region".to_string(),
            });
        }
        // SAFETY: anonymous private mapping at a kernel-chosen address; no existing
        // memory is touched.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(VerbsError::verb("mmap (buffer region)", last_errno()));
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| VerbsError::verb("mmap (buffer region)", libc::EIO))?;
        Ok(Region { base, len })
    }

    pub(super) fn base(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Device address (the virtual address) of byte `offset`.
    pub(super) fn addr(&self, offset: usize) -> u64 {
        self.base.as_ptr() as u64 + offset as u64
    }

    /// `len` bytes at `offset`, `None` if outside the region.
    pub(super) fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: the range is inside the live mapping (checked above). The device may
        // write other slots concurrently, never this one while the caller reads it (the
        // Endpoint contract: read a receive slot only after its completion).
        Some(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(offset), len) })
    }

    /// `len` bytes at `offset`, mutable, `None` if outside the region.
    pub(super) fn slice_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: inside the live mapping (checked above); `&mut self` excludes other
        // Rust references; the device reads a send slot only while it is posted, and
        // the Endpoint contract forbids writing a posted slot.
        Some(unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr().add(offset), len) })
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `map`, unmapped once; the endpoint drops
        // the region after deregistering the MR, and no slice of it outlives `self`.
        if unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) } != 0 {
            let err = io::Error::last_os_error();
            tracing::warn!(error = %err, "munmap of the buffer region failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log() -> (TeardownLog, Arc<TeardownCounters>) {
        let c = Arc::new(TeardownCounters::default());
        (TeardownLog::new(c.clone()), c)
    }

    #[test]
    fn eio_is_already_gone_only_after_a_device_loss() {
        assert_eq!(teardown_outcome(false, libc::EIO), TeardownOutcome::Failed);
        assert_eq!(
            teardown_outcome(true, libc::EIO),
            TeardownOutcome::AlreadyGone
        );
        assert_eq!(teardown_outcome(true, libc::EBUSY), TeardownOutcome::Failed);
        assert_eq!(
            teardown_outcome(false, libc::EINVAL),
            TeardownOutcome::Failed
        );
    }

    #[test]
    fn destroyed_counts_failures_and_losses_apart() {
        let (l, c) = log();
        assert!(l.destroyed("ibv_destroy_qp", 0).is_ok());
        // Before any loss, EIO (positive errno or -1 with errno set) is a failure.
        let e = l.destroyed("ibv_destroy_qp", libc::EIO).unwrap_err();
        assert!(e.to_string().contains("ibv_destroy_qp"), "{e}");
        assert_eq!((l.count(), l.already_gone()), (1, 0));
        // mlx5-style: DEVICE_FATAL, then every destroy answers EIO.
        l.mark_device_lost();
        for verb in [
            "ibv_destroy_qp",
            "ibv_destroy_cq",
            "ibv_dereg_mr",
            "ibv_dealloc_pd",
        ] {
            assert!(l.destroyed(verb, libc::EIO).is_ok());
        }
        assert!(l.destroyed("ibv_destroy_ah", -libc::EIO).is_ok());
        assert_eq!((l.count(), l.already_gone()), (1, 5));
        // Anything else still is a failure.
        assert!(l.destroyed("ibv_destroy_qp", libc::EBUSY).is_err());
        assert_eq!((l.count(), l.already_gone()), (2, 5));
        // `excused` classifies the same way but leaves failures to its caller.
        assert!(l.excused("ibv_detach_mcast", libc::EIO).is_ok());
        assert!(l.excused("ibv_detach_mcast", libc::EINVAL).is_err());
        assert_eq!((l.count(), l.already_gone()), (2, 6));
        // The flag is per endpoint, the counters per provider.
        let other = TeardownLog::new(c.clone());
        assert!(!other.device_lost());
        assert!(other.destroyed("ibv_destroy_qp", libc::EIO).is_err());
        assert_eq!(c.failed.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn ret_errno_accepts_both_conventions() {
        assert_eq!(ret_errno(libc::ENOMEM), libc::ENOMEM);
        assert_eq!(ret_errno(-libc::EINVAL), libc::EINVAL);
        assert_eq!(ret_errno(i32::MIN), libc::EIO);
    }

    #[test]
    fn slot_layout_is_disjoint_and_aligned() {
        let l = SlotLayout::new(4, 3, 1024).unwrap();
        assert_eq!(l.recv_len, GRH_LEN + 1024);
        assert_eq!(l.send_len, 1024);
        let mut spans = Vec::new();
        for s in 0..4 {
            spans.push((l.recv_offset(s).unwrap(), l.recv_len));
        }
        for s in 0..3 {
            let room = l.send_room_offset(s).unwrap();
            assert_eq!(l.send_offset(s), Some(room + SEND_HEADROOM));
            spans.push((room, l.send_room_len()));
        }
        assert_eq!(l.send_room_len(), SEND_HEADROOM + 1024 + SEND_TAILROOM);
        spans.sort();
        for w in spans.windows(2) {
            assert!(w[0].0 + w[0].1 <= w[1].0, "{w:?}");
        }
        for (off, len) in &spans {
            assert_eq!(off % SLOT_ALIGN, 0);
            assert!(off + len <= l.total_len().unwrap());
        }
        assert_eq!(l.recv_offset(4), None);
        assert_eq!(l.send_offset(3), None);
    }

    #[test]
    fn slot_layout_overflow_is_invalid() {
        // (2^32 - 1) slots of about 2^32 bytes each overflow even a 64-bit usize.
        assert!(SlotLayout::new(u32::MAX, u32::MAX, u32::MAX).is_err());
    }

    #[test]
    fn region_slices_are_bounded() {
        let mut r = Region::map(8192).unwrap();
        assert_eq!(r.base() as usize % 4096, 0);
        r.slice_mut(100, 4).unwrap().copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(r.slice(100, 4).unwrap(), &[1, 2, 3, 4]);
        assert!(r.slice(8190, 4).is_none());
        assert!(r.slice(usize::MAX, 2).is_none());
    }
}
