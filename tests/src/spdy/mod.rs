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
//!
//! Rooms: [`frame`] (the codec), [`stream`] (a connection's streams and
//! their handles), [`connection`] (the reading and writing tasks and the
//! connection handle). Every public name is re-exported here.

pub mod connection;
pub mod frame;
pub mod stream;

pub use connection::{Connection, Incoming};
pub use frame::{
    FLAG_FIN, FLAG_UNIDIRECTIONAL, Frame, FrameReader, FrameWriter, Headers, VERSION, status,
};
pub use stream::{PeerReset, Role, Stream, StreamReader, StreamWriter};
