//! The client side: one request, one reply, for the CLI and the scenario runner.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use super::ControlError;

/// Send `{"cmd": cmd}` and return the reply (`ok` checked).
pub fn request(path: &Path, cmd: &str) -> Result<Value, ControlError> {
    request_json(path, &json!({ "cmd": cmd }))
}

/// Send one request object and return the reply (`ok` checked).
pub fn request_json(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let stream = UnixStream::connect(path).map_err(|e| ControlError::NotRunning {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    let bad = |why: String| ControlError::BadReply {
        path: path.to_owned(),
        why,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| bad(e.to_string()))?;
    let mut w = &stream;
    // A daemon that refuses the peer writes its reason and closes at once, so the
    // request may not be writable any more; the reason is still there to be read.
    let sent = writeln!(w, "{req}");
    let mut line = String::new();
    let got = BufReader::new(&stream).read_line(&mut line);
    if line.is_empty() {
        sent.map_err(|e| bad(e.to_string()))?;
        got.map_err(|e| bad(e.to_string()))?;
    }
    let v: Value = serde_json::from_str(&line).map_err(|e| bad(format!("{e}: {line:?}")))?;
    if v.get("ok") == Some(&Value::Bool(true)) {
        Ok(v)
    } else {
        Err(ControlError::Refused(
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error message")
                .to_string(),
        ))
    }
}
