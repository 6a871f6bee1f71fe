//! The reference delivery scripts (docs/design.md §4.9) and what a handler that applies each
//! delivery on arrival makes of them: `inboxctl scenario` sends them to the running stack, the
//! Engine Room runs them on a fresh customer of a test-mode source. One copy of each script.

use chrono::{DateTime, Duration as Span, Utc};
use serde::Serialize;

use crate::billing::account::AccountView;
use crate::domain::{Catalog, SourceKind};
use crate::providers::fixtures::Spec;

/// A reference scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// Plan change to Pro ×3, payment ×5, a cancellation from before the upgrade arriving 7th.
    NineDeliveries,
    /// Two subscriptions, their activations and revocations in a scrambled order.
    Subscriptions,
    /// trialing → active → past_due, with `active` landing last.
    Status,
    /// paid, refunded, then a late paid.
    Refund,
    /// [`Scenario::Status`] on Paddle Billing.
    StatusPaddle,
    /// [`Scenario::Refund`] on Lemon Squeezy orders.
    RefundLemonSqueezy,
    /// [`Scenario::Status`] sent as Stripe thin events: each change's subscription is read
    /// from the provider's API by the worker (docs/design.md §6.2).
    StatusThin,
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Self::NineDeliveries,
        Self::Subscriptions,
        Self::Status,
        Self::Refund,
        Self::StatusPaddle,
        Self::RefundLemonSqueezy,
        Self::StatusThin,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::NineDeliveries => "nine-deliveries",
            Self::Subscriptions => "subscriptions",
            Self::Status => "status",
            Self::Refund => "refund",
            Self::StatusPaddle => "status-paddle",
            Self::RefundLemonSqueezy => "refund-lemonsqueezy",
            Self::StatusThin => "status-thin",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }

    /// Its deliveries, in the order they arrive.
    pub fn script(self) -> Script {
        use Naive::*;
        match self {
            Self::NineDeliveries => {
                let up = || Step::new("plan-changed", "up", 10, Plan("pro")).plan("pro");
                let pay = || {
                    Step::new("payment-succeeded", "pay", 11, Payment)
                        .plan("pro")
                        .object("pay_1")
                };
                let cancel = Step::new("agreement-cancelled", "cancel", 7, Cancel);
                Script {
                    source: "kinde",
                    kind: SourceKind::Kinde,
                    thin: false,
                    // The starting point: Free, with its allowance (where the model on arrival
                    // starts too).
                    start: Some(
                        Step::new("plan-assigned", "start", -60, Plan("free")).plan("free"),
                    ),
                    steps: vec![up(), up(), up(), pay(), pay(), pay(), cancel, pay(), pay()],
                }
            }
            Self::Subscriptions => {
                let s = |tag, kind, object, days: i64, naive| {
                    Step::new(kind, tag, days * 1440, naive)
                        .plan("prod_pro")
                        .object(object)
                };
                Script {
                    source: "polar",
                    kind: SourceKind::StandardWebhooks,
                    thin: false,
                    start: None,
                    steps: vec![
                        s("a1", "subscription", "sub_old", 0, Plan("pro")),
                        s("r1", "revoked", "sub_old", 31, Cancel),
                        s("a1b", "subscription", "sub_old", 0, Plan("pro")),
                        s("a2", "subscription", "sub_new", 59, Plan("pro")),
                        s("r2", "revoked", "sub_old", 90, Cancel),
                        s("r3", "revoked", "sub_new", 45, Cancel),
                        s("r4", "revoked", "sub_new", 120, Cancel),
                    ],
                }
            }
            Self::Status => {
                let s = |tag, status, at, naive| {
                    Step::new("subscription", tag, at, naive)
                        .plan("price_pro")
                        .object("sub_status")
                        .status(status)
                };
                Script {
                    source: "stripe",
                    kind: SourceKind::Stripe,
                    thin: false,
                    start: None,
                    steps: vec![
                        s("trial", "trialing", 0, Status("trialing")),
                        s("past_due", "past_due", 2, Status("past_due")),
                        s("active", "active", 1, Status("active")),
                    ],
                }
            }
            Self::StatusThin => Script {
                thin: true,
                ..Self::Status.script()
            },
            Self::StatusPaddle => {
                // Paddle's subscription notifications, the catalog keyed by price id (§6.4).
                let s = |tag, status, at, naive| {
                    Step::new("subscription", tag, at, naive)
                        .plan(crate::providers::paddle::fixtures::DEV_PRICE)
                        .object("sub_status")
                        .status(status)
                };
                Script {
                    source: "paddle",
                    kind: SourceKind::Paddle,
                    thin: false,
                    start: None,
                    steps: vec![
                        s("trial", "trialing", 0, Status("trialing")),
                        s("past_due", "past_due", 2, Status("past_due")),
                        s("active", "active", 1, Status("active")),
                    ],
                }
            }
            Self::Refund => {
                let s = |tag, kind, at, naive| {
                    Step::new(kind, tag, at, naive)
                        .plan("prod_pro")
                        .object("ord_1")
                };
                Script {
                    source: "polar",
                    kind: SourceKind::StandardWebhooks,
                    thin: false,
                    start: None,
                    steps: vec![
                        s("paid", "order-paid", 0, Status("paid")),
                        s("refund", "order-refunded", 1, Status("refunded")),
                        s("late", "order-paid", 2, Status("paid")),
                    ],
                }
            }
            Self::RefundLemonSqueezy => {
                // Lemon Squeezy's orders, the catalog keyed by variant id (§6.5). Its payloads
                // carry no event id: each step is an event of its own by what it says.
                let s = |tag, kind, at, naive| {
                    Step::new(kind, tag, at, naive)
                        .plan(crate::providers::lemonsqueezy::fixtures::DEV_VARIANT)
                        .object("ord_1")
                };
                Script {
                    source: "lemonsqueezy",
                    kind: SourceKind::LemonSqueezy,
                    thin: false,
                    start: None,
                    steps: vec![
                        s("paid", "order-created", 0, Status("paid")),
                        s("refund", "order-refunded", 1, Status("refunded")),
                        s("late", "order-created", 2, Status("paid")),
                    ],
                }
            }
        }
    }
}

/// A scenario's deliveries.
pub struct Script {
    /// The development stack's source it is sent to (`inboxctl scenario`).
    pub source: &'static str,
    /// The kind of source its deliveries are shaped and signed for: the Engine Room runs it on
    /// a test-mode source of this kind.
    pub kind: SourceKind,
    /// Each delivery is the thin twin of its (Stripe) snapshot event, whose object the
    /// provider API at the source's `api_base_url` is first told to hold (the fakes' own
    /// route, `inboxctl fakes`): the worker reads what the change made of it.
    pub thin: bool,
    /// Delivered before the first step: the account's starting point, which the model on
    /// arrival starts from ([`OnArrival::start`]) rather than applies.
    pub start: Option<Step>,
    pub steps: Vec<Step>,
}

impl Script {
    /// The plan keys its deliveries name: the catalog must know them for the run to show a
    /// plan.
    pub fn plan_keys(&self) -> Vec<&'static str> {
        let mut keys: Vec<&'static str> = self
            .start
            .iter()
            .chain(&self.steps)
            .filter_map(|s| s.plan)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// The provider time of its latest step, in minutes after the start.
    pub fn last_minute(&self) -> i64 {
        self.steps.iter().map(|s| s.at_minutes).max().unwrap_or(0)
    }

    /// The setup delivery in a line, when the script has one: delivered with step 1, before
    /// it, so the account starts where the scenario says; not a step of its own.
    pub fn setup(&self) -> Option<String> {
        let start = self.start.as_ref()?;
        let mut what = start.label();
        if let Some(plan) = start.plan {
            what.push_str(&format!(", plan {plan}"));
        }
        let before = -start.at_minutes;
        match before {
            m if m > 0 => what.push_str(&format!(", {m} minutes before the start")),
            _ => what.push_str(", at the start"),
        }
        Some(what)
    }

    /// Step `n` (1-based) in a line: the delivery, its provider time, and whether it is a
    /// copy of an earlier step (the same event).
    pub fn what(&self, n: usize) -> String {
        let step = &self.steps[n - 1];
        let mut what = step.label();
        if let Some(status) = step.status {
            what.push_str(&format!(" {status}"));
        }
        if let Some(plan) = step.plan {
            what.push_str(&format!(", plan {plan}"));
        }
        let at = step.at_minutes;
        match at {
            0 => what.push_str(", at the start"),
            _ if at % 1440 == 0 => what.push_str(&format!(", day {}", at / 1440)),
            _ => what.push_str(&format!(", minute {at}")),
        }
        if let Some(first) = self.steps[..n - 1].iter().position(|s| s.tag == step.tag) {
            what.push_str(&format!(" (a copy of step {})", first + 1));
        }
        what
    }
}

/// What a handler that applies on arrival does with one delivery.
#[derive(Debug, Clone, Copy)]
pub enum Naive {
    /// Moves the plan and tops the balance up to it.
    Plan(&'static str),
    /// Tops the balance up to the current plan's allowance again.
    Payment,
    /// Drops to free.
    Cancel,
    /// Sets the status it reads.
    Status(&'static str),
}

/// One delivery of a script.
#[derive(Debug, Clone)]
pub struct Step {
    /// The event kind, in the fixtures' words (`inboxctl send`'s).
    pub kind: &'static str,
    /// Which event this delivery carries: the same tag is the same event (a copy).
    pub tag: &'static str,
    pub plan: Option<&'static str>,
    pub object: Option<&'static str>,
    pub status: Option<&'static str>,
    /// Minutes after the scenario's start, in provider time.
    pub at_minutes: i64,
    pub naive: Naive,
}

impl Step {
    fn new(kind: &'static str, tag: &'static str, at_minutes: i64, naive: Naive) -> Self {
        Self {
            kind,
            tag,
            plan: None,
            object: None,
            status: None,
            at_minutes,
            naive,
        }
    }

    fn plan(mut self, plan: &'static str) -> Self {
        self.plan = Some(plan);
        self
    }

    fn object(mut self, object: &'static str) -> Self {
        self.object = Some(object);
        self
    }

    fn status(mut self, status: &'static str) -> Self {
        self.status = Some(status);
        self
    }

    /// The delivery in a few words: its kind and object.
    pub fn label(&self) -> String {
        format!("{} {}", self.kind, self.object.unwrap_or(""))
            .trim()
            .to_owned()
    }

    /// Its provider time in a run that starts at `start`.
    pub fn at(&self, start: DateTime<Utc>) -> DateTime<Utc> {
        start + Span::minutes(self.at_minutes)
    }

    /// The delivery of this step in one run: `run` makes the run's event and object ids its
    /// own (the same tag, the same event id: a copy is a copy).
    pub fn spec(&self, customer: &str, run: &str, start: DateTime<Utc>) -> Spec {
        Spec {
            kind: self.kind.to_owned(),
            customer: customer.to_owned(),
            plan: self.plan.map(str::to_owned),
            at: self.at(start),
            object_id: self.object.map(|o| format!("{o}_{run}")),
            status: self.status.map(str::to_owned),
            event_id: Some(format!("{run}_{}", self.tag)),
            ..Default::default()
        }
    }
}

/// An account in three words: what each row of a scenario shows, for the pipeline's account
/// and for the model on arrival alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AccountLine {
    pub plan: String,
    pub balance: i64,
    pub status: String,
}

impl AccountLine {
    /// The stored account's line: its plan, the period's balance, and the status of its first
    /// subscription, else of its first payment (`-` without either); an account not stored
    /// yet is `free`, 0, `-`.
    pub fn of(account: Option<&AccountView>) -> Self {
        account
            .map(|a| {
                let status = a
                    .subscriptions
                    .first()
                    .map(|x| x.status.clone())
                    .or_else(|| a.payments.first().map(|p| p.status.clone()))
                    .unwrap_or_else(|| "-".into());
                Self {
                    plan: a.plan.clone(),
                    balance: a.balance,
                    status,
                }
            })
            .unwrap_or_else(|| Self {
                plan: "free".into(),
                balance: 0,
                status: "-".into(),
            })
    }
}

/// The account as a handler that applies each delivery on arrival leaves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct OnArrival(pub AccountLine);

impl OnArrival {
    /// Free, with its allowance: where every scenario starts.
    pub fn start(catalog: &Catalog) -> Self {
        Self(AccountLine {
            plan: "free".into(),
            balance: catalog.allowance_of("free").unwrap_or(0),
            status: "-".into(),
        })
    }

    /// After the first `n` steps of `script`, applied in arrival order.
    pub fn after(script: &Script, n: usize, catalog: &Catalog) -> Self {
        let mut state = Self::start(catalog);
        for step in script.steps.iter().take(n) {
            state.apply(step.naive, catalog);
        }
        state
    }

    pub fn apply(&mut self, naive: Naive, catalog: &Catalog) {
        let allowance = |plan: &str| catalog.allowance_of(plan).unwrap_or(0);
        let free = allowance("free");
        let line = &mut self.0;
        match naive {
            Naive::Plan(key) => {
                let plan = catalog
                    .get(key)
                    .map(|p| p.plan.clone())
                    .unwrap_or_else(|| key.to_owned());
                line.balance += allowance(&plan) - free;
                line.plan = plan;
                line.status = "active".into();
            }
            Naive::Payment => line.balance += allowance(&line.plan) - free,
            Naive::Cancel => {
                line.plan = "free".into();
                line.status = "canceled".into();
            }
            Naive::Status(status) => line.status = status.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        Catalog::parse(
            r#"{"free":{"plan":"free","monthly_allowance":10},"pro":{"plan":"pro","monthly_allowance":500},
                "price_pro":{"plan":"pro","monthly_allowance":500},"prod_pro":{"plan":"pro","monthly_allowance":500},
                "pri_01gsz8x8sawmvhz1pv30nge1ke":{"plan":"pro","monthly_allowance":500},
                "101":{"plan":"pro","monthly_allowance":500}}"#,
        )
        .unwrap()
    }

    fn line(plan: &str, balance: i64, status: &str) -> OnArrival {
        OnArrival(AccountLine {
            plan: plan.into(),
            balance,
            status: status.into(),
        })
    }

    /// The Engine Room says what a scenario delivers before its first step: the nine
    /// deliveries start free (its grant is why step 1 grants pro's 500 less free's 10); a
    /// scenario without a starting point says nothing.
    #[test]
    fn the_setup_delivery_is_said_in_a_line() {
        assert_eq!(
            Scenario::NineDeliveries.script().setup().as_deref(),
            Some("plan-assigned, plan free, 60 minutes before the start")
        );
        let without: Vec<&str> = Scenario::ALL
            .into_iter()
            .filter(|s| s.script().start.is_none())
            .map(|s| s.name())
            .collect();
        for name in without {
            let scenario = Scenario::ALL
                .into_iter()
                .find(|s| s.name() == name)
                .unwrap();
            assert_eq!(scenario.script().setup(), None, "{name}");
        }
    }

    /// docs/design.md §4.9: a handler that applies on arrival ends the nine deliveries at
    /// 2,950, on free.
    #[test]
    fn applied_on_arrival_the_nine_deliveries_end_at_2950_on_free() {
        let script = Scenario::NineDeliveries.script();
        let catalog = catalog();
        assert_eq!(
            OnArrival::after(&script, 0, &catalog),
            line("free", 10, "-")
        );
        assert_eq!(
            OnArrival::after(&script, 1, &catalog),
            line("pro", 500, "active")
        );
        assert_eq!(
            OnArrival::after(&script, 6, &catalog),
            line("pro", 2950, "active")
        );
        assert_eq!(
            OnArrival::after(&script, 9, &catalog),
            line("free", 2950, "canceled")
        );
    }

    #[test]
    fn each_scenario_has_its_name_and_its_steps_say_which_are_copies() {
        for scenario in Scenario::ALL {
            assert_eq!(Scenario::parse(scenario.name()), Some(scenario));
        }
        assert_eq!(Scenario::parse("ten-deliveries"), None);
        let nine = Scenario::NineDeliveries.script();
        assert_eq!(nine.steps.len(), 9);
        assert_eq!(nine.what(1), "plan-changed, plan pro, minute 10");
        assert_eq!(
            nine.what(2),
            "plan-changed, plan pro, minute 10 (a copy of step 1)"
        );
        assert_eq!(nine.what(7), "agreement-cancelled, minute 7");
        assert_eq!(
            nine.what(9),
            "payment-succeeded pay_1, plan pro, minute 11 (a copy of step 4)"
        );
        assert_eq!(nine.plan_keys(), ["free", "pro"]);
        assert_eq!(nine.last_minute(), 11);
        assert_eq!(Scenario::Subscriptions.script().last_minute(), 120 * 1440);
        let subscriptions = Scenario::Subscriptions.script();
        assert_eq!(
            subscriptions.what(2),
            "revoked sub_old, plan prod_pro, day 31"
        );
        assert_eq!(
            Scenario::Status.script().what(1),
            "subscription sub_status trialing, plan price_pro, at the start"
        );
        assert_eq!(
            Scenario::parse("status-paddle"),
            Some(Scenario::StatusPaddle)
        );
        assert_eq!(
            Scenario::StatusPaddle.script().what(3),
            "subscription sub_status active, plan pri_01gsz8x8sawmvhz1pv30nge1ke, minute 1"
        );
        assert_eq!(
            Scenario::parse("refund-lemonsqueezy"),
            Some(Scenario::RefundLemonSqueezy)
        );
        assert_eq!(
            Scenario::RefundLemonSqueezy.script().what(2),
            "order-refunded ord_1, plan 101, minute 1"
        );
    }

    /// Each script is shaped for its source kind: every step (and the starting point) is a kind
    /// that provider's fixtures build, its plan key one the development catalog names for it,
    /// and it goes to that kind's development source (`inboxctl scenario`).
    #[test]
    fn every_step_is_a_delivery_its_providers_fixtures_build() {
        use crate::providers::fixtures;
        let start = DateTime::from_timestamp(1_764_700_000, 0).unwrap();
        let sources = fixtures::dev_sources(&fixtures::Local { jwks_url: "" });
        for scenario in Scenario::ALL {
            let script = scenario.script();
            let dev = sources
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == script.source)
                .unwrap_or_else(|| panic!("{}: no dev source {}", scenario.name(), script.source));
            assert_eq!(dev["kind"], script.kind.as_str(), "{}", scenario.name());
            for step in script.start.iter().chain(&script.steps) {
                assert!(
                    fixtures::all_kinds(script.kind).contains(&step.kind),
                    "{}: {}",
                    scenario.name(),
                    step.kind
                );
                let spec = step.spec("er_1", "1_ab", start);
                fixtures::payload(script.kind, &spec)
                    .unwrap_or_else(|e| panic!("{}: {e}", scenario.name()));
            }
            assert!(
                script
                    .plan_keys()
                    .iter()
                    .all(|key| catalog().get(key).is_some()),
                "{}: {:?}",
                scenario.name(),
                script.plan_keys()
            );
        }
        assert_eq!(
            (
                Scenario::StatusPaddle.script().kind,
                Scenario::RefundLemonSqueezy.script().kind
            ),
            (SourceKind::Paddle, SourceKind::LemonSqueezy)
        );
    }

    /// On arrival, Paddle's status scenario ends `active` (the delivery that landed last), and
    /// Lemon Squeezy's refund ends `paid` (the late order): where the pipeline ends
    /// `past_due` and `refunded`.
    #[test]
    fn applied_on_arrival_the_provider_variants_end_on_the_last_delivery() {
        let catalog = catalog();
        let paddle = Scenario::StatusPaddle.script();
        assert_eq!(
            OnArrival::after(&paddle, 3, &catalog),
            line("free", 10, "active")
        );
        let lemonsqueezy = Scenario::RefundLemonSqueezy.script();
        assert_eq!(
            OnArrival::after(&lemonsqueezy, 2, &catalog),
            line("free", 10, "refunded")
        );
        assert_eq!(
            OnArrival::after(&lemonsqueezy, 3, &catalog),
            line("free", 10, "paid")
        );
    }

    #[test]
    fn a_steps_delivery_is_the_runs_own_and_its_copies_share_the_event_id() {
        let nine = Scenario::NineDeliveries.script();
        let start = DateTime::from_timestamp(1_764_700_000, 0).unwrap();
        let first = nine.steps[0].spec("er_1", "1_ab", start);
        let copy = nine.steps[1].spec("er_1", "1_ab", start);
        assert_eq!(first.event_id.as_deref(), Some("1_ab_up"));
        assert_eq!(copy.event_id, first.event_id);
        assert_eq!(first.at, start + Span::minutes(10));
        let pay = nine.steps[3].spec("er_1", "1_ab", start);
        assert_eq!(pay.object_id.as_deref(), Some("pay_1_1_ab"));
        assert_eq!(pay.customer, "er_1");
    }
}
