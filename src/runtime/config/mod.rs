//! Configuration: every `uipoib up` flag has a key in the TOML file, and the flags win.
//!
//! This module owns parsing and validation only. A bad value is a [`ConfigError`] naming
//! the key (and, for a file, where it is); nothing here opens a device or a TAP.
//!
//! Here: `defaults` (every default and limit, with why it is that value), `file` (the
//! keys a file or the flags give, all optional, and how two sets merge), `validate` (the
//! checked [`Config`] and the interface parameters it yields).

mod defaults;
mod file;
mod validate;

use std::path::PathBuf;

pub use defaults::*;
pub use file::{AddrList, ConfigKeys};
pub use validate::{Config, check_ifname};

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (the message names line and key).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// A value out of range or missing.
    #[error("invalid {key}: {why}")]
    Invalid {
        /// The key (same name in the file and as a flag).
        key: &'static str,
        /// Why.
        why: String,
    },
}

#[cfg(test)]
mod tests;
