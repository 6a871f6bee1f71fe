//! One budget of provider API calls per source, shared by every function instance through
//! Postgres (docs/design.md §6.7): a token bucket in a row of `api_budgets`, taken by one
//! statement per call, so that thin-event reads, reconciliation, sweeps and meter reports of
//! a source, in however many Lambda instances, together stay under the provider's rate limit;
//! and the provider's own word after a 429, which holds every instance off until the time it
//! said.

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
    why: &'static str,
}

impl Budget {
    pub fn limit(&self) -> Limit {
        self.limit
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Takes one call: at once when the bucket holds one for this lane, after a short wait when
    /// one comes within [`Budgets::wait`], else [`Throttled`] with the time it will.
    pub async fn take(&self) -> anyhow::Result<()> {
        let started = tokio::time::Instant::now();
        loop {
            let Some(refusal) = self.try_take().await? else {
                return Ok(());
            };
            let wait = (refusal.until - Utc::now()).to_std().unwrap_or_default();
            if started.elapsed() + wait > self.budgets.wait {
                return Err(Throttled {
                    source_name: self.source.clone(),
                    until: refusal.until,
                    why: refusal.why.to_owned(),
                }
                .into());
            }
            // Never a busy loop: a take that lost a token to another instance waits a little.
            tokio::time::sleep(wait.max(Duration::from_millis(10))).await;
        }
    }

    /// One statement takes a token, when the provider's pause is over and the bucket, refilled
    /// for the time since its last take, holds one beyond what this lane must leave. A
    /// refusal is counted and says when a token will be there (or the pause ends).
    async fn try_take(&self) -> Result<Option<Refusal>, sqlx::Error> {
        let burst = f64::from(self.limit.burst);
        let leaves = f64::from(self.limit.leaves(self.lane));
        let taken = sqlx::query_scalar!(
            r#"
            INSERT INTO api_budgets AS b (source, tokens, taken) VALUES ($1, $3::float8 - 1, 1)
            ON CONFLICT (source) DO UPDATE
            SET tokens = least($3::float8, b.tokens + $2::float8 * greatest(0, extract(epoch FROM inbox_now() - b.refilled_at)::float8)) - 1,
                refilled_at = greatest(b.refilled_at, inbox_now()),
                taken = b.taken + 1
            WHERE (b.held_until IS NULL OR b.held_until <= inbox_now())
              AND least($3::float8, b.tokens + $2::float8 * greatest(0, extract(epoch FROM inbox_now() - b.refilled_at)::float8)) >= 1 + $4::float8
            RETURNING b.tokens
            "#,
            self.source,
            self.limit.per_second,
            burst,
            leaves,
        )
        .fetch_optional(exec(&self.budgets.pool))
        .await?;
        if taken.is_some() {
            return Ok(None);
        }
        let row = sqlx::query!(
            r#"
            UPDATE api_budgets AS b SET refused = b.refused + 1
            WHERE source = $1
            RETURNING b.held_until, inbox_now() AS "now!",
                      least($3::float8, b.tokens + $2::float8 * greatest(0, extract(epoch FROM inbox_now() - b.refilled_at)::float8)) AS "tokens!"
            "#,
            self.source,
            self.limit.per_second,
            burst,
        )
        .fetch_optional(exec(&self.budgets.pool))
        .await?;
        // No row: another statement made it meanwhile; the next take sees it.
        let Some(row) = row else {
            return Ok(Some(Refusal {
                until: Utc::now(),
                why: "the source's API budget was being made",
            }));
        };
        if let Some(held) = row.held_until.filter(|held| *held > row.now) {
            return Ok(Some(Refusal {
                until: held,
                why: "the provider asked for a pause (429)",
            }));
        }
        let short = (1.0 + leaves - row.tokens).max(0.0);
        let secs = short / self.limit.per_second;
        Ok(Some(Refusal {
            until: row.now + chrono::Duration::milliseconds((secs * 1000.0).ceil() as i64),
            why: "the source's API budget is spent for now",
        }))
    }

    /// The provider answered 429 and asked for `pause`: no instance calls it before that is
    /// over. Returns the time the pause ends (the later of this and one already held).
    pub async fn hold_off(&self, pause: Duration) -> Result<DateTime<Utc>, sqlx::Error> {
        sqlx::query_scalar!(
            r#"
            INSERT INTO api_budgets AS b (source, tokens, held_until)
            VALUES ($1, 0, inbox_now() + make_interval(secs => $2))
            ON CONFLICT (source) DO UPDATE SET held_until = greatest(b.held_until, EXCLUDED.held_until)
            RETURNING b.held_until AS "held_until!"
            "#,
            self.source,
            pause.as_secs_f64(),
        )
        .fetch_one(exec(&self.budgets.pool))
        .await
    }
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
