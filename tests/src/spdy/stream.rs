//! The streams of one connection: the table the connection's reader routes
//! frames through ([`Shared`]: stream and ping ids, each stream's entry, the
//! queue to the writer task), and the handles a caller holds ([`Stream`],
//! its [`StreamReader`] and [`StreamWriter`] halves), which queue their own
//! frames and forget their entry when dropped.

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use super::frame::{FLAG_FIN, Frame, Headers, MAX_DATA_FRAME, status};

/// Which end of the connection this is: the client's stream and ping ids
/// are odd, the server's even.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

impl Role {
    pub(super) fn first_id(self) -> u32 {
        match self {
            Role::Client => 1,
            Role::Server => 2,
        }
    }

    /// Whether `id` (of a stream or ping) is one this side allocates.
    pub(super) fn owns(self, id: u32) -> bool {
        (id % 2 == 1) == (self == Role::Client)
    }
}

/// Data frames received and not yet read, per stream.
const STREAM_BUFFER: usize = 32;

pub(super) struct Shared {
    pub(super) role: Role,
    pub(super) frames: mpsc::Sender<Frame>,
    pub(super) state: Mutex<State>,
    /// Keeps stream ids rising on the wire when streams open concurrently.
    pub(super) open_order: tokio::sync::Mutex<()>,
    /// Set when reading stops or writing fails.
    pub(super) closed: Arc<watch::Sender<bool>>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) streams: HashMap<u32, Entry>,
    pub(super) next_stream_id: u32,
    pub(super) last_peer_stream_id: u32,
    pub(super) next_ping_id: u32,
    pub(super) pings: HashMap<u32, oneshot::Sender<()>>,
    /// After GOAWAY (either way) or the end of reading: no new peer streams.
    pub(super) going_away: bool,
}

/// The reader's side of one stream.
pub(super) struct Entry {
    /// Data from the peer; `None` once the peer is done (FIN, RST, or end of reading).
    pub(super) data: Option<mpsc::Sender<Bytes>>,
    /// For streams this side opened, until the peer replies (`Ok`) or resets (`Err(status)`).
    pub(super) reply: Option<oneshot::Sender<Result<(), u32>>>,
    pub(super) reset: watch::Sender<bool>,
}

pub(super) fn connection_closed() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the SPDY connection is closed")
}

/// Where the peer's answer to a stream this side opened arrives.
pub(super) type ReplySlot = oneshot::Receiver<Result<(), u32>>;

/// What a new stream's handle needs: its data and the peer's reset.
pub(super) struct StreamParts {
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
    pub(super) async fn send(&self, frame: Frame) -> io::Result<()> {
        self.frames
            .send(frame)
            .await
            .map_err(|_| connection_closed())
    }

    pub(super) fn with_entry(&self, id: u32, f: impl FnOnce(&mut Entry)) {
        if let Some(entry) = self.state.lock().expect("spdy state").streams.get_mut(&id) {
            f(entry);
        }
    }

    pub(super) fn register_own_stream(&self) -> io::Result<(u32, StreamParts, ReplySlot)> {
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
    pub(super) fn register_peer_stream(
        &self,
        id: u32,
        flags: u8,
    ) -> Result<StreamParts, Option<u32>> {
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

/// One stream: its headers, the data the peer sends and a way to send.
/// [`into_split`](Self::into_split) gives halves for concurrent use.
pub struct Stream {
    id: u32,
    headers: Headers,
    pub(super) reader: StreamReader,
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
    pub(super) fn new(
        shared: &Arc<Shared>,
        id: u32,
        headers: Headers,
        parts: StreamParts,
    ) -> Stream {
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
