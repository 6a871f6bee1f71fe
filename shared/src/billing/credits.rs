//! Prepaid credit grants as a fold (docs/design.md §4.14): each grant's register (its latest
//! snapshot, voiding absorbing), each grant's ledger (the signed sum of its transactions, deduped
//! by id, never clamped), the provisional expiry and void the fold counts until the provider's
//! own transaction replaces them, the balances shown, and the documented burn order a debit
//! spends grants in. Pure: the same set of grants and transactions gives the same balances in
//! every order they are added.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use crate::domain::effect::{effect_id, Kind, NewEffect};
use crate::platform::sim::{self, Bug};

/// The version of [`burn_order`]. A debit's answer names it, so that an allocation read later
/// says which rule made it; a change to the order is a new version, never an edit of this one.
pub const BURN_ORDER_VERSION: u32 = 1;

/// Stripe's priority for a grant that names none: "defaults to a value of 50. The highest
/// priority is 0 and the lowest is 100" (Stripe API reference, `billing.credit_grant.priority`).
pub const DEFAULT_PRIORITY: u8 = 50;

/// Decimal places a [`Quantity`] keeps: Stripe's decimal strings (`unit_amount_decimal`, a
/// custom pricing unit's `value`) carry at most 12.
const SCALE: u32 = 12;
const ONE: i128 = 10i128.pow(SCALE);

/// An exact signed amount of a unit: minor units of a currency, or a decimal of a custom pricing
/// unit or of the catalog's credits. Kept as an integer of 10⁻¹² so that sums are exact and
/// associative (a float's sum depends on the order it is added in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity(i128);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a decimal amount of at most 12 places")]
pub struct NotAnAmount(pub String);

impl Quantity {
    pub const ZERO: Quantity = Quantity(0);

    /// A whole number of units (minor units of a currency, or whole credits).
    pub fn whole(n: i64) -> Quantity {
        Quantity(i128::from(n) * ONE)
    }

    /// A decimal string as Stripe writes one (`"100"`, `"12.5"`, `"-3.25"`).
    pub fn parse(s: &str) -> Result<Quantity, NotAnAmount> {
        let bad = || NotAnAmount(s.to_owned());
        let (negative, digits) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
        let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
        if int.is_empty() || !all_digits(int) || !all_digits(frac) || frac.len() > SCALE as usize {
            return Err(bad());
        }
        if digits.contains('.') && frac.is_empty() {
            return Err(bad());
        }
        let int: i128 = int.parse().map_err(|_| bad())?;
        let frac_value: i128 = if frac.is_empty() {
            0
        } else {
            frac.parse::<i128>().map_err(|_| bad())? * 10i128.pow(SCALE - frac.len() as u32)
        };
        let value = int
            .checked_mul(ONE)
            .and_then(|v| v.checked_add(frac_value))
            .ok_or_else(bad)?;
        Ok(Quantity(if negative { -value } else { value }))
    }

    pub fn is_positive(self) -> bool {
        self.0 > 0
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// What is shown: never below zero. The fold keeps the signed value; only its reader clamps.
    pub fn clamped(self) -> Quantity {
        Quantity(self.0.max(0))
    }
}

impl std::ops::Add for Quantity {
    type Output = Quantity;
    fn add(self, o: Quantity) -> Quantity {
        Quantity(self.0 + o.0)
    }
}

impl std::ops::Sub for Quantity {
    type Output = Quantity;
    fn sub(self, o: Quantity) -> Quantity {
        Quantity(self.0 - o.0)
    }
}

impl std::ops::Neg for Quantity {
    type Output = Quantity;
    fn neg(self) -> Quantity {
        Quantity(-self.0)
    }
}

impl std::iter::Sum for Quantity {
    fn sum<I: Iterator<Item = Quantity>>(iter: I) -> Quantity {
        iter.fold(Quantity::ZERO, |a, b| a + b)
    }
}

/// The decimal string of the contract: no exponent, no trailing zeros (`"1000"`, `"12.5"`).
impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let one = ONE as u128;
        let (int, frac) = (abs / one, abs % one);
        if frac == 0 {
            return write!(f, "{sign}{int}");
        }
        let frac = format!("{frac:012}");
        write!(f, "{sign}{int}.{}", frac.trim_end_matches('0'))
    }
}

/// Where a grant comes from; each is its own source in `why` (docs/design.md §4.14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    StripeCreditGrant,
    CatalogPack,
    PolarMeterCredit,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::StripeCreditGrant => "stripe_credit_grant",
            Origin::CatalogPack => "catalog_pack",
            Origin::PolarMeterCredit => "polar_meter_credit",
        }
    }

    pub fn parse(s: &str) -> Option<Origin> {
        [
            Origin::StripeCreditGrant,
            Origin::CatalogPack,
            Origin::PolarMeterCredit,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }
}

/// Stripe's `category`. Promotional credit is spent before paid credit of the same priority
/// and expiry: what was given away goes first, what was bought is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Category {
    Promotional,
    Paid,
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Promotional => "promotional",
            Category::Paid => "paid",
        }
    }

    pub fn parse(s: &str) -> Option<Category> {
        [Category::Promotional, Category::Paid]
            .into_iter()
            .find(|c| c.as_str() == s)
    }
}

/// One snapshot of a grant, as one event gives it. Times are unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct GrantSnapshot {
    pub grant_id: String,
    pub origin: Origin,
    /// A currency (`usd`, amounts in minor units), a custom pricing unit's id, or `credits`.
    pub unit: String,
    /// What the grant may pay for: `all`, or Stripe's scope in words (`price_type:metered`,
    /// `prices:price_1,price_2`). Balances are kept per unit and scope.
    pub scope: String,
    pub amount: Quantity,
    pub category: Category,
    /// `None`: the provider's default ([`DEFAULT_PRIORITY`]).
    pub priority: Option<u8>,
    pub created: i64,
    /// `None`: from `created`.
    pub effective_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub voided_at: Option<i64>,
    /// The snapshot's own time (Stripe's `updated`): the latest wins the register.
    pub updated: i64,
    /// The event's dedupe key, the tie-break of two snapshots of one second.
    pub event_key: String,
}

impl GrantSnapshot {
    pub fn effective_from(&self) -> i64 {
        self.effective_at.unwrap_or(self.created)
    }

    pub fn priority(&self) -> u8 {
        self.priority.unwrap_or(DEFAULT_PRIORITY)
    }

    fn version(&self) -> (i64, &str) {
        (self.updated, self.event_key.as_str())
    }

    /// The grant in words, for the log line: "credit grant credgr_1: 1000 usd, paid, for
    /// price_type:metered, expires 2026-02-01T00:00:00Z".
    pub fn words(&self) -> String {
        let mut words = format!(
            "credit grant {}: {} {}, {}, for {}",
            self.grant_id,
            self.amount,
            self.unit,
            self.category.as_str(),
            self.scope
        );
        for (what, at) in [("expires", self.expires_at), ("voided", self.voided_at)] {
            if let Some(at) = at.and_then(rfc3339) {
                words.push_str(&format!(
                    ", {what} {}",
                    at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ));
            }
        }
        words
    }
}

/// A transaction's type (Stripe's `credit.type` / `debit.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TransactionKind {
    /// credit: the grant's amount became available.
    Granted,
    /// credit: an invoice the credits were applied to was voided, so they came back.
    ApplicationInvoiceVoided,
    /// debit: credits paid (part of) an invoice, or an app's debit spent them.
    Applied,
    /// debit: what remained at `expires_at`.
    Expired,
    /// debit: what remained when the grant was voided.
    Voided,
}

impl TransactionKind {
    /// Stripe's name of the type, by whether it is a `credit` or a `debit`.
    pub fn parse(credit_or_debit: &str, kind: &str) -> Option<TransactionKind> {
        Some(match (credit_or_debit, kind) {
            ("credit", "credits_granted") => TransactionKind::Granted,
            ("credit", "credits_application_invoice_voided") => {
                TransactionKind::ApplicationInvoiceVoided
            }
            ("debit", "credits_applied") => TransactionKind::Applied,
            ("debit", "credits_expired") => TransactionKind::Expired,
            ("debit", "credits_voided") => TransactionKind::Voided,
            _ => return None,
        })
    }

    /// Stripe's name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            TransactionKind::Granted => "credits_granted",
            TransactionKind::ApplicationInvoiceVoided => "credits_application_invoice_voided",
            TransactionKind::Applied => "credits_applied",
            TransactionKind::Expired => "credits_expired",
            TransactionKind::Voided => "credits_voided",
        }
    }

    /// The kind by Stripe's name of the type, whichever side it is on.
    pub fn named(name: &str) -> Option<TransactionKind> {
        TransactionKind::parse("credit", name).or_else(|| TransactionKind::parse("debit", name))
    }

    fn sign(self) -> i128 {
        match self {
            TransactionKind::Granted | TransactionKind::ApplicationInvoiceVoided => 1,
            TransactionKind::Applied | TransactionKind::Expired | TransactionKind::Voided => -1,
        }
    }
}

/// One ledger entry of a grant. It names its grant, not its customer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Transaction {
    pub transaction_id: String,
    pub grant_id: String,
    pub kind: TransactionKind,
    /// As the provider writes it: not negative; the kind gives the sign.
    pub amount: Quantity,
    pub effective_at: i64,
}

impl Transaction {
    pub fn signed(&self) -> Quantity {
        Quantity(self.kind.sign() * self.amount.0)
    }
}

/// A grant's register: the latest snapshot by (`updated`, event key), and the earliest
/// `voided_at` any snapshot ever said, so that a later snapshot without it never revives the
/// grant (a void is absorbing). Both are lattice joins, so the register is the same whatever
/// order its snapshots come in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRegister {
    pub latest: GrantSnapshot,
    pub voided_at: Option<i64>,
}

impl GrantRegister {
    fn take(&mut self, s: GrantSnapshot) {
        self.voided_at = earliest(self.voided_at, s.voided_at);
        if s.version() > self.latest.version() {
            self.latest = s;
        }
    }
}

fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The set of an account's grants and transactions, each once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credits {
    grants: BTreeMap<String, GrantRegister>,
    transactions: BTreeMap<String, Transaction>,
}

/// A grant as of a time: the register and its ledger summed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantBalance {
    pub grant: GrantSnapshot,
    pub voided_at: Option<i64>,
    /// Credits in (`credits_granted`, or the grant's amount until Stripe's transaction comes).
    pub granted: Quantity,
    /// Applied, net of applications whose invoice was voided.
    pub used: Quantity,
    /// Expired or voided (what ended unused).
    pub expired: Quantity,
    /// `granted − used − expired`, signed: an over-applied grant shows below zero here.
    pub remaining: Quantity,
    /// Whether it may be spent at the time asked: effective, not expired, not voided.
    pub live: bool,
    /// The transactions counted (ids), for `why`.
    pub transactions: Vec<String>,
    /// Whether the fold counted the amount, an expiry or a void the provider has not told yet.
    pub provisional: bool,
}

impl GrantBalance {
    /// What may be spent: the remaining of a live grant, never below zero.
    pub fn available(&self) -> Quantity {
        if self.live {
            self.remaining.clamped()
        } else {
            Quantity::ZERO
        }
    }
}

/// Balances per (unit, scope), summed over grants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Balance {
    pub unit: String,
    pub scope: String,
    pub available: Quantity,
    pub granted: Quantity,
    pub used: Quantity,
    pub expired: Quantity,
}

impl Credits {
    pub fn new() -> Credits {
        Credits::default()
    }

    /// A grant snapshot: the register takes it by its rule.
    pub fn grant(&mut self, s: GrantSnapshot) {
        match self.grants.get_mut(&s.grant_id) {
            Some(r) => r.take(s),
            None => {
                let voided_at = s.voided_at;
                self.grants.insert(
                    s.grant_id.clone(),
                    GrantRegister {
                        latest: s,
                        voided_at,
                    },
                );
            }
        }
    }

    /// A transaction, once by id. A provider never changes one; should two copies differ, the
    /// smaller is kept, so the choice does not depend on which came first.
    pub fn transaction(&mut self, t: Transaction) {
        match self.transactions.get_mut(&t.transaction_id) {
            Some(held) if t < *held => *held = t,
            Some(_) => {}
            None => {
                self.transactions.insert(t.transaction_id.clone(), t);
            }
        }
    }

    /// A grant's register, if the grant is known.
    pub fn register(&self, grant_id: &str) -> Option<&GrantRegister> {
        self.grants.get(grant_id)
    }

    /// Every grant's register, by grant id.
    pub fn registers(&self) -> impl Iterator<Item = &GrantRegister> {
        self.grants.values()
    }

    /// The latest provider time the credits say (a snapshot's `updated`, a transaction's
    /// `effective_at`): the provider has told of them, so time has passed at least as far.
    pub fn latest(&self) -> Option<i64> {
        let snapshots = self.grants.values().map(|r| r.latest.updated);
        let transactions = self.transactions.values().map(|t| t.effective_at);
        snapshots.chain(transactions).max()
    }

    /// Whether a transaction is counted already (by its id).
    pub fn counts(&self, transaction_id: &str) -> bool {
        self.transactions.contains_key(transaction_id)
    }

    /// Transactions whose grant is not known yet: held, counted when it comes, never dropped.
    pub fn held(&self) -> Vec<&Transaction> {
        self.transactions
            .values()
            .filter(|t| !self.grants.contains_key(&t.grant_id))
            .collect()
    }

    /// Every known grant as of `at` (unix seconds), in [`burn_order`].
    pub fn balances_at(&self, at: i64) -> Vec<GrantBalance> {
        let mut by_grant: BTreeMap<&str, Vec<&Transaction>> = BTreeMap::new();
        for t in self.transactions.values() {
            by_grant.entry(t.grant_id.as_str()).or_default().push(t);
        }
        let mut out: Vec<GrantBalance> = self
            .grants
            .values()
            .map(|r| grant_at(r, by_grant.get(r.latest.grant_id.as_str()), at))
            .collect();
        out.sort_by(|a, b| burn_order(&a.grant, &b.grant));
        out
    }

    /// Balances per unit and scope as of `at`, in (unit, scope) order.
    pub fn totals_at(&self, at: i64) -> Vec<Balance> {
        let mut totals: BTreeMap<(String, String), Balance> = BTreeMap::new();
        for g in self.balances_at(at) {
            let b = totals
                .entry((g.grant.unit.clone(), g.grant.scope.clone()))
                .or_insert_with(|| Balance {
                    unit: g.grant.unit.clone(),
                    scope: g.grant.scope.clone(),
                    ..Balance::default()
                });
            b.available = b.available + g.available();
            b.granted = b.granted + g.granted;
            b.used = b.used + g.used;
            b.expired = b.expired + g.expired;
        }
        totals.into_values().collect()
    }
}

/// One grant's ledger as of `at`. The provider's transactions count as they are; what it has
/// not told yet the fold counts provisionally, and the provider's own transaction *replaces*
/// the provisional one, never adds to it:
/// - the amount, from `effective_at`, until a `credits_granted` is known;
/// - at `expires_at`, an expiry of what then remains, until a `credits_expired` is known;
/// - at `voided_at`, a void of what then remains, until a `credits_voided` is known.
fn grant_at(r: &GrantRegister, txns: Option<&Vec<&Transaction>>, at: i64) -> GrantBalance {
    let g = &r.latest;
    let txns: Vec<&Transaction> = txns.map(|v| v.to_vec()).unwrap_or_default();
    let has = |k: TransactionKind| txns.iter().any(|t| t.kind == k);
    let told = |until: i64| -> Vec<&Transaction> {
        txns.iter()
            .copied()
            .filter(|t| t.effective_at <= until)
            .collect()
    };
    let mut provisional = false;
    let mut granted = Quantity::ZERO;
    let mut used = Quantity::ZERO;
    let mut expired = Quantity::ZERO;
    let mut ids = Vec::new();
    let count = |t: &Transaction,
                 granted: &mut Quantity,
                 used: &mut Quantity,
                 expired: &mut Quantity| match t.kind {
        TransactionKind::Granted => *granted = *granted + t.amount,
        TransactionKind::ApplicationInvoiceVoided => *used = *used - t.amount,
        TransactionKind::Applied => *used = *used + t.amount,
        TransactionKind::Expired | TransactionKind::Voided => *expired = *expired + t.amount,
    };
    for t in told(at) {
        count(t, &mut granted, &mut used, &mut expired);
        ids.push(t.transaction_id.clone());
    }
    let effective = g.effective_from();
    if !has(TransactionKind::Granted) && effective <= at {
        granted = granted + g.amount;
        provisional = true;
    }
    // The end that comes first (its void or its expiry) closes the grant; what remains then
    // is what the end takes, unless the provider told how the grant ended.
    let end = earliest(r.voided_at, g.expires_at).filter(|&when| when <= at);
    let closed = end.is_some();
    if let Some(when) = end {
        // (A simulation may plant the expiry added to the provider's, docs/design.md §10.)
        let told_end = has(TransactionKind::Expired) || has(TransactionKind::Voided);
        if !told_end || sim::planted(Bug::ExpiryAddedToStripes) {
            let remaining_then = remaining_until(g, &txns, when);
            if remaining_then.is_positive() {
                expired = expired + remaining_then;
                provisional = true;
            }
        }
    }
    // Signed; a simulation may plant the clamp here (docs/design.md §10).
    let remaining = sim::or_planted(Bug::ClampInFold, granted - used - expired, || {
        (granted - used - expired).clamped()
    });
    let live = effective <= at && !closed;
    GrantBalance {
        grant: g.clone(),
        voided_at: r.voided_at,
        granted,
        used,
        expired,
        remaining,
        live,
        transactions: ids,
        provisional,
    }
}

/// What remained of a grant just before `when`: its amount (or Stripe's grant) and every
/// transaction effective before then.
fn remaining_until(g: &GrantSnapshot, txns: &[&Transaction], when: i64) -> Quantity {
    let before: Vec<&&Transaction> = txns.iter().filter(|t| t.effective_at < when).collect();
    let granted_told = before.iter().any(|t| t.kind == TransactionKind::Granted);
    let base = if granted_told || g.effective_from() >= when {
        Quantity::ZERO
    } else {
        g.amount
    };
    base + before.iter().map(|t| t.signed()).sum::<Quantity>()
}

/// The order a debit spends grants in, version [`BURN_ORDER_VERSION`]: priority ascending (0
/// first), then `expires_at` ascending with none last, then promotional before paid, then
/// `effective_at`, then the grant's id. A total order of the grants' own fields, never of
/// arrival, so a replay spends the same grants.
pub fn burn_order(a: &GrantSnapshot, b: &GrantSnapshot) -> Ordering {
    // A simulation may plant an order by arrival here (docs/design.md §10).
    if sim::planted(Bug::BurnOrderByArrival) {
        return (a.updated, &a.event_key, &a.grant_id).cmp(&(b.updated, &b.event_key, &b.grant_id));
    }
    let expiry = |g: &GrantSnapshot| (g.expires_at.is_none(), g.expires_at);
    (a.priority(), expiry(a), a.category, a.effective_from())
        .cmp(&(b.priority(), expiry(b), b.category, b.effective_from()))
        .then_with(|| a.grant_id.cmp(&b.grant_id))
}

/// What a debit takes from where: the allowance first, then grants in [`burn_order`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocation {
    pub from_allowance: Quantity,
    pub from_grants: Vec<(String, Quantity)>,
    pub order_version: u32,
}

/// A debit that does not fit: what remains of the allowance and of each live grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exhausted {
    pub allowance_remaining: Quantity,
    pub grants: Vec<(String, Quantity)>,
}

/// Spends `amount` of the debit's unit: the allowance's remaining first, then the available of
/// each grant of that unit (given in [`burn_order`], as [`Credits::balances_at`] gives them).
/// All or nothing: a debit that does not fit takes nothing.
pub fn allocate(
    allowance_remaining: Quantity,
    grants: &[GrantBalance],
    unit: &str,
    amount: Quantity,
) -> Result<Allocation, Exhausted> {
    let spendable = grants
        .iter()
        .filter(|g| g.grant.unit == unit)
        .map(|g| (g.grant.grant_id.as_str(), g.available()));
    allocate_from(allowance_remaining, spendable, amount)
}

/// [`allocate`] over each grant's id and available, in burn order: the grants with nothing
/// available are passed over.
fn allocate_from<'g>(
    allowance_remaining: Quantity,
    grants: impl Iterator<Item = (&'g str, Quantity)>,
    amount: Quantity,
) -> Result<Allocation, Exhausted> {
    let allowance = allowance_remaining.clamped();
    let spendable: Vec<(&str, Quantity)> = grants.filter(|(_, q)| q.is_positive()).collect();
    let total = allowance + spendable.iter().map(|(_, q)| *q).sum::<Quantity>();
    if amount > total {
        return Err(Exhausted {
            allowance_remaining: allowance,
            grants: spendable
                .into_iter()
                .map(|(id, q)| (id.to_owned(), q))
                .collect(),
        });
    }
    let from_allowance = amount.min(allowance);
    let mut left = amount - from_allowance;
    let mut from_grants = Vec::new();
    for (id, available) in spendable {
        if !left.is_positive() {
            break;
        }
        let take = left.min(available);
        from_grants.push((id.to_owned(), take));
        left = left - take;
    }
    Ok(Allocation {
        from_allowance,
        from_grants,
        order_version: BURN_ORDER_VERSION,
    })
}

/// One grant's remaining through time before the app's debits, as [`grant_at`] gives it while
/// the grant is live: its amount until the provider tells its `credits_granted`, plus the
/// signed sum of its transactions up to the time asked, found by a binary search over their
/// times. Nothing is available before it is effective nor from its end (void or expiry) on,
/// so the provisional end, which only an ended grant counts, never enters.
struct Ledger<'c> {
    grant_id: &'c str,
    effective: i64,
    end: Option<i64>,
    base: Quantity,
    /// The ledger's times, ascending, and the running sum of its signed amounts up to each.
    times: Vec<i64>,
    sums: Vec<Quantity>,
}

impl<'c> Ledger<'c> {
    fn of(r: &'c GrantRegister, txns: &[&Transaction]) -> Ledger<'c> {
        let g = &r.latest;
        let mut by_time: Vec<(i64, Quantity)> =
            txns.iter().map(|t| (t.effective_at, t.signed())).collect();
        by_time.sort_unstable_by_key(|(at, _)| *at);
        let mut sum = Quantity::ZERO;
        let sums = by_time
            .iter()
            .map(|(_, q)| {
                sum = sum + *q;
                sum
            })
            .collect();
        let granted_told = txns.iter().any(|t| t.kind == TransactionKind::Granted);
        Ledger {
            grant_id: g.grant_id.as_str(),
            effective: g.effective_from(),
            end: earliest(r.voided_at, g.expires_at),
            base: if granted_told {
                Quantity::ZERO
            } else {
                g.amount
            },
            times: by_time.into_iter().map(|(at, _)| at).collect(),
            sums,
        }
    }

    fn live(&self, at: i64) -> bool {
        self.effective <= at && self.end.is_none_or(|end| end > at)
    }

    /// The signed remaining at `at` of a live grant (what [`GrantBalance::remaining`] is then).
    fn remaining(&self, at: i64) -> Quantity {
        let told = self.times.partition_point(|&t| t <= at);
        self.base + told.checked_sub(1).map_or(Quantity::ZERO, |i| self.sums[i])
    }
}

impl Credits {
    /// Each grant's [`Ledger`], by unit, in [`burn_order`] (the order
    /// [`Credits::balances_at`] lists them in).
    fn ledgers(&self) -> BTreeMap<&str, Vec<Ledger<'_>>> {
        let mut by_grant: BTreeMap<&str, Vec<&Transaction>> = BTreeMap::new();
        for t in self.transactions.values() {
            by_grant.entry(t.grant_id.as_str()).or_default().push(t);
        }
        let mut registers: Vec<&GrantRegister> = self.grants.values().collect();
        registers.sort_by(|a, b| burn_order(&a.latest, &b.latest));
        let mut out: BTreeMap<&str, Vec<Ledger<'_>>> = BTreeMap::new();
        for r in registers {
            let txns = by_grant
                .get(r.latest.grant_id.as_str())
                .map_or(&[][..], |v| &v[..]);
            out.entry(r.latest.unit.as_str())
                .or_default()
                .push(Ledger::of(r, txns));
        }
        out
    }
}

/// The unit of the monthly allowance and of catalog packs: a debit that names no unit spends
/// it, and only a debit of this unit spends the period's allowance before its grants.
pub const ALLOWANCE_UNIT: &str = "credits";

/// An accepted debit as the allocation reads it (docs/design.md §4.14): not reversed, given in
/// the order the debits were accepted (`usage_debits.seq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpentDebit {
    pub usage_id: String,
    pub unit: String,
    /// The month whose allowance a debit of [`ALLOWANCE_UNIT`] spends first.
    pub period: String,
    pub amount: Quantity,
    /// When it was accepted (unix seconds): it spends the grants available then.
    pub at: i64,
}

/// What one accepted debit took, as derived from the account's grants, allowances and the
/// debits before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebitAllocation {
    pub usage_id: String,
    pub allocation: Allocation,
    /// What neither the allowance nor the grants held once everything known is counted: 0
    /// unless the provider told, after the debit was accepted, of applications that had taken
    /// the credit first. An accepted debit stays accepted; the read shows what it lacks.
    pub unfunded: Quantity,
}

/// Each accepted debit's allocation, derived, never stored as truth: the debits in the order
/// they were accepted, each spending its period's allowance (`allowances`, by period; only for
/// [`ALLOWANCE_UNIT`]) as the debits before it left it, then the grants of its unit in
/// [`burn_order`] as they stood at the debit's time (effective, not ended, the provider's own
/// transactions counted) less what the debits before it took. A grant told late, or told again
/// with another priority, changes the allocation of every debit it comes before: recomputed
/// from the same inputs, never edited.
pub fn allocations(
    credits: &Credits,
    allowances: &BTreeMap<String, Quantity>,
    debits: &[SpentDebit],
) -> Vec<DebitAllocation> {
    // Each grant's ledger is built once and read at each debit's time by a binary search:
    // the cost is the debits times the grants of their unit (times the log of a ledger), not
    // the debits times every grant's whole ledger.
    let ledgers = credits.ledgers();
    // What the debits before took of each grant, beside its ledger.
    let mut taken: BTreeMap<&str, Vec<Quantity>> = ledgers
        .iter()
        .map(|(unit, l)| (*unit, vec![Quantity::ZERO; l.len()]))
        .collect();
    let mut allowance_used: BTreeMap<&str, Quantity> = BTreeMap::new();
    let mut out = Vec::with_capacity(debits.len());
    for d in debits {
        let allowance_left = match d.unit == ALLOWANCE_UNIT {
            true => {
                let granted = allowances.get(&d.period).copied().unwrap_or_default();
                granted
                    - allowance_used
                        .get(d.period.as_str())
                        .copied()
                        .unwrap_or_default()
            }
            false => Quantity::ZERO,
        };
        let unit_ledgers = ledgers.get(d.unit.as_str()).map_or(&[][..], |l| &l[..]);
        let unit_taken = taken.entry(d.unit.as_str()).or_default();
        // What each grant of the unit holds at the debit's time, less what the debits before
        // it took: `GrantBalance::available` of `balances_at(d.at)` with those taken.
        let available = unit_ledgers.iter().zip(unit_taken.iter()).map(|(l, took)| {
            let held = match l.live(d.at) {
                true => (l.remaining(d.at) - *took).clamped(),
                false => Quantity::ZERO,
            };
            (l.grant_id, held)
        });
        let (allocation, unfunded) = match allocate_from(allowance_left, available, d.amount) {
            Ok(a) => (a, Quantity::ZERO),
            // Accepted when it fitted; what it lacks now is shown, never taken from elsewhere.
            Err(e) => {
                let held = e.allowance_remaining + e.grants.iter().map(|(_, q)| *q).sum();
                let a = Allocation {
                    from_allowance: e.allowance_remaining,
                    from_grants: e.grants,
                    order_version: BURN_ORDER_VERSION,
                };
                (a, d.amount - held)
            }
        };
        let used = allowance_used.entry(d.period.as_str()).or_default();
        *used = *used + allocation.from_allowance;
        for (grant, q) in &allocation.from_grants {
            if let Some(i) = unit_ledgers.iter().position(|l| l.grant_id == grant) {
                unit_taken[i] = unit_taken[i] + *q;
            }
        }
        out.push(DebitAllocation {
            usage_id: d.usage_id.clone(),
            allocation,
            unfunded,
        });
    }
    out
}

/// What the app's debits took from each grant, summed over their allocations.
pub fn spent_by_grant(allocations: &[DebitAllocation]) -> BTreeMap<String, Quantity> {
    let mut spent: BTreeMap<String, Quantity> = BTreeMap::new();
    for (grant, q) in allocations.iter().flat_map(|a| &a.allocation.from_grants) {
        let total = spent.entry(grant.clone()).or_default();
        *total = *total + *q;
    }
    spent
}

/// The account's credits with the app's spends counted: each grant a derived allocation took
/// from becomes a local `credits_applied` transaction (`debit:{usage_id}:{grant_id}`, at the
/// debit's time), so that the balances shown, the provisional expiry of what remains and the
/// low and depleted crossings ([`Credits::crossings`]) count what the debits took. `debits`
/// are the ones `allocations` was given, in the same order.
pub fn with_spends(
    credits: &Credits,
    debits: &[SpentDebit],
    allocations: &[DebitAllocation],
) -> Credits {
    let mut out = credits.clone();
    for (d, a) in debits.iter().zip(allocations) {
        for (grant, amount) in &a.allocation.from_grants {
            out.transaction(Transaction {
                transaction_id: format!("debit:{}:{grant}", d.usage_id),
                grant_id: grant.clone(),
                kind: TransactionKind::Applied,
                amount: *amount,
                effective_at: d.at,
            });
        }
    }
    out
}

/// The app's side of an account's credits (docs/design.md §4.14): its accepted debits not
/// reversed, in the order they were accepted, and the allowance of each period (whole units,
/// by month). What every writer of the credits' effects and the read count the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spends {
    pub debits: Vec<SpentDebit>,
    pub allowances: BTreeMap<String, Quantity>,
}

impl Spends {
    /// The account's credits with the debits' derived allocations counted ([`with_spends`]):
    /// the one set the balances shown and the crossings told ([`told`]) are read from, so the
    /// same crossing has one id whoever writes it.
    pub fn counted(&self, credits: &Credits) -> Credits {
        if self.debits.is_empty() {
            return credits.clone();
        }
        let allocations = allocations(credits, &self.allowances, &self.debits);
        with_spends(credits, &self.debits, &allocations)
    }
}

/// The grant a paid payment of a catalog pack's price makes (docs/design.md §4.14): keyed by
/// the payment, so a copy or a replay of the payment, or another event about it, meets the
/// same register and never mints twice; effective from the payment's provider time, expiring
/// `expires_after_days` after it.
pub fn pack_grant(
    pack: &crate::domain::catalog::CreditPack,
    price_key: &str,
    payment_id: &str,
    paid_at: i64,
    event_key: &str,
) -> GrantSnapshot {
    GrantSnapshot {
        grant_id: format!("pack:{payment_id}:{price_key}"),
        origin: Origin::CatalogPack,
        unit: pack.unit.clone(),
        scope: "all".to_owned(),
        amount: Quantity::whole(pack.amount),
        category: Category::Paid,
        priority: pack.priority,
        created: paid_at,
        effective_at: Some(paid_at),
        expires_at: pack
            .expires_after_days
            .map(|days| paid_at + i64::from(days) * 86_400),
        voided_at: None,
        updated: paid_at,
        event_key: event_key.to_owned(),
    }
}

/// The pack's grant as its payment's refund leaves it: voided at the refund's time, which
/// takes what remains (a refund is terminal, §4.6, and a void is absorbing).
pub fn pack_refunded(grant: &GrantSnapshot, refunded_at: i64, event_key: &str) -> GrantSnapshot {
    GrantSnapshot {
        voided_at: Some(refunded_at),
        updated: refunded_at.max(grant.updated),
        event_key: event_key.to_owned(),
        ..grant.clone()
    }
}

/// A level a unit's available balance is watched at (docs/design.md §4.14): `Low(level)`
/// crosses when the balance falls below `level`, `Depleted` when nothing is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Threshold {
    Low(Quantity),
    Depleted,
}

impl Threshold {
    /// The effect kind an app is told on a downward crossing.
    pub fn kind(self) -> &'static str {
        match self {
            Threshold::Low(_) => "billing.credits_low",
            Threshold::Depleted => "billing.credits_depleted",
        }
    }

    fn below(self, available: Quantity) -> bool {
        match self {
            Threshold::Low(level) => available < level,
            Threshold::Depleted => !available.is_positive(),
        }
    }
}

/// One downward crossing: the state an app is told once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crossing {
    pub threshold: Threshold,
    pub unit: String,
    /// The provider time the balance crossed at: with the account, unit and threshold, the
    /// effect's stable id.
    pub at: i64,
    pub available: Quantity,
}

impl Credits {
    /// Every time a unit's available balance can move: a grant's effective, expiry and void
    /// times and each counted transaction's time, in order.
    fn moments(&self) -> Vec<i64> {
        let mut at: Vec<i64> = self
            .grants
            .values()
            .flat_map(|r| {
                [
                    Some(r.latest.effective_from()),
                    r.latest.expires_at,
                    r.voided_at,
                ]
            })
            .flatten()
            .chain(self.transactions.values().map(|t| t.effective_at))
            .collect();
        at.sort_unstable();
        at.dedup();
        at
    }

    /// The downward crossings of `unit`'s available balance (over every scope) up to `until`:
    /// one each time the balance falls below a threshold having been at or above it, re-armed
    /// only once it is back at or above. A balance that starts below (no grant yet) has
    /// crossed nothing. Read from the balance as a function of time, so the same set of
    /// grants and transactions tells the same crossings, at the same times, in every order.
    pub fn crossings(&self, unit: &str, thresholds: &[Threshold], until: i64) -> Vec<Crossing> {
        let mut armed = vec![false; thresholds.len()];
        let mut out = Vec::new();
        for (at, available) in self.available_through(unit, until) {
            for (i, threshold) in thresholds.iter().enumerate() {
                if !threshold.below(available) {
                    armed[i] = true;
                } else if armed[i] {
                    armed[i] = false;
                    out.push(Crossing {
                        threshold: *threshold,
                        unit: unit.to_owned(),
                        at,
                        available,
                    });
                }
            }
        }
        out
    }

    /// `unit`'s available balance (over every scope) at each of [`Credits::moments`] up to
    /// `until`: what [`Credits::totals_at`] gives at each, found by one sweep over the times
    /// in order, a grant's available read again (its ledger's running sum then) only when one
    /// of its transactions, its effective time or its end passes, and the unit's total moved
    /// by the difference. n·log n in the moments and transactions, where reading the totals
    /// afresh at each moment walked every transaction at each: quadratic in the debits that
    /// spent credit, whose spends are transactions here.
    fn available_through(&self, unit: &str, until: i64) -> Vec<(i64, Quantity)> {
        let ledgers: Vec<Ledger<'_>> = self.ledgers().remove(unit).unwrap_or_default();
        // What changes a grant's available, by time: each of its transactions, the time it
        // becomes effective and the time it ends.
        let mut changes: Vec<(i64, usize)> = Vec::new();
        for (i, l) in ledgers.iter().enumerate() {
            changes.extend(l.times.iter().map(|&at| (at, i)));
            changes.push((l.effective, i));
            changes.extend(l.end.map(|at| (at, i)));
        }
        changes.sort_unstable();
        let mut available = vec![Quantity::ZERO; ledgers.len()];
        let mut total = Quantity::ZERO;
        let mut next = 0;
        let mut touched: Vec<usize> = Vec::new();
        let mut out = Vec::new();
        for at in self.moments().into_iter().filter(|&t| t <= until) {
            while next < changes.len() && changes[next].0 <= at {
                touched.push(changes[next].1);
                next += 1;
            }
            touched.sort_unstable();
            touched.dedup();
            for i in touched.drain(..) {
                let l = &ledgers[i];
                let now = match l.live(at) {
                    true => l.remaining(at).clamped(),
                    false => Quantity::ZERO,
                };
                total = total - available[i] + now;
                available[i] = now;
            }
            out.push((at, total));
        }
        out
    }
}

/// The levels each unit's available balance is watched at (docs/design.md §4.14): `Depleted`
/// for every unit, and `Low(level)` for a unit the account's plan gives a `credits_low` level.
pub fn watched(unit: &str, low: &BTreeMap<String, Quantity>) -> Vec<Threshold> {
    low.get(unit)
        .map(|level| Threshold::Low(*level))
        .into_iter()
        .chain([Threshold::Depleted])
        .collect()
}

/// The catalog's low levels (whole units) as the fold's amounts.
pub fn low_levels(levels: &BTreeMap<String, i64>) -> BTreeMap<String, Quantity> {
    levels
        .iter()
        .map(|(unit, level)| (unit.clone(), Quantity::whole(*level)))
        .collect()
}

/// What an account's credits tell the app as of `until` (unix seconds), each effect with its
/// stable id, so that whoever writes them — an event's commit (`until` its provider time), a
/// debit's (the debit's time), the scheduler's tick (now) — writes each once, and the same in
/// every order (docs/design.md §4.14, §11):
/// - `billing.credits_granted`, once per grant, from when it is effective;
/// - `billing.credits_voided`, once per grant, from its (earliest) void;
/// - `billing.credits_expired`, once per grant, from its expiry, unless a void came first;
/// - `billing.credits_low` / `billing.credits_depleted`, once per downward crossing of a unit's
///   available balance ([`Credits::crossings`] over [`watched`]).
///
/// The bodies say only what no later event can change (the grant's own fields, the crossing's
/// unit, level and time); the amounts as of any time are the credits read's.
/// `credits` is everything the account's balances count: the provider's grants and
/// transactions, and the app's spends as local [`TransactionKind::Applied`] transactions.
pub fn told(
    (source, customer): (&str, &str),
    credits: &Credits,
    low: &BTreeMap<String, Quantity>,
    until: i64,
) -> Vec<NewEffect> {
    let account = (source, customer);
    let mut out = Vec::new();
    for register in credits.grants.values() {
        let g = &register.latest;
        let of_grant = |what: &str| format!("credit grant {source}/{} {what}", g.grant_id);
        let grant = serde_json::json!({
            "grant_id": g.grant_id, "origin": g.origin.as_str(), "unit": g.unit,
            "scope": g.scope, "amount": g.amount.to_string(), "category": g.category.as_str(),
            "effective_at": rfc3339(g.effective_from()),
        });
        if g.effective_from() <= until {
            out.push(credit_effect(
                Kind::CreditsGranted,
                of_grant("granted"),
                account,
                g.effective_from(),
                serde_json::json!({ "grant": grant }),
            ));
        }
        let voided = register.voided_at.filter(|&at| at <= until);
        if let Some(at) = voided {
            out.push(credit_effect(
                Kind::CreditsVoided,
                of_grant("voided"),
                account,
                at,
                serde_json::json!({ "grant": grant, "voided_at": rfc3339(at) }),
            ));
        }
        let expired = g
            .expires_at
            .filter(|&at| at <= until)
            .filter(|&at| register.voided_at.is_none_or(|v| v > at));
        if let Some(at) = expired {
            out.push(credit_effect(
                Kind::CreditsExpired,
                of_grant("expired"),
                account,
                at,
                serde_json::json!({ "grant": grant, "expired_at": rfc3339(at) }),
            ));
        }
    }
    let units: std::collections::BTreeSet<&str> = credits
        .grants
        .values()
        .map(|r| r.latest.unit.as_str())
        .collect();
    for unit in units {
        for x in credits.crossings(unit, &watched(unit, low), until) {
            let (kind, level, what) = match x.threshold {
                Threshold::Low(level) => (
                    Kind::CreditsLow,
                    Some(level.to_string()),
                    format!("below {level}"),
                ),
                Threshold::Depleted => (Kind::CreditsDepleted, None, "depleted".to_owned()),
            };
            out.push(credit_effect(
                kind,
                format!(
                    "credits of {source}/{customer} in {unit} {what} at {}",
                    x.at
                ),
                account,
                x.at,
                serde_json::json!({"unit": unit, "level": level, "crossed_at": rfc3339(x.at)}),
            ));
        }
    }
    out
}

/// A credits effect's body: who, when, and the kind's own part (the statement that writes it
/// adds `data.sequence`).
fn credit_effect(
    kind: Kind,
    cause: String,
    (source, customer): (&str, &str),
    at: i64,
    own: serde_json::Value,
) -> NewEffect {
    let id = effect_id(kind, &cause);
    let mut data = serde_json::json!({"source": source, "customer_id": customer});
    if let (Some(data), serde_json::Value::Object(own)) = (data.as_object_mut(), own) {
        data.extend(own);
    }
    let occurred_at = rfc3339(at).map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    NewEffect {
        body: serde_json::json!({
            "id": id, "type": kind.as_str(), "occurred_at": occurred_at, "data": data,
        }),
        id,
        kind,
        cause,
    }
}

/// The credits read as the app API answers it (docs/design.md §4.14, §12): amounts as decimal
/// strings, times in RFC 3339. A grant's `remaining` is what it may still spend (0 once it has
/// ended); `provisional` says the fold counted an amount or an end the provider has not told.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CreditsView {
    pub balances: Vec<BalanceView>,
    pub grants: Vec<GrantView>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BalanceView {
    pub unit: String,
    pub scope: String,
    pub available: String,
    pub granted: String,
    pub used: String,
    pub expired: String,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GrantView {
    pub grant_id: String,
    pub origin: &'static str,
    pub unit: String,
    pub scope: String,
    pub amount: String,
    pub remaining: String,
    pub priority: u8,
    pub category: &'static str,
    pub effective_at: Option<chrono::DateTime<chrono::Utc>>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    pub voided_at: Option<chrono::DateTime<chrono::Utc>>,
    pub provisional: bool,
}

fn rfc3339(secs: i64) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(secs, 0)
}

impl CreditsView {
    /// The view of `credits` as of `at` (unix seconds); grants in burn order.
    pub fn of(credits: &Credits, at: i64) -> CreditsView {
        let balances = credits
            .totals_at(at)
            .into_iter()
            .map(|b| BalanceView {
                unit: b.unit,
                scope: b.scope,
                available: b.available.to_string(),
                granted: b.granted.to_string(),
                used: b.used.to_string(),
                expired: b.expired.to_string(),
            })
            .collect();
        let grants = credits
            .balances_at(at)
            .into_iter()
            .map(|g| GrantView {
                remaining: g.available().to_string(),
                provisional: g.provisional,
                voided_at: g.voided_at.and_then(rfc3339),
                grant_id: g.grant.grant_id.clone(),
                origin: g.grant.origin.as_str(),
                unit: g.grant.unit.clone(),
                scope: g.grant.scope.clone(),
                amount: g.grant.amount.to_string(),
                priority: g.grant.priority(),
                category: g.grant.category.as_str(),
                effective_at: rfc3339(g.grant.effective_from()),
                expires_at: g.grant.expires_at.and_then(rfc3339),
            })
            .collect();
        CreditsView { balances, grants }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(n: i64) -> Quantity {
        Quantity::whole(n)
    }

    fn grant(id: &str, amount: i64, updated: i64) -> GrantSnapshot {
        GrantSnapshot {
            grant_id: id.into(),
            origin: Origin::StripeCreditGrant,
            unit: "usd".into(),
            scope: "price_type:metered".into(),
            amount: q(amount),
            category: Category::Paid,
            priority: None,
            created: 100,
            effective_at: None,
            expires_at: None,
            voided_at: None,
            updated,
            event_key: format!("evt_{id}_{updated}"),
        }
    }

    fn txn(id: &str, grant: &str, kind: TransactionKind, amount: i64, at: i64) -> Transaction {
        Transaction {
            transaction_id: id.into(),
            grant_id: grant.into(),
            kind,
            amount: q(amount),
            effective_at: at,
        }
    }

    #[test]
    fn a_decimal_amount_reads_and_writes_exactly() {
        for (s, shown) in [
            ("100", "100"),
            ("12.5", "12.5"),
            ("0.000000000001", "0.000000000001"),
            ("-3.250", "-3.25"),
        ] {
            assert_eq!(Quantity::parse(s).unwrap().to_string(), shown);
        }
        for bad in ["", "1.", ".5", "1e3", "0.0000000000001", "1,5", "--1"] {
            assert!(Quantity::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_snapshot_without_voided_at_never_revives_a_voided_grant() {
        let mut voided = grant("cg_1", 1000, 200);
        voided.voided_at = Some(200);
        let later = grant("cg_1", 1000, 300);
        for order in [[voided.clone(), later.clone()], [later, voided]] {
            let mut c = Credits::new();
            order.into_iter().for_each(|s| c.grant(s));
            let [b] = c.balances_at(400).try_into().unwrap();
            assert_eq!(b.voided_at, Some(200));
            assert!(!b.live);
            assert_eq!(b.available(), Quantity::ZERO);
            assert_eq!(b.expired, q(1000), "the void takes what remained");
        }
    }

    #[test]
    fn the_latest_snapshot_by_updated_wins_in_either_order() {
        let mut old = grant("cg_1", 1000, 200);
        old.priority = Some(10);
        let new = grant("cg_1", 1000, 300);
        for order in [[old.clone(), new.clone()], [new.clone(), old.clone()]] {
            let mut c = Credits::new();
            order.into_iter().for_each(|s| c.grant(s));
            assert_eq!(c.balances_at(400)[0].grant, new);
        }
    }

    #[test]
    fn a_transaction_before_its_grant_is_held_then_counted() {
        let mut c = Credits::new();
        c.transaction(txn("cbtxn_1", "cg_1", TransactionKind::Applied, 300, 150));
        assert_eq!(c.held().len(), 1);
        assert!(c.balances_at(400).is_empty());
        c.grant(grant("cg_1", 1000, 100));
        assert!(c.held().is_empty());
        assert_eq!(c.balances_at(400)[0].remaining, q(700));
    }

    #[test]
    fn a_copy_of_a_transaction_counts_once() {
        let mut c = Credits::new();
        c.grant(grant("cg_1", 1000, 100));
        for _ in 0..3 {
            c.transaction(txn("cbtxn_1", "cg_1", TransactionKind::Applied, 300, 150));
        }
        assert_eq!(c.balances_at(400)[0].used, q(300));
    }

    #[test]
    fn the_ledger_is_never_clamped_in_the_fold_only_when_shown() {
        let mut c = Credits::new();
        c.grant(grant("cg_1", 100, 100));
        c.transaction(txn("cbtxn_1", "cg_1", TransactionKind::Applied, 80, 150));
        c.transaction(txn("cbtxn_2", "cg_1", TransactionKind::Applied, 80, 160));
        let b = &c.balances_at(400)[0];
        assert_eq!(b.remaining, q(-60));
        assert_eq!(b.available(), Quantity::ZERO);
        // An invoice voided gives back 80: the ledger shows 20, as it would have had it never
        // been applied; a clamped fold would show 80.
        c.transaction(txn(
            "cbtxn_3",
            "cg_1",
            TransactionKind::ApplicationInvoiceVoided,
            80,
            170,
        ));
        assert_eq!(c.balances_at(400)[0].available(), q(20));
    }

    #[test]
    fn stripes_grant_transaction_replaces_the_provisional_amount() {
        let mut c = Credits::new();
        c.grant(grant("cg_1", 1000, 100));
        assert!(c.balances_at(400)[0].provisional);
        c.transaction(txn("cbtxn_g", "cg_1", TransactionKind::Granted, 1000, 100));
        let b = &c.balances_at(400)[0];
        assert_eq!((b.granted, b.provisional), (q(1000), false));
    }

    #[test]
    fn stripes_expiry_replaces_the_provisional_one_and_never_adds_to_it() {
        let mut g = grant("cg_1", 1000, 100);
        g.expires_at = Some(500);
        let mut c = Credits::new();
        c.grant(g);
        c.transaction(txn("cbtxn_1", "cg_1", TransactionKind::Applied, 300, 200));
        assert_eq!(c.balances_at(499)[0].available(), q(700));
        let provisional = &c.balances_at(600)[0];
        assert_eq!(
            (provisional.expired, provisional.available()),
            (q(700), Quantity::ZERO)
        );
        assert!(provisional.provisional);
        // Stripe's own expiry, of a different amount (it saw a later application), is the end.
        c.transaction(txn("cbtxn_2", "cg_1", TransactionKind::Expired, 650, 500));
        let told = &c.balances_at(600)[0];
        assert_eq!(told.expired, q(650), "replaced, not 1350");
        assert_eq!(told.remaining, q(50));
        assert_eq!(
            told.available(),
            Quantity::ZERO,
            "an expired grant spends nothing"
        );
    }

    #[test]
    fn a_grant_not_yet_effective_is_listed_and_spends_nothing() {
        let mut g = grant("cg_1", 1000, 100);
        g.effective_at = Some(1000);
        let mut c = Credits::new();
        c.grant(g);
        let b = &c.balances_at(500)[0];
        assert_eq!(
            (b.granted, b.available(), b.live),
            (Quantity::ZERO, Quantity::ZERO, false)
        );
        assert_eq!(c.balances_at(1000)[0].available(), q(1000));
    }

    #[test]
    fn debits_spend_the_allowance_then_grants_in_the_documented_order() {
        let mk = |id: &str, priority: Option<u8>, expires: Option<i64>, cat: Category| {
            let mut g = grant(id, 100, 100);
            g.unit = "credits".into();
            g.priority = priority;
            g.expires_at = expires;
            g.category = cat;
            g
        };
        let mut c = Credits::new();
        c.grant(mk("cg_e", None, None, Category::Paid));
        c.grant(mk("cg_d", None, Some(5000), Category::Paid));
        c.grant(mk("cg_c", None, Some(5000), Category::Promotional));
        c.grant(mk("cg_b", None, Some(4000), Category::Paid));
        c.grant(mk("cg_a", Some(10), None, Category::Paid));
        let grants = c.balances_at(200);
        let order: Vec<&str> = grants.iter().map(|g| g.grant.grant_id.as_str()).collect();
        assert_eq!(order, ["cg_a", "cg_b", "cg_c", "cg_d", "cg_e"]);
        let a = allocate(q(50), &grants, "credits", q(260)).unwrap();
        assert_eq!(a.from_allowance, q(50));
        assert_eq!(
            a.from_grants,
            vec![
                ("cg_a".to_string(), q(100)),
                ("cg_b".to_string(), q(100)),
                ("cg_c".to_string(), q(10))
            ]
        );
        assert_eq!(a.order_version, BURN_ORDER_VERSION);
        let e = allocate(q(50), &grants, "credits", q(551)).unwrap_err();
        assert_eq!(e.allowance_remaining, q(50));
        assert_eq!(e.grants.len(), 5);
        // Another unit's grants are not spent.
        assert!(allocate(q(0), &grants, "usd", q(1)).is_err());
    }

    fn credits_grant(
        id: &str,
        amount: i64,
        priority: Option<u8>,
        expires: Option<i64>,
    ) -> GrantSnapshot {
        let mut g = grant(id, amount, 100);
        g.unit = ALLOWANCE_UNIT.into();
        g.priority = priority;
        g.expires_at = expires;
        g
    }

    fn spent(id: &str, period: &str, amount: i64, at: i64) -> SpentDebit {
        SpentDebit {
            usage_id: id.into(),
            unit: ALLOWANCE_UNIT.into(),
            period: period.into(),
            amount: q(amount),
            at,
        }
    }

    #[test]
    fn debits_spend_their_periods_allowance_then_grants_as_the_debits_before_left_them() {
        let mut c = Credits::new();
        c.grant(credits_grant("cg_a", 100, Some(10), None));
        c.grant(credits_grant("cg_b", 100, None, None));
        let allowances = BTreeMap::from([
            ("2026-11".to_string(), q(50)),
            ("2026-12".to_string(), q(30)),
        ]);
        let debits = [
            spent("u1", "2026-11", 80, 200),
            spent("u2", "2026-11", 90, 210),
            spent("u3", "2026-12", 40, 220),
        ];
        let got = allocations(&c, &allowances, &debits);
        let shape = |a: &DebitAllocation| {
            (
                a.allocation.from_allowance,
                a.allocation.from_grants.clone(),
                a.unfunded,
            )
        };
        assert_eq!(shape(&got[0]), (q(50), vec![("cg_a".into(), q(30))], q(0)));
        assert_eq!(
            shape(&got[1]),
            (
                q(0),
                vec![("cg_a".into(), q(70)), ("cg_b".into(), q(20))],
                q(0)
            )
        );
        // Another month has its own allowance; the grants are the account's.
        assert_eq!(shape(&got[2]), (q(30), vec![("cg_b".into(), q(10))], q(0)));
        assert_eq!(
            spent_by_grant(&got),
            BTreeMap::from([("cg_a".to_string(), q(100)), ("cg_b".to_string(), q(30))])
        );
        // Another unit spends no allowance, and only its own grants.
        let mut usd = spent("u4", "2026-12", 5, 230);
        usd.unit = "usd".into();
        let got = allocations(&c, &allowances, &[usd]);
        assert_eq!(got[0].allocation.from_allowance, q(0));
        assert_eq!(got[0].unfunded, q(5));
    }

    /// The derivations as they were first written: each debit reads every grant as of its
    /// time, and each moment reads the totals afresh. Quadratic in the debits that spent
    /// credit, and plainly right: what the sweep and the ledgers must give.
    mod reference {
        use super::super::*;

        pub fn allocations(
            credits: &Credits,
            allowances: &BTreeMap<String, Quantity>,
            debits: &[SpentDebit],
        ) -> Vec<DebitAllocation> {
            let mut allowance_used: BTreeMap<&str, Quantity> = BTreeMap::new();
            let mut spent: BTreeMap<String, Quantity> = BTreeMap::new();
            let mut out = Vec::new();
            for d in debits {
                let allowance_left = match d.unit == ALLOWANCE_UNIT {
                    true => {
                        allowances.get(&d.period).copied().unwrap_or_default()
                            - allowance_used
                                .get(d.period.as_str())
                                .copied()
                                .unwrap_or_default()
                    }
                    false => Quantity::ZERO,
                };
                let grants: Vec<GrantBalance> = credits
                    .balances_at(d.at)
                    .into_iter()
                    .map(|mut g| {
                        let taken = spent.get(&g.grant.grant_id).copied().unwrap_or_default();
                        g.remaining = g.remaining - taken;
                        g
                    })
                    .collect();
                let (allocation, unfunded) =
                    match allocate(allowance_left, &grants, &d.unit, d.amount) {
                        Ok(a) => (a, Quantity::ZERO),
                        Err(e) => {
                            let held =
                                e.allowance_remaining + e.grants.iter().map(|(_, q)| *q).sum();
                            let a = Allocation {
                                from_allowance: e.allowance_remaining,
                                from_grants: e.grants,
                                order_version: BURN_ORDER_VERSION,
                            };
                            (a, d.amount - held)
                        }
                    };
                let used = allowance_used.entry(d.period.as_str()).or_default();
                *used = *used + allocation.from_allowance;
                for (grant, q) in &allocation.from_grants {
                    let taken = spent.entry(grant.clone()).or_default();
                    *taken = *taken + *q;
                }
                out.push(DebitAllocation {
                    usage_id: d.usage_id.clone(),
                    allocation,
                    unfunded,
                });
            }
            out
        }

        pub fn crossings(
            credits: &Credits,
            unit: &str,
            thresholds: &[Threshold],
            until: i64,
        ) -> Vec<Crossing> {
            let mut armed = vec![false; thresholds.len()];
            let mut out = Vec::new();
            for at in credits.moments().into_iter().filter(|&t| t <= until) {
                let available: Quantity = credits
                    .totals_at(at)
                    .into_iter()
                    .filter(|b| b.unit == unit)
                    .map(|b| b.available)
                    .sum();
                for (i, threshold) in thresholds.iter().enumerate() {
                    if !threshold.below(available) {
                        armed[i] = true;
                    } else if armed[i] {
                        armed[i] = false;
                        out.push(Crossing {
                            threshold: *threshold,
                            unit: unit.to_owned(),
                            at,
                            available,
                        });
                    }
                }
            }
            out
        }
    }

    /// A small random draw for the comparison with [`reference`] (a linear congruential
    /// generator, as the shuffles here use, so each seed is one case, the same every run).
    struct Draw(u64);

    impl Draw {
        fn below(&mut self, n: u64) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 33) % n
        }

        fn time(&mut self) -> i64 {
            self.below(1_200) as i64
        }

        fn maybe(&mut self, f: impl FnOnce(&mut Draw) -> i64) -> Option<i64> {
            (self.below(3) == 0).then(|| f(self))
        }
    }

    /// An account's credits and debits drawn from `seed`: grants of two units with snapshots
    /// that move priority, expiry and voids, their transactions of every kind (some naming no
    /// known grant), and debits of both units over two periods, accepted at times in no order.
    fn drawn(seed: u64) -> (Credits, BTreeMap<String, Quantity>, Vec<SpentDebit>) {
        use TransactionKind::*;
        let mut r = Draw(seed);
        let units = [ALLOWANCE_UNIT, "usd"];
        let periods = ["2026-11", "2026-12"];
        let mut c = Credits::new();
        let grants = 1 + r.below(5);
        for g in 0..grants {
            let id = format!("cg_{g}");
            let mut s = grant(&id, 1 + r.below(200) as i64, r.time());
            s.unit = units[r.below(2) as usize].into();
            s.created = r.time();
            s.effective_at = r.maybe(Draw::time);
            s.expires_at = r.maybe(Draw::time);
            s.voided_at = r.maybe(Draw::time);
            s.category = [Category::Paid, Category::Promotional][r.below(2) as usize];
            for n in 0..1 + r.below(3) {
                s.priority = r.maybe(|r| r.below(3) as i64 * 10).map(|p| p as u8);
                s.expires_at = s.expires_at.or(r.maybe(Draw::time));
                s.voided_at = r.maybe(Draw::time);
                s.updated = r.time();
                s.event_key = format!("evt_{id}_{n}");
                c.grant(s.clone());
            }
        }
        let kinds = [Granted, ApplicationInvoiceVoided, Applied, Expired, Voided];
        for t in 0..r.below(10) {
            let grant = format!("cg_{}", r.below(grants + 1));
            let kind = kinds[r.below(5) as usize];
            c.transaction(txn(
                &format!("t{t}"),
                &grant,
                kind,
                1 + r.below(120) as i64,
                r.time(),
            ));
        }
        let allowances = periods
            .iter()
            .map(|p| (p.to_string(), q(r.below(100) as i64)))
            .collect();
        let debits = (0..r.below(40))
            .map(|n| SpentDebit {
                usage_id: format!("u{n}"),
                unit: units[r.below(2) as usize].into(),
                period: periods[r.below(2) as usize].into(),
                amount: q(1 + r.below(60) as i64),
                at: r.time(),
            })
            .collect();
        (c, allowances, debits)
    }

    /// The derivations in one pass give what reading every grant afresh at each time gives,
    /// to the unit: each debit's allocation and unfunded part, and each unit's crossings of
    /// the credits with the debits' spends counted, on 2,000 drawn accounts.
    #[test]
    fn the_allocation_and_the_crossings_are_those_of_reading_every_grant_at_each_time() {
        for seed in 0u64..2_000 {
            let (c, allowances, debits) = drawn(seed);
            let got = allocations(&c, &allowances, &debits);
            assert_eq!(
                got,
                reference::allocations(&c, &allowances, &debits),
                "seed {seed}"
            );
            let counted = with_spends(&c, &debits, &got);
            let mut r = Draw(seed);
            for unit in [ALLOWANCE_UNIT, "usd"] {
                let watch = [
                    Threshold::Low(q(1 + r.below(250) as i64)),
                    Threshold::Depleted,
                ];
                for until in [r.time(), i64::MAX] {
                    assert_eq!(
                        counted.crossings(unit, &watch, until),
                        reference::crossings(&counted, unit, &watch, until),
                        "seed {seed}, {unit} until {until}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_late_grant_earlier_in_burn_order_is_spent_by_the_debits_it_comes_before() {
        let mut c = Credits::new();
        c.grant(credits_grant("cg_paid", 100, None, None));
        let debits = [spent("u1", "2026-11", 60, 200)];
        let none = BTreeMap::new();
        let before = allocations(&c, &none, &debits);
        assert_eq!(
            before[0].allocation.from_grants,
            vec![("cg_paid".into(), q(60))]
        );
        // A promotional grant of priority 10, effective before the debit, told after it.
        let mut promo = credits_grant("cg_promo", 50, Some(10), Some(1_000));
        promo.category = Category::Promotional;
        c.grant(promo);
        let after = allocations(&c, &none, &debits);
        assert_eq!(
            after[0].allocation.from_grants,
            vec![("cg_promo".into(), q(50)), ("cg_paid".into(), q(10))]
        );
        // Once the promotional grant has expired, the paid one holds what the debit left it.
        let at = c.balances_at(2_000);
        let paid = at.iter().find(|g| g.grant.grant_id == "cg_paid").unwrap();
        assert_eq!(paid.available() - spent_by_grant(&after)["cg_paid"], q(90));
    }

    #[test]
    fn a_debit_spends_only_grants_available_at_its_time() {
        let mut c = Credits::new();
        let mut later = credits_grant("cg_later", 100, Some(0), None);
        later.effective_at = Some(500);
        c.grant(later);
        c.grant(credits_grant("cg_ends", 100, Some(0), Some(300)));
        c.grant(credits_grant("cg_rest", 100, None, None));
        let got = allocations(&c, &BTreeMap::new(), &[spent("u1", "2026-11", 10, 400)]);
        assert_eq!(
            got[0].allocation.from_grants,
            vec![("cg_rest".into(), q(10))]
        );
    }

    #[test]
    fn an_application_told_later_leaves_an_accepted_debit_unfunded_not_refused() {
        let mut c = Credits::new();
        c.grant(credits_grant("cg_a", 100, None, None));
        c.transaction(txn("t1", "cg_a", TransactionKind::Applied, 70, 150));
        let got = allocations(&c, &BTreeMap::new(), &[spent("u1", "2026-11", 60, 200)]);
        assert_eq!(got[0].allocation.from_grants, vec![("cg_a".into(), q(30))]);
        assert_eq!(got[0].unfunded, q(30));
    }

    #[test]
    fn the_debits_spends_count_in_the_balances_and_the_crossings_they_cause() {
        let mut c = Credits::new();
        c.grant(credits_grant("cg_a", 100, None, Some(1_000)));
        let debits = [
            spent("u1", "2026-11", 60, 200),
            spent("u2", "2026-11", 30, 300),
        ];
        let spends = allocations(&c, &BTreeMap::new(), &debits);
        let counted = with_spends(&c, &debits, &spends);
        let [before] = counted.balances_at(999).try_into().unwrap();
        assert_eq!((before.used, before.available()), (q(90), q(10)));
        // What expires is what the debits left, not the whole grant.
        let [after] = counted.balances_at(1_000).try_into().unwrap();
        assert_eq!((after.expired, after.remaining), (q(10), q(0)));
        let watch = [Threshold::Low(q(50)), Threshold::Depleted];
        let told: Vec<(&str, i64)> = counted
            .crossings(ALLOWANCE_UNIT, &watch, 2_000)
            .iter()
            .map(|x| (x.threshold.kind(), x.at))
            .collect();
        assert_eq!(
            told,
            [
                ("billing.credits_low", 200),
                ("billing.credits_depleted", 1_000)
            ]
        );
    }

    /// One set of grants and transactions for the property: two grants, snapshots that move
    /// priority, a void, an expiry, applications, a voided invoice's return, and Stripe's own
    /// expiry, with copies.
    fn workload() -> Vec<Result<GrantSnapshot, Transaction>> {
        use TransactionKind::*;
        let mut a1 = grant("cg_a", 1000, 100);
        a1.expires_at = Some(900);
        let mut a2 = a1.clone();
        a2.updated = 150;
        a2.priority = Some(5);
        a2.event_key = "evt_a2".into();
        let b1 = grant("cg_b", 500, 100);
        let mut b2 = b1.clone();
        b2.updated = 400;
        b2.voided_at = Some(400);
        b2.event_key = "evt_b2".into();
        let mut b3 = b1.clone();
        b3.updated = 500;
        b3.event_key = "evt_b3".into();
        vec![
            Ok(a1),
            Ok(a2.clone()),
            Ok(a2),
            Ok(b1),
            Ok(b2),
            Ok(b3),
            Err(txn("t1", "cg_a", Granted, 1000, 100)),
            Err(txn("t2", "cg_a", Applied, 700, 200)),
            Err(txn("t3", "cg_a", Applied, 700, 300)),
            Err(txn("t3", "cg_a", Applied, 700, 300)),
            Err(txn("t4", "cg_a", ApplicationInvoiceVoided, 700, 350)),
            Err(txn("t5", "cg_a", Expired, 300, 900)),
            Err(txn("t6", "cg_b", Applied, 200, 300)),
        ]
    }

    fn fold(events: &[Result<GrantSnapshot, Transaction>]) -> Credits {
        let mut c = Credits::new();
        for e in events {
            match e {
                Ok(s) => c.grant(s.clone()),
                Err(t) => c.transaction(t.clone()),
            }
        }
        c
    }

    /// The balances are a function of the set of events: 500 shuffles, each read at every
    /// time the workload names and between them.
    #[test]
    fn balances_are_the_same_in_every_order() {
        let canonical = fold(&workload());
        for seed in 0u64..500 {
            let mut shuffled = workload();
            let mut rng = seed;
            for i in (1..shuffled.len()).rev() {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                shuffled.swap(i, (rng >> 33) as usize % (i + 1));
            }
            let other = fold(&shuffled);
            for at in (0..1200).step_by(50) {
                assert_eq!(
                    other.balances_at(at),
                    canonical.balances_at(at),
                    "seed {seed} at {at}"
                );
                assert_eq!(
                    other.totals_at(at),
                    canonical.totals_at(at),
                    "seed {seed} at {at}"
                );
            }
        }
    }

    #[test]
    fn the_workloads_balances_are_what_its_events_say() {
        let c = fold(&workload());
        let at = 1000;
        let b = c.balances_at(at);
        let a = b.iter().find(|g| g.grant.grant_id == "cg_a").unwrap();
        // 1000 granted, 700 + 700 applied, 700 back, Stripe's expiry 300: 0 left.
        assert_eq!((a.granted, a.used, a.expired), (q(1000), q(700), q(300)));
        assert_eq!(a.remaining, Quantity::ZERO);
        let bb = b.iter().find(|g| g.grant.grant_id == "cg_b").unwrap();
        // Voided at 400 with 300 left; the later snapshot without voided_at keeps it voided.
        assert_eq!((bb.expired, bb.live), (q(300), false));
        assert_eq!(c.totals_at(at)[0].available, Quantity::ZERO);
        // Before the void, b's 300 was spendable; a had 300 (1000 − 700) at 250.
        assert_eq!(c.totals_at(250)[0].available, q(800));
    }

    #[test]
    fn low_and_depleted_are_told_once_per_downward_crossing_and_rearmed_at_or_above() {
        use TransactionKind::*;
        let mut c = Credits::new();
        let mut g = grant("cg_1", 1000, 100);
        g.unit = "credits".into();
        c.grant(g);
        let low = Threshold::Low(q(200));
        let watch = [low, Threshold::Depleted];
        // 1000 → 850 → 150 (low) → 100 (still low, not told again) → 0 (depleted).
        for (id, amount, at) in [
            ("t1", 150, 200),
            ("t2", 700, 300),
            ("t3", 50, 400),
            ("t4", 100, 500),
        ] {
            c.transaction(txn(id, "cg_1", Applied, amount, at));
        }
        let told: Vec<(&str, i64)> = c
            .crossings("credits", &watch, 10_000)
            .iter()
            .map(|x| (x.threshold.kind(), x.at))
            .collect();
        assert_eq!(
            told,
            [
                ("billing.credits_low", 300),
                ("billing.credits_depleted", 500)
            ]
        );
        // A top-up to exactly the level re-arms low; the next fall below it is told again.
        let mut top = grant("cg_2", 200, 600);
        top.unit = "credits".into();
        top.created = 600;
        c.grant(top);
        c.transaction(txn("t5", "cg_2", Applied, 1, 700));
        let again: Vec<(&str, i64)> = c
            .crossings("credits", &watch, 10_000)
            .iter()
            .map(|x| (x.threshold.kind(), x.at))
            .collect();
        assert_eq!(
            again,
            [
                ("billing.credits_low", 300),
                ("billing.credits_depleted", 500),
                ("billing.credits_low", 700)
            ]
        );
        // Another unit crosses nothing.
        assert!(c.crossings("usd", &watch, 10_000).is_empty());
    }

    #[test]
    fn crossings_are_the_same_in_every_order() {
        let watch = [Threshold::Low(q(500)), Threshold::Depleted];
        let canonical = fold(&workload()).crossings("usd", &watch, 2000);
        assert!(!canonical.is_empty());
        let mut reversed = workload();
        reversed.reverse();
        assert_eq!(fold(&reversed).crossings("usd", &watch, 2000), canonical);
    }

    #[test]
    fn what_the_credits_tell_is_the_same_in_every_order_and_grows_with_time() {
        let low: BTreeMap<String, Quantity> = [("usd".to_owned(), q(500))].into();
        let account = ("stripe", "cus_1");
        let ids = |c: &Credits, until: i64| -> Vec<(String, String)> {
            let mut v: Vec<(String, String)> = told(account, c, &low, until)
                .into_iter()
                .map(|e| (e.id, e.body.to_string()))
                .collect();
            v.sort();
            v
        };
        let canonical = fold(&workload());
        let mut reversed = workload();
        reversed.reverse();
        assert_eq!(ids(&fold(&reversed), 2000), ids(&canonical, 2000));
        let kinds: Vec<&str> = told(account, &canonical, &low, 2000)
            .iter()
            .map(|e| e.kind.as_str())
            .collect();
        // Two grants granted, b voided at 400 (not expired), a expired at 900, and the unit's
        // crossings below 500 and to nothing.
        for kind in [
            "billing.credits_granted",
            "billing.credits_voided",
            "billing.credits_expired",
            "billing.credits_low",
            "billing.credits_depleted",
        ] {
            assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
        }
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "billing.credits_granted")
                .count(),
            2
        );
        assert_eq!(
            kinds
                .iter()
                .filter(|k| **k == "billing.credits_expired")
                .count(),
            1
        );
        // Before a's expiry nothing of it is told; what is told earlier is told later too.
        let early = ids(&canonical, 450);
        assert!(!told(account, &canonical, &low, 450)
            .iter()
            .any(|e| e.kind == Kind::CreditsExpired));
        let late = ids(&canonical, 2000);
        assert!(early.iter().all(|e| late.contains(e)));
        // A unit with no low level is watched for depletion only.
        assert_eq!(watched("credits", &low), [Threshold::Depleted]);
    }

    #[test]
    fn the_view_gives_decimal_strings_and_rfc3339_times_in_burn_order() {
        let mut g = grant("cg_1", 1000, 100);
        g.expires_at = Some(1767225600);
        let mut c = Credits::new();
        c.grant(g);
        c.transaction(txn("t1", "cg_1", TransactionKind::Applied, 1100, 150));
        let view = serde_json::to_value(CreditsView::of(&c, 200)).unwrap();
        assert_eq!(
            view,
            serde_json::json!({
                "balances": [{"unit": "usd", "scope": "price_type:metered", "available": "0",
                              "granted": "1000", "used": "1100", "expired": "0"}],
                "grants": [{"grant_id": "cg_1", "origin": "stripe_credit_grant", "unit": "usd",
                            "scope": "price_type:metered", "amount": "1000", "remaining": "0",
                            "priority": 50, "category": "paid",
                            "effective_at": "1970-01-01T00:01:40Z",
                            "expires_at": "2026-01-01T00:00:00Z", "voided_at": null,
                            "provisional": true}]
            })
        );
    }

    #[test]
    fn a_pack_bought_partly_used_and_refunded_voids_what_remains_and_mints_once() {
        let pack = crate::domain::catalog::CreditPack {
            amount: 1000,
            unit: "credits".into(),
            expires_after_days: Some(365),
            priority: Some(10),
        };
        let paid = pack_grant(&pack, "price_pack", "in_1", 1_000, "evt_paid");
        assert_eq!(paid.grant_id, "pack:in_1:price_pack");
        assert_eq!(paid.expires_at, Some(1_000 + 365 * 86_400));
        let copy = pack_grant(&pack, "price_pack", "in_1", 1_000, "evt_paid_copy");
        let refunded = pack_refunded(&paid, 5_000, "evt_refund");
        let spent = txn(
            "debit:1",
            &paid.grant_id,
            TransactionKind::Applied,
            300,
            2_000,
        );
        let events = vec![Ok(paid.clone()), Ok(copy), Ok(refunded), Err(spent)];
        for order in [events.clone(), events.into_iter().rev().collect()] {
            let c = fold(&order);
            let [before] = c.balances_at(4_999).try_into().unwrap();
            assert_eq!(before.available(), q(700), "minted once");
            let [after] = c.balances_at(5_000).try_into().unwrap();
            assert_eq!(
                (after.granted, after.used, after.expired, after.available()),
                (q(1000), q(300), q(700), Quantity::ZERO)
            );
        }
    }
}
