//! header checks
