//! What every metric line shares, whichever layer prints it: the CloudWatch namespace.

/// The CloudWatch namespace of every metric the functions print (Embedded Metric Format).
pub const NAMESPACE: &str = "BillingInbox";
