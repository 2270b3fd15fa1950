//! An endpoint in an example's mio poll set: the descriptors [`Endpoint::watch`] gives,
//! the completion channel's under one token and the async events' under another (what
//! the daemon's poller does).

use std::io;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use uipoib::verbs::{Endpoint, WaitFds};

/// Watch `ep` and register its descriptors: completion fds under `cq`, event fds under
/// `events`.
pub fn watch(
    ep: &mut dyn Endpoint,
    registry: &Registry,
    cq: Token,
    events: Token,
) -> io::Result<WaitFds> {
    let fds = ep.watch()?;
    for (list, token) in [(&fds.cq, cq), (&fds.events, events)] {
        for fd in list {
            registry.register(&mut SourceFd(fd), token, Interest::READABLE)?;
        }
    }
    Ok(fds)
}

/// Undo [`watch`]: every descriptor out of `registry`, then [`Endpoint::unwatch`]. The
/// first deregistration error, if any, after trying them all.
pub fn unwatch(ep: &mut dyn Endpoint, registry: &Registry, fds: &WaitFds) -> io::Result<()> {
    let mut result = Ok(());
    for fd in fds.cq.iter().chain(&fds.events) {
        let r = registry.deregister(&mut SourceFd(fd));
        result = result.and(r);
    }
    ep.unwatch();
    result
}
