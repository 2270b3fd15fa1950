//! Active queue management of the receive completion queue, without any I/O.
//!
//! When the host cannot deliver packets as fast as the fabric brings them, the receive
//! ring is where they wait: its completions pile up in the CQ. The ring is deep (4096
//! slots by default, so that bursts are absorbed rather than dropped by the device), and a
//! TCP sender that sees no loss grows its window until that whole depth is its queue: in
//! the lab a bulk flow's window reached ~900 segments and its round trip ~1 s, with up to
//! ~700 completions waiting in the CQ (docs/PERFORMANCE.md, "The receive queue under
//! TCP"). Such a standing queue is latency for every flow through the interface, and it is
//! what a restart loses: after a failed poll nothing in the failed CQ is delivered.
//!
//! [`RxAqm`] applies CoDel's rule (RFC 8289) to that queue. The sojourn time of a
//! completion is not known (the CQ has no timestamps), but a poll that takes fewer
//! completions than it asked for has seen the CQ empty, and one that used its whole
//! budget (`budget`: a larger one makes the AQM act later) has likely left some behind:
//! a queue that every poll has left behind for a whole `interval` is standing, not a
//! burst being absorbed (an idle poller's queue is empty: its last poll saw it so). From
//! then on one TCP segment that carries data is dropped, then one more after
//! `interval / sqrt(n)` for the n-th, until a poll sees the CQ empty again; a new episode soon after the last
//! resumes near the rate the last one ended at. Each drop is a congestion signal the
//! sender answers by shrinking its window (with SACK, one retransmission): the queue is
//! kept short instead of deep. Only TCP data is dropped: a datagram of a protocol that
//! does not slow down would be lost for nothing, and a pure acknowledgement is no load.
//! Every drop is counted (`rx_aqm`).

use std::time::{Duration, Instant};

use crate::wire::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, eth, ipv4, ipv6};

/// CoDel's own interval (RFC 8289): how long every poll may leave completions behind
/// before the queue counts as standing. `rx-aqm-ms 100` sets it; the daemon's default
/// is off (docs/PERFORMANCE.md says what it costs).
pub const CODEL_INTERVAL: Duration = Duration::from_millis(100);

/// A new episode this soon after the last drop resumes near the last episode's rate
/// (CoDel's "recently dropping": 16 intervals).
const RESUME_WITHIN: u32 = 16;

/// The receive queue's CoDel state. See the module docs.
#[derive(Debug)]
pub struct RxAqm {
    /// Zero: off.
    interval: Duration,
    /// Since when every poll has used its whole budget (`None`: the last poll saw the CQ
    /// empty).
    backlog_since: Option<Instant>,
    /// Inside a dropping episode.
    dropping: bool,
    /// Drops in the current (or last) episode.
    count: u32,
    /// `count` when the last episode began.
    last_count: u32,
    /// When the next drop is due while dropping (or was, after an episode).
    drop_next: Option<Instant>,
}

impl RxAqm {
    /// Off when `interval` is zero.
    pub fn new(interval: Duration) -> RxAqm {
        RxAqm {
            interval,
            backlog_since: None,
            dropping: false,
            count: 0,
            last_count: 0,
            drop_next: None,
        }
    }

    /// The poll of `now` used its whole budget: completions may be left in the CQ.
    pub fn on_backlog(&mut self, now: Instant) {
        self.backlog_since.get_or_insert(now);
    }

    /// A poll took fewer completions than it asked for: the CQ was empty.
    pub fn on_drained(&mut self) {
        self.backlog_since = None;
        self.dropping = false;
    }

    /// Whether a packet dequeued at `now` may have to be dropped: every poll for an
    /// interval has left completions behind. Cheap; [`RxAqm::should_drop`] decides.
    pub fn standing(&self, now: Instant) -> bool {
        match self.backlog_since {
            Some(at) if !self.interval.is_zero() => {
                now.saturating_duration_since(at) >= self.interval
            }
            _ => false,
        }
    }

    /// Whether to drop a droppable packet (TCP data, [`tcp_carries_data`]) dequeued at
    /// `now`. Call it for such packets only: each call may take a drop's turn.
    pub fn should_drop(&mut self, now: Instant) -> bool {
        if !self.standing(now) {
            self.dropping = false;
            return false;
        }
        match self.drop_next {
            Some(next) if self.dropping => {
                if now < next {
                    return false;
                }
                self.count = self.count.saturating_add(1);
                // Far behind (a long pause between polls): one drop now, not a burst of
                // drops to catch up.
                let due = next + self.next_gap();
                self.drop_next = Some(if due < now {
                    now + self.next_gap()
                } else {
                    due
                });
                true
            }
            last => {
                self.dropping = true;
                // Soon after the last episode: resume near its rate, not from one drop.
                let recent = last.is_some_and(|t| {
                    now.saturating_duration_since(t) < self.interval * RESUME_WITHIN
                });
                let delta = self.count.saturating_sub(self.last_count);
                self.count = if delta > 1 && recent { delta } else { 1 };
                self.last_count = self.count;
                self.drop_next = Some(now + self.next_gap());
                true
            }
        }
    }

    /// CoDel's control law: `interval / sqrt(count)`.
    fn next_gap(&self) -> Duration {
        self.interval.div_f64(f64::from(self.count.max(1)).sqrt())
    }
}

/// Whether an Ethernet frame is a TCP segment that carries data (IPv4, not a fragment
/// after the first, or IPv6 with the TCP header found behind its extension headers): a
/// whole TCP header (data offset 5 or more) inside the packet, and bytes after it.
/// Anything that does not parse is not.
pub fn tcp_carries_data(frame: &[u8]) -> bool {
    let Ok((h, ip)) = eth::parse_frame(frame) else {
        return false;
    };
    let (at, end) = match h.ethertype {
        ETHERTYPE_IPV4 => match ipv4::parse_summary(ip) {
            // The fragment offset (bytes 6-7, low 13 bits): a later fragment has no TCP
            // header.
            Ok(s)
                if s.protocol == ipv6::PROTO_TCP
                    && ip.get(6..8).is_some_and(|f| (f[0] & 0x1f) | f[1] == 0) =>
            {
                (s.header_len, s.total_len)
            }
            _ => return false,
        },
        ETHERTYPE_IPV6 => match ipv6::parse_summary(ip) {
            Ok(ipv6::Ipv6Summary {
                upper: Some((ipv6::PROTO_TCP, at)),
                total_len,
                ..
            }) => (at, total_len),
            _ => return false,
        },
        _ => return false,
    };
    // The data offset: the high nibble of the TCP header's byte 12, in 32-bit words.
    if end < at + 20 {
        return false;
    }
    match ip.get(at + 12) {
        Some(b) if b >> 4 >= 5 => end > at + usize::from(b >> 4) * 4,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_queue_drained_within_the_interval_is_never_dropped_from() {
        let t0 = Instant::now();
        let mut q = RxAqm::new(100 * MS);
        for i in 0..50u32 {
            // A backlog for 90 ms, drained, then idle for a second: never standing.
            let start = t0 + 1090 * MS * i;
            q.on_backlog(start);
            assert!(!q.should_drop(start + 90 * MS), "backlog {i}");
            q.on_drained();
            assert!(!q.should_drop(start + 1090 * MS), "after idle {i}");
        }
    }

    #[test]
    fn a_standing_queue_drops_one_then_faster_until_drained() {
        let t0 = Instant::now();
        let mut q = RxAqm::new(100 * MS);
        q.on_backlog(t0);
        assert!(!q.should_drop(t0 + 99 * MS));
        assert!(
            q.should_drop(t0 + 100 * MS),
            "the first drop once standing an interval"
        );
        // Not again before interval / sqrt(1) has passed.
        assert!(!q.should_drop(t0 + 150 * MS));
        assert!(!q.should_drop(t0 + 199 * MS));
        assert!(q.should_drop(t0 + 200 * MS));
        // The second gap is interval / sqrt(2) = 70.7 ms.
        assert!(!q.should_drop(t0 + 270 * MS));
        assert!(q.should_drop(t0 + 271 * MS));
        // Drained: the episode ends, and a queue again standing waits a whole interval.
        q.on_drained();
        assert!(!q.should_drop(t0 + 290 * MS));
        q.on_backlog(t0 + 290 * MS);
        assert!(!q.should_drop(t0 + 389 * MS));
        assert!(q.should_drop(t0 + 390 * MS));
    }

    #[test]
    fn an_episode_soon_after_the_last_resumes_near_its_rate() {
        let t0 = Instant::now();
        let mut q = RxAqm::new(100 * MS);
        q.on_backlog(t0);
        let mut now = t0 + 100 * MS;
        let mut drops = 0;
        while now < t0 + 1000 * MS {
            if q.should_drop(now) {
                drops += 1;
            }
            now += MS;
        }
        assert!(drops >= 5, "{drops} drops in 900 ms of a standing queue");
        let count = q.count;
        q.on_drained();
        // Standing again an interval later, well within 16 intervals of the last drop.
        q.on_backlog(now);
        let again = now + 100 * MS;
        assert!(q.should_drop(again));
        assert!(
            q.count > 1 && q.count <= count,
            "resumed at {} of {count}",
            q.count
        );
        // Long after, an episode starts from one drop.
        q.on_drained();
        q.on_backlog(again + 2900 * MS);
        let late = again + 3000 * MS;
        assert!(q.should_drop(late));
        assert_eq!(q.count, 1);
    }

    #[test]
    fn a_long_pause_gives_one_drop_not_a_burst() {
        let t0 = Instant::now();
        let mut q = RxAqm::new(100 * MS);
        q.on_backlog(t0);
        assert!(q.should_drop(t0 + 100 * MS));
        // The poller was away for two seconds: one drop now, the next a gap later.
        let back = t0 + 2100 * MS;
        assert!(q.should_drop(back));
        assert!(!q.should_drop(back + MS));
        assert!(!q.should_drop(back + 2 * MS));
    }

    #[test]
    fn off_never_drops() {
        let t0 = Instant::now();
        let mut q = RxAqm::new(Duration::ZERO);
        q.on_backlog(t0);
        assert!(!q.standing(t0 + 10_000 * MS));
        assert!(!q.should_drop(t0 + 10_000 * MS));
    }

    fn frame(ethertype: u16, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(ip);
        f
    }

    fn ipv4(proto: u8, payload: &[u8]) -> Vec<u8> {
        let total = 20 + payload.len();
        let mut h = vec![
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0,
            0,
            64,
            proto,
            0,
            0,
        ];
        h.extend_from_slice(&[198, 18, 1, 2, 198, 18, 1, 1]);
        h.extend_from_slice(payload);
        h
    }

    fn ipv6(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut h = vec![0x60, 0, 0, 0];
        h.extend_from_slice(&(payload.len() as u16).to_be_bytes());
        h.extend_from_slice(&[next, 64]);
        h.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        h.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        h.extend_from_slice(payload);
        h
    }

    /// A TCP header of `words` 32-bit words followed by `data` bytes.
    fn tcp(words: u8, data: usize) -> Vec<u8> {
        let mut t = vec![0u8; usize::from(words) * 4];
        t[12] = words << 4;
        t.extend(std::iter::repeat_n(0xab, data));
        t
    }

    #[test]
    fn only_tcp_segments_with_data_are_droppable() {
        assert!(tcp_carries_data(&frame(
            ETHERTYPE_IPV4,
            &ipv4(6, &tcp(5, 1))
        )));
        assert!(tcp_carries_data(&frame(
            ETHERTYPE_IPV4,
            &ipv4(6, &tcp(8, 4000))
        )));
        assert!(tcp_carries_data(&frame(
            ETHERTYPE_IPV6,
            &ipv6(6, &tcp(5, 100))
        )));
        // Pure acknowledgements, with and without options.
        assert!(!tcp_carries_data(&frame(
            ETHERTYPE_IPV4,
            &ipv4(6, &tcp(5, 0))
        )));
        assert!(!tcp_carries_data(&frame(
            ETHERTYPE_IPV4,
            &ipv4(6, &tcp(8, 0))
        )));
        assert!(!tcp_carries_data(&frame(
            ETHERTYPE_IPV6,
            &ipv6(6, &tcp(8, 0))
        )));
        // UDP, ICMP, ARP, and what does not parse.
        assert!(!tcp_carries_data(&frame(
            ETHERTYPE_IPV4,
            &ipv4(17, &[0; 100])
        )));
        assert!(!tcp_carries_data(&frame(
            ETHERTYPE_IPV6,
            &ipv6(58, &[0; 100])
        )));
        assert!(!tcp_carries_data(&frame(0x0806, &[0; 28])));
        assert!(!tcp_carries_data(&frame(ETHERTYPE_IPV4, &ipv4(6, &[0; 5]))));
        assert!(!tcp_carries_data(&[0; 10]));
        let mut short = frame(ETHERTYPE_IPV4, &ipv4(6, &tcp(5, 10)));
        short.truncate(30);
        assert!(!tcp_carries_data(&short));
        // A data offset under 5 words, and a TCP header cut short by the IP length (the
        // frame's padding behind it does not count).
        let mut bad_off = tcp(5, 100);
        bad_off[12] = 4 << 4;
        assert!(!tcp_carries_data(&frame(
            ETHERTYPE_IPV4,
            &ipv4(6, &bad_off)
        )));
        let mut padded = frame(ETHERTYPE_IPV4, &ipv4(6, &[0; 12]));
        padded.extend_from_slice(&[0x50; 40]);
        assert!(!tcp_carries_data(&padded));
        // A later fragment (offset 185 words) carries no TCP header; the first does.
        let mut later = ipv4(6, &tcp(5, 100));
        later[6..8].copy_from_slice(&185u16.to_be_bytes());
        assert!(!tcp_carries_data(&frame(ETHERTYPE_IPV4, &later)));
        let mut first = ipv4(6, &tcp(5, 100));
        first[6] = 0x20; // more fragments, offset 0
        assert!(tcp_carries_data(&frame(ETHERTYPE_IPV4, &first)));
    }
}
