//! The baseline for the intake's cold start (`scripts/cold-start`): a `lambda_http` function
//! that answers every request with 200 and does nothing else, built with the same profile.

use lambda_http::{run, service_fn, Body, Error, Request, Response};

#[tokio::main]
async fn main() -> Result<(), Error> {
    run(service_fn(|_: Request| async {
        Ok::<_, Error>(Response::new(Body::from("hello")))
    }))
    .await
}
