//! The guard between the socket and pgwire: each client message's declared length is checked
//! against [`crate::limits::MESSAGE_BYTES_MAX`] (54000) and, once complete, its layout
//! ([`check_message`], 08P01), so that pgwire never decodes a malformed message.

use super::*;

/// The client's byte stream, framed and checked as it flows past, before pgwire decodes it.
///
/// Two guards, each ending the connection with a FATAL error in [`run_connection`]:
/// - **Size**: every message's declared length is compared with the limit as soon as its header
///   arrives, before its body is buffered (54000).
/// - **Structure**: each message is held back until it is complete, then its body is checked
///   against the layout of its type ([`check_message`]); a message whose fields do not exactly
///   fill its declared length, an unknown message type, or a length below 4 is a protocol
///   violation (08P01). pgwire 0.42 decodes each body from the shared read buffer without
///   bounding it by the declared length, so bytes after a message's fields were read as the next
///   message (a Query hidden inside a Parse ran), and fields missing from a SASLInitialResponse
///   panicked the connection task; no such message reaches pgwire now.
///
/// Invariant: bytes are passed on in order and unchanged, whole messages at a time, and only
/// messages that passed both guards; after the first one that fails, nothing more is passed on
/// and every later read fails.
pub(super) struct Framing<S> {
    pub(super) inner: S,
    /// Bytes pgwire read before the guard was installed, checked (and passed on) first.
    replay: BytesMut,
    /// Checked bytes not yet handed to pgwire.
    pub(super) checked: BytesMut,
    /// The message being received: its header and as much of its body as has arrived.
    current: Vec<u8>,
    /// Length of the current header once complete (5 with a type byte, 4 for the startup packet).
    header_len: usize,
    body_left: usize,
    /// False until the startup packet (the only message without a type byte) has been framed.
    typed: bool,
    /// `p` messages framed so far: the first one is the SASLInitialResponse.
    password_messages: usize,
    message_bytes_max: usize,
    refused: Option<usize>,
    violation: Option<String>,
}

/// Bytes read from the client at a time.
pub(super) const READ_CHUNK_BYTES: usize = 16 * 1024;

impl<S> Framing<S> {
    pub(super) fn new(inner: S, replay: BytesMut, message_bytes_max: usize) -> Framing<S> {
        Framing {
            inner,
            replay,
            checked: BytesMut::new(),
            current: Vec::new(),
            header_len: 0,
            body_left: 0,
            typed: false,
            password_messages: 0,
            message_bytes_max,
            refused: None,
            violation: None,
        }
    }

    /// The declared length of the message refused, if one was.
    pub(super) fn refused_length(&self) -> Option<usize> {
        self.refused
    }

    /// What was wrong with the malformed message that ended the stream, if one did.
    pub(super) fn violation(&self) -> Option<&str> {
        self.violation.as_deref()
    }

    fn failed(&self) -> bool {
        self.refused.is_some() || self.violation.is_some()
    }

    /// Frames `bytes`, moving every complete message that passes both guards to `checked`.
    pub(super) fn scan(&mut self, bytes: &[u8]) {
        let mut i = 0;
        while i < bytes.len() && !self.failed() {
            let header_len = if self.typed { 5 } else { 4 };
            if self.current.len() < header_len {
                let n = (header_len - self.current.len()).min(bytes.len() - i);
                self.current.extend_from_slice(&bytes[i..i + n]);
                i += n;
                if self.current.len() < header_len {
                    break;
                }
                let l = &self.current[header_len - 4..header_len];
                let length = u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize;
                self.header_len = header_len;
                if length > self.message_bytes_max {
                    self.refused = Some(length);
                    break;
                }
                if length < 4 {
                    self.violation = Some("invalid message length".to_owned());
                    break;
                }
                self.body_left = length - 4;
            } else {
                let n = self.body_left.min(bytes.len() - i);
                self.current.extend_from_slice(&bytes[i..i + n]);
                self.body_left -= n;
                i += n;
            }
            if self.body_left == 0 {
                self.finish_message();
            }
        }
    }

    /// Checks the complete message in `current` and passes it on, or records the violation.
    fn finish_message(&mut self) {
        let message = std::mem::take(&mut self.current);
        let (tag, body) = if self.typed {
            (Some(message[0]), &message[self.header_len..])
        } else {
            (None, &message[self.header_len..])
        };
        let sasl_initial = tag == Some(b'p') && self.password_messages == 0;
        match check_message(tag, body, sasl_initial) {
            Ok(()) => {
                self.typed = true;
                if tag == Some(b'p') {
                    self.password_messages += 1;
                }
                self.checked.extend_from_slice(&message);
            }
            Err(what) => self.violation = Some(what),
        }
    }
}

/// `Ok` if `body` is laid out as a frontend message of type `tag` must be (`None`: the startup
/// packet), the way PostgreSQL reads it (`pq_getmsg*` and `pq_getmsgend` in
/// `src/backend/tcop/postgres.c`): every field present, nothing after the last one. `sasl_initial`
/// says that a `p` message is the SASLInitialResponse (pgdp only offers SCRAM, so that is the
/// first `p` after the startup packet; later ones are SASLResponses, opaque bytes). Otherwise the
/// message as PostgreSQL words it.
pub(super) fn check_message(
    tag: Option<u8>,
    body: &[u8],
    sasl_initial: bool,
) -> Result<(), String> {
    const FORMAT: &str = "invalid message format";
    let mut r = Fields { rest: body };
    let ok = match tag {
        None => return check_startup_packet(body),
        Some(b'p') if sasl_initial => {
            let ok = r.cstring() && {
                match r.int32() {
                    Some(-1) => true,
                    Some(n) => usize::try_from(n).is_ok_and(|n| r.take(n)),
                    None => false,
                }
            };
            if !(ok && r.rest.is_empty()) {
                return Err("malformed SASL message".to_owned());
            }
            return Ok(());
        }
        // SASLResponse, CopyData: opaque bytes.
        Some(b'p' | b'd') => return Ok(()),
        Some(b'Q' | b'f') => r.cstring(),
        Some(b'P') => r.cstring() && r.cstring() && r.counted(4),
        Some(b'B') => {
            r.cstring() && r.cstring() && r.counted(2) && r.parameter_values() && r.counted(2)
        }
        Some(b'E') => r.cstring() && r.int32().is_some(),
        Some(kind @ (b'D' | b'C')) => {
            let what = if kind == b'D' { "DESCRIBE" } else { "CLOSE" };
            match r.byte() {
                Some(b'S' | b'P') => {}
                Some(_) => return Err(format!("invalid {what} message subtype")),
                None => return Err(FORMAT.to_owned()),
            }
            r.cstring()
        }
        Some(b'S' | b'H' | b'X' | b'c') => true,
        Some(other) => return Err(format!("invalid frontend message type {other}")),
    };
    if ok && r.rest.is_empty() {
        Ok(())
    } else {
        Err(FORMAT.to_owned())
    }
}

/// The startup packet: a CancelRequest (left to pgwire) or a StartupMessage of protocol 3.x,
/// whose parameters are name/value strings ended by one empty name that is its last byte.
/// pgwire reads the parameters until an empty name without a bound, so a packet without the
/// terminator was read on into the next message. Other codes are left to pgwire, which refuses
/// them.
pub(super) fn check_startup_packet(body: &[u8]) -> Result<(), String> {
    let Some(code) = body.get(..4) else {
        return Ok(());
    };
    if u16::from_be_bytes([code[0], code[1]]) != 3 {
        return Ok(());
    }
    let mut r = Fields { rest: &body[4..] };
    loop {
        match r.rest {
            [0] => return Ok(()),
            // An empty name is the terminator, and only the last byte may be one.
            [] | [0, ..] => break,
            _ => {
                if !(r.cstring() && r.cstring()) {
                    break;
                }
            }
        }
    }
    Err("invalid startup packet layout: expected terminator as last byte".to_owned())
}

/// A cursor over a message body, for [`check_message`].
pub(super) struct Fields<'a> {
    rest: &'a [u8],
}

impl Fields<'_> {
    fn take(&mut self, n: usize) -> bool {
        match self.rest.get(n..) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.rest.first()?;
        self.take(1).then_some(b)
    }

    fn cstring(&mut self) -> bool {
        match self.rest.iter().position(|b| *b == 0) {
            Some(i) => self.take(i + 1),
            None => false,
        }
    }

    fn uint16(&mut self) -> Option<usize> {
        let b = self.rest.get(..2)?;
        let v = usize::from(u16::from_be_bytes([b[0], b[1]]));
        self.take(2).then_some(v)
    }

    fn int32(&mut self) -> Option<i32> {
        let b = self.rest.get(..4)?;
        let v = i32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        self.take(4).then_some(v)
    }

    /// A 16-bit count, then that many items of `size` bytes.
    fn counted(&mut self, size: usize) -> bool {
        self.uint16().is_some_and(|n| self.take(n * size))
    }

    /// Bind's parameter values: a 16-bit count, then each a 32-bit length (-1 for NULL) and
    /// that many bytes.
    fn parameter_values(&mut self) -> bool {
        let Some(n) = self.uint16() else {
            return false;
        };
        (0..n).all(|_| match self.int32() {
            Some(-1) => true,
            Some(len) => usize::try_from(len).is_ok_and(|len| self.take(len)),
            None => false,
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Framing<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.checked.is_empty() {
                let n = this.checked.len().min(buf.remaining());
                buf.put_slice(&this.checked.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.failed() {
                return Poll::Ready(Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "protocol message refused",
                )));
            }
            if !this.replay.is_empty() {
                let replay = this.replay.split();
                this.scan(&replay);
                continue;
            }
            // Uninitialised: the socket writes what it reads and only that is read back, so the
            // chunk is not zeroed first (16 KiB of stores on every read of a small message).
            let mut chunk = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK_BYTES];
            let mut read = ReadBuf::uninit(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                // The end of the stream: a message cut short is dropped, pgwire sees the end.
                return Poll::Ready(Ok(()));
            }
            this.scan(read.filled());
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Framing<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
