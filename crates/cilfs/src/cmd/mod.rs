pub mod info;
pub mod mkfs;
