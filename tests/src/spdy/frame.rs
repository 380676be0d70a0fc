//! The SPDY/3.1 frame codec: [`Frame`], the header blocks ([`Headers`],
//! compressed with one zlib context per direction primed with the SPDY/3
//! dictionary), and the [`FrameWriter`] and [`FrameReader`] that turn frames
//! into bytes and back. No I/O and no session state beyond the two
//! compression contexts.

use std::io;
use std::sync::LazyLock;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};

/// The protocol version in every control frame.
pub const VERSION: u16 = 3;
/// Flag of DATA, SYN_STREAM, SYN_REPLY, HEADERS: the sender is done sending.
pub const FLAG_FIN: u8 = 0x01;
/// Flag of SYN_STREAM: the receiver may not send on the stream.
pub const FLAG_UNIDIRECTIONAL: u8 = 0x02;

/// RST_STREAM status codes used here.
pub mod status {
    pub const PROTOCOL_ERROR: u32 = 1;
    pub const INVALID_STREAM: u32 = 2;
    pub const REFUSED_STREAM: u32 = 3;
    pub const CANCEL: u32 = 5;
    pub const INTERNAL_ERROR: u32 = 6;
}

pub(super) const CONTROL_BIT: u32 = 0x8000_0000;
/// Frame lengths are 24 bits.
const MAX_LENGTH: usize = (1 << 24) - 1;
/// The largest inflated header block accepted (the Go reader's bound on one field).
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Data written in one call leaves in frames of at most this size.
pub(super) const MAX_DATA_FRAME: usize = 32 * 1024;

const SYN_STREAM: u16 = 1;
const SYN_REPLY: u16 = 2;
const RST_STREAM: u16 = 3;
const SETTINGS: u16 = 4;
const PING: u16 = 6;
const GOAWAY: u16 = 7;
const HEADERS: u16 = 8;
const WINDOW_UPDATE: u16 = 9;

/// The SPDY/3 header dictionary: common header names, each behind its
/// length as a 32-bit big-endian number, then a run of common values.
static DICTIONARY: LazyLock<Vec<u8>> = LazyLock::new(|| {
    const NAMES: &[&str] = &[
        "options",
        "head",
        "post",
        "put",
        "delete",
        "trace",
        "accept",
        "accept-charset",
        "accept-encoding",
        "accept-language",
        "accept-ranges",
        "age",
        "allow",
        "authorization",
        "cache-control",
        "connection",
        "content-base",
        "content-encoding",
        "content-language",
        "content-length",
        "content-location",
        "content-md5",
        "content-range",
        "content-type",
        "date",
        "etag",
        "expect",
        "expires",
        "from",
        "host",
        "if-match",
        "if-modified-since",
        "if-none-match",
        "if-range",
        "if-unmodified-since",
        "last-modified",
        "location",
        "max-forwards",
        "pragma",
        "proxy-authenticate",
        "proxy-authorization",
        "range",
        "referer",
        "retry-after",
        "server",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "user-agent",
        "vary",
        "via",
        "warning",
        "www-authenticate",
        "method",
        "get",
        "status",
        "200 OK",
        "version",
        "HTTP/1.1",
        "url",
        "public",
        "set-cookie",
        "keep-alive",
        "origin",
    ];
    const VALUES: &str = concat!(
        "100101201202205206300302303304305306307402405406407408409410411412413414415416417",
        "502504505203 Non-Authoritative Information204 No Content301 Moved Permanently",
        "400 Bad Request401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error",
        "501 Not Implemented503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct ",
        "Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,",
        "image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,",
        "publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.",
    );
    let mut dictionary = Vec::new();
    for name in NAMES {
        dictionary.extend_from_slice(&(name.len() as u32).to_be_bytes());
        dictionary.extend_from_slice(name.as_bytes());
    }
    dictionary.extend_from_slice(VALUES.as_bytes());
    dictionary
});

fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

/// A header block: lowercase names, each once; several values of one name
/// travel joined by NUL bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    pub fn new() -> Self {
        Self::default()
    }

    /// These headers and `name: value`.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.add(name, value);
        self
    }

    /// Adds a value to `name` (lowercased, as SPDY requires).
    pub fn add(&mut self, name: &str, value: &str) {
        let name = name.to_ascii_lowercase();
        match self.0.iter_mut().find(|(n, _)| *n == name) {
            Some((_, values)) => {
                values.push('\0');
                values.push_str(value);
            }
            None => self.0.push((name, value.to_string())),
        }
    }

    /// The first value of `name`, whatever the case asked for.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, values)| values.split('\0').next())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn encode(&self) -> Vec<u8> {
        let mut block = Vec::new();
        block.put_u32(self.0.len() as u32);
        for (name, value) in &self.0 {
            block.put_u32(name.len() as u32);
            block.put_slice(name.as_bytes());
            block.put_u32(value.len() as u32);
            block.put_slice(value.as_bytes());
        }
        block
    }

    fn decode(mut block: &[u8]) -> io::Result<Headers> {
        fn string(block: &mut &[u8]) -> io::Result<String> {
            let len = u32_from(block)? as usize;
            if block.len() < len {
                return Err(invalid("header block ends inside a string"));
            }
            let (text, rest) = block.split_at(len);
            *block = rest;
            String::from_utf8(text.to_vec()).map_err(|_| invalid("header is not UTF-8"))
        }
        let count = u32_from(&mut block)?;
        let mut headers = Headers::default();
        for _ in 0..count {
            let name = string(&mut block)?.to_ascii_lowercase();
            let value = string(&mut block)?;
            headers.0.push((name, value));
        }
        Ok(headers)
    }
}

fn u32_from(block: &mut &[u8]) -> io::Result<u32> {
    if block.len() < 4 {
        return Err(invalid("frame or header block too short"));
    }
    Ok(block.get_u32())
}

/// One SPDY/3 frame. Stream ids are 31 bits; `flags` are the frame's flag
/// byte ([`FLAG_FIN`], [`FLAG_UNIDIRECTIONAL`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    SynStream {
        stream_id: u32,
        associated_to: u32,
        /// 0 (highest) to 7.
        priority: u8,
        flags: u8,
        headers: Headers,
    },
    SynReply {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        flags: u8,
        /// `(flags, id, value)` of each setting.
        values: Vec<(u8, u32, u32)>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        flags: u8,
        headers: Headers,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    Data {
        stream_id: u32,
        flags: u8,
        data: Bytes,
    },
}

/// Encodes the frames one side sends; holds that direction's header
/// compression context, so every frame of the connection goes through the
/// same writer, in order.
pub struct FrameWriter {
    deflate: Compress,
}

impl Default for FrameWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameWriter {
    pub fn new() -> Self {
        let mut deflate = Compress::new(Compression::best(), true);
        deflate
            .set_dictionary(&DICTIONARY)
            .expect("a fresh deflate stream takes a dictionary");
        FrameWriter { deflate }
    }

    /// Appends `frame` to `out`.
    pub fn encode(&mut self, frame: &Frame, out: &mut BytesMut) -> io::Result<()> {
        let mut p = BytesMut::new();
        let (kind, flags) = match frame {
            Frame::Data {
                stream_id,
                flags,
                data,
            } => return data_frame(*stream_id, *flags, data, out),
            Frame::SynStream {
                stream_id,
                associated_to,
                priority,
                flags,
                headers,
            } => {
                p.put_u32(stream_id & !CONTROL_BIT);
                p.put_u32(associated_to & !CONTROL_BIT);
                p.put_u8((priority & 0x7) << 5);
                p.put_u8(0); // credential slot, unused
                self.compress(headers, &mut p)?;
                (SYN_STREAM, *flags)
            }
            Frame::SynReply {
                stream_id,
                flags,
                headers,
            }
            | Frame::Headers {
                stream_id,
                flags,
                headers,
            } => {
                p.put_u32(stream_id & !CONTROL_BIT);
                self.compress(headers, &mut p)?;
                let kind = match frame {
                    Frame::SynReply { .. } => SYN_REPLY,
                    _ => HEADERS,
                };
                (kind, *flags)
            }
            other => return fixed_control_frame(other, out),
        };
        control_frame(kind, flags, &p, out)
    }

    /// Compresses a header block onto `out`, sync-flushed so the reader can
    /// inflate it without the blocks after it.
    fn compress(&mut self, headers: &Headers, out: &mut BytesMut) -> io::Result<()> {
        let raw = headers.encode();
        let mut compressed = Vec::with_capacity(raw.len() + 64);
        let mut consumed = 0;
        loop {
            let before = self.deflate.total_in();
            self.deflate
                .compress_vec(&raw[consumed..], &mut compressed, FlushCompress::Sync)
                .map_err(|e| invalid(format!("compressing headers: {e}")))?;
            consumed += (self.deflate.total_in() - before) as usize;
            // Room left in the output means the flush is complete.
            if consumed == raw.len() && compressed.len() < compressed.capacity() {
                break;
            }
            compressed.reserve(compressed.capacity().max(256));
        }
        out.put_slice(&compressed);
        Ok(())
    }
}

fn data_frame(stream_id: u32, flags: u8, data: &[u8], out: &mut BytesMut) -> io::Result<()> {
    if data.len() > MAX_LENGTH {
        return Err(invalid("data frame longer than 2^24-1 bytes"));
    }
    out.put_u32(stream_id & !CONTROL_BIT);
    out.put_u32(u32::from(flags) << 24 | data.len() as u32);
    out.put_slice(data);
    Ok(())
}

/// The control frames without header blocks.
fn fixed_control_frame(frame: &Frame, out: &mut BytesMut) -> io::Result<()> {
    let mut p = BytesMut::new();
    let (kind, flags) = match frame {
        Frame::RstStream { stream_id, status } => {
            p.put_u32(stream_id & !CONTROL_BIT);
            p.put_u32(*status);
            (RST_STREAM, 0)
        }
        Frame::Settings { flags, values } => {
            p.put_u32(values.len() as u32);
            for (flags, id, value) in values {
                p.put_u32(u32::from(*flags) << 24 | (id & 0x00ff_ffff));
                p.put_u32(*value);
            }
            (SETTINGS, *flags)
        }
        Frame::Ping { id } => {
            p.put_u32(*id);
            (PING, 0)
        }
        Frame::GoAway {
            last_good_stream_id,
            status,
        } => {
            p.put_u32(last_good_stream_id & !CONTROL_BIT);
            p.put_u32(*status);
            (GOAWAY, 0)
        }
        Frame::WindowUpdate { stream_id, delta } => {
            p.put_u32(stream_id & !CONTROL_BIT);
            p.put_u32(delta & !CONTROL_BIT);
            (WINDOW_UPDATE, 0)
        }
        _ => unreachable!("frames with header blocks and data are encoded by FrameWriter::encode"),
    };
    control_frame(kind, flags, &p, out)
}

fn control_frame(kind: u16, flags: u8, payload: &[u8], out: &mut BytesMut) -> io::Result<()> {
    if payload.len() > MAX_LENGTH {
        return Err(invalid("control frame longer than 2^24-1 bytes"));
    }
    out.put_u32(CONTROL_BIT | u32::from(VERSION) << 16 | u32::from(kind));
    out.put_u32(u32::from(flags) << 24 | payload.len() as u32);
    out.put_slice(payload);
    Ok(())
}

/// Decodes the frames one side receives; holds that direction's header
/// decompression context, so it must see every frame of the connection.
pub struct FrameReader {
    inflate: Decompress,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameReader {
    pub fn new() -> Self {
        FrameReader {
            inflate: Decompress::new(true),
        }
    }

    /// Takes the first whole frame off the front of `buf`; `None` while
    /// `buf` holds less than a frame. Control frames of unknown types are
    /// skipped, as the protocol asks.
    pub fn decode(&mut self, buf: &mut BytesMut) -> io::Result<Option<Frame>> {
        loop {
            if buf.len() < 8 {
                return Ok(None);
            }
            let len = usize::from(buf[5]) << 16 | usize::from(buf[6]) << 8 | usize::from(buf[7]);
            if buf.len() < 8 + len {
                buf.reserve(8 + len - buf.len());
                return Ok(None);
            }
            let mut head = buf.split_to(8);
            let payload = buf.split_to(len).freeze();
            let first = head.get_u32();
            let flags = head[0];
            if first & CONTROL_BIT == 0 {
                let (stream_id, data) = (first, payload);
                return Ok(Some(Frame::Data {
                    stream_id,
                    flags,
                    data,
                }));
            }
            let version = (first >> 16) & 0x7fff;
            if version != u32::from(VERSION) {
                return Err(invalid(format!("SPDY version {version}, not {VERSION}")));
            }
            if let Some(frame) = self.control_frame(first as u16, flags, payload)? {
                return Ok(Some(frame));
            }
        }
    }

    fn control_frame(&mut self, kind: u16, flags: u8, p: Bytes) -> io::Result<Option<Frame>> {
        let mut p: &[u8] = &p;
        let frame = match kind {
            SYN_STREAM => {
                let stream_id = u32_from(&mut p)? & !CONTROL_BIT;
                let associated_to = u32_from(&mut p)? & !CONTROL_BIT;
                if p.len() < 2 {
                    return Err(invalid("SYN_STREAM too short"));
                }
                let priority = p[0] >> 5;
                let headers = self.headers(&p[2..])?;
                Frame::SynStream {
                    stream_id,
                    associated_to,
                    priority,
                    flags,
                    headers,
                }
            }
            SYN_REPLY | HEADERS => {
                let stream_id = u32_from(&mut p)? & !CONTROL_BIT;
                let headers = self.headers(p)?;
                match kind {
                    SYN_REPLY => Frame::SynReply {
                        stream_id,
                        flags,
                        headers,
                    },
                    _ => Frame::Headers {
                        stream_id,
                        flags,
                        headers,
                    },
                }
            }
            SETTINGS => settings_frame(flags, p)?,
            RST_STREAM | PING | GOAWAY | WINDOW_UPDATE => fixed_frame(kind, p)?,
            _ => return Ok(None),
        };
        Ok(Some(frame))
    }

    fn headers(&mut self, compressed: &[u8]) -> io::Result<Headers> {
        Headers::decode(&self.inflate_block(compressed)?)
    }

    /// Inflates one sync-flushed header block. The first one starts the zlib
    /// stream, which asks for the dictionary.
    fn inflate_block(&mut self, compressed: &[u8]) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(compressed.len() * 4 + 64);
        let mut pos = 0;
        loop {
            let (in_before, out_before) = (self.inflate.total_in(), self.inflate.total_out());
            let result =
                self.inflate
                    .decompress_vec(&compressed[pos..], &mut out, FlushDecompress::Sync);
            pos += (self.inflate.total_in() - in_before) as usize;
            if let Err(e) = result {
                if e.needs_dictionary().is_none() {
                    return Err(invalid(format!("inflating headers: {e}")));
                }
                self.inflate
                    .set_dictionary(&DICTIONARY)
                    .map_err(|e| invalid(format!("header dictionary: {e}")))?;
                continue;
            }
            if pos == compressed.len() && out.len() < out.capacity() {
                return Ok(out);
            }
            let progressed =
                self.inflate.total_in() != in_before || self.inflate.total_out() != out_before;
            if out.len() >= MAX_HEADER_BLOCK {
                return Err(invalid("header block too large"));
            } else if out.len() == out.capacity() {
                out.reserve(out.capacity());
            } else if !progressed {
                return Err(invalid("header block is cut short"));
            }
        }
    }
}

fn settings_frame(flags: u8, mut p: &[u8]) -> io::Result<Frame> {
    let count = u32_from(&mut p)? as usize;
    if count.checked_mul(8).is_none_or(|n| n > p.len()) {
        return Err(invalid("SETTINGS shorter than its count"));
    }
    let mut values = Vec::with_capacity(count);
    for _ in 0..count {
        let flags_id = p.get_u32();
        values.push(((flags_id >> 24) as u8, flags_id & 0x00ff_ffff, p.get_u32()));
    }
    Ok(Frame::Settings { flags, values })
}

/// RST_STREAM, PING, GOAWAY and WINDOW_UPDATE: one or two numbers.
fn fixed_frame(kind: u16, mut p: &[u8]) -> io::Result<Frame> {
    let first = u32_from(&mut p)?;
    if kind == PING {
        return Ok(Frame::Ping { id: first });
    }
    let second = u32_from(&mut p)?;
    let id = first & !CONTROL_BIT;
    Ok(match kind {
        RST_STREAM => Frame::RstStream {
            stream_id: id,
            status: second,
        },
        GOAWAY => Frame::GoAway {
            last_good_stream_id: id,
            status: second,
        },
        _ => Frame::WindowUpdate {
            stream_id: id,
            delta: second & !CONTROL_BIT,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(text: &str) -> Vec<u8> {
        (0..text.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decode_all(reader: &mut FrameReader, bytes: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(bytes);
        let mut frames = Vec::new();
        while let Some(frame) = reader.decode(&mut buf).unwrap() {
            frames.push(frame);
        }
        assert!(buf.is_empty(), "{} bytes left over", buf.len());
        frames
    }

    #[test]
    fn the_dictionary_is_the_spdy3_one() {
        assert_eq!(DICTIONARY.len(), 1423);
        // zlib names a preset dictionary by its Adler-32; SPDY/3 peers expect this one.
        let adler = Compress::new(Compression::best(), true)
            .set_dictionary(&DICTIONARY)
            .unwrap();
        assert_eq!(adler, 0xe3c6_a7c2);
    }

    /// Frames written by the SPDY library client-go and the kubelet use
    /// (github.com/moby/spdystream v0.5.1), one after another on one
    /// connection: the second header block needs the first one's context.
    const GO_FRAMES: &str = concat!(
        "80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a",
        "6800000000ffff800300010100001600000003000000000000c22a052a651201000000ffff8003000200",
        "00000e000000036260606000000000ffff0000000301000002686980030006000000040000000180030003",
        "00000008000000010000000580030007000000080000000300000000",
    );

    #[test]
    fn frames_written_by_the_go_library_are_read() {
        let frames = decode_all(&mut FrameReader::new(), &hex(GO_FRAMES));
        let syn = |stream_id, flags, kind| Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            flags,
            headers: Headers::new().with("streamType", kind),
        };
        let expected = vec![
            syn(1, 0, "error"),
            syn(3, FLAG_FIN, "data"),
            Frame::SynReply {
                stream_id: 3,
                flags: 0,
                headers: Headers::new(),
            },
            Frame::Data {
                stream_id: 3,
                flags: FLAG_FIN,
                data: Bytes::from_static(b"hi"),
            },
            Frame::Ping { id: 1 },
            Frame::RstStream {
                stream_id: 1,
                status: status::CANCEL,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 0,
            },
        ];
        assert_eq!(frames, expected);
    }

    fn every_kind_of_frame() -> Vec<Frame> {
        let headers = |request: &str| {
            Headers::new()
                .with("streamType", "data")
                .with("port", "2379")
                .with("requestID", request)
        };
        vec![
            Frame::SynStream {
                stream_id: 1,
                associated_to: 0,
                priority: 3,
                flags: 0,
                headers: headers("0"),
            },
            Frame::SynReply {
                stream_id: 1,
                flags: 0,
                headers: Headers::new(),
            },
            Frame::SynStream {
                stream_id: 3,
                associated_to: 1,
                priority: 7,
                flags: FLAG_FIN | FLAG_UNIDIRECTIONAL,
                headers: headers("1").with("port", "2380"),
            },
            Frame::Headers {
                stream_id: 3,
                flags: FLAG_FIN,
                headers: headers("2"),
            },
            Frame::Data {
                stream_id: 1,
                flags: 0,
                data: Bytes::from(vec![7u8; 70_000]),
            },
            Frame::Data {
                stream_id: 1,
                flags: FLAG_FIN,
                data: Bytes::new(),
            },
            Frame::RstStream {
                stream_id: 3,
                status: status::REFUSED_STREAM,
            },
            Frame::Settings {
                flags: 1,
                values: vec![(0, 4, 100), (1, 7, 65_536)],
            },
            Frame::Ping { id: 2 },
            Frame::WindowUpdate {
                stream_id: 1,
                delta: 4096,
            },
            Frame::GoAway {
                last_good_stream_id: 3,
                status: 2,
            },
        ]
    }

    #[test]
    fn every_frame_round_trips_even_when_bytes_arrive_one_by_one() {
        let frames = every_kind_of_frame();
        let mut writer = FrameWriter::new();
        let mut wire = BytesMut::new();
        for frame in &frames {
            writer.encode(frame, &mut wire).unwrap();
        }
        // Whole.
        assert_eq!(decode_all(&mut FrameReader::new(), &wire), frames);
        // A byte at a time: a frame is decoded only once all of it is there.
        let mut reader = FrameReader::new();
        let mut buf = BytesMut::new();
        let mut decoded = Vec::new();
        for byte in wire.iter() {
            buf.put_u8(*byte);
            while let Some(frame) = reader.decode(&mut buf).unwrap() {
                decoded.push(frame);
            }
        }
        assert_eq!(decoded, frames);
    }

    #[test]
    fn header_blocks_share_one_compression_context_per_direction() {
        let syn = |stream_id| Frame::SynStream {
            stream_id,
            associated_to: 0,
            priority: 0,
            flags: 0,
            headers: Headers::new()
                .with("streamtype", "error")
                .with("port", "2379")
                .with("requestid", "12345"),
        };
        let mut writer = FrameWriter::new();
        let (mut first, mut second) = (BytesMut::new(), BytesMut::new());
        writer.encode(&syn(1), &mut first).unwrap();
        writer.encode(&syn(3), &mut second).unwrap();
        assert!(
            second.len() < first.len(),
            "repeated headers cost less the second time: {} then {} bytes",
            first.len(),
            second.len()
        );
        // In order, one reader reads both.
        let mut reader = FrameReader::new();
        let frames = decode_all(&mut reader, &[first.as_ref(), second.as_ref()].concat());
        assert_eq!(frames, vec![syn(1), syn(3)]);
        // The second block alone means nothing to a reader that missed the first.
        let mut fresh = FrameReader::new();
        assert!(fresh.decode(&mut second.clone()).is_err());
    }

    #[test]
    fn headers_are_lowercase_and_found_whatever_the_case() {
        let headers = Headers::new()
            .with("StreamType", "data")
            .with("X-Multi", "a")
            .with("x-multi", "b");
        assert_eq!(headers.get("streamtype"), Some("data"));
        assert_eq!(headers.get("STREAMTYPE"), Some("data"));
        assert_eq!(headers.get("x-multi"), Some("a"));
        let decoded = Headers::decode(&headers.encode()).unwrap();
        assert_eq!(decoded, headers);
        assert_eq!(decoded.0[1], ("x-multi".to_string(), "a\0b".to_string()));
    }

    #[test]
    fn unknown_control_frames_are_skipped_and_bad_versions_refused() {
        let mut wire = BytesMut::new();
        control_frame(0x00ff, 0, b"whatever", &mut wire).unwrap();
        FrameWriter::new()
            .encode(&Frame::Ping { id: 5 }, &mut wire)
            .unwrap();
        assert_eq!(
            decode_all(&mut FrameReader::new(), &wire),
            vec![Frame::Ping { id: 5 }]
        );
        let mut spdy2 = BytesMut::from(&[0x80, 0x02, 0x00, 0x06, 0, 0, 0, 4, 0, 0, 0, 1][..]);
        assert!(FrameReader::new().decode(&mut spdy2).is_err());
    }
}
