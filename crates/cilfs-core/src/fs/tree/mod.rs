//! The B+tree every item of the filesystem lives in: node layout (`node`), the tree operations
//! over any node store (`btree`), and the key layout of the fs tree's items (`keys`).

pub mod btree;
pub mod keys;
pub mod node;
