//! IPoIB encapsulation (RFC 4391 §6): a 4-byte header (EtherType, 16 reserved bits) in
//! front of every payload, and the 20-byte IPoIB link-layer address (RFC 4391 §9.1.1).
