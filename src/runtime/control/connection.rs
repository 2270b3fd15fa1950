//! One connected client: its request bytes, its pending reply and its deadline.

use std::io::{self, Read, Write};
use std::time::Instant;

use serde_json::{Value, json};

use super::protocol::{Served, handle_line};
use super::{CLIENT_TIMEOUT, MAX_REQUEST};

/// What one connected client is in the middle of.
pub(super) struct Client {
    pub(super) stream: mio::net::UnixStream,
    /// Bytes of the request line read so far (at most [`MAX_REQUEST`] + one read).
    input: Vec<u8>,
    /// Reply bytes not yet written.
    pub(super) output: Vec<u8>,
    /// When the current request must have been read and answered.
    pub(super) deadline: Instant,
    /// The peer closed its side: answer what it sent, then close.
    eof: bool,
    /// Close once `output` is written.
    closing: bool,
}

/// What [`Client::drive`] leaves the connection in.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Drive {
    /// Waiting for the peer (more request bytes, or room to write).
    Keep,
    /// Done with: deregister and close.
    Close,
}

impl Client {
    pub(super) fn new(stream: mio::net::UnixStream, now: Instant) -> Client {
        Client {
            stream,
            input: Vec::new(),
            output: Vec::new(),
            deadline: now + CLIENT_TIMEOUT,
            eof: false,
            closing: false,
        }
    }

    fn reply(&mut self, v: &Value) {
        self.output.extend_from_slice(v.to_string().as_bytes());
        self.output.push(b'\n');
    }

    /// Answer one request line (without its newline).
    fn answer(&mut self, line: &[u8], cx: &Served) {
        match std::str::from_utf8(line) {
            Ok(text) if text.trim().is_empty() => {}
            Ok(text) => {
                let r = handle_line(text.trim(), cx);
                self.reply(&r);
            }
            Err(_) => {
                self.reply(&json!({"ok": false, "error": "request is not UTF-8"}));
                self.closing = true;
            }
        }
    }

    /// Make all the progress possible without blocking: write what is pending, answer
    /// complete lines one at a time (the next one only once the previous reply is
    /// written, so a client that does not read its replies holds at most one), read
    /// more. Returns on `WouldBlock` (mio's readiness is edge-triggered, so each
    /// direction is drained until then) or when the connection is done.
    pub(super) fn drive(&mut self, cx: &Served, now: Instant) -> Drive {
        let mut chunk = [0u8; 4096];
        loop {
            while !self.output.is_empty() {
                match self.stream.write(&self.output) {
                    Ok(0) => return Drive::Close,
                    Ok(n) => {
                        self.output.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drive::Keep,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => return Drive::Close,
                }
            }
            if self.closing {
                return Drive::Close;
            }
            if let Some(nl) = self.input.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.input.drain(..=nl).collect();
                self.answer(&line[..nl], cx);
                self.deadline = now + CLIENT_TIMEOUT;
                continue;
            }
            if self.input.len() > MAX_REQUEST {
                self.input = Vec::new();
                self.reply(&json!({"ok": false, "error": format!("request line longer than the limit of {MAX_REQUEST} bytes; closing")}));
                self.closing = true;
                continue;
            }
            if self.eof {
                // A last request without its newline is still answered.
                let line = std::mem::take(&mut self.input);
                self.answer(&line, cx);
                self.closing = true;
                continue;
            }
            match self.stream.read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.input.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drive::Keep,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Drive::Close,
            }
        }
    }
}
