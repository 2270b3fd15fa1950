//! The measurement of the benches whose iterations are a single call (a codec, a table
//! lookup): a short warm-up and one second of samples.

use std::time::Duration;

use criterion::Criterion;

/// Criterion with a 300 ms warm-up, 1 s of measurement and 30 samples.
pub fn short() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30)
}
