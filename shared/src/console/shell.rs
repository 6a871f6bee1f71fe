//! The shell: the one page every console address answers with, the same for everyone and
//! holding no data. The script fills `#page` with the fragment of the address it was loaded
//! at, once the tab holds a key.

use maud::{html, DOCTYPE};

/// The shell of the console served under `base` (what precedes `/console` in the path).
pub fn shell(base: &str) -> String {
    let console = format!("{base}/console");
    let nav = [
        ("", "Overview"),
        ("events", "Events"),
        ("effects", "Effects"),
        ("meters", "Meters"),
        ("divergences", "Divergences"),
        ("engine-room", "Engine Room"),
        ("audit-trail", "Audit trail"),
    ];
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "billing-inbox console" }
                // No icon to fetch: the browser would ask the origin's root for one.
                link rel="icon" href="data:,";
                link rel="stylesheet" href={ (console) "/assets/console.css" };
                script src={ (console) "/assets/console.js" } defer {}
            }
            body {
                a.skip href="#page" { "Skip to the page" }
                header.top {
                    a.brand href={ (console) "/" } { "billing-inbox" }
                    nav aria-label="Console" {
                        ul {
                            @for (path, name) in nav {
                                li { a href={ (console) "/" (path) } data-section=(path) { (name) } }
                            }
                        }
                    }
                    form #account-form method="get" action={ (console) "/accounts" }
                        aria-label="Open an account" {
                        label for="account-source" { "Source" }
                        input #account-source name="source" type="text" required
                            autocomplete="off" spellcheck="false" size="8";
                        label for="account-customer" { "Customer" }
                        input #account-customer name="customer" type="text" required
                            autocomplete="off" spellcheck="false" size="14";
                        button type="submit" { "Open account" }
                    }
                    button #forget-key type="button" { "Forget key" }
                }
                div #flash role="status" aria-live="polite" {}
                main #page tabindex="-1" {}
                noscript {
                    p.noscript { "The console runs in the browser: turn JavaScript on for this page." }
                }
            }
        }
    }
    .into_string()
}
