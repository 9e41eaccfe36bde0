//! CLI placeholder.
