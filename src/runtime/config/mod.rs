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
    /// A value from a config file out of range: where it is.
    #[error("config file {}:{line}: {key}: {why}", path.display())]
    InFile {
        /// The file.
        path: PathBuf,
        /// 1-based line of the key.
        line: usize,
        /// The key.
        key: &'static str,
        /// Why.
        why: String,
    },
}

impl ConfigError {
    /// An [`ConfigError::Invalid`] about a key that `text` (the file at `path`) sets, as
    /// [`ConfigError::InFile`] naming the line; anything else as it is. The caller passes
    /// only errors about values that came from the file (not from a flag).
    pub fn in_file(self, path: &std::path::Path, text: &str) -> ConfigError {
        let ConfigError::Invalid { key, why } = self else {
            return self;
        };
        let line = text.lines().position(|l| {
            l.trim_start()
                .strip_prefix(key)
                .is_some_and(|rest| rest.trim_start().starts_with('='))
        });
        match line {
            Some(i) => ConfigError::InFile {
                path: path.to_owned(),
                line: i + 1,
                key,
                why,
            },
            None => ConfigError::Invalid { key, why },
        }
    }
}

#[cfg(test)]
mod tests;
