//! Simulated in-process fabric (test double).
