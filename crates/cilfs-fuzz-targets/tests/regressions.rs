//! Inputs the fuzz targets found that panicked or aborted, each replayed through its target:
//! every one must now return.

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn run(name: &str, hex: &str) {
    let t = cilfs_fuzz_targets::target(name).expect("a target of that name");
    (t.run)(&unhex(hex));
}

/// A header block shorter than the header's fields (28 bytes) sliced past its end.
#[test]
fn a_short_header_block_is_corrupt() {
    run(
        "header",
        "48534643010000000000000000000000000000000000000000000000",
    );
    let short = unhex("4853464301000000");
    assert!(cilfs_core::fs::items::header::Header::decode(&short, 4).is_err());
}

/// An inode whose block count times the block size passes 2^64 overflowed in getattr.
#[test]
fn an_inode_of_2_64_blocks_has_attributes() {
    run(
        "inode",
        "ed410000e8030000e8030000020000000000000500b80000f15365000000000500000000f1536500000000\
         0500005365000000000500000000f15365000000000500000000f153650000000005000000000000000000\
         0000030000000000000000000000010000000000000000000000",
    );
}

/// A symlink whose inode (resealed) claims a size of some 900 GB: readlink allocated a buffer
/// of that size and the process aborted.
#[test]
fn a_symlink_of_a_huge_size_is_corrupt() {
    run("image", "00910e040085992f479ee2");
}

/// An extent (resealed leaf) whose disk block times the block size passes 2^64: a read of the
/// file overflowed computing the byte offset.
#[test]
fn an_extent_past_2_64_bytes_is_corrupt() {
    run(
        "image",
        "016120040004e70053b93a27040084a9164ccd740f04008888d584b30bb59e22",
    );
}

/// An extent whose last block lies past 2^64 is refused by the decoder: block arithmetic
/// within an extent cannot overflow.
#[test]
fn an_extent_ending_past_2_64_blocks_is_corrupt() {
    use cilfs_core::fs::items::extent::Extent;
    let mut v = (u64::MAX - 2).to_le_bytes().to_vec();
    v.extend_from_slice(&[4, 0, 0, 0, 0, 0, 0, 0]);
    assert!(Extent::decode(0, &v).is_err());
    v[8] = 2;
    assert!(Extent::decode(0, &v).is_ok());
}

/// A free-space item (resealed) claiming blocks past 2^64: the checker's ownership walk
/// overflowed adding its start and length.
#[test]
fn check_of_free_space_past_2_64_blocks_reports_it() {
    run("image", "0082187445feffffffffffffffffffffffffffffff1445");
}

/// A superblock (resealed) whose log is 4 sectors long: the log scan asserted on a log
/// shorter than 16 sectors. The superblock decoder refuses it.
#[test]
fn a_superblock_with_a_log_of_4_sectors_is_refused() {
    run("image", "0037000000c7000100000000003700002bff");
}

/// A resealed inode whose change attribute is near 2^64: the counter in memory keeps it in 63
/// bits and a write's bump wrapped it to zero, which `ChangeCounter::adopt`'s debug check
/// caught (found at c131ba2). Such a value is now corrupt at decode
/// (`fs::tests::damage::a_change_attribute_past_its_range_is_corrupt_and_found`).
#[test]
fn a_change_counter_never_goes_back_on_a_damaged_image() {
    run(
        "image",
        "3a01fffffff80a002cff000000000000ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff08000220f61f0224002c080002da0fb4fffffff80a002cff000000000000ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff08000220f61f0224002c080002da20",
    );
}

/// The remote value of `user.big` (700 bytes, one block; resealed leaf) claiming 44 blocks:
/// the unlink of its file cancelled all 44 in one transaction, past the 9 it reserved, and
/// would have freed 43 blocks it never owned. A remote value of other than the blocks its
/// length takes is corrupt.
#[test]
fn a_remote_xattr_value_of_44_blocks_for_700_bytes_is_corrupt() {
    run("image", "7af90eb40db4180a4047534643000000000000002c");
}

/// A header (resealed) counting fewer free blocks than a write's freelist refill then took:
/// the count wrapped below zero (overflow check). Taking past the count is corrupt.
#[test]
fn an_allocation_past_the_headers_free_count_is_corrupt() {
    run(
        "image",
        "008008020681010100d802021824fff61f00005f080200a3c43d00b5b63a",
    );
}

/// A superblock (resealed) whose log generation is at its largest value: the next mount's
/// generation overflowed in recovery (overflow check). It is damage, refused with a message.
#[test]
fn a_log_generation_at_its_largest_value_is_damage() {
    run("image", "2f54000000f8ffffffffffffff3ab4");
}
