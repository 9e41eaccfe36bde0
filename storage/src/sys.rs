//! Raw syscalls and `unsafe` of this crate live here, each with a `// SAFETY:` comment.
//!
//! There are none: every file operation goes through glommio (io_uring), and directory
//! listing uses `std::fs`. Keep it that way or add them here.
