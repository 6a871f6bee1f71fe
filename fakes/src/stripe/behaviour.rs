//! The fake Stripe asked directly: each behaviour as Stripe's pages say.

/// The meter side.
mod meter {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use chrono::{TimeDelta, Utc};
    use serde_json::{json, Value};

    use crate::stripe::{Asked, FakeStripe, Fault};

    async fn post(
        server: &wiremock::MockServer,
        endpoint: &str,
        key: &str,
        form: &[(&str, &str)],
    ) -> (u16, Value) {
        let answer = reqwest::Client::new()
            .post(format!("{}{endpoint}", server.uri()))
            .header("Idempotency-Key", key)
            .form(form)
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        (status, answer.json().await.unwrap_or(Value::Null))
    }

    fn event<'a>(identifier: &'a str, value: &'a str, at: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("event_name", "api_calls"),
            ("identifier", identifier),
            ("timestamp", at),
            ("payload[stripe_customer_id]", "cus_fake"),
            ("payload[value]", value),
        ]
    }

    #[tokio::test]
    async fn the_fake_replays_saved_answers_and_dedupes_identifiers_as_stripe_does() {
        let fake = FakeStripe::default();
        let server = fake.serve().await;
        let minute = (Utc::now().timestamp() / 60 - 1) * 60;
        let at = (minute + 5).to_string();
        let events = "/v1/billing/meter_events";

        // A 500 is saved: the same key gets it again, though Stripe is well now.
        fake.then(Fault::Fails(500, json!({"error": {"type": "api_error"}})));
        assert_eq!(
            post(&server, events, "k1", &event("bi_1", "3", &at))
                .await
                .0,
            500
        );
        assert_eq!(
            post(&server, events, "k1", &event("bi_1", "3", &at))
                .await
                .0,
            500
        );
        // Another key reaches the endpoint.
        assert_eq!(
            post(&server, events, "k2", &event("bi_1", "3", &at))
                .await
                .0,
            200
        );
        // The same key with other parameters: 400 idempotency_error.
        let (status, body) = post(&server, events, "k2", &event("bi_1", "4", &at)).await;
        assert_eq!(
            (status, body["error"]["type"].as_str()),
            (400, Some("idempotency_error"))
        );
        // The identifier again under a new key: "already exists".
        let (status, body) = post(&server, events, "k3", &event("bi_1", "3", &at)).await;
        assert_eq!(status, 400);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already exists"));
        // After 24 hours the identifier is new again, and the old key pruned.
        fake.age(TimeDelta::hours(25));
        assert_eq!(
            post(&server, events, "k3", &event("bi_1", "3", &at))
                .await
                .0,
            200
        );
        assert_eq!(fake.events().len(), 2);
        // Out of its window: refused.
        let old = (Utc::now() - TimeDelta::days(36)).timestamp().to_string();
        assert_eq!(
            post(&server, events, "k4", &event("bi_2", "1", &old))
                .await
                .0,
            400
        );

        // A key still executing: 409, and the first request's answer is saved when it ends.
        fake.then(Fault::Slow(Duration::from_millis(600)));
        let slow = {
            let server_uri = server.uri();
            let form: Vec<(String, String)> = event("bi_3", "2", &at)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            tokio::spawn(async move {
                reqwest::Client::new()
                    .post(format!("{server_uri}{events}"))
                    .header("Idempotency-Key", "k5")
                    .form(&form)
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(
            post(&server, events, "k5", &event("bi_3", "2", &at))
                .await
                .0,
            409
        );
        assert_eq!(slow.await.unwrap(), 200);
        assert_eq!(
            post(&server, events, "k5", &event("bi_3", "2", &at))
                .await
                .0,
            200
        );

        // The summaries count what it took: 3 (twice, a day apart) and 2 in that minute.
        let summary: Value = reqwest::Client::new()
            .get(format!(
                "{}/v1/billing/meters/mtr_api/event_summaries",
                server.uri()
            ))
            .query(&[
                ("customer", "cus_fake"),
                ("start_time", &minute.to_string()),
                ("end_time", &(minute + 60).to_string()),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(summary["data"][0]["aggregated_value"], 8.0);

        // A cancel within 24 hours of receipt takes an event out; after, it is refused.
        let adjustments = "/v1/billing/meter_event_adjustments";
        let cancel = [
            ("event_name", "api_calls"),
            ("type", "cancel"),
            ("cancel[identifier]", "bi_3"),
        ];
        assert_eq!(post(&server, adjustments, "k6", &cancel).await.0, 200);
        assert_eq!(fake.total("cus_fake"), 6.0);
        let too_late = [
            ("event_name", "api_calls"),
            ("type", "cancel"),
            ("cancel[identifier]", "bi_1"),
        ];
        fake.age(TimeDelta::hours(25));
        assert_eq!(post(&server, adjustments, "k7", &too_late).await.0, 400);
    }

    #[tokio::test]
    async fn the_fake_reads_every_window_on_its_clock_and_asks_its_decider_per_request() {
        let fake = FakeStripe::default();
        let ahead = Utc::now() + TimeDelta::days(400);
        let clock = Arc::new(Mutex::new(ahead));
        let read = clock.clone();
        fake.clocked(Arc::new(move || *read.lock().unwrap()));
        let server = fake.serve().await;
        let events = "/v1/billing/meter_events";
        // A timestamp of the fake's time is taken, 400 days ahead of the wall clock; one of the
        // wall clock's is more than 35 days past.
        let at = ahead.timestamp().to_string();
        assert_eq!(
            post(&server, events, "k1", &event("bi_1", "2", &at))
                .await
                .0,
            200
        );
        let wall = Utc::now().timestamp().to_string();
        assert_eq!(
            post(&server, events, "k2", &event("bi_2", "2", &wall))
                .await
                .0,
            400
        );
        // 25 hours on by its clock, the identifier is new again.
        *clock.lock().unwrap() = ahead + TimeDelta::hours(25);
        assert_eq!(
            post(&server, events, "k3", &event("bi_1", "2", &at))
                .await
                .0,
            200
        );

        // The decider is asked for each request that reaches an endpoint, never for one
        // answered from a saved key.
        let asked = Arc::new(Mutex::new(Vec::new()));
        let (seen, mut first) = (asked.clone(), true);
        fake.deciding(move |a: &Asked<'_>| {
            let key = a.idempotency_key.map(str::to_owned);
            seen.lock().unwrap().push((a.identifier.to_owned(), key));
            std::mem::take(&mut first)
                .then(|| Fault::TakesThenFails(500, json!({"error": {"type": "api_error"}})))
        });
        assert_eq!(
            post(&server, events, "k4", &event("bi_3", "1", &at))
                .await
                .0,
            500
        );
        assert_eq!(
            post(&server, events, "k4", &event("bi_3", "1", &at))
                .await
                .0,
            500,
            "the saved 500"
        );
        let (status, body) = post(&server, events, "k5", &event("bi_3", "1", &at)).await;
        assert_eq!(status, 400);
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already exists"));
        assert_eq!(
            *asked.lock().unwrap(),
            [
                ("bi_3".to_owned(), Some("k4".to_owned())),
                ("bi_3".to_owned(), Some("k5".to_owned()))
            ]
        );
        assert_eq!(fake.resends(), (1, 1), "one replay, one repeat");

        // A cancel is kept with the key it came under.
        fake.no_more_faults();
        let cancel = [
            ("event_name", "api_calls"),
            ("type", "cancel"),
            ("cancel[identifier]", "bi_3"),
        ];
        assert_eq!(
            post(
                &server,
                "/v1/billing/meter_event_adjustments",
                "k6",
                &cancel
            )
            .await
            .0,
            200
        );
        let cancels = fake.cancels();
        assert_eq!(cancels.len(), 1);
        assert_eq!(cancels[0].idempotency_key.as_deref(), Some("k6"));
        assert_eq!(fake.totals()["cus_fake"], 4.0, "bi_1 twice, bi_3 cancelled");
    }
}

/// The read side and the rate limiter.
mod reads {
    use std::time::Duration;

    use chrono::{DateTime, TimeDelta, Utc};
    use serde_json::{json, Value};

    use crate::described::ProviderServer;
    use crate::stripe::{FakeStripe, Fault, On, RateSeen};

    async fn get(
        server: &ProviderServer,
        key: &str,
        path: &str,
        query: &[(&str, &str)],
        context: Option<&str>,
    ) -> (u16, Value, reqwest::header::HeaderMap) {
        let mut request = reqwest::Client::new()
            .get(format!("{}{path}", server.uri()))
            .bearer_auth(key)
            .query(query);
        if let Some(account) = context {
            request = request.header("Stripe-Account", account);
        }
        let answer = request.send().await.unwrap();
        let status = answer.status().as_u16();
        let headers = answer.headers().clone();
        (status, answer.json().await.unwrap_or(Value::Null), headers)
    }

    fn event(id: &str, created: i64, kind: &str) -> Value {
        json!({"id": id, "object": "event", "type": kind, "created": created,
               "livemode": false, "data": {"object": {"id": "sub_1", "object": "subscription"}}})
    }

    fn ids(body: &Value) -> Vec<&str> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["id"].as_str().unwrap())
            .collect()
    }

    #[tokio::test]
    async fn lists_page_newest_first_with_stripes_cursors_limits_and_filters() {
        let fake = FakeStripe::default();
        let now = Utc::now();
        fake.clock_at(now);
        let t = now.timestamp() - 3_600;
        for n in 0..5 {
            fake.has_event(event(
                &format!("evt_{n}"),
                t + n,
                "customer.subscription.updated",
            ));
        }
        fake.has_event(event("evt_paid", t + 10, "invoice.paid"));
        fake.has_undelivered_event(event("evt_lost", t + 20, "invoice.paid"));
        fake.has_event(event(
            "evt_old",
            (now - TimeDelta::days(31)).timestamp(),
            "invoice.paid",
        ));
        let server = fake.serve().await;
        let key = "sk_test_fake";

        let (status, all, headers) = get(&server, key, "/v1/events", &[], None).await;
        assert_eq!(status, 200);
        assert!(headers.get("request-id").is_some());
        assert_eq!(
            ids(&all),
            ["evt_lost", "evt_paid", "evt_4", "evt_3", "evt_2", "evt_1", "evt_0"],
            "newest first, 30 days"
        );
        assert_eq!(
            (all["object"].as_str(), all["url"].as_str()),
            (Some("list"), Some("/v1/events"))
        );
        assert_eq!(all["has_more"], false);

        let (_, first, _) = get(
            &server,
            key,
            "/v1/events",
            &[("limit", "2"), ("types[]", "customer.subscription.updated")],
            None,
        )
        .await;
        assert_eq!(
            (ids(&first), first["has_more"].as_bool()),
            (vec!["evt_4", "evt_3"], Some(true))
        );
        let (_, next, _) = get(
            &server,
            key,
            "/v1/events",
            &[
                ("limit", "2"),
                ("types[]", "customer.subscription.updated"),
                ("starting_after", "evt_3"),
            ],
            None,
        )
        .await;
        assert_eq!(ids(&next), ["evt_2", "evt_1"]);
        let (_, before, _) = get(
            &server,
            key,
            "/v1/events",
            &[("limit", "2"), ("ending_before", "evt_2")],
            None,
        )
        .await;
        assert_eq!(
            (ids(&before), before["has_more"].as_bool()),
            (vec!["evt_4", "evt_3"], Some(true))
        );
        let gte = (t + 3).to_string();
        let lt = (t + 10).to_string();
        let (_, window, _) = get(
            &server,
            key,
            "/v1/events",
            &[("created[gte]", gte.as_str()), ("created[lt]", lt.as_str())],
            None,
        )
        .await;
        assert_eq!(ids(&window), ["evt_4", "evt_3"]);
        let (_, wildcard, _) =
            get(&server, key, "/v1/events", &[("type", "invoice.*")], None).await;
        assert_eq!(ids(&wildcard), ["evt_lost", "evt_paid"]);
        let (_, lost, _) = get(
            &server,
            key,
            "/v1/events",
            &[("delivery_success", "false")],
            None,
        )
        .await;
        assert_eq!(ids(&lost), ["evt_lost"]);
        let (status, _, _) = get(&server, key, "/v1/events/evt_old", &[], None).await;
        assert_eq!(status, 404, "an event past 30 days is gone");

        // Out of range: refused by the description (limit 1-100) and by the fake alike.
        let checked = server.refused();
        assert!(checked.is_empty(), "{checked:?}");
    }

    async fn meter_event(server: &ProviderServer, identifier: &str, at: i64) -> u16 {
        let at = at.to_string();
        reqwest::Client::new()
            .post(format!("{}/v1/billing/meter_events", server.uri()))
            .bearer_auth("sk_test_x")
            .form(&[
                ("event_name", "api_calls"),
                ("identifier", identifier),
                ("timestamp", at.as_str()),
                ("payload[stripe_customer_id]", "cus_1"),
                ("payload[value]", "1"),
            ])
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    #[tokio::test]
    async fn the_meter_side_and_the_read_side_read_the_accounts_one_clock() {
        let fake = FakeStripe::default();
        let ahead = Utc::now() + TimeDelta::days(400);
        fake.clock_at(ahead);
        let day_old = (ahead - TimeDelta::days(1)).timestamp();
        fake.has_event(event("evt_recent", day_old, "invoice.paid"));
        let server = fake.serve().await;
        // The read side: a day old by the account's clock, listed (the wall clock's future).
        let (_, listed, _) = get(&server, "sk_test_x", "/v1/events", &[], None).await;
        assert_eq!(ids(&listed), ["evt_recent"]);
        // The meter side: a timestamp of the account's time is taken, one of the wall clock's
        // is more than 35 days past.
        assert_eq!(meter_event(&server, "bi_1", ahead.timestamp()).await, 200);
        assert_eq!(
            meter_event(&server, "bi_2", Utc::now().timestamp()).await,
            400
        );
        assert_eq!(
            meter_event(&server, "bi_1", ahead.timestamp()).await,
            400,
            "repeat"
        );
        // Moved on 25 hours: the identifier is new again, and the event still listed.
        fake.clock_advance(TimeDelta::hours(25));
        assert_eq!(meter_event(&server, "bi_1", ahead.timestamp()).await, 200);
        let (_, listed, _) = get(&server, "sk_test_x", "/v1/events", &[], None).await;
        assert_eq!(ids(&listed), ["evt_recent"]);
        assert_eq!(fake.now(), ahead + TimeDelta::hours(25));
    }

    #[tokio::test]
    async fn objects_are_read_in_their_account_and_a_missing_one_is_stripes_404() {
        let fake = FakeStripe::default();
        fake.holds(
            json!({"id": "sub_1", "object": "subscription", "status": "active", "created": 1}),
        );
        fake.holds_in(
            Some("acct_1"),
            json!({"id": "sub_2", "object": "subscription", "status": "active", "created": 2}),
        );
        fake.holds(
            json!({"id": "sub_3", "object": "subscription", "status": "canceled", "created": 3}),
        );
        let server = fake.serve().await;
        let key = "sk_test_fake";

        let (status, sub, _) = get(&server, key, "/v1/subscriptions/sub_1", &[], None).await;
        assert_eq!((status, sub["status"].as_str()), (200, Some("active")));
        let (status, body, headers) = get(&server, key, "/v1/subscriptions/sub_2", &[], None).await;
        assert_eq!(status, 404, "another account's object");
        assert_eq!(
            body["error"],
            json!({"type": "invalid_request_error", "code": "resource_missing",
                   "message": "No such subscription: 'sub_2'", "param": "id",
                   "doc_url": "https://stripe.com/docs/error-codes/resource-missing"})
        );
        assert!(headers.get("request-id").is_some());
        let (status, _, _) =
            get(&server, key, "/v1/subscriptions/sub_2", &[], Some("acct_1")).await;
        assert_eq!(status, 200);
        let (_, listed, _) = get(&server, key, "/v1/subscriptions", &[], None).await;
        assert_eq!(ids(&listed), ["sub_1"], "canceled ones only with a status");
        let (_, listed, _) = get(
            &server,
            key,
            "/v1/subscriptions",
            &[("status", "all")],
            None,
        )
        .await;
        assert_eq!(ids(&listed), ["sub_3", "sub_1"]);
        let (status, body, _) = get(
            &server,
            key,
            "/v1/subscriptions",
            &[("starting_after", "sub_9")],
            None,
        )
        .await;
        assert_eq!(
            (status, body["error"]["param"].as_str()),
            (404, Some("starting_after"))
        );
        let (status, _, _) = get(&server, "", "/v1/subscriptions/sub_1", &[], None).await;
        assert_eq!(status, 401, "no key");
    }

    #[tokio::test]
    async fn the_limiter_answers_429_past_each_modes_limit_per_second_and_says_what_it_saw() {
        let fake = FakeStripe::default();
        let second = DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        fake.clock_at(second);
        fake.holds(json!({"id": "sub_1", "object": "subscription", "created": 1}));
        fake.holds(json!({"id": "cus_1", "object": "customer", "created": 1}));
        let server = fake.serve().await;
        let path = "/v1/subscriptions/sub_1";

        // A sandbox: 25 a second, the 26th refused before anything runs.
        for _ in 0..25 {
            assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 200);
        }
        let (status, body, headers) = get(&server, "sk_test_x", path, &[], None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (429, Some("rate_limit"))
        );
        assert_eq!(headers["stripe-should-retry"], "true");
        assert_eq!(headers["stripe-rate-limited-reason"], "global-rate");
        assert_eq!(fake.read_count(), 25, "the endpoint never saw it");

        // The next second counts afresh; live mode takes 100, but one endpoint 25.
        fake.clock_advance(TimeDelta::seconds(1));
        for _ in 0..25 {
            assert_eq!(get(&server, "sk_live_x", path, &[], None).await.0, 200);
        }
        let (status, _, headers) = get(&server, "sk_live_x", path, &[], None).await;
        assert_eq!(
            (status, &headers["stripe-rate-limited-reason"]),
            (429, &"endpoint-rate".parse().unwrap())
        );
        assert_eq!(
            get(&server, "sk_live_x", "/v1/customers/cus_1", &[], None)
                .await
                .0,
            200
        );

        assert_eq!(
            fake.rate_seen(),
            RateSeen {
                requests: 53,
                over_limit: 2,
                peak_per_second: 27,
                peak_endpoint: 26
            }
        );
    }

    #[tokio::test]
    async fn a_scripted_fault_comes_on_top_of_the_faithful_answer() {
        let fake = FakeStripe::default();
        fake.holds(json!({"id": "sub_1", "object": "subscription", "created": 1}));
        fake.read_fails(
            On::Nth(2),
            Fault::Fails(500, json!({"error": {"type": "api_error"}})),
            1,
        );
        fake.read_fails(
            On::Path("/v1/subscriptions/sub_1".into()),
            Fault::Slow(Duration::from_secs(2)),
            1,
        );
        let server = fake.serve().await;
        let path = "/v1/subscriptions/sub_1";
        let timed_out = reqwest::Client::new()
            .get(format!("{}{path}", server.uri()))
            .bearer_auth("sk_test_x")
            .timeout(Duration::from_millis(50))
            .send()
            .await;
        assert!(
            timed_out.unwrap_err().is_timeout(),
            "slow: the client gave up"
        );
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 500);
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 200);
        fake.read_fails(On::Any, Fault::RateLimited(Some(30)), 1);
        let (status, body, headers) = get(&server, "sk_test_x", path, &[], None).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (429, Some("rate_limit"))
        );
        assert_eq!(
            (&headers["retry-after"], &headers["stripe-should-retry"]),
            (&"30".parse().unwrap(), &"true".parse().unwrap())
        );
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 200);
    }

    #[tokio::test]
    async fn a_list_leaves_out_test_clock_subscriptions_and_a_deleted_customers_entitlements() {
        let fake = FakeStripe::default();
        fake.holds(
            json!({"id": "sub_1", "object": "subscription", "created": 1,
                          "customer": "cus_1", "status": "active"}),
        );
        fake.holds(
            json!({"id": "sub_clock", "object": "subscription", "created": 2,
                          "customer": "cus_1", "status": "active", "test_clock": "clock_1"}),
        );
        fake.entitles(None, "cus_gone", &["sso"]);
        fake.holds(json!({"id": "cus_gone", "object": "customer", "deleted": true}));
        let server = fake.serve().await;
        let listed = |query: &'static [(&'static str, &'static str)]| {
            let server = &server;
            async move {
                get(server, "sk_test_x", "/v1/subscriptions", query, None)
                    .await
                    .1
            }
        };
        assert_eq!(ids(&listed(&[("status", "all")]).await), ["sub_1"]);
        assert_eq!(
            ids(&listed(&[("status", "all"), ("customer", "cus_1")]).await),
            ["sub_clock", "sub_1"]
        );
        assert_eq!(
            ids(&listed(&[("test_clock", "clock_1")]).await),
            ["sub_clock"]
        );
        let (status, body, _) = get(
            &server,
            "sk_test_x",
            "/v1/entitlements/active_entitlements",
            &[("customer", "cus_gone")],
            None,
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("resource_missing"))
        );
    }

    #[tokio::test]
    async fn a_decider_deletes_an_object_once_the_read_it_decides_is_answered() {
        let fake = FakeStripe::default();
        fake.holds(json!({"id": "sub_1", "object": "subscription", "created": 1}));
        let forgets = fake.forgetting();
        let triggers = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = triggers.clone();
        fake.deciding_reads(move |asked: &crate::stripe::Asked<'_>| {
            seen.lock().unwrap().push(asked.trigger.map(str::to_owned));
            forgets.forget("sub_1");
            None
        });
        let server = fake.serve().await;
        let path = "/v1/subscriptions/sub_1";
        let read = reqwest::Client::new()
            .get(format!("{}{path}", server.uri()))
            .bearer_auth("sk_test_x")
            .header("Stripe-Request-Trigger", "event=evt_thin")
            .send()
            .await
            .unwrap();
        assert_eq!(read.status(), 200, "the read that deletes it finds it");
        assert_eq!(get(&server, "sk_test_x", path, &[], None).await.0, 404);
        assert_eq!(
            *triggers.lock().unwrap(),
            [Some("evt_thin".to_owned()), None]
        );
    }

    #[tokio::test]
    async fn a_credit_grant_is_retrieved_as_its_latest_snapshot_and_an_unknown_one_is_missing() {
        let fake = FakeStripe::default();
        let grant = |name: &str| {
            json!({"id": "credgr_1", "object": "billing.credit_grant", "created": 1,
                   "customer": "cus_1", "name": name,
                   "amount": {"type": "monetary", "monetary": {"currency": "usd", "value": 500}}})
        };
        fake.holds(grant("first"));
        fake.holds(grant("renamed"));
        let server = fake.serve().await;
        let path = "/v1/billing/credit_grants/credgr_1";
        let (status, body, _) = get(&server, "sk_test_x", path, &[], None).await;
        assert_eq!((status, body["name"].as_str()), (200, Some("renamed")));
        let (status, body, _) = get(
            &server,
            "sk_test_x",
            "/v1/billing/credit_grants/credgr_none",
            &[],
            None,
        )
        .await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (404, Some("resource_missing"))
        );
        // Another account's grant is not this one's.
        let (status, _, _) = get(&server, "sk_test_x", path, &[], Some("acct_other")).await;
        assert_eq!(status, 404);
    }
}
