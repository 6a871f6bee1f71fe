//! `inboxctl usage`: a period's usage of an account, `usage record`, a debit of its
//! allowance, and `usage reverse`, a debit taken back (docs/design.md §4.10), through the
//! library the API uses.

use anyhow::Context;
use clap::{Args, Subcommand};
use sqlx::PgPool;

use shared::billing::usage::{self, Debit, DebitRequest, Invalid, Listed, Reversal};
use shared::domain::{CustomerId, Period};
use shared::effects::outbox::Effects;
use shared::meters::outbox::MeterReports;
use shared::platform::config::Env;
use shared::platform::queued;

use crate::show::{opt, parse_period, print_json, resolve_source, table};

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct UsageArgs {
    #[command(subcommand)]
    command: Option<UsageCommand>,
    /// The customer whose usage to list.
    #[arg(required = true)]
    customer_id: Option<String>,
    #[command(flatten)]
    account: AccountArgs,
    /// How many debits to show (a page; `--after` the last one shown for the next).
    #[arg(long, default_value_t = 100)]
    limit: i64,
    /// Show the debits after this usage id (the page's `next`).
    #[arg(long)]
    after: Option<String>,
}

/// Which account a customer id names: its source, period, and Connect account (shared by
/// `account` and `usage`).
#[derive(Args)]
pub(crate) struct AccountArgs {
    /// The source the customer belongs to (needed when several have that id).
    #[arg(long)]
    pub(crate) source: Option<String>,
    /// The period, YYYY-MM (default: the current UTC month).
    #[arg(long)]
    pub(crate) period: Option<String>,
    /// The Stripe connected account (acct_…) the customer belongs to, for events that came
    /// through a Connect endpoint.
    #[arg(long)]
    pub(crate) stripe_account: Option<String>,
}

impl AccountArgs {
    /// The customer as the store keys it: with `--stripe-account`, the customer in that
    /// connected account (shared::domain::AccountRef); without, the id as stored.
    pub(crate) fn stored_customer(&self, customer_id: &str) -> anyhow::Result<CustomerId> {
        stored_customer(customer_id, self.stripe_account.as_deref())
    }
}

/// The customer `customer_id` as the store keys it, in the connected account `stripe_account`
/// when one is named.
pub(crate) fn stored_customer(
    customer_id: &str,
    stripe_account: Option<&str>,
) -> anyhow::Result<CustomerId> {
    match stripe_account {
        Some(_) => CustomerId::of_account(customer_id, stripe_account)
            .map_err(|e| anyhow::anyhow!("customer '{customer_id}': {e}")),
        None => CustomerId::parse(customer_id)
            .map_err(|e| anyhow::anyhow!("customer id '{customer_id}': {e}")),
    }
}

#[derive(Subcommand)]
enum UsageCommand {
    /// Spend AMOUNT (1 to 1,000,000,000) of the period's allowance, once per --key. Checked
    /// as the API checks a debit, before anything is stored: a bad amount, key, note or
    /// period (a later month than the current one) exits 1 with the API's code in --json.
    /// Exit codes: 3 allowance exhausted, 4 the key was used with another amount, period or
    /// note, 5 customer deleted, 6 unknown customer.
    Record {
        customer_id: String,
        amount: i64,
        /// The idempotency key: the same key always gets the same answer.
        #[arg(long)]
        key: String,
        #[arg(long)]
        note: Option<String>,
        #[command(flatten)]
        account: AccountArgs,
    },
    /// Take the accepted debit USAGE_ID back, once: its amount returns to its period's
    /// allowance, and its meter report is withdrawn or corrected at the provider. Asked again,
    /// the same answer. Exit codes: 6 unknown customer, 7 no such debit of the account, 8 the
    /// debit was refused (nothing to reverse).
    Reverse {
        customer_id: String,
        usage_id: String,
        #[command(flatten)]
        account: AccountArgs,
    },
}

/// A usage request refused (a debit answered but not accepted, or one the check refuses, or a
/// cursor of no page): its code for `--json` and its exit code.
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
pub struct Refused {
    pub code: &'static str,
    pub detail: String,
    pub remaining: Option<i64>,
    pub exit: u8,
}

impl Refused {
    fn new(code: &'static str, exit: u8, detail: String) -> Self {
        Self {
            code,
            detail,
            remaining: None,
            exit,
        }
    }
}

/// A debit the library's check refuses, before anything is looked up or stored.
fn invalid(invalid: Invalid) -> Refused {
    let detail = match &invalid {
        Invalid::Key => format!("--key: {invalid}"),
        Invalid::Period(_) | Invalid::FuturePeriod { .. } => format!("--period: {invalid}"),
        Invalid::Note => format!("--note: {invalid}"),
        Invalid::Amount | Invalid::Unit => invalid.to_string(),
    };
    Refused {
        code: invalid.code(),
        detail,
        remaining: None,
        exit: 1,
    }
}

fn unknown(customer: &CustomerId, source: Option<&str>) -> Refused {
    let detail = match source {
        Some(source) => format!("no account for customer '{customer}' in source '{source}'"),
        None => format!("no account for customer '{customer}'"),
    };
    Refused {
        code: "unknown_customer",
        detail,
        remaining: None,
        exit: 6,
    }
}

pub async fn run(args: &UsageArgs, pool: &PgPool, json_output: bool) -> anyhow::Result<()> {
    match &args.command {
        Some(UsageCommand::Record {
            customer_id,
            amount,
            key,
            note,
            account,
        }) => {
            record(
                pool,
                customer_id,
                *amount,
                key,
                note.as_deref(),
                account,
                json_output,
            )
            .await
        }
        Some(UsageCommand::Reverse {
            customer_id,
            usage_id,
            account,
        }) => reverse(pool, customer_id, usage_id, account, json_output).await,
        None => {
            let customer_id = args.customer_id.as_deref().context("name a customer")?;
            list(pool, customer_id, args, json_output).await
        }
    }
}

async fn list(
    pool: &PgPool,
    customer_id: &str,
    args: &UsageArgs,
    json_output: bool,
) -> anyhow::Result<()> {
    if args.limit < 1 {
        anyhow::bail!("--limit must be at least 1, got {}", args.limit);
    }
    let period = parse_period(args.account.period.as_deref())?;
    let customer = args.account.stored_customer(customer_id)?;
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let source = resolve_source(&mut conn, &customer, args.account.source.as_deref()).await?;
    let listed = match &source {
        Some(source) => {
            usage::list(
                &mut conn,
                source,
                &customer,
                &period,
                args.limit,
                args.after.as_deref(),
            )
            .await?
        }
        None => Listed::UnknownCustomer,
    };
    let (source, page) = match (source, listed) {
        (Some(source), Listed::Page(page)) => (source, page),
        (_, Listed::UnknownCursor) => {
            return Err(Refused {
                code: "bad_cursor",
                detail: format!(
                    "--after {} is no usage id of {customer} in {period}: pass the `more: \
                     --after …` of an earlier page",
                    args.after.as_deref().unwrap_or_default()
                ),
                remaining: None,
                exit: 1,
            }
            .into())
        }
        _ => return Err(unknown(&customer, args.account.source.as_deref()).into()),
    };
    if json_output {
        return print_json(&page);
    }
    out!(
        "usage of {customer} ({source}) for {}: {} used of {}, {} remaining",
        page.period,
        page.used,
        page.allowance,
        page.remaining
    );
    if !page.usage.is_empty() {
        let mut t = table(&["usage", "amount", "key", "note", "recorded"]);
        for line in &page.usage {
            t.add_row(vec![
                line.usage_id.clone(),
                line.amount.to_string(),
                line.idempotency_key.clone(),
                opt(&line.note),
                line.recorded_at.to_rfc3339(),
            ]);
        }
        out!("{t}");
    }
    if let Some(next) = &page.next {
        out!("more: --after {next}");
    }
    Ok(())
}

/// Hands what a debit or a reversal wrote to the dispatcher's queue: its effect, its meter
/// report or correction. What the queue refuses, or what finds no queue, the scheduler's
/// rescue sends.
async fn hand_over(
    pool: &PgPool,
    env: &Env<fn(&str) -> Option<String>>,
    told: Option<&String>,
    reported: Option<&String>,
) -> anyhow::Result<()> {
    if let (Some(told), Some(effects)) = (told, env.effects()?) {
        let queue = shared::platform::queue::Queue::from_env(effects.queue_url.clone()).await;
        queued::enqueue_or_unmark::<Effects>(pool, &queue, std::slice::from_ref(told)).await?;
    }
    if let (Some(reported), Some(url)) = (reported, env.outbox_queue_url()) {
        let queue = shared::platform::queue::Queue::from_env(url).await;
        queued::enqueue_or_unmark::<MeterReports>(pool, &queue, std::slice::from_ref(reported))
            .await?;
    }
    Ok(())
}

async fn reverse(
    pool: &PgPool,
    customer_id: &str,
    usage_id: &str,
    account: &AccountArgs,
    json_output: bool,
) -> anyhow::Result<()> {
    if account.period.is_some() {
        anyhow::bail!("--period: a reversal names its debit, whose period is its own");
    }
    let customer = account.stored_customer(customer_id)?;
    let env = Env::process();
    let catalog = env.plans_or_empty()?;
    let effects = env.effects()?.map(|_| &catalog);
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let Some(source) = resolve_source(&mut conn, &customer, account.source.as_deref()).await?
    else {
        return Err(unknown(&customer, None).into());
    };
    let today = Period::current();
    let reversed =
        usage::reverse(&mut conn, (&source, &customer), usage_id, effects, &today).await?;
    drop(conn);
    hand_over(
        pool,
        &env,
        reversed.told.as_ref(),
        reversed.correction.as_ref(),
    )
    .await?;
    if let (true, Some(body)) = (json_output, reversed.reversal.body()) {
        return print_json(&body);
    }
    match reversed.reversal {
        Reversal::Reversed {
            amount,
            period,
            used,
            remaining,
            replayed,
            ..
        } => {
            out!(
                "{usage_id}: {amount} reversed for {period}; {used} used, {remaining} remaining{}",
                if replayed {
                    " (replayed: it was reversed before)"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Reversal::UnknownUsage => Err(Refused::new(
            "not_found",
            7,
            format!("no debit {usage_id} of customer '{customer}' in source '{source}'"),
        )
        .into()),
        Reversal::NotAccepted => Err(Refused::new(
            "not_accepted",
            8,
            format!("refused: the debit {usage_id} was refused; it spent nothing to reverse"),
        )
        .into()),
    }
}

async fn record(
    pool: &PgPool,
    customer_id: &str,
    amount: i64,
    key: &str,
    note: Option<&str>,
    account: &AccountArgs,
    json_output: bool,
) -> anyhow::Result<()> {
    let customer = account.stored_customer(customer_id)?;
    let today = Period::current();
    // The API's check, before the store is asked: what it refuses would otherwise be stored
    // under the key as a permanent refusal. The source is found below.
    let asked = DebitRequest::checked(
        "",
        &customer,
        key,
        amount,
        account.period.as_deref(),
        note,
        None,
        &today,
    )
    .map_err(invalid)?;
    let env = Env::process();
    let catalog = env.plans_or_empty()?;
    let effects = env.effects()?;
    let mut conn = pool.acquire().await.context("connecting to DATABASE_URL")?;
    let Some(source) = resolve_source(&mut conn, &customer, account.source.as_deref()).await?
    else {
        return Err(unknown(&customer, None).into());
    };
    // The source's meter, when INBOX_SOURCES gives it one: the debit's report is written with
    // it, as the API writes it.
    let meter = env
        .sources_or_none()?
        .into_iter()
        .find(|s| s.name == source)
        .and_then(|s| s.meter)
        .and_then(|m| m.name().map(str::to_owned));
    let request = DebitRequest {
        source: &source,
        effects: effects.as_ref().map(|_| &catalog),
        meter: meter.as_deref(),
        ..asked
    };
    let debited = usage::debit(&mut conn, &request).await?;
    drop(conn);
    hand_over(pool, &env, debited.told.as_ref(), debited.reported.as_ref()).await?;
    let who = format!("customer '{customer}' in source '{source}'");
    let refused = |code, exit, remaining: Option<i64>, detail: String| Refused {
        remaining,
        ..Refused::new(code, exit, detail)
    };
    if let (true, Some(body)) = (json_output, debited.debit.accepted_body(request.unit)) {
        return print_json(&body);
    }
    match debited.debit {
        Debit::Accepted {
            usage_id,
            amount,
            period,
            used,
            remaining,
            replayed,
            ..
        } => {
            out!(
                "{usage_id}: {amount} recorded for {period}; {used} used, {remaining} remaining{}",
                if replayed {
                    " (replayed: this key was recorded before)"
                } else {
                    ""
                }
            );
            Ok(())
        }
        Debit::Exhausted { remaining, .. } => Err(refused(
            "allowance_exhausted",
            3,
            Some(remaining),
            format!(
                "refused: {amount} is more than the {remaining} remaining for {who} in {}",
                request.period.period()
            ),
        )
        .into()),
        Debit::KeyConflict => Err(refused(
            "idempotency_conflict",
            4,
            None,
            format!("refused: key '{key}' was used for {who} with another amount, period or note"),
        )
        .into()),
        Debit::CustomerDeleted => Err(refused(
            "customer_deleted",
            5,
            None,
            format!("refused: {who} is deleted"),
        )
        .into()),
        Debit::UnknownCustomer => Err(unknown(&customer, Some(&source)).into()),
    }
}
