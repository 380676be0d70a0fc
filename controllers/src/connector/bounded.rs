//! Bounds on what a workload API server can make the controller hold or
//! wait for. A tenant names the server (its kubeconfig Secret), so every
//! call through a workload client is bounded twice: its response body is
//! read to at most [`MAX_RESPONSE_BYTES`], and the whole call — connection,
//! response headers and body — ends within [`CALL_DEADLINE`]. A server that
//! answers a huge body fails its call instead of filling the controller's
//! memory; one that trickles a byte at a time fails it instead of holding a
//! reconcile slot. The reconcile then ends with the connector's condition
//! (`RemoteReachable=False`) and the cluster backs off as from any
//! unreachable server.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};
use tower::BoxError;

/// The most of one response body the controller reads: its requests are
/// gets, lists and patches in one namespace, and the API server stores no
/// object over 1.5 MiB (etcd's request limit).
pub const MAX_RESPONSE_BYTES: u64 = 4 * 1024 * 1024;

/// The longest one workload API call may take, all of it (the read timeout
/// of 20 s bounds each read, not the call).
pub const CALL_DEADLINE: Duration = Duration::from_secs(30);

/// Why a call was cut short.
#[derive(Debug, thiserror::Error)]
pub enum Exceeded {
    #[error("no whole answer within {0:?}, the controller's deadline for one call")]
    Deadline(Duration),
    #[error("the answer is over {0} bytes, the most the controller reads of one")]
    Size(u64),
}

/// The bounds, as a tower layer around a workload client's HTTP service.
#[derive(Clone, Copy, Debug)]
pub struct BoundedLayer {
    pub max_bytes: u64,
    pub deadline: Duration,
}

impl Default for BoundedLayer {
    fn default() -> Self {
        BoundedLayer {
            max_bytes: MAX_RESPONSE_BYTES,
            deadline: CALL_DEADLINE,
        }
    }
}

impl<S> tower::Layer<S> for BoundedLayer {
    type Service = Bounded<S>;

    fn layer(&self, inner: S) -> Bounded<S> {
        Bounded {
            inner,
            bounds: *self,
        }
    }
}

/// A service whose calls are bounded ([`BoundedLayer`]).
#[derive(Clone, Debug)]
pub struct Bounded<S> {
    inner: S,
    bounds: BoundedLayer,
}

type Call<B> =
    Pin<Box<dyn Future<Output = Result<http::Response<BoundedBody<B>>, BoxError>> + Send>>;

impl<S, Req, B> tower::Service<Req> for Bounded<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<BoundedBody<B>>;
    type Error = BoxError;
    type Future = Call<B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        let bounds = self.bounds;
        let until = Instant::now() + bounds.deadline;
        let call = self.inner.call(request);
        Box::pin(async move {
            let response = tokio::time::timeout_at(until, call)
                .await
                .map_err(|_| Exceeded::Deadline(bounds.deadline))?
                .map_err(Into::into)?;
            Ok(response.map(|body| BoundedBody::new(body, bounds, until)))
        })
    }
}

/// A response body read to at most its bound, by its call's deadline.
pub struct BoundedBody<B> {
    inner: Pin<Box<B>>,
    remaining: u64,
    bounds: BoundedLayer,
    deadline: Pin<Box<Sleep>>,
}

impl<B> BoundedBody<B> {
    fn new(inner: B, bounds: BoundedLayer, until: Instant) -> Self {
        BoundedBody {
            inner: Box::pin(inner),
            remaining: bounds.max_bytes,
            bounds,
            deadline: Box::pin(tokio::time::sleep_until(until)),
        }
    }
}

impl<B> Body for BoundedBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Exceeded::Deadline(this.bounds.deadline).into())));
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let len = frame.data_ref().map_or(0, |d| d.len() as u64);
                if len > this.remaining {
                    return Poll::Ready(Some(Err(Exceeded::Size(this.bounds.max_bytes).into())));
                }
                this.remaining -= len;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, StreamBody};
    use tower::{Service, ServiceExt};

    type Chunks = StreamBody<futures::stream::BoxStream<'static, Result<Frame<Bytes>, BoxError>>>;

    /// A service answering at once with `chunks` of `size` bytes, one every
    /// `every`.
    fn server(
        chunks: usize,
        size: usize,
        every: Duration,
    ) -> impl tower::Service<
        (),
        Response = http::Response<Chunks>,
        Error = BoxError,
        Future: Send + 'static,
    > + Clone {
        tower::service_fn(move |()| async move {
            use futures::StreamExt;
            let stream = futures::stream::iter(0..chunks)
                .then(move |_| async move {
                    tokio::time::sleep(every).await;
                    Ok(Frame::data(Bytes::from(vec![b'x'; size])))
                })
                .boxed();
            Ok::<_, BoxError>(http::Response::new(StreamBody::new(stream)))
        })
    }

    async fn read(
        service: impl tower::Service<
            (),
            Response = http::Response<Chunks>,
            Error = BoxError,
            Future: Send + 'static,
        >,
        bounds: BoundedLayer,
    ) -> Result<usize, BoxError> {
        let mut bounded = tower::Layer::layer(&bounds, service);
        let response = bounded.ready().await?.call(()).await?;
        Ok(response.into_body().collect().await?.to_bytes().len())
    }

    fn bounds(max_bytes: u64, deadline_ms: u64) -> BoundedLayer {
        BoundedLayer {
            max_bytes,
            deadline: Duration::from_millis(deadline_ms),
        }
    }

    #[tokio::test]
    async fn an_answer_within_its_bounds_is_read_whole() {
        let got = read(server(4, 1000, Duration::ZERO), bounds(4000, 5000)).await;
        assert_eq!(got.unwrap(), 4000);
    }

    #[tokio::test]
    async fn a_tenants_server_answering_past_the_size_bound_fails_the_call() {
        let err = read(server(100, 1000, Duration::ZERO), bounds(4000, 5000))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("over 4000 bytes"), "{err}");
    }

    #[tokio::test]
    async fn a_tenants_trickling_server_fails_the_call_at_its_deadline() {
        // One byte every 200 ms would take 200 s; the call ends at 500 ms.
        let started = Instant::now();
        let err = read(
            server(1000, 1, Duration::from_millis(200)),
            bounds(4000, 500),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("within 500ms"), "{err}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(500) && took < Duration::from_secs(10),
            "{took:?}"
        );
    }
}
