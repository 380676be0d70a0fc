//! SPDY/3.1, as much of it as Kubernetes' streaming protocols use: the
//! `portforward.k8s.io` protocol a kubelet speaks after an
//! `Upgrade: SPDY/3.1` request (see [`crate::kubelet_server`]).
//!
//! This module owns the frame codec ([`FrameReader`], [`FrameWriter`]) and a
//! session over one connection ([`Connection`], [`Stream`]): the kubelet
//! server runs it as the server; tests run it as the client.
//!
//! What the Go peers (client-go and the kubelet, both on the same SPDY
//! library) do, and this module therefore does too:
//! - Header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are one zlib stream per
//!   direction per connection, primed with the SPDY/3 dictionary and
//!   sync-flushed after every block: a block can only be read by a reader
//!   that has read every block before it on that connection.
//! - No flow control: SETTINGS and WINDOW_UPDATE are accepted and ignored,
//!   none are sent. Backpressure is the connection's own: a stream whose
//!   reader lags stops the reading of the whole connection.
//! - Stream ids are odd from the client and even from the server, and only
//!   rise; a SYN_STREAM out of order is refused with RST_STREAM. Ping ids
//!   have the same parity: a ping with the peer's parity is echoed, one with
//!   ours answers our [`Connection::ping`].
//! - A GOAWAY ends reading (every stream reads its end); data for streams
//!   that are unknown or gone is dropped.
//! - A stream is answered with SYN_REPLY (or refused with RST_STREAM) before
//!   its data flows; a FIN flag half-closes one direction.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

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

const CONTROL_BIT: u32 = 0x8000_0000;
/// Frame lengths are 24 bits.
const MAX_LENGTH: usize = (1 << 24) - 1;
/// The largest inflated header block accepted (the Go reader's bound on one field).
const MAX_HEADER_BLOCK: usize = 1 << 20;
/// Data written in one call leaves in frames of at most this size.
const MAX_DATA_FRAME: usize = 32 * 1024;

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

/// Which end of the connection this is: the client's stream and ping ids
/// are odd, the server's even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

impl Role {
    fn first_id(self) -> u32 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
        }
    }

    /// Whether `id` (of a stream or ping) is one this side allocates.
    fn owns(self, id: u32) -> bool {
        (id % 2 == 1) == (self == Role::Client)
    }
}

/// Frames waiting for the writer task.
const FRAME_QUEUE: usize = 64;
/// Data frames received and not yet read, per stream.
const STREAM_BUFFER: usize = 32;

/// One SPDY connection. A task reads frames and routes them to streams; a
/// task writes the frames the streams queue. The connection lives while
/// this handle does (dropping it stops reading) and, for writing, while
/// any [`Stream`] does; [`abort`](Self::abort) cuts it at once.
pub struct Connection {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

struct Shared {
    role: Role,
    frames: mpsc::Sender<Frame>,
    state: Mutex<State>,
    /// Keeps stream ids rising on the wire when streams open concurrently.
    open_order: tokio::sync::Mutex<()>,
    /// Set when reading stops or writing fails.
    closed: Arc<watch::Sender<bool>>,
}

#[derive(Default)]
struct State {
    streams: HashMap<u32, Entry>,
    next_stream_id: u32,
    last_peer_stream_id: u32,
    next_ping_id: u32,
    pings: HashMap<u32, oneshot::Sender<()>>,
    /// After GOAWAY (either way) or the end of reading: no new peer streams.
    going_away: bool,
}

/// The reader's side of one stream.
struct Entry {
    /// Data from the peer; `None` once the peer is done (FIN, RST, or end of reading).
    data: Option<mpsc::Sender<Bytes>>,
    /// For streams this side opened, until the peer replies (`Ok`) or resets (`Err(status)`).
    reply: Option<oneshot::Sender<Result<(), u32>>>,
    reset: watch::Sender<bool>,
}

/// Streams the peer opens, in the order it opened them.
pub struct Incoming(mpsc::Receiver<Stream>);

impl Incoming {
    /// The next stream; `None` once the connection stops reading.
    pub async fn accept(&mut self) -> Option<Stream> {
        self.0.recv().await
    }
}

impl Connection {
    /// Runs SPDY over `io` (an upgraded HTTP connection) as `role`; needs
    /// a Tokio runtime.
    pub fn new<T>(io: T, role: Role) -> (Connection, Incoming)
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (read, write) = tokio::io::split(io);
        let (frames, queued) = mpsc::channel(FRAME_QUEUE);
        let closed = Arc::new(watch::channel(false).0);
        let writer = tokio::spawn(write_frames(write, queued, closed.clone()));
        let shared = Arc::new(Shared {
            role,
            frames,
            state: Mutex::new(State {
                next_stream_id: role.first_id(),
                next_ping_id: role.first_id(),
                ..State::default()
            }),
            open_order: tokio::sync::Mutex::new(()),
            closed,
        });
        let (incoming, accepted) = mpsc::channel(16);
        let reader = tokio::spawn(read_frames(read, shared.clone(), incoming));
        let connection = Connection {
            shared,
            reader,
            writer,
        };
        (connection, Incoming(accepted))
    }

    /// Opens a stream and waits for the peer's reply.
    pub async fn open(&self, headers: Headers) -> io::Result<Stream> {
        let (stream, replied) = {
            let _order = self.shared.open_order.lock().await;
            let (id, parts, replied) = self.shared.register_own_stream()?;
            let syn = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: headers.clone(),
            };
            self.shared.send(syn).await?;
            (Stream::new(&self.shared, id, headers, parts), replied)
        };
        match replied.await {
            Ok(Ok(())) => Ok(stream),
            Ok(Err(status)) => Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "stream {} refused (RST_STREAM status {status})",
                    stream.id()
                ),
            )),
            Err(_) => Err(connection_closed()),
        }
    }

    /// Pings the peer; the round trip.
    pub async fn ping(&self) -> io::Result<Duration> {
        let (answered, id) = {
            let mut state = self.shared.state.lock().expect("spdy state");
            let id = state.next_ping_id;
            state.next_ping_id = id.wrapping_add(2) & !CONTROL_BIT;
            let (tx, rx) = oneshot::channel();
            state.pings.insert(id, tx);
            (rx, id)
        };
        let started = Instant::now();
        self.shared.send(Frame::Ping { id }).await?;
        answered.await.map_err(|_| connection_closed())?;
        Ok(started.elapsed())
    }

    /// Tells the peer no more streams are accepted (GOAWAY, status OK).
    pub async fn go_away(&self) -> io::Result<()> {
        let last_good_stream_id = {
            let mut state = self.shared.state.lock().expect("spdy state");
            state.going_away = true;
            state.last_peer_stream_id
        };
        self.shared
            .send(Frame::GoAway {
                last_good_stream_id,
                status: 0,
            })
            .await
    }

    /// Completes when the connection has ended: reading stopped (the peer
    /// closed it, sent GOAWAY or an unreadable frame; the connection was
    /// dropped or aborted) or writing failed.
    pub fn closed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut closed = self.shared.closed.subscribe();
        async move {
            let _ = closed.wait_for(|closed| *closed).await;
        }
    }

    /// Cuts the connection without a GOAWAY, like a lost network connection.
    pub fn abort(&self) {
        self.reader.abort();
        self.writer.abort();
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Streams still held keep the writer; nobody can accept new ones.
        self.reader.abort();
    }
}

fn connection_closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the SPDY connection is closed")
}

/// Where the peer's answer to a stream this side opened arrives.
type ReplySlot = oneshot::Receiver<Result<(), u32>>;

/// What a new stream's handle needs: its data and the peer's reset.
struct StreamParts {
    data: mpsc::Receiver<Bytes>,
    reset: watch::Receiver<bool>,
}

fn new_entry(peer_done: bool) -> (Entry, StreamParts) {
    let (data, data_rx) = mpsc::channel(STREAM_BUFFER);
    let (reset, reset_rx) = watch::channel(false);
    let entry = Entry {
        data: (!peer_done).then_some(data),
        reply: None,
        reset,
    };
    let parts = StreamParts {
        data: data_rx,
        reset: reset_rx,
    };
    (entry, parts)
}

impl Shared {
    async fn send(&self, frame: Frame) -> io::Result<()> {
        self.frames
            .send(frame)
            .await
            .map_err(|_| connection_closed())
    }

    fn with_entry(&self, id: u32, f: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self.state.lock().expect("spdy state").streams.get_mut(&id) {
            f(entry);
        }
    }

    fn register_own_stream(&self) -> io::Result<(u32, StreamParts, ReplySlot)> {
        let mut state = self.state.lock().expect("spdy state");
        if state.going_away {
            return Err(connection_closed());
        }
        let id = state.next_stream_id;
        if id > 0x7fff_ffff {
            return Err(io::Error::other("SPDY stream ids are used up"));
        }
        state.next_stream_id += 2;
        let (mut entry, parts) = new_entry(false);
        let (tx, rx) = oneshot::channel();
        entry.reply = Some(tx);
        state.streams.insert(id, entry);
        Ok((id, parts, rx))
    }

    /// Registers a stream the peer opened, or says why it is refused
    /// (`None`: ignored, the connection is going away).
    fn register_peer_stream(&self, id: u32, flags: u8) -> Result<StreamParts, Option<u32>> {
        let mut state = self.state.lock().expect("spdy state");
        if state.going_away {
            return Err(None);
        }
        if id == 0 || self.role.owns(id) || id <= state.last_peer_stream_id {
            return Err(Some(status::PROTOCOL_ERROR));
        }
        state.last_peer_stream_id = id;
        let (entry, parts) = new_entry(flags & FLAG_FIN != 0);
        state.streams.insert(id, entry);
        Ok(parts)
    }
}

/// Ends every stream's data and every wait on the peer when reading stops
/// (the peer closed, sent GOAWAY or garbage, or the connection was dropped).
struct ReaderExit(Arc<Shared>);

impl Drop for ReaderExit {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().expect("spdy state");
        state.going_away = true;
        for entry in state.streams.values_mut() {
            entry.data = None;
            entry.reply = None;
        }
        state.pings.clear();
        self.0.closed.send_replace(true);
    }
}

async fn read_frames<R: AsyncRead + Unpin>(
    mut io: R,
    shared: Arc<Shared>,
    incoming: mpsc::Sender<Stream>,
) {
    let _exit = ReaderExit(shared.clone());
    let mut decoder = FrameReader::new();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    loop {
        let frame = match decoder.decode(&mut buf) {
            Ok(Some(frame)) => frame,
            Ok(None) => match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
            Err(e) => {
                // The header context is lost with the frame: nothing after it can be read.
                tracing::debug!(error = %e, "SPDY: unreadable frame, reading stops");
                return;
            }
        };
        if !dispatch(&shared, &incoming, frame).await {
            return;
        }
    }
}

/// Acts on one received frame; `false` when reading should stop.
async fn dispatch(shared: &Arc<Shared>, incoming: &mpsc::Sender<Stream>, frame: Frame) -> bool {
    match frame {
        Frame::SynStream {
            stream_id,
            flags,
            headers,
            ..
        } => accept_stream(shared, incoming, stream_id, flags, headers).await,
        Frame::SynReply {
            stream_id, flags, ..
        } => shared.with_entry(stream_id, |entry| {
            if let Some(reply) = entry.reply.take() {
                let _ = reply.send(Ok(()));
            }
            if flags & FLAG_FIN != 0 {
                entry.data = None;
            }
        }),
        Frame::Data {
            stream_id,
            flags,
            data,
        } => deliver(shared, stream_id, flags, data).await,
        Frame::Headers {
            stream_id, flags, ..
        } if flags & FLAG_FIN != 0 => shared.with_entry(stream_id, |entry| entry.data = None),
        Frame::RstStream { stream_id, status } => shared.with_entry(stream_id, |entry| {
            entry.data = None;
            entry.reset.send_replace(true);
            if let Some(reply) = entry.reply.take() {
                let _ = reply.send(Err(status));
            }
        }),
        Frame::Ping { id } => answer_ping(shared, id).await,
        Frame::GoAway { .. } => return false,
        // No flow control (as the Go peers): SETTINGS and WINDOW_UPDATE change nothing.
        Frame::Headers { .. } | Frame::Settings { .. } | Frame::WindowUpdate { .. } => {}
    }
    true
}

async fn accept_stream(
    shared: &Arc<Shared>,
    incoming: &mpsc::Sender<Stream>,
    id: u32,
    flags: u8,
    headers: Headers,
) {
    match shared.register_peer_stream(id, flags) {
        Ok(parts) => {
            // If nobody accepts streams any more, dropping it refuses it.
            let _ = incoming.send(Stream::new(shared, id, headers, parts)).await;
        }
        Err(Some(status)) if id != 0 => {
            let _ = shared
                .send(Frame::RstStream {
                    stream_id: id,
                    status,
                })
                .await;
        }
        Err(_) => {}
    }
}

async fn deliver(shared: &Shared, id: u32, flags: u8, data: Bytes) {
    let sender = {
        let state = shared.state.lock().expect("spdy state");
        state.streams.get(&id).and_then(|entry| entry.data.clone())
    };
    if let Some(sender) = sender
        && !data.is_empty()
    {
        // A stream whose handle is gone drops its data.
        let _ = sender.send(data).await;
    }
    if flags & FLAG_FIN != 0 {
        shared.with_entry(id, |entry| entry.data = None);
    }
}

async fn answer_ping(shared: &Shared, id: u32) {
    if shared.role.owns(id) {
        let answered = shared.state.lock().expect("spdy state").pings.remove(&id);
        if let Some(answered) = answered {
            let _ = answered.send(());
        }
    } else {
        let _ = shared.send(Frame::Ping { id }).await;
    }
}

/// Marks the connection closed when the writer stops, however it stops
/// (after its last frame, too: by then nothing holds the connection).
struct WriterExit(Arc<watch::Sender<bool>>);

impl Drop for WriterExit {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Writes queued frames, those queued together in one write, until every
/// sender is gone (then closes the write side) or the peer stops taking them.
async fn write_frames<W: AsyncWrite + Unpin>(
    mut io: W,
    mut frames: mpsc::Receiver<Frame>,
    closed: Arc<watch::Sender<bool>>,
) {
    let _exit = WriterExit(closed);
    let mut encoder = FrameWriter::new();
    let mut buf = BytesMut::with_capacity(16 * 1024);
    while let Some(frame) = frames.recv().await {
        let mut next = Some(frame);
        while let Some(frame) = next {
            if let Err(e) = encoder.encode(&frame, &mut buf) {
                tracing::debug!(error = %e, "SPDY: frame not encodable, connection closes");
                return;
            }
            next = if buf.len() < 64 * 1024 {
                frames.try_recv().ok()
            } else {
                None
            };
        }
        if io.write_all(&buf).await.is_err() || io.flush().await.is_err() {
            return;
        }
        buf.clear();
    }
    let _ = io.shutdown().await;
}

/// One stream: its headers, the data the peer sends and a way to send.
/// [`into_split`](Self::into_split) gives halves for concurrent use.
pub struct Stream {
    id: u32,
    headers: Headers,
    reader: StreamReader,
    writer: StreamWriter,
}

/// Forgets the stream once both halves are gone; later frames for it are dropped.
struct EntryGuard {
    id: u32,
    shared: Arc<Shared>,
}

impl Drop for EntryGuard {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().expect("spdy state");
        state.streams.remove(&self.id);
    }
}

/// The receiving half of a stream.
pub struct StreamReader {
    data: mpsc::Receiver<Bytes>,
    reset: watch::Receiver<bool>,
    _guard: Arc<EntryGuard>,
}

/// The sending half of a stream. Dropped before [`close`](Self::close) or
/// [`reset`](Self::reset), it resets the stream (CANCEL) so the peer does
/// not wait for it.
pub struct StreamWriter {
    id: u32,
    frames: mpsc::Sender<Frame>,
    reset: watch::Receiver<bool>,
    finished: bool,
    _guard: Arc<EntryGuard>,
}

/// Completes when the peer resets a stream.
pub struct PeerReset(watch::Receiver<bool>);

impl PeerReset {
    pub async fn wait(mut self) {
        let _ = self.0.wait_for(|reset| *reset).await;
    }
}

impl Stream {
    fn new(shared: &Arc<Shared>, id: u32, headers: Headers, parts: StreamParts) -> Stream {
        let guard = Arc::new(EntryGuard {
            id,
            shared: shared.clone(),
        });
        let reader = StreamReader {
            data: parts.data,
            reset: parts.reset.clone(),
            _guard: guard.clone(),
        };
        let writer = StreamWriter {
            id,
            frames: shared.frames.clone(),
            reset: parts.reset,
            finished: false,
            _guard: guard,
        };
        Stream {
            id,
            headers,
            reader,
            writer,
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// The headers of the SYN_STREAM that opened it.
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// Accepts a stream the peer opened (SYN_REPLY, no headers).
    pub async fn reply(&self) -> io::Result<()> {
        self.writer
            .send(Frame::SynReply {
                stream_id: self.id,
                flags: 0,
                headers: Headers::new(),
            })
            .await
    }

    pub async fn read(&mut self) -> Option<Bytes> {
        self.reader.read().await
    }

    pub async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.writer.write(data).await
    }

    pub async fn close(&mut self) -> io::Result<()> {
        self.writer.close().await
    }

    pub async fn reset(&mut self, status: u32) -> io::Result<()> {
        self.writer.reset(status).await
    }

    pub fn into_split(self) -> (StreamReader, StreamWriter) {
        (self.reader, self.writer)
    }
}

impl StreamReader {
    /// The next data the peer sent; `None` once it finished, reset the
    /// stream, or the connection stopped reading.
    pub async fn read(&mut self) -> Option<Bytes> {
        self.data.recv().await
    }

    /// Whether the peer reset the stream.
    pub fn was_reset(&self) -> bool {
        *self.reset.borrow()
    }
}

impl StreamWriter {
    async fn send(&self, frame: Frame) -> io::Result<()> {
        self.frames
            .send(frame)
            .await
            .map_err(|_| connection_closed())
    }

    fn check_open(&self) -> io::Result<()> {
        if *self.reset.borrow() {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("stream {} was reset by the peer", self.id),
            ));
        }
        if self.finished {
            return Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!("stream {} is closed for writing", self.id),
            ));
        }
        Ok(())
    }

    /// Sends `data`, in frames of at most 32 KiB.
    pub async fn write(&mut self, data: &[u8]) -> io::Result<()> {
        for chunk in data.chunks(MAX_DATA_FRAME) {
            self.check_open()?;
            self.send(Frame::Data {
                stream_id: self.id,
                flags: 0,
                data: Bytes::copy_from_slice(chunk),
            })
            .await?;
        }
        Ok(())
    }

    /// Half-closes: an empty DATA frame with FIN. The peer may still send.
    pub async fn close(&mut self) -> io::Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        self.send(Frame::Data {
            stream_id: self.id,
            flags: FLAG_FIN,
            data: Bytes::new(),
        })
        .await
    }

    /// Ends the stream both ways (RST_STREAM with `status`).
    pub async fn reset(&mut self, status: u32) -> io::Result<()> {
        self.finished = true;
        self.send(Frame::RstStream {
            stream_id: self.id,
            status,
        })
        .await
    }

    /// Completes when the peer resets the stream.
    pub fn peer_reset(&self) -> PeerReset {
        PeerReset(self.reset.clone())
    }
}

impl Drop for StreamWriter {
    fn drop(&mut self) {
        if !self.finished && !*self.reset.borrow() {
            let _ = self.frames.try_send(Frame::RstStream {
                stream_id: self.id,
                status: status::CANCEL,
            });
        }
    }
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

    /// A client and a server connection joined by an in-memory pipe.
    fn pair() -> (Connection, Incoming, Connection, Incoming) {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let (client, client_incoming) = Connection::new(a, Role::Client);
        let (server, server_incoming) = Connection::new(b, Role::Server);
        (client, client_incoming, server, server_incoming)
    }

    async fn read_all(stream: &mut Stream) -> Vec<u8> {
        let mut all = Vec::new();
        while let Some(data) = stream.read().await {
            all.extend_from_slice(&data);
        }
        all
    }

    #[tokio::test]
    async fn a_stream_carries_data_both_ways_and_half_closes_each_way() {
        let (client, _, _server, mut accepted) = pair();
        let serve = tokio::spawn(async move {
            let mut stream = accepted.accept().await.unwrap();
            assert_eq!(stream.headers().get("port"), Some("2379"));
            stream.reply().await.unwrap();
            let got = read_all(&mut stream).await;
            assert_eq!(got, b"request".repeat(10_000), "all of it, then the FIN");
            // Half-closed by the client: the server still sends.
            stream
                .write(b"answer after the client's FIN")
                .await
                .unwrap();
            stream.close().await.unwrap();
            assert!(stream.write(b"late").await.is_err(), "closed for writing");
        });
        let mut stream = client
            .open(Headers::new().with("port", "2379"))
            .await
            .unwrap();
        assert_eq!(stream.id(), 1);
        stream.write(&b"request".repeat(10_000)).await.unwrap();
        stream.close().await.unwrap();
        assert_eq!(
            read_all(&mut stream).await,
            b"answer after the client's FIN"
        );
        serve.await.unwrap();
    }

    #[tokio::test]
    async fn a_reset_ends_the_stream_both_ways_and_a_refused_stream_fails_to_open() {
        let (client, _, _server, mut accepted) = pair();
        let serve = tokio::spawn(async move {
            let mut first = accepted.accept().await.unwrap();
            first.reply().await.unwrap();
            first.reset(status::CANCEL).await.unwrap();
            let mut second = accepted.accept().await.unwrap();
            second.reset(status::REFUSED_STREAM).await.unwrap();
        });
        let mut stream = client.open(Headers::new()).await.unwrap();
        assert_eq!(stream.read().await, None);
        assert!(stream.reader.was_reset());
        let error = stream.write(b"x").await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::ConnectionReset);
        let refused = client.open(Headers::new()).await.err().unwrap();
        assert_eq!(refused.kind(), io::ErrorKind::ConnectionRefused);
        serve.await.unwrap();
    }

    #[tokio::test]
    async fn concurrent_streams_stay_apart() {
        let (client, _, _server, mut accepted) = pair();
        tokio::spawn(async move {
            while let Some(stream) = accepted.accept().await {
                tokio::spawn(async move {
                    let mut stream = stream;
                    stream.reply().await.unwrap();
                    let got = read_all(&mut stream).await;
                    stream.write(&got).await.unwrap();
                    stream.close().await.unwrap();
                });
            }
        });
        let client = Arc::new(client);
        let echoes = (0..20u32).map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut stream = client.open(Headers::new()).await.unwrap();
                let message = format!("stream {i} ").repeat(1000 * (i as usize + 1));
                stream.write(message.as_bytes()).await.unwrap();
                stream.close().await.unwrap();
                assert_eq!(read_all(&mut stream).await, message.as_bytes());
                stream.id()
            })
        });
        let mut ids = Vec::new();
        for echo in echoes {
            ids.push(echo.await.unwrap());
        }
        ids.sort();
        assert_eq!(ids, (0..20).map(|i| 2 * i + 1).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn pings_are_answered_both_ways() {
        let (client, _, server, _) = pair();
        client.ping().await.unwrap();
        server.ping().await.unwrap();
        client.ping().await.unwrap();
    }

    #[tokio::test]
    async fn a_goaway_ends_reading_and_accepting() {
        let (client, _, _server, mut accepted) = pair();
        let (opened, served) = tokio::join!(client.open(Headers::new()), async {
            let served = accepted.accept().await.unwrap();
            served.reply().await.unwrap();
            served
        });
        let (mut stream, mut served) = (opened.unwrap(), served);
        client.go_away().await.unwrap();
        assert!(accepted.accept().await.is_none(), "no streams after GOAWAY");
        assert_eq!(served.read().await, None, "reading ended");
        // Writing still works: the client keeps reading its streams.
        served.write(b"last words").await.unwrap();
        served.close().await.unwrap();
        assert_eq!(read_all(&mut stream).await, b"last words");
    }

    #[tokio::test]
    async fn streams_out_of_order_are_refused_and_dropped_writers_reset() {
        let (raw, end) = tokio::io::duplex(64 * 1024);
        let (_server, mut accepted) = Connection::new(end, Role::Server);
        let (mut raw_read, mut raw_write) = tokio::io::split(raw);
        let mut writer = FrameWriter::new();
        let mut wire = BytesMut::new();
        for id in [5, 3] {
            let syn = Frame::SynStream {
                stream_id: id,
                associated_to: 0,
                priority: 0,
                flags: 0,
                headers: Headers::new(),
            };
            writer.encode(&syn, &mut wire).unwrap();
        }
        raw_write.write_all(&wire).await.unwrap();
        let five = accepted.accept().await.unwrap();
        assert_eq!(five.id(), 5);
        drop(five); // never replied nor closed: the peer must not wait for it
        let mut reader = FrameReader::new();
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        while frames.len() < 2 {
            raw_read.read_buf(&mut buf).await.unwrap();
            while let Some(frame) = reader.decode(&mut buf).unwrap() {
                frames.push(frame);
            }
        }
        frames.sort_by_key(|f| match f {
            Frame::RstStream { stream_id, .. } => *stream_id,
            _ => 0,
        });
        let rst = |stream_id, status| Frame::RstStream { stream_id, status };
        assert_eq!(
            frames,
            vec![rst(3, status::PROTOCOL_ERROR), rst(5, status::CANCEL)]
        );
    }
}
