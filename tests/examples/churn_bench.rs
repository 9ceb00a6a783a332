//! Placeholder: the churn benchmark (being written).
fn main() {}
