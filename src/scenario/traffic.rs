//! What the runner watches while the steps run: the daemon's counters, sampled by a
//! thread of their own, and the background load, a child process whose output is
//! stamped line by line (iperf3's interval lines give its throughput).

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::Program;
use super::parse::STATES;
use super::report::TrafficReport;
use super::run::{Client, SAMPLE_EVERY, unix_ms};
use super::series::Series;
use crate::iface::stats::Snapshot;

/// Lines of the load's output kept for the report.
const TAIL: usize = 20;

/// Most counter samples a run keeps: 10 minutes at 20 Hz. Past it the oldest go (the
/// measurements only look back a few seconds) and are counted.
pub const MAX_SAMPLES: usize = 12_000;

/// A sample's state: 0 before any status was read, `1..=STATES.len()` the supervisor's
/// states ([`STATES`], the list scenarios expect from), and past them any other.
const STATE_NONE: u8 = 0;
const STATE_OTHER: u8 = STATES.len() as u8 + 1;

fn state_code(state: &str) -> u8 {
    STATES
        .iter()
        .position(|s| *s == state)
        .map_or(STATE_OTHER, |i| i as u8 + 1)
}

/// One counter sample.
#[derive(Clone, Copy, Debug)]
pub(super) struct Sample {
    pub(super) unix_ms: u64,
    /// The daemon it was read from: 0 for the first, one more after each `kill` step
    /// (a new daemon's counters start at 0 again).
    pub(super) generation: u32,
    /// Packets through the interface, both ways.
    pub(super) packets: u64,
    /// Bytes through the interface, both ways.
    pub(super) bytes: u64,
    /// Counters that show a fault: drops, spurious events, rejected completions.
    pub(super) evidence: u64,
    /// The interface's own counters, each way (received: written to the TAP).
    pub(super) rx_bytes: u64,
    /// See `rx_bytes`.
    pub(super) tx_bytes: u64,
    /// See `rx_bytes`.
    pub(super) rx_packets: u64,
    /// See `rx_bytes`.
    pub(super) tx_packets: u64,
    /// Restarts the daemon had completed.
    pub(super) restarts: u64,
    /// The supervisor's state (the last status read), coded as [`state_code`] says.
    pub(super) state: u8,
}

impl Sample {
    /// A sample of nothing.
    pub(super) const ZERO: Sample = Sample {
        unix_ms: 0,
        generation: 0,
        packets: 0,
        bytes: 0,
        evidence: 0,
        rx_bytes: 0,
        tx_bytes: 0,
        rx_packets: 0,
        tx_packets: 0,
        restarts: 0,
        state: STATE_NONE,
    };

    pub(super) fn of(s: &Snapshot, generation: u32, state: u8) -> Sample {
        Sample {
            unix_ms: unix_ms(),
            generation,
            packets: s.rx_packets + s.tx_packets,
            bytes: s.rx_bytes + s.tx_bytes,
            evidence: s.drops_total() + s.spurious_events + s.completions_rejected,
            rx_bytes: s.rx_bytes,
            tx_bytes: s.tx_bytes,
            rx_packets: s.rx_packets,
            tx_packets: s.tx_packets,
            restarts: s.restarts,
            state,
        }
    }

    /// Its state's name.
    pub(super) fn state_name(&self) -> &'static str {
        match self.state {
            STATE_NONE => "",
            n => STATES.get(usize::from(n) - 1).copied().unwrap_or("other"),
        }
    }
}

/// Samples up to a cap; past it the oldest are dropped and counted.
#[derive(Debug, Default)]
pub(super) struct Capped {
    pub(super) cap: usize,
    pub(super) items: VecDeque<Sample>,
    pub(super) dropped: u64,
}

impl Capped {
    pub(super) fn new(cap: usize) -> Capped {
        Capped {
            cap: cap.max(1),
            items: VecDeque::new(),
            dropped: 0,
        }
    }

    pub(super) fn push(&mut self, s: Sample) {
        while self.items.len() >= self.cap {
            self.items.pop_front();
            self.dropped += 1;
        }
        self.items.push_back(s);
    }
}

pub(super) type Shared<T> = Arc<Mutex<T>>;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) struct Sampler {
    samples: Shared<Capped>,
    generation: Arc<AtomicU32>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Read the daemon's counters (and its state) every [`SAMPLE_EVERY`], keeping the
    /// last `cap` samples.
    pub(super) fn start(client: Client, cap: usize) -> Sampler {
        let samples: Shared<Capped> = Arc::new(Mutex::new(Capped::new(cap)));
        let stop = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(AtomicU32::new(0));
        let (s, st, g) = (samples.clone(), stop.clone(), generation.clone());
        let thread = thread::spawn(move || {
            let mut state = 0u8;
            let mut state_gen = 0u32;
            while !st.load(Ordering::Relaxed) {
                // Read before the request: a reading the old daemon gave is never
                // stamped with the new one's generation.
                let r#gen = g.load(Ordering::SeqCst);
                if let Ok(snap) = client.stats()
                    && g.load(Ordering::SeqCst) == r#gen
                {
                    // The state read right after the counters; a failed read keeps
                    // the last one this daemon gave.
                    if state_gen != r#gen {
                        (state, state_gen) = (0, r#gen);
                    }
                    if let Ok(status) = client.status() {
                        state = state_code(&status.state);
                    }
                    if g.load(Ordering::SeqCst) == r#gen {
                        lock(&s).push(Sample::of(&snap, r#gen, state));
                    }
                }
                thread::sleep(SAMPLE_EVERY);
            }
        });
        Sampler {
            samples,
            generation,
            stop,
            thread: Some(thread),
        }
    }

    /// The samples so far, and the load's intervals `iv`, as the report keeps them.
    pub(super) fn series(&self, iv: &[Interval], started_unix_ms: u64) -> Series {
        Series::of(
            &lock(&self.samples),
            iv,
            started_unix_ms,
            SAMPLE_EVERY.as_millis() as u64,
        )
    }

    /// The daemon samples are read from now.
    pub(super) fn generation(&self) -> u32 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A new daemon answers from now on (the old one has exited): the next one.
    pub(super) fn next_generation(&self) -> u32 {
        self.generation.fetch_add(1, Ordering::SeqCst) + 1
    }

    pub(super) fn snapshot(&self) -> Vec<Sample> {
        lock(&self.samples).items.iter().copied().collect()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An iperf3 interval line's throughput (Mbit/s): `[  5]   1.00-2.00   sec  11.2 MBytes
/// 94.0 Mbits/sec ...`. Summary lines (`sender`, `receiver`) are not intervals.
pub fn iperf3_interval_mbps(line: &str) -> Option<f64> {
    iperf3_interval(line, 0).map(|i| i.mbps)
}

/// One iperf3 interval line, stamped with when it was read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    /// When the line was read (ms since the Unix epoch): about when the interval ended.
    pub stamp_ms: u64,
    /// Its start and end, in seconds from the start of the test.
    pub start_s: f64,
    /// See `start_s`.
    pub end_s: f64,
    /// Bytes moved in it.
    pub bytes: f64,
    /// Its rate (Mbit/s).
    pub mbps: f64,
}

/// Parse an iperf3 interval line read at `stamp_ms` (see [`iperf3_interval_mbps`]).
pub fn iperf3_interval(line: &str, stamp_ms: u64) -> Option<Interval> {
    if line.contains("sender") || line.contains("receiver") {
        return None;
    }
    let t: Vec<&str> = line.split_whitespace().collect();
    let i = t.iter().position(|w| *w == "sec")?;
    let (start, end) = t.get(i.checked_sub(1)?)?.split_once('-')?;
    let (amount, bunit) = (t.get(i + 1)?, t.get(i + 2)?);
    let (value, unit) = (t.get(i + 3)?, t.get(i + 4)?);
    let v: f64 = value.parse().ok()?;
    let scale = match *unit {
        "bits/sec" => 1e-6,
        "Kbits/sec" => 1e-3,
        "Mbits/sec" => 1.0,
        "Gbits/sec" => 1e3,
        _ => return None,
    };
    let bscale = match *bunit {
        "Bytes" => 1.0,
        "KBytes" => 1024.0,
        "MBytes" => 1024.0 * 1024.0,
        "GBytes" => 1024.0 * 1024.0 * 1024.0,
        "TBytes" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(Interval {
        stamp_ms,
        start_s: start.parse().ok()?,
        end_s: end.parse().ok()?,
        bytes: amount.parse::<f64>().ok()? * bscale,
        mbps: v * scale,
    })
}

/// The background load, its output stamped.
pub(super) struct Load {
    child: Child,
    command: String,
    pub(super) intervals: Shared<Vec<Interval>>,
    tail: Shared<VecDeque<String>>,
    readers: Vec<JoinHandle<()>>,
}

pub(super) fn spawn(command: &Program) -> std::io::Result<Child> {
    let mut c = match command {
        Program::Argv(a) => {
            let mut c = std::process::Command::new(&a[0]);
            c.args(&a[1..]);
            c
        }
        Program::Shell(s) => {
            let mut c = std::process::Command::new("sh");
            c.arg("-c").arg(s);
            c
        }
    };
    // A group of its own: a signal reaches what a shell line started, too.
    c.process_group(0);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

impl Load {
    pub(super) fn start(command: &Program) -> std::io::Result<Load> {
        let mut child = spawn(command)?;
        let intervals: Shared<Vec<Interval>> = Arc::default();
        let tail: Shared<VecDeque<String>> = Arc::default();
        let mut readers = Vec::new();
        let outs: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
        ];
        for out in outs.into_iter().flatten() {
            let (iv, tl) = (intervals.clone(), tail.clone());
            readers.push(thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if let Some(i) = iperf3_interval(&line, unix_ms()) {
                        let mut iv = lock(&iv);
                        // iperf3 prints the last interval again at its end.
                        if !iv
                            .iter()
                            .any(|o| (o.start_s, o.end_s) == (i.start_s, i.end_s))
                        {
                            iv.push(i);
                        }
                    }
                    let mut t = lock(&tl);
                    if t.len() == TAIL {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }));
        }
        Ok(Load {
            child,
            command: command.to_string(),
            intervals,
            tail,
            readers,
        })
    }

    pub(super) fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stop it (SIGINT, so iperf3 ends its test cleanly; SIGKILL after 5 s).
    pub(super) fn stop(mut self) -> TrafficReport {
        let running = self.running();
        if running {
            let _ = crate::sys::process::kill_group(self.child.id(), libc::SIGINT);
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && self.running() {
                thread::sleep(Duration::from_millis(20));
            }
            if self.running() {
                let _ = crate::sys::process::kill_group(self.child.id(), libc::SIGKILL);
            }
        }
        let status = self.child.wait().ok();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        TrafficReport {
            command: self.command.clone(),
            moved_before_steps: false,
            running_at_end: running,
            exit: status.and_then(|s| s.code()),
            tail: lock(&self.tail).iter().cloned().collect(),
        }
    }
}
