//! ARP on both sides: Ethernet ARP (the TAP) and IPoIB ARP (the wire, RFC 4391 §9.1).
