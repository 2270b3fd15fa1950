//! Just enough of IPv4 to route a packet: version, lengths, addresses.
