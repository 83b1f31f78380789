//! Never built: this package only names the crate whose source `cargo fetch` downloads.
