//! The 40 bytes in front of every UD receive.
