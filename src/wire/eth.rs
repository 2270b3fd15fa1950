//! Ethernet frames from and to the TAP, and MACs standing for IPoIB peers.
