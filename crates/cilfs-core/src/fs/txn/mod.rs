//! The tree-transaction API: a filesystem transaction (a journal transaction plus the header
//! it may change, the extents it frees, busy until the checkpoint that frees them is stable,
//! and tree access that logs every node it writes), and what it is made of:
//!
//! - `api.rs`: `FsTx`, begin and commit, its tree access and the checks an optimistic one
//!   runs at commit;
//! - `busy.rs`: busy extents, freed by commits whose checkpoint is not yet stable;
//! - `diff.rs`: what a node's new image logs (the diff against the block as it was);
//! - `late.rs`: the header's late write at commit;
//! - `debug.rs`: debug builds' checks that every changed leaf is where a descent leads;
//! - `view.rs`: the `Trees` and `TreeRead` traits, and `ReadView`, tree access without a
//!   transaction;
//! - `shared_tx.rs`: transactions built and published under the shared state lock;
//! - `publish.rs`: the order of that publish's steps, and the retry after conflicts, written
//!   once for `shared_tx.rs` and the loom model;
//! - `retry.rs`: running an operation again when it must wait outside the state lock.

pub mod api;
pub(crate) mod busy;
#[cfg(debug_assertions)]
mod debug;
mod diff;
mod late;
pub(crate) mod publish;
pub(crate) mod retry;
pub(crate) mod shared_tx;
pub mod view;

pub(crate) use api::freelist_band;
pub use api::{FsTx, TX_MAX_BUFFERS};
#[cfg(debug_assertions)]
pub(crate) use debug::assert_published_keys_routed;
pub(crate) use view::Reshape;
pub use view::{ReadView, TreeRead, Trees};
