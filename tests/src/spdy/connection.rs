//! One SPDY connection over an upgraded HTTP connection: a task that reads
//! frames and routes them to streams (accepting, refusing and resetting
//! streams, answering pings, stopping at GOAWAY), a task that writes the
//! frames the streams queue, and the [`Connection`] handle that opens
//! streams, pings and says goodbye.

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use super::frame::{CONTROL_BIT, FLAG_FIN, Frame, FrameReader, FrameWriter, Headers};
use super::stream::{Role, Shared, State, Stream, connection_closed};

/// Frames waiting for the writer task.
const FRAME_QUEUE: usize = 64;

/// One SPDY connection. A task reads frames and routes them to streams; a
/// task writes the frames the streams queue. The connection lives while
/// this handle does (dropping it stops reading) and, for writing, while
/// any [`Stream`] does; [`abort`](Self::abort) cuts it at once.
pub struct Connection {
    shared: Arc<Shared>,
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spdy::frame::{Frame, FrameReader, FrameWriter, Headers, status};

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
