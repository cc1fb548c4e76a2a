//! Unit tests of the front end: message layout checks and encoding.

/// A framed message: type byte, length, body.
fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
    out
}

fn startup() -> Vec<u8> {
    let body = b"\x00\x03\x00\x00user\x00analyst\x00\x00";
    let mut out = (body.len() as u32 + 4).to_be_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

/// Feeds `stream` to a [`super::Framing`] in pieces of `piece` bytes; returns the bytes it
/// passes on and the violation it found.
fn frame(stream: &[u8], piece: usize) -> (Vec<u8>, Option<String>) {
    let mut framing = super::Framing::new((), bytes::BytesMut::new(), 1 << 20);
    for chunk in stream.chunks(piece) {
        framing.scan(chunk);
    }
    (
        framing.checked.to_vec(),
        framing.violation().map(str::to_owned),
    )
}

#[test]
fn well_formed_messages_pass_unchanged_in_any_pieces() {
    let mut stream = startup();
    stream.extend(message(b'p', b"SCRAM-SHA-256\x00\x00\x00\x00\x03abc"));
    stream.extend(message(b'p', b"c=biws,r=x,p=y"));
    stream.extend(message(b'Q', b"SELECT 1\x00"));
    stream.extend(message(
        b'P',
        b"s1\x00SELECT $1\x00\x00\x01\x00\x00\x00\x17",
    ));
    stream.extend(message(
        b'B',
        b"\x00s1\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x0242\xff\xff\xff\xff\x00\x01\x00\x01",
    ));
    stream.extend(message(b'D', b"P\x00"));
    stream.extend(message(b'E', b"\x00\x00\x00\x00\x00"));
    stream.extend(message(b'C', b"S\x00"));
    stream.extend(message(b'H', b""));
    stream.extend(message(b'S', b""));
    stream.extend(message(b'd', b"\x00\x01anything"));
    stream.extend(message(b'f', b"oops\x00"));
    stream.extend(message(b'X', b""));
    for piece in [1, 3, 7, stream.len()] {
        assert_eq!(
            frame(&stream, piece),
            (stream.clone(), None),
            "pieces of {piece}"
        );
    }
}

#[test]
fn malformed_messages_stop_the_stream_where_they_start() {
    let login = [
        startup(),
        message(b'p', b"SCRAM-SHA-256\x00\xff\xff\xff\xff"),
    ]
    .concat();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // The two pgwire 0.42 bugs the wire fuzzer found.
        (message(b'p', b"junk"), "malformed SASL message"),
        (
            message(b'P', b"\x00SELECT 1\x00\x00\x00B\x08\x00\x00\x00\x00\x00"),
            "invalid message format",
        ),
        // Trailing bytes and short fields in the other extended-query messages.
        (
            message(b'B', b"\x00\x00\x00\x00\x00\x00\x00\x00Q"),
            "invalid message format",
        ),
        (
            message(b'B', b"\x00\x00\x00\x00\x00\x01\x00\x00\x00\x09ab"),
            "invalid message format",
        ),
        (
            message(b'B', b"\x00\x00\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x00"),
            "invalid message format",
        ),
        (message(b'E', b"\x00\x00\x00"), "invalid message format"),
        (
            message(b'E', b"\x00\x00\x00\x00\x00\x00"),
            "invalid message format",
        ),
        (message(b'D', b"P\x00X"), "invalid message format"),
        (message(b'D', b"Z\x00"), "invalid DESCRIBE message subtype"),
        (message(b'C', b""), "invalid message format"),
        (message(b'C', b"S"), "invalid message format"),
        (
            message(b'Q', b"SELECT 1\x00SELECT 2\x00"),
            "invalid message format",
        ),
        (message(b'Q', b"SELECT 1"), "invalid message format"),
        (message(b'S', b"\x00"), "invalid message format"),
        (message(b'F', b""), "invalid frontend message type 70"),
        (b"Q\x00\x00\x00\x02".to_vec(), "invalid message length"),
    ];
    for (bad, expected) in cases {
        // The SASL case is judged as the first `p` after startup; the others after a login.
        let before = if bad[0] == b'p' {
            startup()
        } else {
            login.clone()
        };
        let after = message(b'Q', b"SELECT 2\x00");
        let stream = [before.clone(), bad.clone(), after].concat();
        for piece in [1, 5, stream.len()] {
            assert_eq!(
                frame(&stream, piece),
                (before.clone(), Some(expected.to_owned())),
                "{bad:?} in pieces of {piece}"
            );
        }
    }
}

#[test]
fn startup_packets_must_end_with_their_terminator() {
    for body in [
        &b"\x00\x03\x00\x00user\x00analyst\x00"[..],
        b"\x00\x03\x00\x00user\x00analyst",
        b"\x00\x03\x00\x00\x00user\x00analyst\x00\x00",
        b"\x00\x03\x00\x00user\x00analyst\x00\x00\x00",
    ] {
        assert_eq!(
            super::check_startup_packet(body),
            Err("invalid startup packet layout: expected terminator as last byte".to_owned()),
            "{body:?}"
        );
    }
    assert_eq!(super::check_startup_packet(b"\x00\x03\x00\x00\x00"), Ok(()));
    // A CancelRequest and other codes are pgwire's to judge.
    assert_eq!(
        super::check_startup_packet(b"\x04\xd2\x16\x2e\x00\x00\x00\x01"),
        Ok(())
    );
}

#[test]
fn execute_row_limits_are_made_safe_for_pgwire() {
    use super::rows_per_execute;
    assert_eq!(rows_per_execute(0), 0, "zero: all rows");
    assert_eq!(
        rows_per_execute(-1),
        0,
        "negative: all rows, as in PostgreSQL"
    );
    assert_eq!(rows_per_execute(i32::MIN), 0);
    assert_eq!(rows_per_execute(3), 3);
    let cap = i32::try_from(crate::limits::ROWS_PER_EXECUTE_MAX).expect("fits");
    assert_eq!(rows_per_execute(i32::MAX), cap, "no huge preallocation");
}
