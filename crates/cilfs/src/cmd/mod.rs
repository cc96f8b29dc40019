pub mod bench;
pub mod crashtest;
pub mod info;
pub mod logprint;
pub mod mkfs;
