//! The run's time series, as the report keeps them: every counter sample the runner took
//! (every 50 ms) and every iperf3 interval the load printed, each placed on the wall
//! clock and relative to the run's start, so that a recovery can be drawn
//! ([`super::plot`]) or computed again from the JSON.

use serde::{Deserialize, Serialize};

use super::traffic::{Capped, Interval, Sample};

/// The time series of a run (`series` in the report). Both lists are always there
/// (empty when nothing was read: no sample, or a load that is not iperf3).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Series {
    /// How often the counters were sampled (ms).
    pub every_ms: u64,
    /// The most samples kept; past it the oldest were dropped.
    pub cap: usize,
    /// Samples dropped past the cap (the oldest ones): 0 unless the run was longer
    /// than `cap` samples.
    pub dropped: u64,
    /// The counter samples, oldest first.
    pub samples: Vec<SeriesSample>,
    /// The load's iperf3 intervals, in the order printed (empty when the load is not
    /// iperf3).
    pub iperf3: Vec<SeriesInterval>,
    /// iperf3 intervals left out past the cap (the oldest ones).
    pub iperf3_dropped: u64,
}

/// One reading of the daemon's counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SeriesSample {
    /// When it was read (ms since the Unix epoch).
    pub unix_ms: u64,
    /// The same, in ms from the run's start (`started_unix_ms`).
    pub t_ms: u64,
    /// The daemon it came from: 0, then one more after each `kill` step (a new daemon's
    /// counters start again from 0: no rate is computed across two daemons).
    pub daemon: u32,
    /// Bytes written to the TAP from the wire.
    pub rx_bytes: u64,
    /// Bytes sent to the wire from the TAP.
    pub tx_bytes: u64,
    /// Packets written to the TAP.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Restarts the daemon had completed.
    pub restarts: u64,
    /// Its supervisor's state as last read (`running`, `restarting`, ...; empty before
    /// the first status read).
    pub state: String,
}

/// One iperf3 interval line of the load.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct SeriesInterval {
    /// When the line was read (ms since the Unix epoch): about when the interval ended.
    pub unix_ms: u64,
    /// The same, in ms from the run's start.
    pub t_ms: u64,
    /// Its start and end in seconds from the start of the iperf3 test.
    pub start_s: f64,
    /// See `start_s`.
    pub end_s: f64,
    /// Bytes in it.
    pub bytes: f64,
    /// Its rate as iperf3 printed it (Mbit/s).
    pub mbps: f64,
}

impl SeriesSample {
    pub(super) fn of(s: &Sample, started_unix_ms: u64) -> SeriesSample {
        SeriesSample {
            unix_ms: s.unix_ms,
            t_ms: s.unix_ms.saturating_sub(started_unix_ms),
            daemon: s.generation,
            rx_bytes: s.rx_bytes,
            tx_bytes: s.tx_bytes,
            rx_packets: s.rx_packets,
            tx_packets: s.tx_packets,
            restarts: s.restarts,
            state: s.state_name().to_string(),
        }
    }
}

/// A finite value, or 0 (the report and the plots never hold NaN or infinities).
pub(super) fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

impl Series {
    /// The series of a run that started at `started_unix_ms`: the sampler's samples
    /// and the load's intervals (at most `samples.cap` of them, the newest).
    pub(super) fn of(
        samples: &Capped,
        intervals: &[Interval],
        started_unix_ms: u64,
        every_ms: u64,
    ) -> Series {
        let cap = samples.cap;
        let skip = intervals.len().saturating_sub(cap);
        Series {
            every_ms,
            cap,
            dropped: samples.dropped,
            samples: samples
                .items
                .iter()
                .map(|s| SeriesSample::of(s, started_unix_ms))
                .collect(),
            iperf3: intervals[skip..]
                .iter()
                .map(|i| SeriesInterval {
                    unix_ms: i.stamp_ms,
                    t_ms: i.stamp_ms.saturating_sub(started_unix_ms),
                    start_s: finite(i.start_s),
                    end_s: finite(i.end_s),
                    bytes: finite(i.bytes),
                    mbps: finite(i.mbps),
                })
                .collect(),
            iperf3_dropped: skip as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: u64, rx: u64, state: u8) -> Sample {
        Sample {
            unix_ms: t,
            rx_bytes: rx,
            tx_bytes: rx / 2,
            rx_packets: rx / 1000,
            tx_packets: rx / 2000,
            bytes: rx + rx / 2,
            packets: rx / 1000 + rx / 2000,
            restarts: 1,
            state,
            ..Sample::ZERO
        }
    }

    #[test]
    fn the_series_goes_through_json_and_back() {
        let mut c = Capped::new(100);
        for i in 0..5 {
            c.push(sample(10_000 + i * 50, i * 125_000, 1 + (i == 2) as u8));
        }
        let iv = [Interval {
            stamp_ms: 10_200,
            start_s: 0.0,
            end_s: 1.0,
            bytes: 1e6,
            mbps: 8.0,
        }];
        let s = Series::of(&c, &iv, 9_000, 50);
        assert_eq!(s.samples.len(), 5);
        assert_eq!(s.samples[0].t_ms, 1_000);
        assert_eq!(s.samples[2].state, "restarting");
        assert_eq!(s.samples[1].state, "running");
        assert_eq!(s.samples[4].rx_bytes, 500_000);
        assert_eq!(s.samples[4].tx_bytes, 250_000);
        assert_eq!(s.iperf3[0].t_ms, 1_200);
        let text = serde_json::to_string(&s).unwrap();
        let back: Series = serde_json::from_str(&text).unwrap();
        assert_eq!(back, s);
        // The lists are there even when empty.
        let empty = serde_json::to_value(Series::of(&Capped::new(10), &[], 0, 50)).unwrap();
        assert_eq!(empty["samples"], serde_json::json!([]));
        assert_eq!(empty["iperf3"], serde_json::json!([]));
    }

    #[test]
    fn past_the_cap_the_oldest_go_and_are_counted() {
        let mut c = Capped::new(3);
        for i in 0..10 {
            c.push(sample(i, i, 1));
        }
        let s = Series::of(&c, &[], 0, 50);
        assert_eq!(s.cap, 3);
        assert_eq!(s.dropped, 7);
        let kept: Vec<u64> = s.samples.iter().map(|x| x.unix_ms).collect();
        assert_eq!(kept, [7, 8, 9]);
        // The same for the iperf3 intervals.
        let iv: Vec<Interval> = (0..5)
            .map(|i| Interval {
                stamp_ms: i,
                start_s: i as f64,
                end_s: i as f64 + 1.0,
                bytes: 1.0,
                mbps: f64::NAN,
            })
            .collect();
        let s = Series::of(&c, &iv, 0, 50);
        assert_eq!(s.iperf3_dropped, 2);
        assert_eq!(s.iperf3.len(), 3);
        assert_eq!(s.iperf3[0].unix_ms, 2);
        // A NaN a line could never give is not carried into the report either.
        assert_eq!(s.iperf3[0].mbps, 0.0);
        assert!(serde_json::to_string(&s).unwrap().contains("\"mbps\":0.0"));
    }
}
