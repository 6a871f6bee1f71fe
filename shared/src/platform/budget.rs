//! One budget of provider API calls per source, shared by every function instance through
//! Postgres (docs/design.md §6.7): a token bucket in a row of `api_budgets`, taken by one
//! statement per call, so that thin-event reads, reconciliation, sweeps and meter reports of
//! a source, in however many Lambda instances, together stay under the provider's rate limit;
//! and the provider's own word after a 429, which holds every instance off until the time it
//! said. A provider that limits each endpoint apart (Stripe) gives each endpoint a bucket of
//! its own too, taken in the same statement as the source's.

use std::time::Duration;

use chrono::{DateTime, Utc};
use http::{HeaderMap, StatusCode};
use sqlx::PgPool;

use crate::platform::config::LimitSetting;
use crate::platform::db::exec;

/// Whose call takes from a budget. Meter reports keep a share of the bucket that reads never
/// take, so that a burst of thin events or a long reconciliation cannot starve them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Object reads, reconciliation, health sweeps, the meter audit.
    Reads,
    /// Meter reports: their sends and read-backs.
    Meter,
}

/// A source's budget: the calls per second its bucket refills, the most it holds (a burst),
/// and the part of it only meter reports take. In any span of `t` seconds at most
/// `burst + per_second × t` calls go out, whatever the number of instances.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub per_second: f64,
    pub burst: u32,
    pub reserved: u32,
    /// The span the provider counts its published limit over (a second for Stripe, a minute
    /// for the others): a 429 that names no pause holds the source off for one.
    pub window: Duration,
}

impl Limit {
    /// `setting` over `default`: why not, when the result is no budget at all.
    pub fn set(default: Limit, setting: &LimitSetting) -> Result<Limit, String> {
        let limit = Limit {
            per_second: setting.per_second.unwrap_or(default.per_second),
            burst: setting.burst.unwrap_or(default.burst),
            reserved: setting.reserved.unwrap_or(default.reserved),
            window: default.window,
        };
        if !(limit.per_second.is_finite() && limit.per_second > 0.0) {
            return Err("per_second must be a number above 0".into());
        }
        if limit.burst == 0 {
            return Err("burst must be at least 1".into());
        }
        if limit.reserved >= limit.burst {
            return Err(format!(
                "reserved ({}) must be below burst ({}): reads must be able to take one",
                limit.reserved, limit.burst
            ));
        }
        Ok(limit)
    }

    /// The tokens a call of `lane` must leave in the bucket.
    pub fn leaves(&self, lane: Lane) -> u32 {
        match lane {
            Lane::Reads => self.reserved,
            Lane::Meter => 0,
        }
    }

    /// The most calls this budget lets out in any span of `secs` seconds.
    pub fn most_in(&self, secs: f64) -> f64 {
        f64::from(self.burst) + self.per_second * secs
    }
}

/// How a provider that limits each endpoint apart names an endpoint, and each one's budget
/// (docs/design.md §6.7): the provider's rule, handed to the budget, which knows no provider.
#[derive(Debug, Clone, Copy)]
pub struct Endpoints {
    /// The endpoint a request counts against (a method and path with its ids taken out), or
    /// `None` for one the provider does not limit apart (or limits far above the source).
    pub of: fn(&http::Method, &str) -> Option<String>,
    /// Each endpoint's budget. Its `reserved` is 0: the meter reports' share is kept in the
    /// source's bucket, and their sends have endpoints of their own.
    pub limit: Limit,
}

/// One endpoint's bucket, for one call.
struct Endpoint {
    key: String,
    limit: Limit,
}

/// The key of a source's own row in `api_budgets` (its endpoints' rows name theirs).
const SOURCE_ROW: &str = "";

/// Where every source's budget is kept, and how long a call waits for a token before it gives
/// up on the call (and its item waits, its attempt not spent).
#[derive(Clone, Debug)]
pub struct Budgets {
    pool: PgPool,
    pub wait: Duration,
}

/// How long a call waits for a token by default: a worker's provider read has 5 s.
pub const WAIT: Duration = Duration::from_secs(2);

impl Budgets {
    pub fn new(pool: PgPool) -> Self {
        Self { pool, wait: WAIT }
    }

    /// The same store, a call waiting at most `wait` for a token.
    pub fn waiting(self, wait: Duration) -> Self {
        Self { wait, ..self }
    }

    /// The budget of `source`, for calls of `lane`.
    pub fn of(&self, source: &str, limit: Limit, lane: Lane) -> Budget {
        Budget {
            budgets: self.clone(),
            source: source.to_owned(),
            limit,
            lane,
            endpoints: None,
        }
    }
}

/// One source's budget, as one kind of caller takes from it.
#[derive(Clone, Debug)]
pub struct Budget {
    budgets: Budgets,
    source: String,
    limit: Limit,
    lane: Lane,
    endpoints: Option<Endpoints>,
}

/// A call not made: the source's budget is spent, or its provider asked for a pause (429). The
/// item it was made for waits until `until`, its attempt not spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}; source '{source_name}' calls its provider again from {until}")]
pub struct Throttled {
    pub source_name: String,
    pub until: DateTime<Utc>,
    pub why: String,
}

impl Throttled {
    /// The throttle in an error's chain, if that is what it is.
    pub fn find(error: &anyhow::Error) -> Option<&Throttled> {
        error.chain().find_map(|e| e.downcast_ref::<Throttled>())
    }
}

/// Why a take refused.
struct Refusal {
    until: DateTime<Utc>,
    why: String,
}

/// One row of a take, as the statement left it.
struct Row {
    endpoint: String,
    tokens: f64,
    held_until: Option<DateTime<Utc>>,
}

impl Budget {
    pub fn limit(&self) -> Limit {
        self.limit
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The same budget, each call also taking from its endpoint's bucket as `endpoints` names
    /// it (a provider that limits each endpoint apart).
    pub fn by_endpoint(self, endpoints: Option<Endpoints>) -> Self {
        Self { endpoints, ..self }
    }

    /// The endpoint `method` `path` counts against, with its budget, when the provider limits
    /// endpoints apart.
    fn endpoint(&self, method: &http::Method, path: &str) -> Option<Endpoint> {
        let endpoints = self.endpoints?;
        (endpoints.of)(method, path).map(|key| Endpoint {
            key,
            limit: endpoints.limit,
        })
    }

    /// Takes one call of the source's budget alone.
    pub async fn take(&self) -> anyhow::Result<()> {
        self.take_at(None).await
    }

    /// Takes one call of `method` `path`: from the source's budget and, when the provider
    /// limits endpoints apart, from its endpoint's, both or neither.
    pub async fn take_for(&self, method: &http::Method, path: &str) -> anyhow::Result<()> {
        self.take_at(self.endpoint(method, path).as_ref()).await
    }

    /// Takes one call: at once when the buckets hold one for this lane, after a short wait when
    /// one comes within [`Budgets::wait`], else [`Throttled`] with the time it will.
    async fn take_at(&self, endpoint: Option<&Endpoint>) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        loop {
            let Some(refusal) = self.try_take(endpoint).await? else {
                return Ok(());
            };
            let wait = (refusal.until - Utc::now()).to_std().unwrap_or_default();
            if started.elapsed() + wait > self.budgets.wait {
                return Err(Throttled {
                    source_name: self.source.clone(),
                    until: refusal.until,
                    why: refusal.why,
                }
                .into());
            }
            // Never a busy loop: a take that lost a token to another instance waits a little.
            tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
        }
    }

    /// The rows a take of `endpoint` takes from: the source's, and the endpoint's when there is
    /// one; each with its rate, burst and the tokens its lane must leave.
    fn rows(&self, endpoint: Option<&Endpoint>) -> (Vec<String>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut rows = (
            vec![SOURCE_ROW.to_owned()],
            vec![self.limit.per_second],
            vec![f64::from(self.limit.burst)],
            vec![f64::from(self.limit.leaves(self.lane))],
        );
        if let Some(endpoint) = endpoint {
            rows.0.push(endpoint.key.clone());
            rows.1.push(endpoint.limit.per_second);
            rows.2.push(f64::from(endpoint.limit.burst));
            rows.3.push(f64::from(endpoint.limit.leaves(self.lane)));
        }
        rows
    }

    /// One statement takes a token from the source's row and the endpoint's together, when no
    /// pause the provider asked for holds either and each, refilled for the time since its last
    /// take, holds one beyond what this lane must leave; else it takes from neither and counts
    /// the refusal on the rows that refused. The rows are locked in one order (by endpoint), so
    /// concurrent takes of any instance queue on them and never deadlock. A row not made yet is
    /// made full (once per source and endpoint) and the take made again.
    async fn try_take(&self, endpoint: Option<&Endpoint>) -> Result<Option<Refusal>, sqlx::Error> {
        let (keys, rates, bursts, leaves) = self.rows(endpoint);
        for _ in 0..2 {
            let rows = sqlx::query!(
                r#"
                WITH wanted AS (
                    SELECT * FROM unnest($2::text[], $3::float8[], $4::float8[], $5::float8[])
                        AS w(endpoint, per_second, burst, leaves)
                ),
                locked AS (
                    SELECT b.endpoint, w.leaves,
                           (b.held_until IS NOT NULL AND b.held_until > inbox_now()) AS held,
                           least(w.burst, b.tokens + w.per_second * greatest(0, extract(epoch FROM inbox_now() - b.refilled_at)::float8)) AS tokens
                    FROM api_budgets b JOIN wanted w ON w.endpoint = b.endpoint
                    WHERE b.source = $1
                    ORDER BY b.endpoint
                    FOR UPDATE OF b
                ),
                verdict AS (
                    SELECT count(*) = cardinality($2::text[]) AS made,
                           coalesce(bool_and(NOT held AND tokens >= 1 + leaves), false) AS go
                    FROM locked
                )
                UPDATE api_budgets AS b
                SET tokens = CASE WHEN v.go THEN l.tokens - 1 ELSE b.tokens END,
                    refilled_at = CASE WHEN v.go THEN greatest(b.refilled_at, inbox_now()) ELSE b.refilled_at END,
                    taken = b.taken + v.go::int,
                    refused = b.refused + (NOT v.go AND (l.held OR l.tokens < 1 + l.leaves))::int
                FROM locked l, verdict v
                WHERE v.made AND b.source = $1 AND b.endpoint = l.endpoint
                RETURNING b.endpoint, v.go AS "go!", l.tokens AS "tokens!", b.held_until,
                          inbox_now() AS "now!"
                "#,
                self.source,
                &keys,
                &rates,
                &bursts,
                &leaves,
            )
            .fetch_all(exec(&self.budgets.pool))
            .await?;
            let Some(first) = rows.first() else {
                sqlx::query!(
                    r#"
                    INSERT INTO api_budgets (source, endpoint, tokens)
                    SELECT $1, w.endpoint, w.burst FROM unnest($2::text[], $3::float8[]) AS w(endpoint, burst)
                    ON CONFLICT (source, endpoint) DO NOTHING
                    "#,
                    self.source,
                    &keys,
                    &bursts,
                )
                .execute(exec(&self.budgets.pool))
                .await?;
                continue;
            };
            if first.go {
                return Ok(None);
            }
            let now = first.now;
            let rows = rows.into_iter().map(|r| Row {
                endpoint: r.endpoint,
                tokens: r.tokens,
                held_until: r.held_until,
            });
            return Ok(Some(self.refusal(rows, endpoint, now)));
        }
        // Made meanwhile by another statement: the next take sees it.
        Ok(Some(Refusal {
            until: Utc::now(),
            why: "the source's API budget was being made".into(),
        }))
    }

    /// When a refused take can be made: the latest of the pauses held and the times the short
    /// rows refill to what this lane needs.
    fn refusal(
        &self,
        rows: impl Iterator<Item = Row>,
        endpoint: Option<&Endpoint>,
        now: DateTime<Utc>,
    ) -> Refusal {
        let mut refusal = Refusal {
            until: now,
            why: String::new(),
        };
        for row in rows {
            let limit = match (row.endpoint.as_str(), endpoint) {
                (SOURCE_ROW, _) | (_, None) => self.limit,
                (_, Some(endpoint)) => endpoint.limit,
            };
            let whose = match row.endpoint.as_str() {
                SOURCE_ROW => "the source's API budget".to_owned(),
                key => format!("the API budget of its endpoint {key}"),
            };
            let (until, why) = match row.held_until.filter(|held| *held > now) {
                Some(held) => (
                    held,
                    format!("{whose}: the provider asked for a pause (429)"),
                ),
                None => {
                    let short = (1.0 + f64::from(limit.leaves(self.lane)) - row.tokens).max(0.0);
                    if short == 0.0 {
                        continue;
                    }
                    let secs = short / limit.per_second;
                    (
                        now + chrono::Duration::milliseconds((secs * 1000.0).ceil() as i64),
                        format!("{whose} is spent for now"),
                    )
                }
            };
            if refusal.why.is_empty() || until > refusal.until {
                refusal = Refusal { until, why };
            }
        }
        refusal
    }

    /// The provider answered 429 and asked for `pause`: no instance calls it before that is
    /// over; only `method` `path`'s endpoint when the provider said the endpoint's limit was
    /// the one met ([`Pause::endpoint`]) and this budget has that endpoint. Returns the time
    /// the pause ends (the later of this and one already held).
    pub async fn hold_off(
        &self,
        pause: Pause,
        method: &http::Method,
        path: &str,
    ) -> Result<DateTime<Utc>, sqlx::Error> {
        let endpoint = match pause.endpoint {
            true => self.endpoint(method, path).map(|e| e.key),
            false => None,
        };
        sqlx::query_scalar!(
            r#"
            INSERT INTO api_budgets AS b (source, endpoint, tokens, held_until)
            VALUES ($1, $3, 0, inbox_now() + make_interval(secs => $2))
            ON CONFLICT (source, endpoint) DO UPDATE SET held_until = greatest(b.held_until, EXCLUDED.held_until)
            RETURNING b.held_until AS "held_until!"
            "#,
            self.source,
            pause.wait.as_secs_f64(),
            endpoint.as_deref().unwrap_or(SOURCE_ROW),
        )
        .fetch_one(exec(&self.budgets.pool))
        .await
    }
}

/// A pause a provider's 429 asked for: how long, and whether only the endpoint called (Stripe's
/// `Stripe-Rate-Limited-Reason: endpoint-rate` or `endpoint-concurrency`,
/// docs.stripe.com/rate-limits) or the whole source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    pub wait: Duration,
    pub endpoint: bool,
}

/// How long a provider's answer asks the client to pause, when it is a 429 that asks for
/// one: `Retry-After` in seconds (Paddle, Polar) or as an HTTP date, else `RateLimit-Reset` in
/// seconds (Kinde), else `unnamed`, the span the provider counts its limit over
/// ([`Limit::window`]: Stripe's limits are per second and its 429s carry no `Retry-After`,
/// docs.stripe.com/rate-limits; Lemon Squeezy's are per minute and its 429 documents no
/// header, docs.lemonsqueezy.com/api/getting-started). `None` for any other answer, and for a
/// 429 with `Stripe-Should-Retry: false`, Stripe's word that retrying the same request will
/// not help (an ordinary failure then).
pub fn pause_asked(
    status: StatusCode,
    headers: &HeaderMap,
    now: DateTime<Utc>,
    unnamed: Duration,
) -> Option<Duration> {
    if status != StatusCode::TOO_MANY_REQUESTS {
        return None;
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    if header("stripe-should-retry") == Some("false") {
        return None;
    }
    let seconds = |value: &str| {
        value
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64)
    };
    let asked = header("retry-after")
        .and_then(|value| {
            seconds(value).or_else(|| {
                DateTime::parse_from_rfc2822(value)
                    .ok()
                    .map(|at| (at.with_timezone(&Utc) - now).to_std().unwrap_or_default())
            })
        })
        .or_else(|| header("ratelimit-reset").and_then(seconds));
    Some(asked.unwrap_or(unnamed).min(LONGEST_PAUSE))
}

/// Whether a 429 says the limit met was the endpoint's alone: Stripe names the limiter in
/// `Stripe-Rate-Limited-Reason` (`global-rate`, `endpoint-rate`, `global-concurrency`,
/// `endpoint-concurrency`, `resource-specific`; docs.stripe.com/rate-limits), and only the
/// endpoint's need pause that endpoint alone.
pub fn endpoint_limited(headers: &HeaderMap) -> bool {
    headers
        .get("stripe-rate-limited-reason")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|reason| reason.trim().starts_with("endpoint-"))
}

/// The span a limit is counted over, per provider.
pub const PER_SECOND: Duration = Duration::from_secs(1);
pub const PER_MINUTE: Duration = Duration::from_secs(60);
/// The longest pause taken from a provider's answer: past it, the item's own retry schedule
/// takes over.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_429_pauses_as_long_as_the_provider_asks() {
        let now = Utc::now();
        let too_many = StatusCode::TOO_MANY_REQUESTS;
        assert_eq!(
            pause_asked(too_many, &headers(&[("retry-after", "7")]), now, PER_MINUTE),
            Some(Duration::from_secs(7))
        );
        let date = (now + chrono::Duration::seconds(30)).to_rfc2822();
        let pause = pause_asked(
            too_many,
            &headers(&[("retry-after", &date)]),
            now,
            PER_MINUTE,
        )
        .unwrap();
        assert!(pause <= Duration::from_secs(30) && pause >= Duration::from_secs(29));
        assert_eq!(
            pause_asked(
                too_many,
                &headers(&[("ratelimit-reset", "12")]),
                now,
                PER_MINUTE
            ),
            Some(Duration::from_secs(12)),
            "Kinde says when its limit resets"
        );
        assert_eq!(
            pause_asked(
                too_many,
                &headers(&[("stripe-should-retry", "true")]),
                now,
                PER_SECOND
            ),
            Some(PER_SECOND),
            "Stripe's 429 names no time: its limits are per second"
        );
        assert_eq!(
            pause_asked(too_many, &HeaderMap::new(), now, PER_MINUTE),
            Some(PER_MINUTE),
            "Lemon Squeezy's names none either: its limit is per minute"
        );
        assert_eq!(
            pause_asked(
                too_many,
                &headers(&[("stripe-should-retry", "false")]),
                now,
                PER_MINUTE
            ),
            None,
            "Stripe says the same request will not go through"
        );
        assert_eq!(
            pause_asked(
                StatusCode::SERVICE_UNAVAILABLE,
                &headers(&[("retry-after", "7")]),
                now,
                PER_MINUTE
            ),
            None
        );
        assert_eq!(
            pause_asked(
                too_many,
                &headers(&[("retry-after", "999999")]),
                now,
                PER_MINUTE
            ),
            Some(LONGEST_PAUSE)
        );
    }

    #[test]
    fn a_budget_setting_keeps_a_share_reads_can_never_take() {
        let default = Limit {
            per_second: 20.0,
            burst: 5,
            reserved: 2,
            window: PER_SECOND,
        };
        assert_eq!(Limit::set(default, &LimitSetting::default()), Ok(default));
        let set = Limit::set(
            default,
            &LimitSetting {
                per_second: Some(4.0),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(set.per_second, 4.0);
        assert_eq!(set.leaves(Lane::Reads), 2);
        assert_eq!(set.leaves(Lane::Meter), 0);
        assert!(Limit::set(
            default,
            &LimitSetting {
                reserved: Some(5),
                ..Default::default()
            }
        )
        .is_err());
        assert!(Limit::set(
            default,
            &LimitSetting {
                per_second: Some(0.0),
                ..Default::default()
            }
        )
        .is_err());
        assert_eq!(default.most_in(1.0), 25.0);
    }
}
