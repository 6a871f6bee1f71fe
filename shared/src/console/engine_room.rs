//! The Engine Room: a reference scenario run on a fresh customer of a test-mode source,
//! through the real intake and worker. The page holds the choice and the empty tables; the
//! script drives the run through the admin API and fills them, delivery by delivery.

use maud::{html, Markup};
use serde_json::Value;

use super::view::{list, text, Links};

/// The reference scenarios, offered when the answer names none.
const SCENARIOS: [&str; 7] = [
    "nine-deliveries",
    "subscriptions",
    "status",
    "refund",
    "status-paddle",
    "refund-lemonsqueezy",
    "status-thin",
];

pub(super) fn render(data: &Value, links: Links) -> Markup {
    if data["enabled"].as_bool() != Some(true) {
        return html! {
            h1 { "Engine Room" }
            p #engine-off.note {
                "The Engine Room is off in this deployment. It runs the reference scenarios on a "
                "fresh customer of a test-mode source, and is turned on only by the deployment's "
                "parameter."
            }
        };
    }
    let scenarios = list(data, "scenarios");
    html! {
        h1 { "Engine Room" }
        p.meta {
            "Runs a reference scenario's deliveries, one at a time, through the real intake and "
            "worker on a fresh test-mode customer, and shows each answer and the account after "
            "it beside what a handler that applies each event on arrival would hold. Only what "
            "differs between the two is marked (a status neither side has, shown as -, is not "
            "compared)."
        }
        div #engine-form.search data-runs=(links.api("/v1/admin/engine-room/runs"))
            data-console=(links.console("")) {
            div.field {
                label for="scenario" { "Scenario" }
                select #scenario name="scenario" {
                    @if scenarios.is_empty() {
                        @for name in SCENARIOS { option value=(name) { (name) } }
                    }
                    @for scenario in scenarios {
                        option value=(text(scenario, "name")) data-setup=[scenario["setup"].as_str()] {
                            (text(scenario, "name"))
                            @let n = list(scenario, "steps").len();
                            @if n > 0 {
                                " (" (text(scenario, "source")) ", " (n)
                                @if n == 1 { " delivery)" } @else { " deliveries)" }
                            }
                        }
                    }
                }
            }
            div.actions { button #run type="button" { "Run" } }
        }
        @for scenario in scenarios {
            details.scenario data-scenario=(text(scenario, "name")) {
                summary { "What " (text(scenario, "name")) " sends" }
                @if let Some(setup) = scenario["setup"].as_str() {
                    p.setup {
                        "First, with step 1 and not a step of its own, the setup: " (setup)
                        ". The account starts there (its grant counts toward step 1's); applying "
                        "on arrival starts from the same place."
                    }
                }
                ol {
                    @for step in list(scenario, "steps") { li { (text(step, "what")) } }
                }
            }
        }
        div.scroll {
            table #engine-steps {
                thead {
                    tr {
                        th scope="col" { "Step" }
                        th scope="col" { "Delivery" }
                        th scope="col" { "HTTP answer" }
                        th scope="col" { "The event's outcome" }
                        th scope="col" { "Account after it" }
                        th scope="col" { "Applying on arrival" }
                    }
                }
                tbody {}
            }
        }
        p #engine-result aria-live="polite" {}
    }
}
