//! Compatibility alias from before `steering.rs` landed: `SteeringMode` is the real one now.
//! Remove once no caller names `net::steer_shim`.

pub use super::steering::SteeringMode;
