//! How a fuzz input is laid out: a mode byte, then records of a flag byte, a 16-bit
//! little-endian length and that many bytes (the last record takes what is left).

/// At most this many records are taken from one input (keeps each run short).
pub const MAX_RECORDS: usize = 16;

/// One record.
#[derive(Clone, Copy, Debug)]
pub struct Record<'a> {
    /// Its flag byte.
    pub flags: u8,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// The mode byte (0 for an empty input) and the records after it.
pub fn split(data: &[u8]) -> (u8, Vec<Record<'_>>) {
    let Some((&mode, mut rest)) = data.split_first() else {
        return (0, Vec::new());
    };
    let mut out = Vec::new();
    while !rest.is_empty() && out.len() < MAX_RECORDS {
        let flags = rest[0];
        let len = match rest.get(1..3) {
            Some(l) => usize::from(u16::from_le_bytes([l[0], l[1]])),
            None => usize::MAX,
        };
        let body = rest.get(3..).unwrap_or(&[]);
        let n = len.min(body.len());
        out.push(Record {
            flags,
            bytes: &body[..n],
        });
        rest = &body[n..];
    }
    (mode, out)
}

/// Write `records` after `mode` in the layout [`split`] reads.
pub fn join(mode: u8, records: &[(u8, &[u8])]) -> Vec<u8> {
    let mut out = vec![mode];
    for (flags, bytes) in records {
        out.push(*flags);
        out.extend_from_slice(&(bytes.len() as u16).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}
