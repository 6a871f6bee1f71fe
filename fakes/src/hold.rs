//! What a fake is told to hold, over HTTP: `POST /_fake/objects` with the object as its body,
//! the fake's own route (under [`crate::described::ADMIN`], which no provider has and the
//! description checks skip). `inboxctl fakes` mounts it on each fake it serves, so that whoever sends a delivery
//! whose object the worker will read (`inboxctl send --thin`) first gives the fake that object,
//! built by the same fixtures (docs/design.md §6.6).

use serde_json::{json, Value};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::stripe::FakeStripe;
use crate::{FakeKinde, FakeLemonSqueezy, FakePaddle, FakePolar};

/// The route a fake is told to hold an object on.
pub const HOLD: &str = "/_fake/objects";

/// A fake told to hold an object, each by its own seeding method.
pub enum Hold {
    Stripe(FakeStripe),
    Polar(FakePolar),
    Kinde(FakeKinde),
    Paddle(FakePaddle),
    LemonSqueezy(FakeLemonSqueezy),
}

impl Respond for Hold {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let Ok(object) = serde_json::from_slice::<Value>(&request.body) else {
            return ResponseTemplate::new(400).set_body_json(json!({"detail": "not JSON"}));
        };
        let id = object["id"].clone();
        match self {
            // A v1 object with its `id` and `object`, in the account its `account` names.
            Self::Stripe(fake) => {
                if !(object["id"].is_string() && object["object"].is_string()) {
                    return ResponseTemplate::new(400).set_body_json(
                        json!({"detail": "a Stripe object has an id and an object"}),
                    );
                }
                fake.holds(object);
            }
            Self::Polar(fake) => {
                fake.subscription(object);
            }
            Self::Paddle(fake) => {
                fake.subscription(object);
            }
            Self::LemonSqueezy(fake) => {
                fake.subscription(object);
            }
            // `{"customer", "plans": [...]}`: the plans Kinde lists for a customer.
            Self::Kinde(fake) => {
                let Some(customer) = object["customer"].as_str() else {
                    return ResponseTemplate::new(400)
                        .set_body_json(json!({"detail": "a Kinde customer names its customer"}));
                };
                fake.customer(customer, object["plans"].clone());
                return ResponseTemplate::new(200).set_body_json(json!({"held": customer}));
            }
        }
        ResponseTemplate::new(200).set_body_json(json!({"held": id}))
    }
}

impl Hold {
    /// Mounts the route on `server`, before the provider's own routes.
    pub async fn mount(self, server: &MockServer) {
        Mock::given(method("POST"))
            .and(path(HOLD))
            .respond_with(self)
            .with_priority(2)
            .mount(server)
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::described::ADMIN;

    #[test]
    fn the_hold_route_is_under_the_fakes_own_prefix() {
        assert!(HOLD.starts_with(ADMIN));
    }
}
