//! Pure rules of POSIX behaviour, apart from the operations that apply them: POSIX ACLs, the
//! set-user-ID and set-group-ID rules, when atime moves, and the change attribute's counter.

pub mod acl;
pub(crate) mod atime;
pub mod change;
pub(crate) mod setid;
