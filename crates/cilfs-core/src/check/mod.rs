//! Offline tools over an unmounted image, built on the filesystem layer: `repair` rebuilds what
//! the checker (today `fs/check.rs`) finds wrong.

pub mod repair;
