//! Which account something is about (docs/design.md §4.6a): a customer of one source and,
//! for a provider that keeps accounts inside another's (Stripe Connect: a connected account's
//! customers are that account's, not the platform's), the connected account the customer
//! belongs to. The store keys such a customer as one [`CustomerId`], `acct_…/cus_…`; that key
//! is built and taken apart here and nowhere else. The customer's own id may be an `acct_…`
//! too (a Stripe customer that is an Account): what is before the separator is the connected
//! account, what is after it (or the whole key) the customer.

use super::{parse_id, CustomerId, DomainError};

/// What separates the connected account from the customer in a stored customer id.
const SEPARATOR: char = '/';

/// An account as a handler, the CLI or the API names it: the source, the customer's own id at
/// the provider, and the connected account when the customer lives in one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountRef {
    pub source: String,
    stored: CustomerId,
}

impl AccountRef {
    /// The account of `customer` (the provider's own id) in `source`, inside the connected
    /// account `connected` when one is named. Neither id may hold the separator the store
    /// joins them with.
    pub fn new(
        source: impl Into<String>,
        customer: &str,
        connected: Option<&str>,
    ) -> Result<Self, AccountError> {
        Ok(Self {
            source: source.into(),
            stored: CustomerId::of_account(customer, connected)?,
        })
    }

    /// The customer as the store keys it.
    pub fn customer_id(&self) -> &CustomerId {
        &self.stored
    }

    /// The customer's own id at the provider (`cus_…` of `acct_…/cus_…`).
    pub fn customer(&self) -> &str {
        self.stored.at_provider()
    }

    /// The connected account the customer belongs to, if any.
    pub fn connected_account(&self) -> Option<&str> {
        self.stored.connected_account()
    }
}

/// Why an account cannot be named so.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AccountError {
    #[error("{0}")]
    Customer(DomainError),
    #[error("a customer id has no '{SEPARATOR}'")]
    CustomerHasSeparator,
    #[error("{0}")]
    Connected(DomainError),
    #[error("a connected account's id has no '{SEPARATOR}'")]
    ConnectedHasSeparator,
}

impl CustomerId {
    /// The stored id of `customer`, inside the connected account `connected` when named
    /// (`acct_…/cus_…`).
    pub fn of_account(customer: &str, connected: Option<&str>) -> Result<Self, AccountError> {
        let customer = CustomerId::parse(customer).map_err(AccountError::Customer)?;
        if customer.as_str().contains(SEPARATOR) {
            return Err(AccountError::CustomerHasSeparator);
        }
        let Some(connected) = connected else {
            return Ok(customer);
        };
        let connected =
            parse_id("connected account", connected).map_err(AccountError::Connected)?;
        if connected.contains(SEPARATOR) {
            return Err(AccountError::ConnectedHasSeparator);
        }
        let joined = format!("{connected}{SEPARATOR}{}", customer.as_str());
        CustomerId::parse(&joined).map_err(AccountError::Customer)
    }

    /// The connected account this stored id names (`acct_…` of `acct_…/cus_…`), if any.
    pub fn connected_account(&self) -> Option<&str> {
        self.split().0
    }

    /// The customer's own id at the provider (`cus_…` of `acct_…/cus_…`; the whole id when
    /// it names no connected account).
    pub fn at_provider(&self) -> &str {
        self.split().1
    }

    fn split(&self) -> (Option<&str>, &str) {
        match self.as_str().split_once(SEPARATOR) {
            Some((account, customer)) if !account.is_empty() => (Some(account), customer),
            _ => (None, self.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connected_customer_is_stored_as_one_key_and_taken_apart_again() {
        let account = AccountRef::new("stripe", "cus_1", Some("acct_1Conn")).unwrap();
        assert_eq!(account.customer_id().as_str(), "acct_1Conn/cus_1");
        assert_eq!(account.customer(), "cus_1");
        assert_eq!(account.connected_account(), Some("acct_1Conn"));
        let again = account.customer_id();
        assert_eq!(again.connected_account(), Some("acct_1Conn"));
        assert_eq!(again.at_provider(), "cus_1");
    }

    /// A customer that is an Account (Accounts v2) has an `acct_…` id of its own: the stored
    /// key tells it from a connected account by place alone (docs/design.md §4.6a).
    #[test]
    fn a_customer_that_is_an_account_is_told_from_a_connected_account_by_its_place() {
        let own = AccountRef::new("stripe", "acct_cust", None).unwrap();
        assert_eq!(own.customer_id().as_str(), "acct_cust");
        assert_eq!(own.customer(), "acct_cust");
        assert_eq!(own.connected_account(), None);
        let connected =
            AccountRef::new("stripe", "acct_cust", Some("acct_platformconnected")).unwrap();
        assert_eq!(
            connected.customer_id().as_str(),
            "acct_platformconnected/acct_cust"
        );
        assert_eq!(connected.customer(), "acct_cust");
        assert_eq!(
            connected.connected_account(),
            Some("acct_platformconnected")
        );
        assert_ne!(own.customer_id(), connected.customer_id());
    }

    #[test]
    fn a_platform_customer_names_no_connected_account() {
        let account = AccountRef::new("polar", " cus_1 ", None).unwrap();
        assert_eq!(account.customer_id().as_str(), "cus_1");
        assert_eq!(account.customer(), "cus_1");
        assert_eq!(account.connected_account(), None);
    }

    #[test]
    fn neither_id_may_hold_the_separator_or_be_empty() {
        assert_eq!(
            AccountRef::new("stripe", "acct_1/cus_1", None),
            Err(AccountError::CustomerHasSeparator)
        );
        assert_eq!(
            AccountRef::new("stripe", "cus_1", Some("acct_1/x")),
            Err(AccountError::ConnectedHasSeparator)
        );
        assert_eq!(
            AccountRef::new("stripe", "cus_1", Some(" ")),
            Err(AccountError::Connected(DomainError::Empty(
                "connected account"
            )))
        );
        assert_eq!(
            AccountRef::new("stripe", "", None),
            Err(AccountError::Customer(DomainError::Empty("customer id")))
        );
    }
}
