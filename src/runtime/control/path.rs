//! The socket's directory and path: what is created, what is refused, and which file
//! may be removed.

use std::io;
use std::path::Path;

use super::ControlError;
use crate::sys::process as sys;

/// Why a control-socket path cannot be used.
fn unsafe_dir(dir: &Path, why: String) -> ControlError {
    ControlError::UnsafeDir {
        dir: dir.to_owned(),
        why,
    }
}

/// Create the socket's directory (mode 0700) if it is missing, and check that only
/// this user (or root) can write to it: a directory others can write to would let
/// them replace the socket, or put something in its place before the daemon starts.
pub(super) fn prepare_dir(dir: &Path) -> Result<(), ControlError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let io_err = |e: io::Error| unsafe_dir(dir, e.to_string());
    if let Err(e) = std::fs::metadata(dir) {
        if e.kind() != io::ErrorKind::NotFound {
            return Err(io_err(e));
        }
        if let Some(parent) = dir.parent()
            && !parent.as_os_str().is_empty()
        {
            std::fs::create_dir_all(parent).map_err(io_err)?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(e)),
        }
    }
    let md = std::fs::metadata(dir).map_err(io_err)?;
    if !md.is_dir() {
        return Err(unsafe_dir(dir, "not a directory".into()));
    }
    let own = sys::euid();
    if md.uid() != own && md.uid() != 0 {
        return Err(unsafe_dir(
            dir,
            format!(
                "owned by uid {}, not by this user (uid {own}) or root",
                md.uid()
            ),
        ));
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(
            dir,
            format!(
                "mode {mode:04o} lets {} write to it",
                if mode & 0o002 != 0 {
                    "everyone"
                } else {
                    "its group"
                }
            ),
        ));
    }
    Ok(())
}

/// What is at a path, for an error message.
pub(super) fn file_kind(md: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = md.file_type();
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() || t.is_block_device() {
        "a device node"
    } else {
        "not a socket"
    }
}

/// The device and inode of the socket file at `path`, if a socket is there.
pub(super) fn socket_id(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = std::fs::symlink_metadata(path).ok()?;
    md.file_type().is_socket().then(|| (md.dev(), md.ino()))
}
