//! What the examples on a real device share on their command line: which device, port
//! and GID to open, and logging to standard error.

use clap::Args;
use uipoib::verbs::EndpointConfig;

/// The device, port and GID index an example opens its UD QP on.
#[derive(Args, Debug)]
pub struct Device {
    /// Verbs device.
    #[arg(long, default_value = "rxe0")]
    pub device: String,
    /// Port number.
    #[arg(long, default_value_t = 1)]
    pub port: u8,
    /// GID index (default: the provider's choice, the one the daemon picks too).
    #[arg(long)]
    pub gid_index: Option<u8>,
}

impl Device {
    /// The endpoint on this device: `slots` receives and sends, Q_Key `qkey`, the
    /// largest payload the port allows.
    pub fn endpoint(&self, qkey: u32, slots: u32) -> EndpointConfig {
        EndpointConfig {
            device: self.device.clone(),
            port: self.port,
            gid_index: self.gid_index,
            qkey,
            recv_slots: slots,
            send_slots: slots,
            max_payload: None,
            banks: 1,
        }
    }
}

/// Log to standard error at `RUST_LOG`'s level, `info` without it.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}
