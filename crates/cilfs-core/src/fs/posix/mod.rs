//! The operations a request reaches, one file per family.

pub(crate) mod xattr;
