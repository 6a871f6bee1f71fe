//! Round trips to Postgres counted on the wire (docs/design.md §8): a proxy in front of the
//! server reads the client's side of the protocol and counts the messages that end a round
//! trip (`Sync`, or a simple `Query`). The intake's delivery is exactly one, pings included;
//! a connection killed between two deliveries is replaced and the delivery still stored. The
//! same proxy loses the reply to a chosen statement, closing the connection or holding it
//! open and silent, to prove what the intake and the worker do when a reply never comes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use http::StatusCode;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use shared::platform::sim::{with_interrupts, Interrupts, Point};
use shared::BoxFuture;

use crate::helpers::*;

/// The proxy's handles: the client's round trips through it, and a switch that loses the
/// reply to the next statement.
#[derive(Clone, Default)]
struct Trips {
    count: Arc<AtomicUsize>,
    next_reply: Arc<AtomicU8>,
    /// Every statement from now on is stalled, on every connection.
    stall_all: Arc<AtomicBool>,
}

/// What becomes of the replies on a connection (and, armed on [`Trips`], of the reply to
/// the next statement).
const FORWARD: u8 = 0;
/// The connection is closed in place of the reply.
const CLOSE: u8 = 1;
/// Nothing more goes either way, and the connection stays open.
const STALL: u8 = 2;

impl Trips {
    fn take(&self) -> usize {
        self.count.swap(0, Ordering::SeqCst)
    }

    /// The next statement executed through the proxy reaches the server and runs there
    /// (committed, if it commits), but its reply never reaches the client: the connection
    /// is closed instead, as a network or a failover can do.
    fn cut_next_reply(&self) {
        self.next_reply.store(CLOSE, Ordering::SeqCst);
    }

    /// The next statement reaches the server and runs there, and from then on the connection
    /// carries nothing either way while staying open: a network that drops what it carries,
    /// as a changed path to the database can after an instance was frozen.
    fn stall_next_reply(&self) {
        self.next_reply.store(STALL, Ordering::SeqCst);
    }

    /// Like [`Self::stall_next_reply`] for every statement from now on, on every connection:
    /// a database that takes what it is sent and answers nothing.
    fn stall_every_reply(&self) {
        self.stall_all.store(true, Ordering::SeqCst);
    }
}

/// A proxy on a free loopback port that forwards to `upstream` and counts round trips.
async fn counting_proxy(upstream: SocketAddr) -> (u16, Trips) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let trips = Trips::default();
    let counted = trips.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let trips = counted.clone();
            tokio::spawn(async move {
                let server = TcpStream::connect(upstream).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let cut = Arc::new(AtomicU8::new(FORWARD));
                let reply_cut = cut.clone();
                tokio::spawn(async move {
                    let _ = forward_replies(&mut server_read, &mut client_write, &reply_cut).await;
                });
                let _ = forward_counting(&mut client_read, &mut server_write, &trips, &cut).await;
            });
        }
    });
    (port, trips)
}

/// Copies the server's replies to the client until `cut` says otherwise: then closes the
/// client's side, or holds both open and copies nothing more.
async fn forward_replies(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    cut: &AtomicU8,
) -> std::io::Result<()> {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = from.read(&mut buffer).await?;
        match cut.load(Ordering::SeqCst) {
            STALL => return std::future::pending().await,
            _ if read == 0 => return to.shutdown().await,
            CLOSE => return to.shutdown().await,
            _ => to.write_all(&buffer[..read]).await?,
        }
    }
}

/// Copies the client's messages to the server, counting each `Sync` and `Query`. The
/// startup messages (no type byte; an SSL request first, refused here) are copied as they
/// come. When the proxy is armed for the next reply, the `Sync` that ends the next
/// `Execute` sets this connection's `cut` before it goes: the server answers a statement
/// only at its `Sync`, so nothing of that answer reaches the client. A stalled connection
/// takes nothing more from the client either.
async fn forward_counting(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    trips: &Trips,
    cut: &AtomicU8,
) -> std::io::Result<()> {
    const SSL_REQUEST: u32 = 80_877_103;
    loop {
        let len = from.read_u32().await?;
        let mut rest = vec![0; len as usize - 4];
        from.read_exact(&mut rest).await?;
        to.write_u32(len).await?;
        to.write_all(&rest).await?;
        let is_ssl_request = len == 8 && rest[..4] == SSL_REQUEST.to_be_bytes();
        if !is_ssl_request {
            break;
        }
    }
    let mut executed = false;
    loop {
        let kind = from.read_u8().await?;
        let len = from.read_u32().await?;
        let mut rest = vec![0; len as usize - 4];
        from.read_exact(&mut rest).await?;
        executed |= kind == b'E';
        if kind == b'S' || kind == b'Q' {
            trips.count.fetch_add(1, Ordering::SeqCst);
            if executed {
                let next = if trips.stall_all.load(Ordering::SeqCst) {
                    STALL
                } else {
                    trips.next_reply.swap(FORWARD, Ordering::SeqCst)
                };
                cut.store(next, Ordering::SeqCst);
            }
            executed = false;
        }
        to.write_u8(kind).await?;
        to.write_u32(len).await?;
        to.write_all(&rest).await?;
        if cut.load(Ordering::SeqCst) == STALL {
            return std::future::pending().await;
        }
    }
}

/// A lazy pool of one connection that goes through the proxy on `port` (without TLS, so
/// that the proxy reads the protocol).
fn through(pool: &PgPool, port: u16) -> PgPool {
    through_n(pool, port, 1)
}

/// The same with up to `connections` connections.
fn through_n(pool: &PgPool, port: u16, connections: u32) -> PgPool {
    let options: PgConnectOptions = pool
        .connect_options()
        .as_ref()
        .clone()
        .host("127.0.0.1")
        .port(port)
        .ssl_mode(PgSslMode::Disable);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(connections)
        .connect_lazy_with(options)
}

async fn upstream_of(pool: &PgPool) -> SocketAddr {
    let options = pool.connect_options().as_ref().clone();
    let host = match options.get_host() {
        "localhost" => "127.0.0.1".to_owned(),
        host => host.to_owned(),
    };
    tokio::net::lookup_host((host, options.get_port()))
        .await
        .unwrap()
        .next()
        .unwrap()
}

/// An app whose intake reaches Postgres through a counting proxy, with a queue of its own.
async fn app_through_proxy(pool: &PgPool) -> (TestApp, Trips) {
    let (port, trips) = counting_proxy(upstream_of(pool).await).await;
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let queue = shared::platform::queue::Queue::new(sqs.clone(), queue_url.clone());
    let app = TestApp::with_parts(pool.clone(), through(pool, port), sqs, queue_url, queue).await;
    (app, trips)
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn one_intake_delivery_is_one_round_trip_and_a_killed_connection_is_replaced(pool: PgPool) {
    let (app, trips) = app_through_proxy(&pool).await;
    let t = Utc::now().timestamp();

    // The first delivery opens the connection and prepares the statement.
    let (status, _) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event("evt_rt0", "cus_rt", t)),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    trips.take();

    let mut answers = Vec::new();
    for n in 1..=5 {
        let delivery = stripe_delivery(&stripe_event(&format!("evt_rt{n}"), "cus_rt", t));
        for _ in 0..2 {
            answers.push(app.post("stripe", &delivery).await.1["status"].clone());
        }
    }
    assert_eq!(
        trips.take(),
        10,
        "ten deliveries, ten round trips: no ping before or after ({answers:?})"
    );

    // The instance is frozen; meanwhile its connection is closed. The next delivery finds it
    // broken, opens another and is stored.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let (status, body) = app
        .post(
            "stripe",
            &stripe_delivery(&stripe_event("evt_rt9", "cus_rt", t)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
    let id = app.event_id("stripe", "evt_rt9").await;
    assert_eq!(app.event(id).await.seen_count, 1);
}

/// The reply to a delivery's statement is lost after the statement committed (a network or
/// a failover closes the connection in between): the intake tries once more on a new
/// connection and finds the event its first attempt stored, marked for a send that never
/// happened. It sends it now, rather than leaving it to the rescue five minutes later.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_delivery_whose_reply_was_lost_after_its_commit_is_still_sent(pool: PgPool) {
    delivered_though_its_reply_was_lost(&pool, "evt_cut", Trips::cut_next_reply, false).await;
}

/// The same for a provider's copy of a stored event: the copy is counted once and answered
/// `duplicate`, though its statement ran twice.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_copy_whose_reply_was_lost_after_its_commit_is_counted_once(pool: PgPool) {
    delivered_though_its_reply_was_lost(&pool, "evt_cutcopy", Trips::cut_next_reply, true).await;
}

/// The held connection stops answering without closing, after the statement reached the
/// server: the intake gives up on it after `STATEMENT_TIMEOUT` rather than waiting until
/// Lambda stops the instance, and stores the delivery through a new connection.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_delivery_whose_connection_stops_answering_is_stored_through_a_new_one(pool: PgPool) {
    delivered_though_its_reply_was_lost(&pool, "evt_stall", Trips::stall_next_reply, false).await;
}

/// The database takes every statement and answers none, on the held connection and on the
/// new one: the intake answers 503 within its store budget (5 s), and the provider retries,
/// rather than the delivery waiting until Lambda stops the instance.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_database_that_answers_nothing_is_answered_503(pool: PgPool) {
    let (app, trips) = app_through_proxy(&pool).await;
    let t = Utc::now().timestamp();
    let first = stripe_delivery(&stripe_event("evt_mute0", "cus_mute", t));
    assert_eq!(app.post("stripe", &first).await.0, StatusCode::OK);

    trips.stall_every_reply();
    let delivery = stripe_delivery(&stripe_event("evt_mute1", "cus_mute", t));
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(60), app.post("stripe", &delivery))
            .await
            .expect("the intake answers though the database does not");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["code"], "store_unavailable");
    // The silent statements ran: the event is stored once, and the retry will find it.
    assert_eq!(
        app.count("SELECT count(*) FROM inbox_events WHERE dedupe_key = 'evt_mute1'")
            .await,
        1
    );
}

/// The queue refuses the send, and then the database takes the statement that clears the
/// event's enqueue mark and answers nothing: the intake gives up on it after
/// `UNMARK_TIMEOUT` and answers `stored`, rather than waiting until Lambda stops the
/// instance and the provider hears a 500. Marked or not, the rescue sends the event.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_refused_send_whose_unmark_is_not_answered_is_still_answered_stored(pool: PgPool) {
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let sqs = sqs_client().await;
    let queue_url = create_queue(&sqs).await;
    let refusing = unreachable_queue().await;
    let app =
        TestApp::with_parts(pool.clone(), through(&pool, port), sqs, queue_url, refusing).await;
    let stall: Arc<dyn Interrupts> = Arc::new(ArmAt::new(
        trips,
        Point::IntakeStored,
        Trips::stall_next_reply,
    ));
    let delivery = stripe_delivery(&stripe_event(
        "evt_unmark",
        "cus_unmark",
        Utc::now().timestamp(),
    ));

    let (status, body) = tokio::time::timeout(
        Duration::from_secs(60),
        with_interrupts(stall, app.post("stripe", &delivery)),
    )
    .await
    .expect("the intake answers though the unmark is never answered");

    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "stored");
    let event = app.event(app.event_id("stripe", "evt_unmark").await).await;
    assert_eq!(event.status, "received");
    assert!(
        event.enqueued_at.is_none(),
        "the silent unmark ran on the server (only its reply was held): the rescue's rule for \
         unmarked rows sends the event"
    );
}

/// Delivers an event (a provider's copy of a stored one, when `copy`) whose statement's
/// reply `lose` keeps from the intake, after one delivery that opened the connection, and
/// checks that the second attempt answers what the first stored, that the one delivery is
/// counted and recorded once, and that the event is on its way to a worker.
async fn delivered_though_its_reply_was_lost(
    pool: &PgPool,
    key: &str,
    lose: fn(&Trips),
    copy: bool,
) {
    let (app, trips) = app_through_proxy(pool).await;
    let t = Utc::now().timestamp();
    let first = stripe_delivery(&stripe_event(&format!("{key}0"), "cus_lost", t));
    assert_eq!(app.post("stripe", &first).await.0, StatusCode::OK);
    let delivery = stripe_delivery(&stripe_event(&format!("{key}1"), "cus_lost", t));
    if copy {
        assert_eq!(app.post("stripe", &delivery).await.1["status"], "stored");
    }
    app.drain_queue().await;

    lose(&trips);
    let (status, body) =
        tokio::time::timeout(Duration::from_secs(60), app.post("stripe", &delivery))
            .await
            .expect("the intake answers though the reply never came");
    assert_eq!(status, StatusCode::OK, "{body}");
    let id = app.event_id("stripe", &format!("{key}1")).await;
    assert_eq!(body["event_id"], id);
    let (answer, verdicts) = match copy {
        true => ("duplicate", &["stored", "duplicate"][..]),
        false => ("stored", &["stored"][..]),
    };
    assert_eq!(body["status"], answer, "the first attempt's verdict");
    assert_eq!(
        app.drain_queue().await,
        [id],
        "the event is on its way to a worker"
    );
    let event = app.event(id).await;
    assert_eq!(event.status, "received");
    assert!(event.enqueued_at.is_some(), "marked as sent");
    assert_eq!(
        app.verdicts(id).await,
        verdicts,
        "the second attempt found its first's record and wrote none"
    );
    assert_eq!(event.seen_count as usize, verdicts.len(), "counted once");
}

/// Arms the proxy with `lose` (to cut or to stall the reply to the next statement) when the
/// worker reaches `point`, with any event or with `event` alone.
struct ArmAt {
    trips: Trips,
    point: Point,
    lose: fn(&Trips),
    event: Option<i64>,
}

impl ArmAt {
    fn new(trips: Trips, point: Point, lose: fn(&Trips)) -> Self {
        Self {
            trips,
            point,
            lose,
            event: None,
        }
    }
}

impl Interrupts for ArmAt {
    fn at(&self, point: Point, event_id: i64) -> Option<BoxFuture<'static, ()>> {
        if point == self.point && self.event.is_none_or(|e| e == event_id) {
            (self.lose)(&self.trips);
        }
        None
    }
}

/// The reply to the worker's writing statement is lost after the statement committed: the
/// attempt cannot record a failure (its lease is no longer held: the write finished the
/// event), so it acknowledges the message and sends the effects that write left marked for
/// a send, rather than leaving them to the rescue.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_whose_reply_was_lost_after_its_commit_still_tells_the_app(pool: PgPool) {
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let mut app = TestApp::spawn(pool.clone()).await;
    let effects_url = app.enable_effects().await;
    // A second connection, for what the worker does after its own broke.
    let mut worker = test_worker(through_n(&pool, port, 2));
    worker.catalog = app.worker.catalog.clone();
    worker.effects = app.worker.effects.clone();
    let t = Utc::now().timestamp();
    let id = app.store_stripe_event("evt_lost", "cus_lost", t).await;

    let cut = ArmAt::new(trips, Point::WorkerDecided, Trips::cut_next_reply);
    let response = armed_batch(&worker, cut, &[id]).await;
    assert!(
        response.batch_item_failures.is_empty(),
        "the event is done: its message goes"
    );
    assert_eq!(app.event(id).await.status, "applied");
    let mut written: Vec<String> = app.effects().await.into_iter().map(|e| e.id).collect();
    written.sort();
    assert!(!written.is_empty(), "the write told of a change");
    let mut sent = app.drain(&effects_url).await;
    sent.sort();
    assert_eq!(sent, written, "every effect of the write is on its way");
}

/// How many of this database's sessions are idle inside a transaction.
async fn idle_in_transaction(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND state = 'idle in transaction'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A worker's connection goes silent inside its transaction, with the event's row and its
/// account locked: the server ends the transaction once it has idled 10 s, instead of
/// keeping the locks until its TCP keepalive gives up, and the event can be claimed again.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_silent_inside_its_transaction_lets_go_of_its_locks(pool: PgPool) {
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let app = TestApp::spawn(pool.clone()).await;
    let mut worker = test_worker(through(&pool, port));
    worker.catalog = app.worker.catalog.clone();
    // A refund names its payment intent, so it is written under the account's lock.
    let mut event = stripe_event("evt_silent", "cus_silent", Utc::now().timestamp());
    event["api_version"] = "2025-03-31.basil".into();
    event["type"] = "charge.refunded".into();
    event["data"]["object"] = serde_json::json!({
        "id": "ch_silent", "object": "charge", "customer": "cus_silent",
        "payment_intent": "pi_silent", "amount": 2000, "amount_refunded": 2000,
        "refunded": true, "status": "succeeded"});
    let (_, answer) = app.post("stripe", &stripe_delivery(&event)).await;
    let id = answer["event_id"].as_i64().unwrap();

    let stall = ArmAt::new(trips, Point::WorkerLocked, Trips::stall_next_reply);
    let ids = [id];
    let work = armed_batch(&worker, stall, &ids);
    // The worker never hears again; what the server does meanwhile is what counts.
    let watch = async {
        let mut seen = false;
        for _ in 0..600 {
            let idle = idle_in_transaction(&app.pool).await;
            seen |= idle > 0;
            if seen && idle == 0 {
                return (seen, true);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (seen, false)
    };
    let (seen, ended) = tokio::select! {
        _ = work => panic!("the worker cannot finish without its connection"),
        watched = watch => watched,
    };
    assert!(seen, "the worker's transaction went silent");
    assert!(
        ended,
        "the server ended the silent transaction within a minute"
    );
    // The session leaves pg_stat_activity's "idle in transaction" a moment before its
    // backend has exited and let go of its locks: the row is taken once it has.
    let mut locked = None;
    for _ in 0..100 {
        match sqlx::query_scalar::<_, i64>(
            "SELECT id FROM inbox_events WHERE id = $1 FOR UPDATE NOWAIT",
        )
        .bind(id)
        .fetch_optional(&app.pool)
        .await
        {
            Ok(row) => {
                locked = row;
                break;
            }
            Err(e) if e.as_database_error().and_then(|d| d.code()).as_deref() == Some("55P03") => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("reading the event's row: {e}"),
        }
    }
    assert_eq!(locked, Some(id), "the event's row is no longer locked");
    assert_eq!(
        app.event(id).await.status,
        "processing",
        "nothing was written"
    );
}

/// The worker's claim reaches the server and nothing comes back: the batch is given back to
/// the queue after the event budget, rather than held until Lambda stops the invocation,
/// and the events the silent claim leased come again once their lease ends.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_whose_claim_is_not_answered_gives_the_batch_back(pool: PgPool) {
    let (app, worker, trips) = app_and_worker_with_one_proxied_connection(&pool).await;
    let t = Utc::now().timestamp();
    let id = app
        .store_stripe_event("evt_mute_claim", "cus_mute_claim", t)
        .await;

    trips.stall_next_reply();
    let response = tokio::time::timeout(
        Duration::from_secs(60),
        shared::handlers::worker::handle_batch(&worker, sqs_batch(&[id])),
    )
    .await
    .expect("the batch ends though its claim was never answered");

    let failed = failed_messages(&response);
    assert_eq!(failed, [format!("m{id}")], "the message comes again");
    let event = app.event(id).await;
    assert_eq!(
        event.status, "processing",
        "the silent claim ran: {event:?}"
    );

    // Once the lease ends, the event is claimed again and applied on a new connection.
    sqlx::query("UPDATE inbox_events SET locked_until = now() - interval '1 second' WHERE id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    let response = shared::handlers::worker::handle_batch(&worker, sqs_batch(&[id])).await;
    assert!(response.batch_item_failures.is_empty());
    assert_eq!(app.event(id).await.status, "applied");
}

/// The worker's connection goes silent in the middle of a batch, outside any transaction:
/// the event it was on is given up after the worker's budget for one event and left to the
/// queue's redelivery, its connection is closed, and the rest of the batch is applied on
/// another, rather than the whole batch waiting until Lambda stops the invocation.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_whose_connection_goes_silent_mid_batch_applies_the_rest_on_another(pool: PgPool) {
    // One connection: the silent one must leave the pool for another to be had.
    let (app, worker, trips) = app_and_worker_with_one_proxied_connection(&pool).await;
    let t = Utc::now().timestamp();
    let mut ids = Vec::new();
    for n in 0..3 {
        let event = stripe_event(&format!("evt_mute{n}"), &format!("cus_mute{n}"), t);
        let (_, answer) = app.post("stripe", &stripe_delivery(&event)).await;
        ids.push(answer["event_id"].as_i64().unwrap());
    }

    // The second event's read reaches the server, and nothing comes back.
    let stall = ArmAt {
        event: Some(ids[1]),
        ..ArmAt::new(trips, Point::WorkerClaimed, Trips::stall_next_reply)
    };
    let response = tokio::time::timeout(Duration::from_secs(60), armed_batch(&worker, stall, &ids))
        .await
        .expect("the batch ends though a connection went silent");

    let failed = failed_messages(&response);
    assert_eq!(
        failed,
        [format!("m{}", ids[1])],
        "only the silent event comes again"
    );
    assert_eq!(app.event(ids[0]).await.status, "applied");
    assert_eq!(
        app.event(ids[1]).await.status,
        "processing",
        "nothing was written"
    );
    assert_eq!(
        app.event(ids[2]).await.status,
        "applied",
        "the rest of the batch went on"
    );
}

/// Waits until every connection of `pool` is back in it: sqlx pings a connection on its
/// way back, in a task of its own, after the caller has let go of it. Bounded (5 s).
async fn returned(pool: &PgPool) {
    for _ in 0..500 {
        if pool.num_idle() as u32 == pool.size() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("a connection never came back to the pool");
}

/// An SQS batch naming `ids`, as the event source mapping builds it.
/// An app, and a worker of its own whose one pooled connection goes through a counting
/// proxy, with a budget of 1 s per event.
async fn app_and_worker_with_one_proxied_connection(
    pool: &PgPool,
) -> (TestApp, shared::handlers::worker::WorkerState, Trips) {
    let (port, trips) = counting_proxy(upstream_of(pool).await).await;
    let app = TestApp::spawn(pool.clone()).await;
    let mut worker = test_worker(through(pool, port));
    worker.catalog = app.worker.catalog.clone();
    worker.event_budget = Duration::from_secs(1);
    (app, worker, trips)
}

/// The worker's handling of a batch of `ids`, with the proxy armed by `arm`.
async fn armed_batch(
    worker: &shared::handlers::worker::WorkerState,
    arm: ArmAt,
    ids: &[i64],
) -> aws_lambda_events::event::sqs::SqsBatchResponse {
    let batch = sqs_batch(ids);
    with_interrupts(
        Arc::new(arm),
        shared::handlers::worker::handle_batch(worker, batch),
    )
    .await
}

/// The messages a batch response asks SQS to deliver again.
fn failed_messages(response: &aws_lambda_events::event::sqs::SqsBatchResponse) -> Vec<String> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect()
}

/// Stores `events`, works the first alone (it opens the connection and prepares the
/// statements), then the other ten as one batch through a counting proxy: the app, the
/// events' ids and the measured batch's round trips, its connection back in the pool.
async fn measured_batch(pool: &PgPool, events: &[serde_json::Value]) -> (TestApp, Vec<i64>, usize) {
    let (port, trips) = counting_proxy(upstream_of(pool).await).await;
    let app = TestApp::spawn(pool.clone()).await;
    let mut worker = test_worker(through(pool, port));
    worker.catalog = app.worker.catalog.clone();
    let mut ids = Vec::new();
    for event in events {
        let (_, answer) = app.post("stripe", &stripe_delivery(event)).await;
        ids.push(answer["event_id"].as_i64().unwrap());
    }
    shared::handlers::worker::handle_batch(&worker, sqs_batch(&ids[..1])).await;
    returned(&worker.pool).await;
    trips.take();
    let response = shared::handlers::worker::handle_batch(&worker, sqs_batch(&ids[1..])).await;
    assert!(response.batch_item_failures.is_empty());
    returned(&worker.pool).await;
    (app, ids, trips.take())
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_worker_batch_is_claimed_in_one_statement_and_worked_on_one_connection(pool: PgPool) {
    let t = Utc::now().timestamp();
    let events: Vec<_> = (0..11)
        .map(|n| stripe_event(&format!("evt_w{n}"), &format!("cus_w{n}"), t))
        .collect();
    let (app, ids, trips) = measured_batch(&pool, &events).await;
    // Each event: the read of its account's registers, and the one statement that writes
    // the subscription, the grant, the log line and the finish. The batch: one ping on
    // acquire, one claim, one ping on release. No ping between events.
    assert_eq!(trips, 3 + 10 * 2);
    for id in &ids {
        assert_eq!(app.event(*id).await.status, "applied");
    }
}

/// An event about an account that changes nothing (here Stripe's `invoice.created`, which
/// no register follows) decides nothing from the account: one statement writes its log line
/// and finishes it, with no read, and the account's version stays where it was.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_ignored_event_about_an_account_is_one_round_trip(pool: PgPool) {
    let t = Utc::now().timestamp();
    let events: Vec<_> = (0..11)
        .map(|n| {
            let mut event = stripe_event(&format!("evt_i{n}"), "cus_i", t);
            event["type"] = "invoice.created".into();
            event["data"]["object"] = serde_json::json!({
                "id": format!("in_i{n}"), "object": "invoice", "customer": "cus_i",
                "status": "draft", "subscription": "sub_1"
            });
            event
        })
        .collect();
    let (app, ids, trips) = measured_batch(&pool, &events).await;
    // The batch's ping on acquire, its claim and its ping on release; one per event.
    assert_eq!(trips, 3 + 10);
    let version: i64 = app
        .count("SELECT version FROM accounts WHERE source = 'stripe' AND customer_id = 'cus_i'")
        .await;
    assert_eq!(
        version, 1,
        "the first event made the account; none moved it"
    );
    for id in &ids {
        let row = app.event(*id).await;
        assert_eq!(row.status, "ignored");
        assert_eq!(
            row.reason.as_deref(),
            Some("event type invoice.created is not a billing event")
        );
    }
    let logged: i64 = app
        .count(
            "SELECT count(*) FROM account_log WHERE customer_id = 'cus_i' AND outcome = 'ignored'",
        )
        .await;
    assert_eq!(logged, 11);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_app_api_read_and_feature_check_are_one_round_trip_and_a_debit_one_with_effects_off(
    pool: PgPool,
) {
    use crate::app_api::{api_state, call, debit, on_pro, APP_KEY};
    let app = TestApp::spawn(pool.clone()).await;
    on_pro(&app, "kc_rt").await;
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let state = api_state(&through(&pool, port));
    let path = "/v1/accounts/kinde/kc_rt";
    let feature = "/v1/accounts/kinde/kc_rt/features/sso";
    // The first requests open the connection and prepare the statements.
    call(&state, "GET", path, Some(APP_KEY), &[], None).await;
    debit(&state, "kc_rt", "rt-warm", serde_json::json!({"amount": 1})).await;
    trips.take();

    for n in 0..5 {
        let read = call(&state, "GET", path, Some(APP_KEY), &[], None).await;
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(trips.take(), 1, "read {n}");
        // A feature check is the account's read: the same one statement.
        let check = call(&state, "GET", feature, Some(APP_KEY), &[], None).await;
        assert_eq!(check.status, StatusCode::OK);
        assert_eq!(trips.take(), 1, "feature check {n}");
        let spent = debit(
            &state,
            "kc_rt",
            &format!("rt-{n}"),
            serde_json::json!({"amount": 2}),
        )
        .await;
        assert_eq!(spent.status, StatusCode::OK);
        assert_eq!(trips.take(), 1, "debit {n}");
    }
    // A key sent again is answered from what it stored, in one round trip too.
    let again = debit(&state, "kc_rt", "rt-0", serde_json::json!({"amount": 2})).await;
    assert_eq!(again.body["replayed"], true);
    assert_eq!(trips.take(), 1);
}

#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn an_account_read_is_one_round_trip_and_a_debit_one_or_two_with_effects(pool: PgPool) {
    use shared::billing::usage::{self, Debit, DebitPeriod, DebitRequest};
    use shared::domain::Period;
    let app = TestApp::spawn(pool.clone()).await;
    let claims = serde_json::json!({"type": "customer.plan_changed",
        "event_timestamp": "2026-03-01T00:00:00Z",
        "data": {"customer_id": "kc_trips", "plan": {"key": "pro"}}});
    app.post("kinde", &kinde_delivery("k_trips", &claims)).await;
    app.run_worker().await;
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let proxied = through(&pool, port);
    let mut conn = proxied.acquire().await.unwrap();
    let customer = shared::domain::CustomerId::parse("kc_trips").unwrap();
    let period = Period::parse("2026-03").unwrap();
    let catalog = app.worker.catalog.clone();
    // The connection's first use of a statement prepares it (a round trip of its own); a
    // function's connection has them prepared after its first request.
    let warm = DebitRequest {
        source: "kinde",
        customer: &customer,
        key: "req_warm",
        amount: 1,
        period: DebitPeriod::Named(Period::parse("2026-04").unwrap()),
        note: None,
        effects: Some(&catalog),
        meter: None,
        unit: shared::billing::credits::ALLOWANCE_UNIT,
    };
    usage::debit(&mut conn, &warm).await.unwrap();
    trips.take();

    let snapshot =
        shared::billing::account::snapshot(&mut conn, "kinde", &customer, &period, &catalog)
            .await
            .unwrap()
            .unwrap();
    assert_eq!((snapshot.plan.as_str(), snapshot.remaining), ("pro", 500));
    assert_eq!(trips.take(), 1, "a read is one round trip");

    let mut request = DebitRequest {
        source: "kinde",
        customer: &customer,
        key: "req_1",
        amount: 3,
        period: DebitPeriod::Named(period.clone()),
        note: None,
        effects: None,
        meter: None,
        unit: shared::billing::credits::ALLOWANCE_UNIT,
    };
    let debited = usage::debit(&mut conn, &request).await.unwrap();
    assert!(matches!(
        debited.debit,
        Debit::Accepted { remaining: 497, .. }
    ));
    assert_eq!(
        trips.take(),
        1,
        "a debit with effects off is one round trip"
    );

    request.key = "req_2";
    request.amount = 497;
    request.effects = Some(&catalog);
    let debited = usage::debit(&mut conn, &request).await.unwrap();
    assert!(matches!(
        debited.debit,
        Debit::Accepted { remaining: 0, .. }
    ));
    assert!(debited.told.is_some());
    assert_eq!(
        trips.take(),
        2,
        "with effects on, the snapshot for the plan and the debit"
    );

    let nobody = shared::domain::CustomerId::parse("kc_nobody").unwrap();
    request.customer = &nobody;
    let debited = usage::debit(&mut conn, &request).await.unwrap();
    assert_eq!(debited.debit, Debit::UnknownCustomer);
    assert_eq!(trips.take(), 1, "no account: the snapshot says so");
}

/// The child of the test below: with `DATABASE_POOLER=transaction` (this process's alone),
/// the round trips of an intake delivery, of a worker's batch and of an api read and debit.
const UNNAMED_CHILD: &str =
    "round_trips::unnamed_statements_cost_what_the_pooler_test_says_when_run_as_a_child";
const UNNAMED_CHILD_DB: &str = "INBOX_ROUND_TRIPS_CHILD_DB";

/// A no-op unless the test below runs it as its child.
#[tokio::test]
async fn unnamed_statements_cost_what_the_pooler_test_says_when_run_as_a_child() {
    use crate::app_api::{api_state, call, debit, on_pro, APP_KEY};
    let Ok(url) = std::env::var(UNNAMED_CHILD_DB) else {
        return;
    };
    let config = shared::platform::config::DatabaseConfig::read(|var| match var {
        shared::platform::config::DATABASE_URL_VAR => Some(url.clone()),
        shared::platform::config::DATABASE_POOLER_VAR => Some("transaction".into()),
        _ => None,
    })
    .unwrap();
    let database = shared::platform::database::Database::open(&config)
        .await
        .unwrap();
    assert!(shared::platform::database::sends_unnamed_statements());
    let pool = database.pool(2);

    // An autocommit statement: BEGIN, Parse/Describe/Sync, Bind/Execute/Sync, COMMIT.
    let (app, trips) = app_through_proxy(&pool).await;
    let t = Utc::now().timestamp();
    for n in 0..=5 {
        let delivery = stripe_delivery(&stripe_event(&format!("evt_un{n}"), "cus_un", t));
        let (status, _) = app.post("stripe", &delivery).await;
        assert_eq!(status, StatusCode::OK);
        if n == 0 {
            trips.take();
        }
    }
    assert_eq!(
        trips.take(),
        5 * 4,
        "four round trips per delivery, not one"
    );

    // The worker's batch of ignored events: pings (acquire, release), the claim, and each
    // event's one statement, each in a transaction of its own.
    let events: Vec<_> = (0..11)
        .map(|n| {
            let mut event = stripe_event(&format!("evt_ui{n}"), "cus_ui", t);
            event["type"] = "invoice.created".into();
            event["data"]["object"] = serde_json::json!({
                "id": format!("in_ui{n}"), "object": "invoice", "customer": "cus_ui",
                "status": "draft", "subscription": "sub_1"
            });
            event
        })
        .collect();
    let (_, _, batch) = measured_batch(&pool, &events).await;
    assert_eq!(batch, 2 + 4 + 10 * 4, "3 + 10 with named statements");

    on_pro(&app, "kc_un").await;
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let state = api_state(&through(&pool, port));
    let path = "/v1/accounts/kinde/kc_un";
    call(&state, "GET", path, Some(APP_KEY), &[], None).await;
    trips.take();
    let read = call(&state, "GET", path, Some(APP_KEY), &[], None).await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(trips.take(), 4, "a read: 1 with named statements");
    let check = call(
        &state,
        "GET",
        &format!("{path}/features/sso"),
        Some(APP_KEY),
        &[],
        None,
    )
    .await;
    assert_eq!(check.status, StatusCode::OK);
    assert_eq!(trips.take(), 4, "a feature check: 1 with named statements");
    let spent = debit(&state, "kc_un", "un-1", serde_json::json!({"amount": 2})).await;
    assert_eq!(spent.status, StatusCode::OK);
    assert_eq!(trips.take(), 4, "a debit: 1 with named statements");
}

/// What sending every statement unnamed, each in a transaction, costs on the wire
/// (`DATABASE_POOLER=transaction`, docs/deploy.md "RDS Proxy"): counted through the same proxy
/// as above, in a process of its own, since the setting is the process's.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn with_the_pooler_setting_an_autocommit_statement_is_four_round_trips(pool: PgPool) {
    let db: String = sqlx::query_scalar("SELECT current_database()")
        .fetch_one(&pool)
        .await
        .unwrap();
    let options = pool.connect_options();
    let url = format!(
        "postgres://{}@{}:{}/{db}",
        options.get_username(),
        options.get_host(),
        options.get_port()
    );
    let (code, output) = tokio::task::spawn_blocking(move || {
        crate::pooler::run_test_as_child(UNNAMED_CHILD, &[(UNNAMED_CHILD_DB, &url)])
    })
    .await
    .unwrap();
    assert_eq!(code, Some(0), "the child's output:\n{output}");
    assert!(output.contains("1 passed"), "{output}");
}

/// A flood of junk at the webhook route (each delivery refused 401) costs the database one
/// write for the instance's window, not one a refusal: written each, the count's one hot row
/// (a source's minute) would hold a connection per request for up to the count's budget. The
/// first refusal is written at once, so a source whose secret stopped matching shows at once.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_flood_of_refused_deliveries_is_counted_without_a_write_each(pool: PgPool) {
    let (mut app, trips) = app_through_proxy(&pool).await;
    let clock = shared::handlers::api::SetClock::at(Utc::now());
    app.state.clock = shared::handlers::api::Clock::Set(clock.clone());
    let t = Utc::now().timestamp();
    let mut junk = stripe_delivery(&stripe_event("evt_junk", "cus_junk", t));
    junk.body = b"{}".to_vec();
    // The connection is open and the count's statement prepared.
    assert_eq!(app.post("stripe", &junk).await.0, StatusCode::UNAUTHORIZED);
    trips.take();

    clock.set(clock.now() + shared::operate::refusals::WINDOW);
    for _ in 0..50 {
        assert_eq!(app.post("stripe", &junk).await.0, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(trips.take(), 1, "one write for fifty refusals");
    let written: i64 = sqlx::query_scalar(
        "SELECT COALESCE(sum(count), 0)::bigint FROM intake_refusals WHERE source = 'stripe'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(written, 2, "the first of each window, written at once");
}

/// The credits read (docs/design.md §4.14) is one statement: the account's grants and their
/// transactions, with the time they are read as of, in one round trip.
#[sqlx::test(migrator = "shared::MIGRATOR")]
async fn a_credits_read_is_one_round_trip(pool: PgPool) {
    use crate::app_api::{api_state, call, READER_KEY};
    sqlx::raw_sql(
        "INSERT INTO accounts (source, customer_id) VALUES ('stripe', 'cus_crt');
         INSERT INTO credit_grants (source, customer_id, grant_id, origin, unit, scope, amount,
             category, created_at, version_at, version_key, event_id)
         VALUES ('stripe', 'cus_crt', 'credgr_1', 'stripe_credit_grant', 'usd', 'all', 1000,
             'paid', now(), now(), 'evt_1', 1);
         INSERT INTO credit_transactions (source, transaction_id, grant_id, kind, amount,
             effective_at, event_id)
         VALUES ('stripe', 'cbtxn_1', 'credgr_1', 'credits_applied', 300, now(), 2)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let (port, trips) = counting_proxy(upstream_of(&pool).await).await;
    let state = api_state(&through(&pool, port));
    let path = "/v1/accounts/stripe/cus_crt/credits";
    call(&state, "GET", path, Some(READER_KEY), &[], None).await;
    trips.take();
    for n in 0..5 {
        let read = call(&state, "GET", path, Some(READER_KEY), &[], None).await;
        assert_eq!(read.status, StatusCode::OK);
        assert_eq!(read.body["balances"][0]["available"], "700");
        assert_eq!(trips.take(), 1, "credits read {n}");
    }
}
