//! Pure rules of POSIX behaviour, apart from the operations that apply them: POSIX ACLs, the
//! set-user-ID and set-group-ID rules, when atime moves, the change attribute's counter, and what
//! the inode flags users set forbid, and which extent size hints an inode takes.

pub mod acl;
pub(crate) mod atime;
pub mod change;
pub(crate) mod extsize;
pub mod iflags;
pub(crate) mod setid;
