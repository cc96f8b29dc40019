//! Deliberately broken code paths, in `--cfg shuttle` builds only (the scheduled explorers):
//! switched on, each must make the explorer fail, which shows that it can.

use std::cell::Cell;

std::thread_local! {
    // Per OS thread, which is one scheduled run's: runs on other threads keep their checks.
    static PUBLISH_CHECK_OFF: Cell<bool> = const { Cell::new(false) };
}

/// Turns off a publish's checks that what its commit saw is still so: that every block it
/// changes is at the version it copied (`trans::publish::lock_in_block_order`), and, for an
/// optimistic commit (`SharedPublish::check`), that every tree block it read is still current
/// and the blocks it allocated were not taken meanwhile. A commit built on a view another
/// commit changed then publishes over that change. For the runs of the calling OS thread.
pub fn set_publish_check_off(off: bool) {
    PUBLISH_CHECK_OFF.with(|c| c.set(off));
}

pub(crate) fn publish_check_off() -> bool {
    PUBLISH_CHECK_OFF.with(Cell::get)
}
