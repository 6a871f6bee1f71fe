//! The plain HTTP/1 server the benches put a stand-in behind on loopback: the intake's handler
//! (`crate::bench_peer`).

use std::convert::Infallible;
use std::future::Future;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use tokio::net::TcpListener;

/// Answers HTTP/1 on `listener` until the process ends: each connection takes the state `next`
/// gives it when it is accepted, and each of its requests is `answer(state, request)`.
pub fn serve<N, S, A, F>(listener: TcpListener, mut next: N, answer: A)
where
    N: FnMut() -> S + Send + 'static,
    S: Clone + Send + 'static,
    A: Fn(S, Request<Incoming>) -> F + Clone + Send + 'static,
    F: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (state, answer) = (next(), answer.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |request| {
                    let answered = answer(state.clone(), request);
                    async move { Ok::<_, Infallible>(answered.await) }
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_connection_is_answered_with_the_state_it_was_accepted_with() {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let mut accepted = 0;
        let next = move || {
            accepted += 1;
            accepted
        };
        serve(
            listener,
            next,
            |state: u32, request: Request<Incoming>| async move {
                let body = format!("{state} {}", request.uri().path());
                Response::new(Full::new(Bytes::from(body)))
            },
        );
        // A client keeps its connection: its requests share a state, another client's do not.
        let (first, second) = (reqwest::Client::new(), reqwest::Client::new());
        let text = |client: &reqwest::Client| {
            let request = client.get(&url).send();
            async move { request.await.unwrap().text().await.unwrap() }
        };
        assert_eq!(text(&first).await, "1 /");
        assert_eq!(text(&second).await, "2 /");
        assert_eq!(text(&first).await, "1 /");
    }
}
